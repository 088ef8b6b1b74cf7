"""One `meshrun` invocation and the jobs it runs: the state of the invocation (one object,
`Invocation`), what each kind of job does (`train_job`, `plan_job`, `isolated_job`), and who answers
for a job's run dir (`RunDir`). The Hydra app (meshrun.app) hands every job here as a plain `Job`;
nothing here knows Hydra, and nothing imports jax before the job's devices are set.
"""

from __future__ import annotations

import contextlib
import contextvars
import json
import os
import shutil
import sys
import time
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from meshrun import compat
from meshrun.config.parse import parse_run_config
from meshrun.config.schema import RunConfig
from meshrun.data import notes as data_notes
from meshrun.errors import ConfigError, DoesNotFit, Preempted, RunFailed
from meshrun.files import write_json
from meshrun.launch import join as join_lib
from meshrun.launch.spawn import ForwardedStop, Role, spawn
from meshrun.logs.timing import process_start_time
from meshrun.placement import devices
from meshrun.placement.identity import ONE_PROCESS, Identity, identify, job_size, say_if_alone
from meshrun.specs.metrics import PREEMPTED, RunMetrics
from meshrun.specs.rundir import ERROR_LOG, HYDRA_DIR, METRICS_FILE, PLAN_FILE, job_log
from meshrun.system import signals
from meshrun.wording import error_text, say_error


@dataclass
class Invocation:
    """One `meshrun` command and what its jobs did: the command, its flags and Hydra overrides, the
    role this process was started in, whether it runs as the meshrun program (the process ends when
    the command is done) and whether multirun jobs each run in a process of their own; then, as the
    jobs run, the sweep dir, each train job's run dir and the exit statuses of the jobs that failed."""

    command: str
    overrides: list[str]
    role: Role = Role.USER
    as_json: bool = False
    full: bool = False
    save_layout: str | None = None
    as_program: bool = False
    isolate: bool = False
    sweep_dir: str | None = None
    runs: list[str] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    preempted: bool = False

    @property
    def multirun(self) -> bool:
        return "-m" in self.overrides

    def start_job(self, run_dir: str) -> float:
        """Notes a train job's start; returns the time its start-up, wall time and train.max_time
        count from: process start for the first job of the process (imports and device set-up
        count), the job's own start for a later one, which shares the process."""
        self.runs.append(run_dir)
        return process_start_time() if len(self.runs) == 1 else time.time()

    def exit_status(self) -> int:
        """The invocation's exit status: the worst failed job's; for a multirun, 0 if any job
        succeeded (its comparison says which failed); a stop signal's (128 + its number) once one
        stopped a job."""
        if self.preempted:
            return self.failures[-1]
        if self.multirun and self.runs:
            return 0 if len(self.runs) > len(self.failures) else max(self.failures, default=1)
        return max(self.failures, default=0)


_CURRENT: contextvars.ContextVar[Invocation] = contextvars.ContextVar("meshrun_invocation")


@contextlib.contextmanager
def running(invocation: Invocation):
    """Makes `invocation` the current one while its jobs run (Hydra's callbacks find it there)."""
    token = _CURRENT.set(invocation)
    try:
        yield invocation
    finally:
        _CURRENT.reset(token)


def current() -> Invocation:
    """The invocation whose jobs are running."""
    return _CURRENT.get()


@dataclass(frozen=True)
class Job:
    """One job of an invocation, as Hydra composed it: its config (resolved on demand: a broken
    interpolation is the job's config error), its run dir and name, its number in a multirun (None:
    a single run), and its config group choices and command-line overrides."""

    resolve: Callable[[], dict]
    run_dir: str
    name: str
    number: int | None
    choices: dict
    overrides: list


def run_job(invocation: Invocation, job: Job) -> None:
    """Runs one job; a job that fails says why in one line and is counted, the others go on. Once
    a stop signal has stopped a job, the multirun's later jobs are not run."""
    if invocation.preempted:
        _remove_hydra_leftovers(job)
        return
    try:
        if invocation.command == "plan":
            plan_job(invocation, job)
        elif invocation.isolate:
            isolated_job(invocation, job)
        else:
            train_job(invocation, job)
    except ConfigError as err:
        _job_failed(invocation, job, str(err), status=2)
    except RunFailed as err:
        _job_failed(invocation, job, str(err), status=1)
    except Preempted as stop:
        print(f"meshrun: {(f'job {job.number}: ' if job.number is not None else '')}{stop}", file=sys.stderr)
        if stop.signum == signals.scheduler_signal():
            # submitit requeues the job with this invocation as it is now: as it was when it began
            invocation.runs.remove(job.run_dir)
            signals.hand_on(stop.signum)  # on the first task, requeues and ends the process
        invocation.failures.append(stop.exit_status)
        invocation.preempted = True


def _remove_hydra_leftovers(job: Job) -> None:
    """Removes what Hydra made in the run dir of a job that is not run (its config under .hydra,
    its empty log), and the dir if nothing else is in it."""
    run_dir = Path(job.run_dir)
    shutil.rmtree(run_dir / HYDRA_DIR, ignore_errors=True)
    log_file = job_log(run_dir, job.name)
    if log_file.is_file() and log_file.stat().st_size == 0:
        log_file.unlink()
    with contextlib.suppress(OSError):
        run_dir.rmdir()


def _job_failed(invocation: Invocation, job: Job, message: str, status: int) -> None:
    say_error((f"job {job.number}: " if job.number is not None else "") + message)
    invocation.failures.append(status)


@dataclass
class RunDir:
    """A job's run dir and who answers for it. The process that owns it writes the job's verdict
    there and cleans up after a rejected config: a multirun (or a sweep job in a process of its own)
    keeps the job with its reason (metrics.json, status error), a single run leaves nothing behind.
    A process started by the local launcher owns nothing (the launcher does), and once a
    multi-process job has formed only process 0 owns it."""

    job: Job
    keeps_rejected: bool
    launched: bool

    @property
    def path(self) -> str:
        return self.job.run_dir

    def owned(self, identity: Identity) -> bool:
        return not self.launched and (identity.is_first or not join_lib.joined())

    def reject(self, err: ConfigError | str, identity: Identity) -> None:
        """A config error of the job: recorded or cleaned up, as the owner decides (a job that
        does not fit a device's memory is recorded as such, with its figures)."""
        if not self.owned(identity):
            return
        if not self.keeps_rejected:
            self.discard()
        elif isinstance(err, DoesNotFit):
            metrics = RunMetrics.not_fitting(str(err), self.path, self.job.choices, self.job.overrides, err.needed, err.available)
            write_json(metrics.to_json(), self.path, METRICS_FILE)
        else:
            self.record(str(err), exit_status=2)

    def record(self, message: str, exit_status: int | None = None) -> None:
        """Writes metrics.json with status error and `message`."""
        metrics = RunMetrics.failed(message, self.path, self.job.choices, self.job.overrides, exit_status)
        write_json(metrics.to_json(), self.path, METRICS_FILE)

    def record_failure(self, err: Exception) -> RunFailed:
        """A failure during training: metrics.json (status error) and the traceback in error.log."""
        trace = Path(self.path) / ERROR_LOG
        trace.write_text("".join(traceback.format_exception(err)))
        self.record(error_text(err))
        return RunFailed(f"training failed: {error_text(err)} (traceback in {trace})")

    def discard(self) -> None:
        """Removes what Hydra wrote into a rejected job's run dir (`.hydra/` and `<job>.log`), then
        the dir if that left it empty, and empty parents below the working dir. Nothing else goes."""
        path = Path(self.path).resolve()
        shutil.rmtree(path / HYDRA_DIR, ignore_errors=True)
        job_log(path, self.job.name).unlink(missing_ok=True)
        cwd = Path.cwd().resolve()
        for folder in (path, *path.parents):
            if folder != path and (folder == cwd or cwd not in folder.parents):
                break
            try:
                folder.rmdir()
            except OSError:  # not empty: it holds something that is not ours
                break


def train_job(invocation: Invocation, job: Job) -> None:
    """One job of `meshrun train`: check the config, join the job's processes, train, report. With
    distributed.local_processes the job's processes are started here instead; in a multi-process
    job only process 0 reports and writes files."""
    started_at = invocation.start_job(job.run_dir)
    run_dir = RunDir(job, keeps_rejected=job.number is not None or invocation.role is Role.SWEEP_JOB,
                     launched=invocation.role is Role.LOCAL_PROCESS)
    identity = ONE_PROCESS
    try:
        config = parse_run_config(job.resolve())
        if config.distributed.launches_locally:
            from meshrun.launch.local import run_local

            run_local(config.distributed, job.run_dir, job.overrides)
            return  # process 0 has printed the report and written the run's files
        with signals.StopSignals() as stop_signals:  # from here on, a stop signal stops training at its first step
            identity = enter(config, invocation, run_dir)
            stop_signals.catch()  # from jax, which set its own SIGTERM handler when the process joined the job
            trained = _train(config, invocation, job, identity, started_at)
    except ConfigError as err:
        run_dir.reject(err, identity)
        raise
    except RunFailed as err:  # from the local launcher: the job's verdict replaces process 0's
        run_dir.record(str(err), exit_status=1)
        raise
    except Preempted:  # from the local launcher: process 0's metrics.json says where the job stopped
        raise
    except Exception as err:
        if not identity.is_first:  # its log is its stderr; process 0 writes the run's files
            traceback.print_exception(err)
            raise RunFailed(f"training failed: {error_text(err)}") from err
        raise run_dir.record_failure(err) from err
    if identity.is_first:
        publish(trained, job.run_dir)
    if trained.metrics.status == PREEMPTED:
        raise Preempted(signals.stopped_line(trained.metrics.train.stopped), trained.metrics.exit_status)


def enter(config: RunConfig, invocation: Invocation, run_dir: RunDir) -> Identity:
    """Takes this process's place: its identity in the job, its devices (before jax starts) and,
    in a multi-process job, joining the others; a process other than the first logs into its own
    file in the run dir."""
    identity = identify(config.distributed, os.environ, launched_locally=invocation.role is Role.LOCAL_PROCESS)
    say_if_alone(config.distributed, identity)
    devices.prepare(config.devices, config.mesh, identity.num_processes)
    if identity.several:
        join_lib.join(identity, config.distributed.timeout_s, on_timeout=lambda m: (say_error(m), run_dir.reject(m, identity)))
        if not identity.is_first:
            join_lib.route_output(run_dir.path, identity.process_id)
    return identity


def _train(config: RunConfig, invocation: Invocation, job: Job, identity: Identity, started_at: float):
    from meshrun.train import RunContext, train  # imports jax and keras: only after devices.prepare

    context = RunContext(run_dir=job.run_dir, choices=job.choices, overrides=job.overrides, started_at=started_at,
                         identity=identity, process_ends_after=invocation.as_program and job.number is None,
                         requeued=int(os.environ.get("SLURM_RESTART_COUNT") or 0) > 0)
    return train(config, context)


def publish(trained, run_dir: str) -> None:
    """Writes the run's plan.json and metrics.json and prints its report."""
    from meshrun.report.render import render

    write_json(trained.plan.to_dict(), run_dir, PLAN_FILE)
    write_json(trained.metrics.to_json(), run_dir, METRICS_FILE)
    render(trained.metrics)


def plan_job(invocation: Invocation, job: Job) -> None:
    """One `meshrun plan` job: check the config, plan from shapes alone, print (JSON with the job's
    config choices and overrides, so the lines of `plan -m` can be told apart); lint errors exit 2."""
    config = parse_run_config(job.resolve())
    devices.prepare_for_plan(config.devices, config.mesh)
    from meshrun.report.render import render_plan  # imports rich only; the plan imports jax and keras
    compat.import_keras()
    from meshrun.run.prepare import place_for_plan

    planned = place_for_plan(config, job_size(config.distributed, os.environ))
    plan = planned.plan
    data = {**plan.to_dict(), "layout": job.choices.get("layout"), "choices": job.choices, "overrides": job.overrides,
            "data": {"source": config.data.name, "notes": data_notes(config.data)}}
    if invocation.as_json:
        print(json.dumps(data) if job.number is not None else json.dumps(data, indent=2))
    else:
        render_plan(data, full=invocation.full)
    if plan.errors:
        for error in plan.errors[:-1]:
            say_error(str(error))
        raise plan.errors[-1]
    if invocation.save_layout:
        from meshrun.placement.layout_file import save_layout

        save_layout(invocation.save_layout, planned.rules, plan, job.overrides)
        print(f"wrote {invocation.save_layout} ({len(planned.rules)} rules); load it with layout={invocation.save_layout}",
              file=sys.stderr if invocation.as_json else sys.stdout)


def isolated_job(invocation: Invocation, job: Job) -> None:
    """Runs one multirun job as `meshrun train` in a process of its own (jobs needing different
    device counts cannot share one: jax fixes the count when it starts), into the job's own run dir.
    A stop signal to this process is passed on to the job, which stops with a checkpoint."""
    invocation.runs.append(job.run_dir)
    process = spawn(["train", *job.overrides, f"hydra.run.dir={job.run_dir}"], Role.SWEEP_JOB, own_group=True)
    with ForwardedStop([process]) as forwarded:
        try:
            status = process.wait()
        except KeyboardInterrupt:  # a second Ctrl-C
            process.kill()
            raise
    if status == 0:
        return
    if forwarded.stopped(status):
        raise Preempted(forwarded.stopped_line(job.run_dir), signals.exit_status(forwarded.signum))
    if not (Path(job.run_dir) / METRICS_FILE).exists():  # the process died before it could say why
        RunDir(job, keeps_rejected=True, launched=False).record(f"the job's process exited with status {status}", 1)
    invocation.failures.append(2 if status == 2 else 1)


def finish(invocation: Invocation) -> int:
    """After the jobs: a multirun's comparison (table and summary files in its sweep dir); returns
    the invocation's exit status. Jobs that ran elsewhere (Hydra's submitit launcher runs them on
    SLURM nodes) are known by the metrics.json files in the sweep dir."""
    if not invocation.multirun or invocation.command == "plan" or join_lib.follows():
        return invocation.exit_status()
    from meshrun.report import sweep

    if invocation.runs:
        sweep.compare(sweep.find_runs(invocation.runs), invocation.sweep_dir)
        return invocation.exit_status()
    sweep_dir = invocation.sweep_dir
    rows = sweep.compare(sweep.find_runs([sweep_dir]), sweep_dir) if sweep_dir and Path(sweep_dir).is_dir() else []
    if any(row["status"] == "ok" for row in rows):
        return 0
    say_error(f"no job of the multirun succeeded (their files: {sweep_dir})")
    return 1
