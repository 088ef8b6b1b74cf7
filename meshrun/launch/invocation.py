"""One `meshrun` invocation as its jobs run: the command and its flags, the role the process was
started in, and what its jobs did (`Invocation`); the current invocation, for Hydra's callbacks
(`running`, `current`); and one job as Hydra composed it (`Job`). Plain state: nothing here runs a
job, and nothing here knows Hydra.
"""

from __future__ import annotations

import contextlib
import contextvars
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshrun.errors import Preempted
from meshrun.launch.spawn import Role
from meshrun.logs.timing import process_start_time


@dataclass
class Invocation:
    """One `meshrun` command and what its jobs did: the command, its flags and Hydra overrides, the
    role this process was started in, whether it runs as the meshrun program (the process ends when
    the command is done) and whether multirun jobs each run in a process of their own; then, as the
    jobs run, the sweep dir, each train job's run dir, the exit statuses of the jobs that failed and
    the warnings its jobs say once for all of them (`said_once`, meshrun.run.prepare.RunContext).
    `kube` holds the options of `meshrun k8s` (meshrun.kube.options.KubeOptions)."""

    command: str
    overrides: list[str]
    role: Role = Role.USER
    as_json: bool = False
    full: bool = False
    save_layout: str | None = None
    fit: str | None = None  # plan --fit: batch or seq_len
    kube: Any = None
    as_program: bool = False
    isolate: bool = False
    sweep_dir: str | None = None
    runs: list[str] = field(default_factory=list)
    failures: list[int] = field(default_factory=list)
    preempted: bool = False
    said_once: set[str] = field(default_factory=set)

    @property
    def multirun(self) -> bool:
        return "-m" in self.overrides

    def start_job(self, run_dir: str) -> float:
        """Notes a train job's start; returns the time its start-up, wall time and train.max_time
        count from: process start for the first job of the process (imports and device set-up
        count), the job's own start for a later one, which shares the process."""
        self.runs.append(run_dir)
        return process_start_time() if len(self.runs) == 1 else time.time()

    def count_stop(self, stop: Preempted) -> None:
        """Counts a job a stop signal stopped: the invocation exits with its status, and the
        multirun's later jobs are not run."""
        self.failures.append(stop.exit_status)
        self.preempted = True

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

    def says(self, text: str) -> str:
        """`text` as said of this job: after its number in a multirun."""
        return (f"job {self.number}: " if self.number is not None else "") + text


def say_stopped(job: Job, stop: Preempted) -> None:
    """Says on stderr where a stop signal stopped `job`."""
    print(f"meshrun: {job.says(str(stop))}", file=sys.stderr)
