"""The `meshrun` command: reads argv (the command, its flags, the role a meshrun process was started
in), runs the command and exits with its status. Every problem with the command line is one line on
stderr (`meshrun: error: ...`) and exit status 2. The jobs go through the Hydra app (meshrun.app);
this module imports neither Hydra, jax nor keras.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass

from meshrun.errors import ConfigError
from meshrun.files import unwritable
from meshrun.launch import join
from meshrun.launch.spawn import ROLE_FLAG, Role, parse_role
from meshrun.system import signals
from meshrun.usage import USAGE, command_help, versions_line
from meshrun.wording import not_a_flag, one_of, say_error

COMMANDS = ("train", "plan", "sweep", "report", "generate", "preset", "k8s")
CONFIG_COMMANDS = ("train", "plan", "sweep", "k8s")  # they take overrides: their help lists the config groups
HELP_FLAGS = ("-h", "--help")
OWN_HELP = ("generate", "preset")  # commands that word their own help
VERSION_FLAGS = ("-V", "--version")


def main(argv: list[str] | None = None) -> None:
    """Entry point of the `meshrun` console script and of `python -m meshrun` (argv None), and of
    in-process callers (tests) with their own argv, for whom a failure is SystemExit. Run as a
    program, the process ends as soon as its output is written, except in a multi-process job, whose
    processes leave through jax's shutdown barrier together."""
    if argv is not None:
        status = run(list(argv), as_program=False)
        if status:
            sys.exit(status)
        return
    try:
        status = run(sys.argv[1:], as_program=True)
    except SystemExit as ended:  # Hydra's --help and --cfg end with SystemExit
        if ended.code is not None and not isinstance(ended.code, int):
            raise
        status = ended.code or 0
    except KeyboardInterrupt:  # Ctrl-C before training, or a second one during it
        signals.on_the_way_out()
        say_error(signals.INTERRUPTED)
        status = signals.INTERRUPTED_STATUS
    leave(status)


def run(args: list[str], as_program: bool) -> int:
    """Runs the command `args` names; returns its exit status."""
    if not args or args[0] in (*HELP_FLAGS, "help"):
        print(USAGE, end="")
        return 0
    if args[0] in VERSION_FLAGS:
        print(versions_line())
        return 0
    command, rest = args[0], args[1:]
    if command not in COMMANDS:
        say_error(f"unknown command {command!r}; valid: {one_of(COMMANDS)} (see meshrun --help)")
        return 2
    if command not in OWN_HELP and any(a in HELP_FLAGS for a in rest):
        print(command_help(command), end="")
        if command in CONFIG_COMMANDS:
            from meshrun import app

            print(app.config_groups_text())
        return 0
    try:
        if command == "report":
            from meshrun.report import sweep

            sweep.report(rest)
            return 0
        if command == "generate":
            from meshrun import generate as generate_command

            return generate_command.main(rest)
        if command == "preset":
            from meshrun import preset as preset_command

            return preset_command.main(rest)
        invocation = parse_k8s(rest, as_program) if command == "k8s" else parse(command, rest, as_program)
    except ConfigError as err:
        say_error(str(err))
        return 2
    from meshrun import app

    status = app.run(invocation)
    if status and join.joined():  # a failed process of a job: the others would wait for it at exit
        join.exit_now(status)
    return status


@dataclass(frozen=True)
class Flag:
    """A flag of a command that takes overrides: its names, the values it takes (None: none; ():
    any; `optional`: it may go without one) as help writes them (`meta`), and whether Hydra reads
    it (then it goes before the overrides, the only place Hydra takes flags)."""

    names: tuple[str, ...]
    values: tuple[str, ...] | None = None
    meta: str = ""
    optional: bool = False
    hydra: bool = False

    def __str__(self) -> str:
        return "/".join(self.names) + (f" {self.meta}" if self.meta else "")


MULTIRUN = Flag(("-m", "--multirun"), hydra=True)
SAVE_LAYOUT = "--save-layout"
FIT = "--fit"  # plan --fit: the largest batch or sequence length whose train step fits
FIT_TARGETS = ("batch", "seq_len")
# Each command's flags; train's are the Hydra flags meshrun passes on (Hydra's others would change
# meshrun's config tree or its app: --config-path, --config-name, --run, --shell-completion, ...).
FLAGS = {
    "train": (
        MULTIRUN,
        Flag(("--cfg", "-c"), ("job", "hydra", "all"), "job|hydra|all", hydra=True),
        Flag(("--resolve",), hydra=True),
        Flag(("--package", "-p"), (), "PACKAGE", hydra=True),
        Flag(
            ("--info", "-i"),
            ("all", "config", "defaults", "defaults-tree", "plugins", "searchpath"),
            "[WHAT]",
            optional=True,
            hydra=True,
        ),
    ),
    "plan": (
        Flag(("--json",)),
        Flag(("--full",)),
        Flag((SAVE_LAYOUT,), (), "FILE.yaml"),
        Flag((FIT,), FIT_TARGETS, "batch|seq_len"),
        MULTIRUN,
    ),
    "sweep": (MULTIRUN,),
}


def parse(command: str, args: list[str], as_program: bool):
    """The invocation `meshrun COMMAND ARGS` asks for: its flags read and checked, and those Hydra
    reads (-m, --cfg job, ...) put before the overrides (Hydra takes them only there; users put them
    anywhere)."""
    from meshrun.jobs import Invocation

    given, hydra_flags, overrides, role = read_flags(command, args)
    save_layout = given.get(SAVE_LAYOUT)
    if save_layout is not None:
        check_layout_path(save_layout)
    if save_layout is not None and "-m" in given:
        raise ConfigError(
            SAVE_LAYOUT,
            f"got {save_layout!r} with -m; a layout file holds the rules of one job: plan one job at a time",
        )
    return Invocation(
        command=command,
        overrides=[*hydra_flags, *overrides],
        role=role,
        as_json="--json" in given,
        full="--full" in given,
        as_program=as_program,
        save_layout=save_layout,
        fit=given.get(FIT),
    )


def read_flags(command: str, args: list[str]) -> tuple[dict, list[str], list[str], Role]:
    """The flags `args` give `meshrun COMMAND` (by first name: the value given, "" for none), the
    Hydra flags among them as Hydra takes them, the overrides, and the role the process was started
    in; a ConfigError for a flag the command does not take, or a value it does not."""
    by_name = {name: flag for flag in FLAGS[command] for name in flag.names}
    given, overrides, role, rest = {}, [], Role.USER, list(args)
    while rest:
        arg = rest.pop(0)
        name, has_value, value = arg.partition("=")
        if name == ROLE_FLAG:
            role = _role(value)
        elif not arg.startswith("-"):
            overrides.append(arg)
        elif name not in by_name:
            raise ConfigError(
                name,
                not_a_flag(name, command, [*map(str, FLAGS[command]), "--help"], taken_by(name, command)),
            )
        else:
            flag = by_name[name]
            given[flag.names[0]] = _flag_value(flag, name, value if has_value else None, rest)
    hydra_flags = [
        part
        for flag in FLAGS[command]
        if flag.hydra and flag.names[0] in given
        for part in (flag.names[0], given[flag.names[0]])
        if part
    ]
    return given, hydra_flags, overrides, role


def taken_by(flag: str, command: str) -> list[str]:
    """The other commands (of train, plan and sweep) that take `flag`."""
    return [
        other for other, flags in FLAGS.items() if other != command and any(flag in f.names for f in flags)
    ]


def _flag_value(flag: Flag, name: str, value: str | None, rest: list[str]) -> str:
    """The value of `flag` (given as `name`): `value` when it came with `=`, else taken off the
    front of `rest` where the flag takes one; "" for none."""
    if flag.values is None:
        if value is not None:
            raise ConfigError(name, f"got {value!r}; it takes no value")
        return ""
    if (
        value is None
        and rest
        and not rest[0].startswith("-")
        and (not flag.optional or rest[0] in flag.values)
    ):
        value = rest.pop(0)
    if value is None and flag.optional:
        return ""
    if flag.values and value not in flag.values:
        raise ConfigError(
            name, f"got {'nothing' if value is None else repr(value)}; valid: {one_of(flag.values)}"
        )
    if value is None and flag.names[0] != SAVE_LAYOUT:  # check_layout_path words a missing layout path
        raise ConfigError(name, f"got nothing; give {flag.meta} after it")
    return value or ""


def _role(value: str) -> Role:
    try:
        return parse_role(f"{ROLE_FLAG}={value}")
    except ValueError:
        raise ConfigError(ROLE_FLAG, f"got {value!r}; valid: {one_of(r.value for r in Role)}") from None


def parse_k8s(args: list[str], as_program: bool):
    """The invocation `meshrun k8s ARGS` asks for: its flags read and checked, and the overrides
    its pods' `meshrun train` gets, which are also those its config is composed from."""
    from meshrun.jobs import Invocation
    from meshrun.kube.options import parse_options
    from meshrun.kube.render import pod_overrides

    options, overrides = parse_options(args)
    return Invocation(
        command="k8s", overrides=pod_overrides(overrides, options), kube=options, as_program=as_program
    )


def check_layout_path(path: str) -> None:
    """ConfigError unless `path` is a .yaml file path that can be written (its missing dirs are
    made when it is)."""
    if not path or path.startswith("-"):
        raise ConfigError(
            SAVE_LAYOUT,
            f"got {path!r}; give the path of the layout file to write, e.g. --save-layout my_layout.yaml",
        )
    if not path.endswith((".yaml", ".yml")):
        raise ConfigError(
            SAVE_LAYOUT,
            f"got {path!r}; a layout file is YAML: give a path ending in .yaml (layout=PATH loads it back)",
        )
    reason = unwritable(path)
    if reason:
        raise ConfigError(
            SAVE_LAYOUT,
            f"got {path!r}, which cannot be written ({reason}); give a file path where you can write, "
            "e.g. --save-layout layouts/my_layout.yaml",
        )


def leave(status: int) -> None:
    """Ends the meshrun program with `status` as soon as its output is written (exit_now); a
    process of a multi-process job leaves through jax's shutdown barrier with the others."""
    if join.joined():
        sys.exit(status)
    join.exit_now(status)
