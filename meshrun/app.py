"""The Hydra app: composes each job's config from meshrun's config tree and the configs it serves
Hydra beside it (meshrun.hydra_sources: `mesh=AxB` shapes made on demand, a switch for every log
sink, the options' defaults), with overrides, -m multiruns and run dirs; hands every job to
meshrun.jobs as a plain `Job`, and words Hydra's and OmegaConf's own errors as one line. With
meshrun.hydra_sources, the only modules that know about Hydra; it imports neither jax nor keras.
"""

from __future__ import annotations

import contextlib
import copy
import os
import re
import shutil
import sys
import tempfile
import textwrap

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.object_type import ObjectType
from hydra.errors import ConfigCompositionException, MissingConfigException, OverrideParseException
from hydra.experimental.callback import Callback
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf, open_dict, read_write
from omegaconf.errors import OmegaConfBaseException

from meshrun import jobs
from meshrun.compat import names as compat
from meshrun.compat.hydra import run_mode_from_the_command_line, split_sweep
from meshrun.config.parse import known_keys, other_choice_hint, parse_run_config
from meshrun.errors import ConfigError
from meshrun.hydra_sources import CONFIG_MODULE, SCHEMA_GROUP, YAML_SUFFIXES, register_config_sources
from meshrun.placement import devices
from meshrun.placement.identity import job_size
from meshrun.wording import did_you_mean, first_line, one_of, say_error

# The commands that train nothing here (k8s renders its pods' run dir): their jobs get a throw-away
# run dir, and Hydra's settings for `meshrun plan`: no files written, no log files.
SCRATCH_COMMANDS = ("plan", "k8s")
PLAN_HYDRA_OVERRIDES = (
    "hydra.output_subdir=null",
    "hydra/job_logging=none",
    "hydra/hydra_logging=none",
    "hydra.job.name=plan",
)
# Config keys holding free-form mappings: `key={...}` on the command line replaces the mapping.
MAPPING_KEYS = (
    "layout.rules",
    "layout.extra_rules",
    "data.features",
    "data.kwargs",
    "model.kwargs",
    "model.backbone",
)


class RecordSweepDir(Callback):
    """A Hydra callback (configs/meshrun.yaml) that notes a multirun's sweep dir in the launching
    process, where the comparison is made (with Hydra's submitit launcher no job runs there)."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        jobs.current().sweep_dir = config.hydra.sweep.dir


class CheckRunDir(Callback):
    """A Hydra callback (configs/meshrun.yaml) that checks a run's dir, or a multirun's sweep dir,
    for an earlier run before Hydra writes into it (its .hydra/ would replace that run's):
    meshrun.jobs.check_run_dir and check_sweep_dir. Hydra turns an exception raised in a callback
    into a warning, so a refusal leaves as `Refused`."""

    def on_run_start(self, config: DictConfig, **kwargs) -> None:
        HydraConfig.instance().set_config(
            config
        )  # as Hydra's run_job does before it reads the run dir, which it sets
        run_dir = str(config.hydra.run.dir)  # ${now:...} is read once: Hydra's run_job gets the same value
        with read_write(config.hydra.runtime), open_dict(config.hydra.runtime):
            config.hydra.runtime.output_dir = os.path.abspath(run_dir)
        with refused_past_hydra():
            jobs.check_run_dir(jobs.current(), run_dir, lambda: resolved(task_config(config)))

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        with refused_past_hydra():
            jobs.check_sweep_dir(
                jobs.current(),
                str(config.hydra.sweep.dir),
                OmegaConf.select(config, "resume"),
                OmegaConf.select(config, "checkpoint.dir"),
            )


class Refused(BaseException):
    """A ConfigError raised in a Hydra callback, carried past Hydra (which turns an Exception there
    into a warning) to `run`, which says it as the config error it is."""

    def __init__(self, error: ConfigError):
        super().__init__(str(error))
        self.error = error


@contextlib.contextmanager
def refused_past_hydra():
    try:
        yield
    except ConfigError as err:
        raise Refused(err) from None


def task_config(config: DictConfig) -> DictConfig:
    """The job's config without Hydra's node, as Hydra hands it to the job."""
    task = copy.deepcopy(config)
    with read_write(task), open_dict(task):
        del task["hydra"]
    return task


def run(invocation: jobs.Invocation) -> int:
    """Runs the invocation's jobs through Hydra; returns its exit status (2 for a config error)."""
    os.environ["HYDRA_FULL_ERROR"] = "1"  # Hydra's errors reach us whole, to be worded as one line
    register_config_sources()
    with jobs.running(invocation):
        try:
            compat.ensure("hydra")
            _run_hydra(invocation, expand_overrides(invocation))
        except (ConfigError, Refused) as err:
            say_error(str(err))
            return 2
        except Exception as err:  # jobs catch their own errors: what gets here is Hydra's composition
            say_error(hydra_error_line(err, invocation.overrides))
            return 2
        return jobs.finish(invocation)


def expand_overrides(invocation: jobs.Invocation) -> list[str]:
    """The overrides Hydra gets: `meshrun sweep`'s mesh shapes filled in, and the user's rewritten
    where Hydra would read them otherwise (`prepare_overrides`). Decides whether multirun jobs need
    processes of their own. The invocation keeps the overrides as the user meant them."""
    rest = invocation.overrides
    if invocation.command == "sweep":
        rest = ["-m", *sweep_overrides(rest)]
    invocation.overrides = rest
    overrides = prepare_overrides(rest)
    if invocation.command != "plan" and invocation.multirun:
        invocation.isolate = jobs_need_own_processes([o for o in overrides if o != "-m"])
    return overrides


def _run_hydra(invocation: jobs.Invocation, overrides: list[str]) -> None:
    """Runs Hydra's app once over `overrides` (all jobs of a multirun), each job through meshrun.jobs."""

    @hydra.main(version_base="1.3", config_path=f"pkg://{CONFIG_MODULE}", config_name="meshrun")
    def app(cfg: DictConfig) -> None:  # a multirun's sweep dir is noted by RecordSweepDir
        jobs.run_job(invocation, job_of(cfg, HydraConfig.get()))

    scratch = (
        tempfile.mkdtemp(prefix=f"meshrun-{invocation.command}-")
        if invocation.command in SCRATCH_COMMANDS
        else None
    )
    hydra_args = (
        [*PLAN_HYDRA_OVERRIDES, f"hydra.run.dir={scratch}", f"hydra.sweep.dir={scratch}"] if scratch else []
    )
    saved_argv = sys.argv
    sys.argv = [f"meshrun {invocation.command}", *overrides, *hydra_args]
    try:
        with run_mode_from_the_command_line():
            app()
    finally:
        sys.argv = saved_argv
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


def job_of(cfg: DictConfig, hydra_cfg) -> jobs.Job:
    """The job Hydra is running, as meshrun.jobs takes it: its config (resolved when the job asks),
    run dir, name, number in a multirun, group choices (Hydra's own left out) and overrides."""
    # Unresolved: an override string such as train.seed=${x} must not be read as an interpolation.
    all_choices = OmegaConf.to_container(hydra_cfg.runtime.choices, resolve=False)
    choices = {k: v for k, v in all_choices.items() if not k.startswith("hydra")}
    return jobs.Job(
        resolve=lambda: resolved(cfg),
        run_dir=hydra_cfg.runtime.output_dir,
        name=hydra_cfg.job.name,
        number=hydra_cfg.job.num if hydra_cfg.mode == RunMode.MULTIRUN else None,
        choices=choices,
        overrides=OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False),
    )


def resolved(cfg: DictConfig) -> dict:
    """The composed config as plain data, interpolations resolved (a broken one is a ConfigError)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(getattr(err, "full_key", "") or "config", first_line(err)) from None


def prepare_overrides(overrides: list[str]) -> list[str]:
    """Adjusts overrides Hydra would otherwise take differently from what users mean: `mesh=8` (a
    1-D shape: Hydra reads 8 as a number, and group options must be strings), `mesh=[2,4]` (a
    list: Hydra would select several mesh configs at once) and `layout.rules={...}`
    and the other MAPPING_KEYS (Hydra merges a dict into the existing one, and rejects new keys in
    it; users mean replace)."""
    rewritten = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key.lstrip("+~") == "hydra.mode":
            raise ConfigError(
                "hydra.mode",
                f"got {value!r}; meshrun runs a multirun with -m "
                "(meshrun train -m KEY=A,B), one job without it",
            )
        if key == "mesh":
            value = shapes_from_lists(value)
        if key == "mesh" and re.fullmatch(r"[\w,-]+", value):
            quoted = [f"'{v}'" if re.fullmatch(r"-?\d+", v) else v for v in value.split(",")]
            rewritten.append("mesh=" + ",".join(quoted))
        elif key in MAPPING_KEYS:
            rewritten += [f"~{key}", "+" + override]
        else:
            rewritten.append(override)
    return rewritten


SHAPE_LIST = r"\[\s*-?\d+(?:\s*,\s*-?\d+)*\s*\]"


def shapes_from_lists(value: str) -> str:
    """A mesh option written as a list, the way Hydra users write shapes (`mesh=[2,4]`, or a sweep
    `mesh=[2,4],[4,2]`), in meshrun's shape form (`2x4`, `2x4,4x2`); any other value as given."""
    if not re.fullmatch(rf"{SHAPE_LIST}(?:\s*,\s*{SHAPE_LIST})*", value.strip()):
        return value
    return ",".join("x".join(re.findall(r"-?\d+", shape)) for shape in re.findall(SHAPE_LIST, value))


@contextlib.contextmanager
def composer():
    """Yields a function that composes one job's config from its overrides (no sweep values),
    resolved; every call shares one Hydra context."""
    from hydra import compose, initialize_config_module

    with initialize_config_module(config_module=CONFIG_MODULE, version_base="1.3"):
        yield lambda overrides: resolved(compose(config_name="meshrun", overrides=overrides))


def config_groups_text() -> str:
    """The config groups and their options, one line each, as `meshrun COMMAND --help` lists them
    (Hydra's own groups, the schema's defaults, and logging/sinks, which logging/default includes,
    left out; mesh also takes any shape)."""
    from hydra.core.global_hydra import GlobalHydra

    register_config_sources()
    lines = ["\nconfig groups (group=option):"]
    with composer():
        loader = GlobalHydra.instance().config_loader()
        for group in sorted(g for g in loader.list_groups("") if g not in ("hydra", SCHEMA_GROUP)):
            options = sorted(
                o
                for o in loader.get_group_options(group, ObjectType.CONFIG)
                if f"{group}/{o}" != "logging/sinks"
            )
            shapes = ", or any shape: mesh=2x4, mesh=[2,4]" if group == "mesh" else ""
            lines.append(f"  {group}: {', '.join(options)}{shapes}")
    return "\n".join(lines)


def jobs_need_own_processes(overrides: list[str]) -> bool:
    """Whether the jobs of a multirun need different device counts; says so when they do. The
    count of a job is its mesh size, or devices.cpu_devices for a mesh holding -1."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        counts = set()
        with composer() as compose:
            for job in split_sweep(OverridesParser.create().parse_overrides(overrides)):
                config = parse_run_config(compose(job))
                counts.add(devices.cpu_devices_needed(config.mesh, config.devices))
    except Exception:  # a job that does not compose fails in the multirun itself, with its reason
        return False
    if len(counts) < 2:
        return False
    print(
        "meshrun: jobs need different device counts "
        f"({one_of(sorted(counts))}): running each job in its own process"
    )
    return True


def sweep_overrides(overrides: list[str]) -> list[str]:
    """`meshrun sweep`'s overrides: the user's as they are when they give a mesh (one shape or
    several: those are what they want run), else with `mesh=` set to every shape of the available
    devices for the mesh's number of axes (that of `mesh.axis_names` when given, else of the
    config the other overrides compose)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    from meshrun.report.sweep import mesh_shapes
    from meshrun.wording import format_shape

    kept = [o for o in overrides if o != "-m"]
    given = [o.partition("=")[2] for o in kept if o.startswith("mesh=")]
    if given:
        print(
            f"meshrun sweep: mesh={given[-1]} given: running that; "
            "leave mesh out to sweep every shape of the devices"
        )
        return kept
    parser = OverridesParser.create()
    names = [o for o in kept if o.startswith("mesh.axis_names=")]
    fixed = [
        o
        for o in prepare_overrides(kept)
        if o not in names and not parser.parse_override(o).is_sweep_override()
    ]
    with composer() as compose:
        config = parse_run_config(compose(fixed))
    rank = len(parser.parse_override(names[-1]).value()) if names else len(config.mesh.shape)
    count = devices.available_count(config.devices)
    shapes = mesh_shapes(count, rank)
    processes = job_size(config.distributed, os.environ)
    if processes > 1:
        shapes = shapes_within_processes(shapes, config, rank, processes)
    shapes = [format_shape(s) for s in shapes]
    print(f"meshrun sweep: {len(shapes)} mesh shapes of {count} devices: {', '.join(shapes)}")
    return [*kept, "mesh=" + ",".join(shapes)]


def shapes_within_processes(
    shapes: list[tuple[int, ...]], config, rank: int, processes: int
) -> list[tuple[int, ...]]:
    """The shapes of a sweep of `processes`-process jobs that keep every axis but the batch and
    stage axes within a process (mesh.dcn as given, else its default); says which it leaves out."""
    from meshrun.config.layout_schema import DEFAULT_AXIS_NAMES, MeshConfig
    from meshrun.config.slices import across_processes, with_dcn
    from meshrun.wording import format_shape

    names = (
        config.mesh.axis_names
        if len(config.mesh.axis_names) == rank
        else DEFAULT_AXIS_NAMES.get(rank, config.mesh.axis_names)
    )
    batch = config.mesh.batch_axis if config.mesh.batch_axis in names else names[0]
    kept, left = [], []
    for shape in shapes:
        mesh = MeshConfig(shape=shape, axis_names=tuple(names), batch_axis=batch, dcn=config.mesh.dcn)
        try:
            crossing = set(across_processes(with_dcn(mesh, processes, (config.pipeline.axis,)))) - {
                batch,
                config.pipeline.axis,
            }
        except ConfigError:
            crossing = {"(none fits mesh.dcn)"}
        (left if crossing else kept).append(shape)
    if left:
        print(
            f"meshrun sweep: left out {', '.join(format_shape(s) for s in left)}: across {processes} "
            "processes they would split variables over the slow "
            "network (an axis besides the batch axis spanning processes)"
        )
    return kept


def hydra_error_line(err: Exception, overrides: list[str]) -> str:
    """Words a Hydra or OmegaConf error as one line naming the key, the value and what is valid."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options is not None:
        group, _, option = err.missing_cfg_file.rpartition("/")
        path = err.missing_cfg_file.partition("/")[2]
        if path.endswith(YAML_SUFFIXES):
            head = err.missing_cfg_file.partition("/")[0]
            return (
                f"{head}: got {path!r}, which is not a file; give the path of a YAML file (such "
                f"as `meshrun plan --save-layout` writes) or one of {one_of(sorted(err.options))}"
            )
        return (
            f"{group}: unknown option {option!r}; "
            f"{did_you_mean(option, err.options)}available: {one_of(sorted(err.options))}"
        )
    if isinstance(err, OverrideParseException):
        typed = as_typed(err.override, overrides)
        if typed.lstrip("+~").partition("=")[0] in ("layout.rules", "layout.extra_rules"):
            return (
                f"malformed override {typed!r} ({first_line(err)}); in "
                "a rule's pattern on the command line, put a backslash "
                r"before ( ) [ ] { } : = , and spaces, e.g. "
                r"'layout.rules={d\[12\]/kernel:[null,model],block_\(0|1\)/.*:[model]}'"
            )
        return (
            f"malformed override {typed!r} ({first_line(err)}); write overrides as key=value, "
            "e.g. mesh=2x4 train.epochs=5, quoting values with special characters"
        )
    if isinstance(err, ConfigCompositionException) and first_line(err).startswith("Could not override"):
        key = _quoted(first_line(err))
        given = next((o for o in overrides if o.lstrip("+~").split("=", 1)[0] == key), key)
        other = other_choice_hint(key)
        if other:
            chosen = {"model": "model", "data": "data source"}[key.split(".")[0]]
            return f"{key}: not a key of the chosen {chosen} (got override {given!r}); {other}"
        hint = did_you_mean(key, known_keys()).strip() or "run `meshrun train --cfg job` to see every key"
        return f"{key}: no such key (got override {given!r}); {hint}"
    return textwrap.shorten(
        " ".join(first_line(e) for e in _chain(err) if first_line(e)), 500, placeholder=" ..."
    )


def as_typed(override: str, typed: list[str]) -> str:
    """The override as the user typed it, for one prepare_overrides rewrote (`+layout.rules=...`
    for `layout.rules=...`)."""
    key, _, value = override.lstrip("+").partition("=")
    if key in MAPPING_KEYS and override.startswith("+"):
        return next((t for t in typed if t.lstrip("+").partition("=")[::2] == (key, value)), override)
    return override


def _chain(err: BaseException):
    while err is not None:
        yield err
        err = err.__cause__


def _quoted(text: str) -> str:
    found = re.search(r"'([^']+)'", text)
    return found.group(1) if found else text
