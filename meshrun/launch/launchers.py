"""How a train job runs: one interface, `Launcher`, and one launcher per way a job runs.

- `InProcess`: in this process (each process of a multi-process job runs it in its own);
- `OwnProcess`: as `meshrun train` in a process of its own (the jobs of a multirun that need
  different device counts: jax fixes the count when it starts);
- `LocalProcesses`: as `distributed.local_processes` processes on this machine (meshrun.launch.local);
- `Slurm`: under Hydra's submitit launcher, on a SLURM node: as the launcher it wraps runs it, with
  submitit's signal handed on for submitit to requeue the job.

meshrun.jobs picks the launcher of each job (`launcher_for`) and passes in what the launcher cannot
import from this layer: the training itself and publishing its results.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from meshrun.config.schema import DistributedConfig, RunConfig
from meshrun.errors import Preempted
from meshrun.launch import join as join_lib
from meshrun.launch.invocation import Invocation, Job, say_stopped
from meshrun.launch.local import run_local
from meshrun.launch.ownership import RunDir
from meshrun.launch.spawn import ForwardedStop, Role, spawn
from meshrun.placement import devices
from meshrun.placement.identity import Identity, identify, say_if_alone
from meshrun.specs.metrics import PREEMPTED, RunMetrics
from meshrun.specs.rundir import METRICS_FILE
from meshrun.system import signals
from meshrun.wording import say_error


class Launcher(Protocol):
    """One way a train job runs."""

    def launch(self, job: Job) -> None:
        """Runs `job` to its end, answering for its run dir. A job that does not succeed raises its
        verdict (ConfigError, RunFailed or Preempted) for the invocation to say and count; one whose
        own process already said why is counted in the invocation here."""


class Trained(Protocol):
    """What a run trained in this process hands back (meshrun.train.TrainedRun), as far as its
    launcher reads it."""

    metrics: RunMetrics


@dataclass
class InProcess:
    """The job runs in this process: it takes its place in the job, trains (`train`, given that
    place) and, as process 0, publishes the run (`publish`: its files and its report). From its
    start on, a stop signal stops training at its first step; a second Ctrl-C during training
    ends the process at once where `ends_process_on_interrupt` (the `meshrun` program), else raises
    KeyboardInterrupt (meshrun.system.signals.interrupt)."""

    config: RunConfig
    run_dir: RunDir
    train: Callable[[Identity], Trained]
    publish: Callable[[Trained], None]
    ends_process_on_interrupt: bool = False

    def launch(self, job: Job) -> None:
        stopping = signals.StopSignals(ends_process=self.ends_process_on_interrupt)
        with self.run_dir.answering(), stopping as stop_signals:
            self.run_dir.identity = self.enter()
            # from jax, which set its own SIGTERM handler when the process joined the job
            stop_signals.catch()
            trained = self.train(self.run_dir.identity)
        if self.run_dir.identity.is_first:
            self.publish(trained)
        metrics = trained.metrics
        if metrics.status == PREEMPTED:
            raise Preempted(signals.stopped_line(metrics.train.stopped), metrics.exit_status)

    def enter(self) -> Identity:
        """Takes this process's place: its identity in the job, its devices (before jax starts) and,
        in a multi-process job, joining the others; a process other than the first logs into its
        own file in the run dir."""
        config, run_dir = self.config, self.run_dir
        identity = identify(config.distributed, os.environ, launched_locally=run_dir.launched)
        say_if_alone(config.distributed, identity)
        devices.prepare(config.devices, config.mesh, identity.num_processes)
        if identity.several:
            listen = (
                join_lib.listen_address(identity, config.distributed.bind_address, local=run_dir.launched)
                if identity.is_first
                else None
            )
            join_lib.join(
                identity,
                config.distributed.timeout_s,
                on_timeout=lambda m: (say_error(m), run_dir.reject(m, identity)),
                listen=listen,
            )
            if not identity.is_first:
                join_lib.route_output(run_dir.path, identity.process_id)
        return identity


@dataclass
class LocalProcesses:
    """The job runs as `distributed.local_processes` processes on this machine, started and watched
    from this process, which answers for the run dir; process 0 prints the report and writes the
    run's files."""

    config: DistributedConfig
    run_dir: RunDir

    def launch(self, job: Job) -> None:
        with self.run_dir.answering():
            run_local(self.config, job.run_dir, job.overrides)


@dataclass
class OwnProcess:
    """The job runs as `meshrun train` in a process of its own, into the job's run dir; that
    process says and records why the job failed (this one records a process that died before it
    could). A stop signal to this process is passed on to the job, which stops with a checkpoint."""

    invocation: Invocation
    run_dir: RunDir

    def launch(self, job: Job) -> None:
        process = spawn(
            ["train", *job.overrides, f"hydra.run.dir={job.run_dir}"], Role.SWEEP_JOB, own_group=True
        )
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
            self.run_dir.record(f"the job's process exited with status {status}", 1)
        self.invocation.failures.append(2 if status == 2 else 1)


@dataclass
class Slurm:
    """A job Hydra's submitit launcher runs on a SLURM node (in this process, which takes its place
    from SLURM's environment): it runs as `launcher` runs it. Stopped by submitit's own signal
    (`requeue_signal`, signals.scheduler_signal), the job is said to have stopped, then the signal
    goes on to submitit's handler, which requeues the job and, on the first task, ends the process."""

    launcher: Launcher
    invocation: Invocation
    requeue_signal: int

    def launch(self, job: Job) -> None:
        try:
            self.launcher.launch(job)
        except Preempted as stop:
            if stop.signum != self.requeue_signal:
                raise
            say_stopped(job, stop)
            # submitit requeues the job with this invocation as it is now: as it was when it began
            self.invocation.runs.remove(job.run_dir)
            _hand_on(stop.signum)  # on the first task, requeues and ends the process
            self.invocation.count_stop(stop)


def _hand_on(signum: int) -> None:
    """After a run stopped by submitit's signal has saved its checkpoint and written its files:
    gives the signal to the handler submitit installed, which requeues the job (on the first task;
    the requeued job resumes from the checkpoint) and ends the process."""
    handler = signal.getsignal(signum)
    if callable(handler):
        handler(signum, None)
