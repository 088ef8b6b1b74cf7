"""The one way meshrun starts meshrun processes: `python -m meshrun ARGS --role=ROLE`.

The role says why the process was started, and so who owns its run dir and its verdict:
- `user`: started by a person, a script or a scheduler (the default): it owns its run dir.
- `local-process`: one process of a `distributed.local_processes` job; the local launcher owns the
  run dir and the job's verdict, and cleans up after a rejected config.
- `sweep-job`: one job of a multirun run in a process of its own (its device count differs from the
  others'); a config error is recorded as the job's row (metrics.json with status error) instead of
  removing its run dir, as a job of an in-process multirun would be.
"""

from __future__ import annotations

import ctypes
import enum
import json
import os
import signal
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from meshrun.specs.rundir import METRICS_FILE
from meshrun.system import signals
from meshrun.system.process import SignalHandlers


class Role(enum.Enum):
    """Why a meshrun process runs (see the module doc)."""

    USER = "user"
    LOCAL_PROCESS = "local-process"
    SWEEP_JOB = "sweep-job"


ROLE_FLAG = "--role"
MODULE_ENTRY = ("-m", "meshrun")


def parse_role(arg: str) -> Role | None:
    """The role `--role=NAME` names, or None when `arg` is not that flag; ValueError for an unknown
    role."""
    flag, _, value = arg.partition("=")
    if flag != ROLE_FLAG:
        return None
    return Role(value)


def command(
    args: Sequence[str], role: Role, entry: Sequence[str] = MODULE_ENTRY, python: str | None = None
) -> list[str]:
    """The command line of a meshrun process with `args` (command and overrides) in `role`;
    `entry` is how Python starts meshrun (`-m meshrun`, or `-c CODE` for a wrapper that does) and
    `python` the interpreter (default: this process's)."""
    return [python or sys.executable, *entry, *args, f"{ROLE_FLAG}={role.value}"]


def spawn(
    args: Sequence[str],
    role: Role,
    *,
    stdout=None,
    stderr=None,
    env: Mapping[str, str] | None = None,
    cwd=None,
    own_group: bool = False,
    entry: Sequence[str] = MODULE_ENTRY,
    python: str | None = None,
) -> subprocess.Popen:
    """Starts meshrun with `args` in `role` (with interpreter `python`, default this process's). With
    `own_group` the process leads a process group of its own (stopping the group stops its children
    too) and is killed when this process dies, however it dies (Linux)."""
    return subprocess.Popen(
        command(args, role, entry, python),
        stdout=stdout,
        stderr=stderr,
        env=None if env is None else dict(env),
        cwd=cwd,
        start_new_session=own_group,
        preexec_fn=_die_with_parent if own_group else None,
    )


def _die_with_parent() -> None:
    """In the child, before exec: ask Linux to kill it when its parent dies."""
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:  # not Linux: the launcher's own signal handling still stops the processes
        pass


class ForwardedStop(SignalHandlers):
    """While entered (on the main thread), passes the first stop signal this process gets
    (SIGTERM, SIGUSR1, Ctrl-C) on to the process groups of `processes` (started with `own_group`),
    which then stop with a checkpoint and exit with 128 + its number; `signum` remembers it. A
    second Ctrl-C raises KeyboardInterrupt here, for the caller to stop them at once."""

    def __init__(self, processes: Sequence[subprocess.Popen]):
        super().__init__({sig: self._forward for sig in signals.STOP_SIGNALS})
        self.processes = processes
        self.signum: int | None = None

    def _forward(self, signum, frame) -> None:
        if self.signum is not None:
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            return
        self.signum = signum
        for process in self.processes:
            try:
                os.killpg(process.pid, signum)
            except ProcessLookupError:
                pass

    def stopped(self, returncode: int | None) -> bool:
        """Whether `returncode` is how a process ends that the forwarded signal stopped: 128 + its
        number after saving, or killed by it before it could catch it (while it started up)."""
        return self.signum is not None and returncode in (signals.exit_status(self.signum), -self.signum)

    def stopped_line(self, run_dir: str) -> str:
        """Where the stopped job stopped, as its (first) process wrote it into metrics.json."""
        try:
            stopped = json.loads((Path(run_dir) / METRICS_FILE).read_text())["train"]["stopped"]
            return signals.stopped_line(stopped)
        except (OSError, ValueError, KeyError, TypeError):
            return (
                f"{signals.signal_name(self.signum)} received: the job stopped "
                f"before training began; nothing was saved (see {run_dir})"
            )
