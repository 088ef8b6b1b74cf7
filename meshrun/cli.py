"""The `meshrun` command: reads argv (the command, its flags, the role a meshrun process was started
in), runs the command and exits with its status. Every problem with the command line is one line on
stderr (`meshrun: error: ...`) and exit status 2. The jobs go through the Hydra app (meshrun.app);
this module imports neither Hydra, jax nor keras.
"""

from __future__ import annotations

import os
import sys

from meshrun.errors import ConfigError
from meshrun.launch import join
from meshrun.launch.spawn import ROLE_FLAG, Role, parse_role
from meshrun.system import signals
from meshrun.usage import USAGE, command_help, versions_line
from meshrun.wording import one_of, say_error

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
    signals.end_process_when_interrupted()
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


def parse(command: str, args: list[str], as_program: bool):
    """The invocation `meshrun COMMAND ARGS` asks for: its flags read and checked, and `-m` put
    first (Hydra takes it only before the overrides; users put it anywhere)."""
    from meshrun.jobs import Invocation

    flags = {"--json", "--full"}
    as_json, full = "--json" in args, "--full" in args
    if as_json and command != "plan":
        raise ConfigError("--json", "only `meshrun plan` prints JSON; `meshrun train` writes metrics.json into its run dir")
    if full and command != "plan":
        raise ConfigError("--full", "only `meshrun plan` takes it (a row per variable instead of one per repeated block)")
    args, save_layout = _take_save_layout(command, args)
    role = Role.USER
    for arg in (a for a in args if a.startswith(f"{ROLE_FLAG}=")):
        try:
            role = parse_role(arg)
        except ValueError:
            raise ConfigError(ROLE_FLAG, f"got {arg.partition('=')[2]!r}; valid: {one_of(r.value for r in Role)}") from None
    overrides = [a for a in args if a not in flags and not a.startswith(f"{ROLE_FLAG}=")]
    multirun = any(a in ("-m", "--multirun") for a in overrides)
    overrides = ["-m"] * multirun + [a for a in overrides if a not in ("-m", "--multirun")]
    if save_layout and multirun:
        raise ConfigError("--save-layout", f"got {save_layout!r} with -m; a layout file holds the rules of one job: plan one job at a time")
    return Invocation(command=command, overrides=overrides, role=role, as_json=as_json, full=full, as_program=as_program,
                      save_layout=save_layout)


def parse_k8s(args: list[str], as_program: bool):
    """The invocation `meshrun k8s ARGS` asks for: its flags read and checked, and the overrides
    its pods' `meshrun train` gets, which are also those its config is composed from."""
    from meshrun.jobs import Invocation
    from meshrun.kube.options import parse_options
    from meshrun.kube.render import pod_overrides

    options, overrides = parse_options(args)
    return Invocation(command="k8s", overrides=pod_overrides(overrides, options), kube=options, as_program=as_program)


SAVE_LAYOUT = "--save-layout"


def _take_save_layout(command: str, args: list[str]) -> tuple[list[str], str | None]:
    """`--save-layout FILE` (or `--save-layout=FILE`) taken out of `args`; the file must be a .yaml
    path that can be written (checked now, so that a bad one costs no planning)."""
    for index, arg in enumerate(args):
        if arg == SAVE_LAYOUT or arg.startswith(f"{SAVE_LAYOUT}="):
            given = arg.partition("=")[2] if "=" in arg else (args[index + 1] if index + 1 < len(args) else "")
            rest = args[:index] + args[index + (1 if "=" in arg else 2):]
            break
    else:
        return args, None
    if command != "plan":
        raise ConfigError(SAVE_LAYOUT, "only `meshrun plan` takes it (it writes the layout rules the plan places by)")
    check_layout_path(given)
    return rest, given


def check_layout_path(path: str) -> None:
    """ConfigError unless `path` is a .yaml file path whose directory exists and can be written."""
    if not path or path.startswith("-"):
        raise ConfigError(SAVE_LAYOUT, f"got {path!r}; give the path of the layout file to write, e.g. --save-layout my_layout.yaml")
    if not path.endswith((".yaml", ".yml")):
        raise ConfigError(SAVE_LAYOUT, f"got {path!r}; a layout file is YAML: give a path ending in .yaml (layout=PATH loads it back)")
    folder = os.path.dirname(os.path.abspath(path))
    if os.path.isdir(path) or not os.path.isdir(folder) or not os.access(folder, os.W_OK):
        reason = "is a directory" if os.path.isdir(path) else "its directory does not exist" if not os.path.isdir(folder) else "its directory is not writable"
        raise ConfigError(SAVE_LAYOUT, f"got {path!r}, which cannot be written: {reason}; give a path in a writable directory")


def leave(status: int) -> None:
    """Ends the meshrun program with `status` as soon as its output is written (exit_now); a
    process of a multi-process job leaves through jax's shutdown barrier with the others."""
    if join.joined():
        sys.exit(status)
    join.exit_now(status)
