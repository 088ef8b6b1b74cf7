"""`distributed.local_processes=N`: runs one job as N `meshrun train` processes on this machine,
each emulating an even share of the mesh's devices on the CPU, joined through a coordinator on
localhost (a multi-host job in miniature, for trying layouts and the launch path).

Process 0 prints to the terminal and writes the run's files; every process's stderr (and the other
processes' stdout) goes to `process-<i>.log` in the run dir, and `processes.json` lists their pids
and logs. If any process fails, the others are stopped at once and the job fails with one line
naming that process and its log; no process outlives the launcher (they die with it, too). A stop
signal to the launcher is passed on: the processes stop together with a checkpoint, and the
launcher exits with their status (meshrun.system.signals).
"""

from __future__ import annotations

import json
import logging
import os
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from meshrun.config.schema import DistributedConfig
from meshrun.errors import ConfigError, Preempted, RunFailed
from meshrun.launch.join import check_bind_address, check_port_free, free_port, log_path, split_address
from meshrun.launch.spawn import ForwardedStop, Role, spawn
from meshrun.specs.rundir import PROCESSES_FILE
from meshrun.system import signals
from meshrun.system.process import SignalHandlers
from meshrun.wording import ERROR_PREFIX

log = logging.getLogger("meshrun")

# The keys the launcher sets for each process; the user's own values for them are dropped.
_OWN_KEYS = (
    "distributed.mode",
    "distributed.local_processes",
    "distributed.coordinator",
    "distributed.num_processes",
    "distributed.process_id",
    "distributed.port",
    "devices.platform",
)
# How long the other processes may take to exit after process 0 has finished the job.
_FINISH_GRACE_S = 60
_POLL_S = 0.1


@dataclass(frozen=True)
class Stopped:
    """The job's processes stopped on a stop signal the launcher passed on to them (each saved the
    checkpoint of the step they agreed on and exited with 128 + the signal's number)."""

    signum: int
    line: str  # where the job stopped, as process 0 wrote it


@dataclass(frozen=True)
class Failure:
    """The first process of the job that failed: its id, exit status and log."""

    process_id: int
    returncode: int
    log: Path


def run_local(config: DistributedConfig, run_dir: str, overrides: list[str]) -> None:
    """Runs the job's processes to the end. Raises ConfigError when they reject the config (after
    removing what they wrote), RunFailed when one fails, naming it and its log."""
    count = config.local_processes
    if config.port is not None:
        check_port_free(config.port, "distributed.port", config.port)
    # Every process is on this machine: they meet on loopback, where process 0's coordinator listens.
    port = config.port or (split_address(config.bind_address)[1] if config.bind_address else free_port())
    coordinator = f"127.0.0.1:{port}"
    if config.bind_address is not None:
        check_bind_address(config.bind_address, coordinator)
    kept = [o for o in overrides if o.lstrip("+~").split("=", 1)[0] not in _OWN_KEYS]
    listening = config.bind_address or f"{coordinator}, loopback only"
    log.info(
        f"starting {count} processes on this machine (coordinator {coordinator}, listening on {listening}); "
        f"logs in {run_dir}/process-*.log"
    )
    Path(run_dir).mkdir(parents=True, exist_ok=True)
    logged_before = logs_there(run_dir, count)
    started = [_start(i, count, coordinator, run_dir, kept) for i in range(count)]
    # processes.json says the job is under way: written once a stop signal is passed on, not before
    follow(started, run_dir, logged_before, lambda: _write_processes_file(run_dir, coordinator, started))


def logs_there(run_dir: str, count: int) -> bool:
    """Whether the run dir holds a log of one of a job's `count` processes already (of an earlier
    launch there, continued)."""
    return any(log_path(run_dir, i).exists() for i in range(count))


def follow(
    started: list[subprocess.Popen], run_dir: str, logged_before: bool = False, watching=lambda: None
) -> None:
    """Watches the started processes of one job (`start_process`) to their end, passing a stop
    signal on to them (`watching()` is called once that is in force). Raises ConfigError when they
    reject the config (after removing their logs, unless `logged_before`: those are an earlier
    launch's too), Preempted when a stop signal stopped them, RunFailed when one fails, naming it
    and its log."""
    count = len(started)
    try:
        ending = _watch(started, run_dir, watching)
    except KeyboardInterrupt:
        raise RunFailed(f"interrupted; stopped all {count} processes") from None
    if ending is None:
        return
    if isinstance(ending, Stopped):
        raise Preempted(ending.line, signals.exit_status(ending.signum))
    raise _explain(ending, count, run_dir, remove_logs=not logged_before)


def _start(
    process_id: int, count: int, coordinator: str, run_dir: str, overrides: list[str]
) -> subprocess.Popen:
    args = [
        "train",
        *overrides,
        "devices.platform=cpu",
        f"hydra.run.dir={run_dir}",
        "hydra.output_subdir=null",
        f"distributed.coordinator={coordinator}",
        f"distributed.num_processes={count}",
        f"distributed.process_id={process_id}",
    ]
    return start_process(args, Role.LOCAL_PROCESS, process_id, run_dir)


def start_process(
    args: list[str], role: Role, process_id: int, run_dir: str, env: dict[str, str] | None = None
) -> subprocess.Popen:
    """Starts process `process_id` of a job on this machine, `meshrun ARGS` in `role` (with `env`:
    that environment instead of this one's), in a process group of its own that dies with this
    process. Its stderr, and the stdout of every process but the first, go to its log in `run_dir`."""
    with open(log_path(run_dir, process_id), "ab") as log_file:
        return spawn(
            args, role, stdout=None if process_id == 0 else log_file, stderr=log_file, own_group=True, env=env
        )


def _write_processes_file(run_dir: str, coordinator: str, started: list[subprocess.Popen]) -> None:
    entries = [
        {"process_id": i, "pid": p.pid, "log": str(log_path(run_dir, i))} for i, p in enumerate(started)
    ]
    path = Path(run_dir) / PROCESSES_FILE
    path.write_text(json.dumps({"coordinator": coordinator, "processes": entries}, indent=2) + "\n")


def _watch(started: list[subprocess.Popen], run_dir: str, watching) -> Failure | Stopped | None:
    """Waits for every process; at the first failure stops the rest and returns it. A stop signal
    to the launcher (SIGTERM, SIGUSR1, the first Ctrl-C) is passed on to every process, which then
    stop together with a checkpoint (returns Stopped); a second Ctrl-C, or SIGHUP, stops them all
    at once."""
    forwarded = ForwardedStop(started)
    with SignalHandlers({signal.SIGHUP: _raise_interrupt}):
        try:
            with forwarded:
                watching()
                return _wait(started, forwarded, run_dir)
        finally:
            _stop(started)


def _wait(
    started: list[subprocess.Popen], forwarded: ForwardedStop, run_dir: str
) -> Failure | Stopped | None:
    """Polls the processes until one fails, all have ended, or the others outstay process 0."""
    first_done_at = None
    while True:
        codes = [p.poll() for p in started]
        failed = [i for i, code in enumerate(codes) if code not in (None, 0) and not forwarded.stopped(code)]
        if failed:
            first = min(failed, key=lambda i: _blame_order(codes[i], i))
            return Failure(first, codes[first], log_path(run_dir, first))
        if all(code is not None for code in codes):
            return Stopped(forwarded.signum, forwarded.stopped_line(run_dir)) if any(codes) else None
        if codes[0] is not None:  # the job is done: process 0 has written its results
            first_done_at = first_done_at or time.monotonic()
            if time.monotonic() - first_done_at > _FINISH_GRACE_S:
                late = [i for i, code in enumerate(codes) if code is None]
                log.warning(
                    f"processes {late} had not exited {_FINISH_GRACE_S} "
                    "s after process 0 finished; stopping them"
                )
                return None
        time.sleep(_POLL_S)


def _blame_order(returncode: int, process_id: int) -> tuple:
    # When several have died by the time we look, a killed process is the likelier cause: the
    # others then fail in a collective that lost its peer.
    return (0 if returncode < 0 else 1, process_id)


def _raise_interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _stop(started: list[subprocess.Popen]) -> None:
    """Stops every process still running: SIGTERM to its group, then SIGKILL after 3 s."""
    running = [p for p in started if p.poll() is None]
    for sig, wait_s in ((signal.SIGTERM, 3.0), (signal.SIGKILL, 5.0)):
        for process in running:
            try:
                os.killpg(process.pid, sig)
            except ProcessLookupError:
                pass
        deadline = time.monotonic() + wait_s
        while running and time.monotonic() < deadline:
            running = [p for p in running if p.poll() is None]
            time.sleep(0.05)
        if not running:
            return


def _explain(failure: Failure, count: int, run_dir: str, remove_logs: bool) -> Exception:
    """The error for a failed job: the process's own config error (its files removed where
    `remove_logs`), or which process failed, how, and where its log is."""
    said = _last_error_line(failure.log)
    if failure.returncode == 2 and said:
        if remove_logs:
            _remove_launch_files(run_dir, count)
        key, _, message = said.partition(": ")
        return ConfigError(key, message)
    if failure.returncode < 0:
        how = f"was killed by {signal.Signals(-failure.returncode).name}"
    else:
        how = f"failed with exit status {failure.returncode}"
    detail = f" ({said})" if said else ""
    return RunFailed(f"process {failure.process_id} of {count} {how}{detail}; its log: {failure.log}")


def _last_error_line(log_file: Path) -> str:
    """The last `meshrun: error:` line the process wrote to its log, without that prefix."""
    try:
        lines = log_file.read_text(errors="replace").splitlines()
    except OSError:
        return ""
    said = [line.split(ERROR_PREFIX, 1)[1] for line in lines if ERROR_PREFIX in line]
    return said[-1].strip() if said else ""


def _remove_launch_files(run_dir: str, count: int) -> None:
    for process_id in range(count):
        log_path(run_dir, process_id).unlink(missing_ok=True)
    (Path(run_dir) / PROCESSES_FILE).unlink(missing_ok=True)
