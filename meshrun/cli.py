"""The `meshrun` command: the only module that knows about Hydra.

It composes the config with Hydra (overrides, -m multiruns, run dirs), hands a validated RunConfig
to the library, and turns every config problem, ours or Hydra's, into one line on stderr
(`meshrun: error: ...`) with exit status 2. It imports neither jax nor keras at import time.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import traceback
from pathlib import Path
from typing import List, Optional

import hydra
from hydra.core.hydra_config import HydraConfig
from hydra.core.object_type import ObjectType
from hydra.core.plugins import Plugins
from hydra.errors import (
    ConfigCompositionException,
    MissingConfigException,
    OverrideParseException,
)
from hydra.experimental.callback import Callback
from hydra.plugins.config_source import ConfigResult, ConfigSource
from hydra.types import RunMode
from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from meshrun import devices, processes, schema
from meshrun.errors import ConfigError, RunFailed, closest, first_line, one_of

COMMANDS = ("train", "plan", "sweep", "report")
USAGE = """\
usage: meshrun train  [OVERRIDE ...] [-m] [--cfg job] [--help]
       meshrun plan   [OVERRIDE ...] [-m] [--json] [--full]
       meshrun sweep  [OVERRIDE ...]
       meshrun report DIR [DIR ...] [--out DIR]

train: trains a Keras model on a device mesh described by Hydra config, then prints and writes a
report (metrics.json and plan.json in the run dir).
plan: trains nothing and allocates no model memory; shows where every variable lives and how many
bytes land on each device, and lints the layout (exit 2 on errors). Repeated blocks share a row
(block_{0..31}/...) unless --full; --json prints it all as JSON.
sweep: trains on every mesh shape of the available devices (a multirun) and compares the jobs.
report: the comparison table and summary files of an existing sweep dir, or of any run dirs.

  meshrun train mesh=2x4 layout=dense_model        # a 2x4 (data, model) mesh, the seeds' rules
  meshrun train -m mesh=8x1,4x2,2x4,1x8 layout=dense_model
  meshrun sweep layout=dense_model                 # the same four shapes, found for you
  meshrun report multirun/2026-11-21/10-00-00      # re-render a sweep's table and files
  meshrun train model=transformer mesh=2x4         # models: dense_model, cnn, transformer, two_tower
  meshrun train model=python model.factory=mymodels:build train.loss=mse         # your own Keras model
  meshrun train model=keras_hub model.task=LlamaCausalLM 'model.backbone={...}' layout=from_model
  meshrun train recipe=transformer_2d              # a complete experiment from recipes/
  meshrun plan model=transformer model.preset=7b mesh=1x8 layout=transformer_tp
  meshrun train --cfg job                         # print the composed config
  meshrun train --help                            # config groups and their options
"""
# Hydra settings for `meshrun plan`: it writes nothing, so its jobs get a throw-away run dir
# and no log files.
PLAN_HYDRA_OVERRIDES = ("hydra.output_subdir=null", "hydra/job_logging=none", "hydra/hydra_logging=none", "hydra.job.name=plan")


class MeshShapeSource(ConfigSource):
    """Serves `mesh=AxB[xC]` for any shape: Hydra asks it for `mesh/<name>` configs whose name
    starts with a digit (or -digit) and gets `shape: <name>`; meshrun.schema parses and checks it."""

    def __init__(self, provider: str, path: str) -> None:
        super().__init__(provider=provider, path=path)

    @staticmethod
    def scheme() -> str:
        return "meshrun-shapes"

    def load_config(self, config_path: str) -> ConfigResult:
        name = config_path.rsplit("/", 1)[-1].removesuffix(".yaml")
        return ConfigResult(
            config=OmegaConf.create({"shape": name, "axis_names": None, "batch_axis": None}),
            path=f"{self.scheme()}://{self.path}",
            provider=self.provider,
            header={"package": None},
        )

    def available(self) -> bool:
        return True

    def is_group(self, config_path: str) -> bool:
        return config_path.strip("/") in ("", "mesh")

    def is_config(self, config_path: str) -> bool:
        group, _, name = config_path.strip("/").rpartition("/")
        return group == "mesh" and re.match(r"^-?\d", name.removesuffix(".yaml")) is not None

    def list(self, config_path: str, results_filter: Optional[ObjectType]) -> List[str]:
        return []


def main(argv: Optional[list[str]] = None) -> None:
    """Entry point of the `meshrun` console script and of `python -m meshrun` (argv None), and of
    in-process callers (tests) with their own argv. Run as a program, the process ends as soon as
    its output is written (processes.exit_now), except in a multi-process job, whose processes
    leave through jax's shutdown barrier together."""
    _JOB["as_program"] = argv is None
    if argv is not None:
        _main(list(argv))
        return
    try:
        _main(sys.argv[1:])
        status = 0
    except SystemExit as ended:
        if ended.code is not None and not isinstance(ended.code, int):
            raise
        status = ended.code or 0
    if processes.joined():
        sys.exit(status)
    processes.exit_now(status)


def _main(argv: list[str]) -> None:
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(USAGE, end="")
        return
    command, rest = argv[0], argv[1:]
    if command not in COMMANDS:
        _fail(f"unknown command {command!r}; valid: {one_of(COMMANDS)} (see meshrun --help)", status=2)
    if command == "report":
        report_command(rest)
        return
    _JOB.update(command=command, json="--json" in rest, full="--full" in rest, isolate=False, sweep_dir=None, runs=[])
    rest = [arg for arg in rest if arg not in ("--json", "--full")]
    # Hydra's argument parser takes -m only before the overrides; users put it anywhere.
    multirun = [arg for arg in rest if arg in ("-m", "--multirun")]
    rest = multirun[:1] + [arg for arg in rest if arg not in ("-m", "--multirun")]
    if _JOB["json"] and command != "plan":
        _fail("--json: only `meshrun plan` prints JSON; `meshrun train` writes metrics.json into its run dir", status=2)
    if _JOB["full"] and command != "plan":
        _fail("--full: only `meshrun plan` takes it (a row per variable instead of one per repeated block)", status=2)
    # Let Hydra's errors reach us whole, so they can be worded as one line below.
    os.environ["HYDRA_FULL_ERROR"] = "1"
    Plugins.instance().register(MeshShapeSource)
    _FAILED_JOBS.clear()
    try:
        if command == "sweep":
            rest = ["-m", *sweep_overrides(rest)]
        overrides = prepare_overrides(rest)
        if command != "plan" and "-m" in overrides:
            _JOB["isolate"] = jobs_need_own_processes([o for o in overrides if o != "-m"])
    except ConfigError as err:
        _fail(str(err), status=2)
    saved_argv = sys.argv
    scratch = tempfile.mkdtemp(prefix="meshrun-plan-") if command == "plan" else None
    hydra_args = [*PLAN_HYDRA_OVERRIDES, f"hydra.run.dir={scratch}", f"hydra.sweep.dir={scratch}"] if scratch else []
    sys.argv = [f"meshrun {command}", *overrides, *hydra_args]
    try:
        _hydra_main()
    except Exception as err:  # jobs catch their own errors: what gets here is Hydra's composition
        _fail(hydra_error_line(err, rest), status=2)
    finally:
        sys.argv = saved_argv
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
    status = max(_FAILED_JOBS, default=0)
    if "-m" in overrides and command != "plan" and not processes.follows():
        status = finish_sweep(_JOB["sweep_dir"], _JOB["runs"], _FAILED_JOBS)
    if status and processes.joined():
        processes.exit_now(status)
    if status:
        sys.exit(status)


# Exit statuses of the jobs of this invocation that failed (a multirun has several jobs).
_FAILED_JOBS: list[int] = []
# This invocation: its command, whether `plan` prints JSON and every variable (--full), whether
# multirun jobs each run in a process of their own, whether it runs as the meshrun program (its
# process ends when it is done), and (filled in by the jobs) the sweep dir and its jobs' run dirs.
_JOB: dict = {"command": "train", "json": False, "full": False, "isolate": False, "sweep_dir": None, "runs": [],
              "as_program": False}


class RecordSweepDir(Callback):
    """A Hydra callback (configs/meshrun.yaml) that notes a multirun's sweep dir in the launching
    process: with Hydra's submitit launcher no job runs there, but the comparison is made there."""

    def on_multirun_start(self, config: DictConfig, **kwargs) -> None:
        _JOB["sweep_dir"] = config.hydra.sweep.dir


# Config keys holding free-form mappings: `key={...}` on the command line replaces the mapping.
MAPPING_KEYS = ("layout.rules", "layout.extra_rules", "data.features", "data.kwargs", "model.kwargs", "model.backbone")


def prepare_overrides(overrides: list[str]) -> list[str]:
    """Adjusts overrides Hydra would otherwise take differently from what users mean: `mesh=8` (a
    1-D shape: Hydra reads 8 as a number, and group options must be strings) and `layout.rules={...}`
    and the other MAPPING_KEYS (Hydra merges a dict into the existing one, and rejects new keys in
    it; users mean replace)."""
    rewritten = []
    for override in overrides:
        key, _, value = override.partition("=")
        if key == "mesh" and re.fullmatch(r"[\w,-]+", value):
            quoted = [f"'{v}'" if re.fullmatch(r"-?\d+", v) else v for v in value.split(",")]
            rewritten.append("mesh=" + ",".join(quoted))
        elif key in MAPPING_KEYS:
            rewritten += [f"~{key}", "+" + override]
        else:
            rewritten.append(override)
    return rewritten


@hydra.main(version_base="1.3", config_path="pkg://meshrun.configs", config_name="meshrun")
def _hydra_main(cfg: DictConfig) -> None:
    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        _JOB.update(sweep_dir=hydra_cfg.sweep.dir)
    try:
        if _JOB["command"] == "plan":
            plan_job(cfg, hydra_cfg, as_json=_JOB["json"], full=_JOB["full"])
        elif _JOB["isolate"]:
            _JOB["runs"].append(hydra_cfg.runtime.output_dir)
            isolated_job(hydra_cfg)
        else:
            _JOB["runs"].append(hydra_cfg.runtime.output_dir)
            train_job(cfg, hydra_cfg)
    except ConfigError as err:
        _report_job_failure(str(err), status=2, hydra_cfg=hydra_cfg)
    except RunFailed as err:
        _report_job_failure(str(err), status=1, hydra_cfg=hydra_cfg)


def job_choices(hydra_cfg) -> tuple[dict, list]:
    """The job's config group choices (model, layout, mesh, ...; Hydra's own left out) and its
    command-line overrides."""
    # Unresolved: an override string such as train.seed=${x} must not be read as an interpolation.
    all_choices = OmegaConf.to_container(hydra_cfg.runtime.choices, resolve=False)
    choices = {k: v for k, v in all_choices.items() if not k.startswith("hydra")}
    return choices, OmegaConf.to_container(hydra_cfg.overrides.task, resolve=False)


def _report_job_failure(message: str, status: int, hydra_cfg) -> None:
    # In a multirun the other jobs go on; meshrun exits non-zero at the end.
    prefix = f"job {hydra_cfg.job.num}: " if hydra_cfg.mode == RunMode.MULTIRUN else ""
    _say_error(prefix + message)
    _FAILED_JOBS.append(status)


def _say_error(message: str) -> None:
    print(f"meshrun: error: {message}", file=sys.stderr)


def train_job(cfg: DictConfig, hydra_cfg) -> None:
    """One Hydra job: validate, set up devices (joining a multi-process job), train, report.
    Config errors leave no run dir. With distributed.local_processes the job's processes are
    started here instead; in a multi-process job only process 0 reports and writes files."""
    run_dir = hydra_cfg.runtime.output_dir
    choices, overrides = job_choices(hydra_cfg)
    keep_job = hydra_cfg.mode == RunMode.MULTIRUN or bool(os.environ.get(SWEEP_JOB_ENV))
    # A process started by meshrun's local launcher leaves the job's verdict and files to it.
    owns_run_dir = not os.environ.get(processes.LAUNCHED_ENV)
    identity = processes.ONE_PROCESS

    def reject(message: str) -> None:
        """A config error: a sweep keeps the job with its reason, a single run leaves nothing.
        Once a job has formed, its run dir is process 0's to clean."""
        if not owns_run_dir or not (identity.is_first or not processes.joined()):
            return
        if keep_job:
            _write_error_metrics(message, 2, run_dir, choices, overrides)
        else:
            discard_run_dir(run_dir, hydra_cfg.job.name)

    try:
        config = schema.parse_run_config(resolved(cfg))
        if config.distributed.launches_locally:
            from meshrun import launch

            launch.run_local(config.distributed, run_dir, overrides)
            return  # process 0 has printed the report and written the run's files
        identity = processes.identify(config.distributed, os.environ)
        processes.say_if_alone(config.distributed, identity)
        devices.prepare(config.devices, config.mesh, identity.num_processes)
        if identity.several:
            processes.join(identity, config.distributed.timeout_s, on_timeout=lambda m: (_say_error(m), reject(m)))
            if not identity.is_first:
                processes.route_output(run_dir, identity.process_id)
        from meshrun import train  # imports jax and keras: only after devices.prepare

        process_ends_after = _JOB["as_program"] and hydra_cfg.mode != RunMode.MULTIRUN
        context = train.RunContext(run_dir=run_dir, choices=choices, overrides=overrides, identity=identity,
                                   process_ends_after=process_ends_after)
        result = train.run(config, context)
    except ConfigError as err:
        reject(str(err))
        raise
    except RunFailed as err:  # from the local launcher: the job's verdict replaces process 0's
        _write_error_metrics(str(err), 1, run_dir, choices, overrides)
        raise
    except Exception as err:
        if not identity.is_first:  # its log is its stderr; process 0 writes the run's files
            traceback.print_exception(err)
            raise RunFailed(f"training failed: {_error_text(err)}") from err
        raise _record_failure(err, run_dir, choices, overrides) from err
    if not identity.is_first:
        return
    from meshrun import report

    report.write_json(result.plan.to_dict(), run_dir, report.PLAN_FILE)
    report.write_json(result.metrics, run_dir, report.METRICS_FILE)
    report.render(result.metrics)


def plan_job(cfg: DictConfig, hydra_cfg, as_json: bool, full: bool = False) -> None:
    """One `meshrun plan` job: validate, plan from shapes alone, print (JSON with the job's config
    choices and overrides, so the lines of `plan -m` can be told apart); lint errors exit 2."""
    config = schema.parse_run_config(resolved(cfg))
    devices.prepare_for_plan(config.devices, config.mesh)
    from meshrun import (  # imports jax and keras: only after the devices are set
        report,
        train,
    )

    plan = train.plan(config, processes.job_size(config.distributed, os.environ))
    choices, overrides = job_choices(hydra_cfg)
    data = {**plan.to_dict(), "layout": choices.get("layout"), "choices": choices, "overrides": overrides}
    if as_json:
        multirun = hydra_cfg.mode == RunMode.MULTIRUN
        print(json.dumps(data) if multirun else json.dumps(data, indent=2))
    else:
        report.render_plan(data, full=full)
    if plan.errors:
        for error in plan.errors[:-1]:
            print(f"meshrun: error: {error}", file=sys.stderr)
        raise plan.errors[-1]


# Set for a sweep job that runs in a process of its own: it records a config error like a job of
# an in-process multirun (metrics.json with status error) instead of discarding its run dir.
SWEEP_JOB_ENV = "MESHRUN_SWEEP_JOB"


def isolated_job(hydra_cfg) -> None:
    """Runs one multirun job as `meshrun train` in a fresh process (jobs needing different device
    counts cannot share one: jax fixes the count when it starts), into the job's own run dir."""
    run_dir = hydra_cfg.runtime.output_dir
    overrides = list(hydra_cfg.overrides.task)
    command = [sys.executable, "-m", "meshrun", "train", *overrides, f"hydra.run.dir={run_dir}"]
    done = subprocess.run(command, env={**os.environ, SWEEP_JOB_ENV: "1"}, check=False)
    if done.returncode == 0:
        return
    metrics_file = Path(run_dir) / "metrics.json"
    if not metrics_file.exists():  # the process died before it could say why
        choices = OmegaConf.to_container(hydra_cfg.runtime.choices, resolve=False)
        _write_error_metrics(f"the job's process exited with status {done.returncode}", 1, run_dir, choices, overrides)
    _FAILED_JOBS.append(2 if done.returncode == 2 else 1)


def jobs_need_own_processes(overrides: list[str]) -> bool:
    """Whether the jobs of a multirun need different device counts; says so when they do. The
    count of a job is its mesh size, or devices.cpu_devices for a mesh holding -1."""
    from hydra import compose, initialize_config_module
    from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
    from hydra.core.override_parser.overrides_parser import OverridesParser

    try:
        parsed = OverridesParser.create().parse_overrides(overrides)
        (jobs,) = BasicSweeper.split_arguments(parsed, max_batch_size=None)
        counts = set()
        with initialize_config_module(config_module="meshrun.configs", version_base="1.3"):
            for job in jobs:
                config = schema.parse_run_config(resolved(compose(config_name="meshrun", overrides=job)))
                counts.add(devices.cpu_devices_needed(config.mesh, config.devices))
    except Exception:  # a job that does not compose fails in the multirun itself, with its reason
        return False
    if len(counts) < 2:
        return False
    print(f"meshrun: jobs need different device counts ({one_of(sorted(counts))}): running each job in its own process")
    return True


def sweep_overrides(overrides: list[str]) -> list[str]:
    """`meshrun sweep`'s overrides: the user's, with `mesh=` set to every shape of the available
    devices for the mesh's number of axes (from the config the other overrides compose)."""
    from hydra import compose, initialize_config_module
    from hydra.core.override_parser.overrides_parser import OverridesParser

    kept = [o for o in overrides if o != "-m" and not o.startswith("mesh=")]
    chosen = [o for o in overrides if o.startswith("mesh=")][-1:]
    parser = OverridesParser.create()
    fixed = [o for o in prepare_overrides(kept + chosen) if not parser.parse_override(o).is_sweep_override()]
    with initialize_config_module(config_module="meshrun.configs", version_base="1.3"):
        config = schema.parse_run_config(resolved(compose(config_name="meshrun", overrides=fixed)))
    count = devices.available_count(config.devices)
    from meshrun.sweep import mesh_shapes

    shapes = [schema.format_shape(s) for s in mesh_shapes(count, len(config.mesh.shape))]
    print(f"meshrun sweep: {len(shapes)} mesh shapes of {count} devices: {', '.join(shapes)}")
    return [*kept, "mesh=" + ",".join(shapes)]


def finish_sweep(sweep_dir: str, runs: list[str], failed: list[int]) -> int:
    """Compares a multirun's jobs (table and summary files in its sweep dir); returns the exit
    status: 0 if any job succeeded, else the worst job's. Jobs that ran elsewhere (Hydra's
    submitit launcher runs them on SLURM nodes) are known by the metrics.json in the sweep dir."""
    from meshrun import sweep

    if runs:
        sweep.compare(sweep.find_runs(runs), sweep_dir)
        return 0 if len(runs) > len(failed) else max(failed, default=1)
    rows = sweep.compare(sweep.find_runs([sweep_dir]), sweep_dir) if Path(sweep_dir).is_dir() else []
    if any(row["status"] == "ok" for row in rows):
        return 0
    print(f"meshrun: error: no job of the multirun succeeded (their files: {sweep_dir})", file=sys.stderr)
    return 1


def report_command(args: list[str]) -> None:
    """`meshrun report DIR [DIR ...] [--out DIR]`."""
    from meshrun import sweep

    try:
        sweep.report(args)
    except ConfigError as err:
        _fail(str(err), status=2)


def _write_error_metrics(message: str, status: int, run_dir: str, choices: dict, overrides: list) -> None:
    from meshrun import report

    metrics = {**report.error_metrics(message, run_dir, choices, overrides), "exit_status": status}
    report.write_json(metrics, run_dir, report.METRICS_FILE)


def resolved(cfg: DictConfig) -> dict:
    """The composed config as plain data, interpolations resolved (a broken one is a ConfigError)."""
    try:
        return OmegaConf.to_container(cfg, resolve=True)
    except OmegaConfBaseException as err:
        raise ConfigError(getattr(err, "full_key", "") or "config", first_line(err)) from None


def _record_failure(err: Exception, run_dir: str, choices: dict, overrides: list) -> RunFailed:
    """Writes metrics.json (status: error) and the traceback into the run dir."""
    from meshrun import report

    message = _error_text(err)
    trace = Path(run_dir) / "error.log"
    trace.write_text("".join(traceback.format_exception(err)))
    report.write_json(report.error_metrics(message, run_dir, choices, overrides), run_dir, report.METRICS_FILE)
    return RunFailed(f"training failed: {message} (traceback in {trace})")


def _error_text(err: Exception) -> str:
    return f"{type(err).__name__}: {first_line(err)}"


def discard_run_dir(run_dir: str, job_name: str) -> None:
    """Removes what Hydra wrote into a rejected job's run dir (`.hydra/` and `<job>.log`), then
    the dir if that left it empty, and empty parents below the working dir. Nothing else goes."""
    path = Path(run_dir).resolve()
    shutil.rmtree(path / ".hydra", ignore_errors=True)
    (path / f"{job_name}.log").unlink(missing_ok=True)
    cwd = Path.cwd().resolve()
    for folder in (path, *path.parents):
        if folder != path and (folder == cwd or cwd not in folder.parents):
            break
        try:
            folder.rmdir()
        except OSError:  # not empty: it holds something that is not ours
            break


def hydra_error_line(err: Exception, overrides: list[str]) -> str:
    """Words a Hydra or OmegaConf error as one line naming the key, the value and what is valid."""
    if isinstance(err, MissingConfigException) and err.missing_cfg_file and err.options is not None:
        group, _, option = err.missing_cfg_file.rpartition("/")
        hint = closest(option, err.options, n=1)
        return (
            f"{group}: unknown option {option!r}; "
            f"{'did you mean ' + hint[0] + '? ' if hint else ''}available: {one_of(sorted(err.options))}"
        )
    if isinstance(err, OverrideParseException):
        return (
            f"malformed override {err.override!r} ({first_line(err)}); write overrides as key=value, "
            "e.g. mesh=2x4 train.epochs=5, quoting values with special characters"
        )
    if isinstance(err, ConfigCompositionException) and first_line(err).startswith("Could not override"):
        key = _quoted(first_line(err))
        given = next((o for o in overrides if o.lstrip("+~").split("=", 1)[0] == key), key)
        other = schema.other_choice_hint(key)
        if other:
            chosen = {"model": "model", "data": "data source"}[key.split(".")[0]]
            return f"{key}: not a key of the chosen {chosen} (got override {given!r}); {other}"
        hint = closest(key, schema.known_keys(), n=1)
        return (
            f"{key}: no such key (got override {given!r}); "
            + (f"did you mean {hint[0]}?" if hint else "run `meshrun train --cfg job` to see every key")
        )
    return " ".join(first_line(e) for e in _chain(err) if first_line(e))[:500]


def _chain(err: BaseException):
    while err is not None:
        yield err
        err = err.__cause__


def _quoted(text: str) -> str:
    found = re.search(r"'([^']+)'", text)
    return found.group(1) if found else text


def _fail(message: str, status: int) -> None:
    print(f"meshrun: error: {message}", file=sys.stderr)
    sys.exit(status)
