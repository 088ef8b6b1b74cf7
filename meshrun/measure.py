"""Runs `python -m meshrun ...` in a fresh process and measures it: for benchmarks under scripts/
and for tests that hold meshrun to a time or memory bound."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass


@dataclass(frozen=True)
class Measured:
    """One finished meshrun process: exit status, output, wall seconds, and its own peak RSS."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_bytes: int


def run_measured(args: list[str], cwd, timeout: float = 120, env=None) -> Measured:
    """Runs `python -m meshrun ARGS` in `cwd`, killed after `timeout` seconds. The peak RSS comes
    from the child's own rusage (os.wait4), so other processes do not count."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        proc = subprocess.Popen([sys.executable, "-m", "meshrun", *args], cwd=cwd, stdout=out, stderr=err, env=env)
        killer = threading.Timer(timeout, proc.kill)
        killer.start()
        try:
            _, status, usage = os.wait4(proc.pid, 0)
        finally:
            killer.cancel()
        wall = time.perf_counter() - started
        proc.returncode = os.waitstatus_to_exitcode(status)  # reaped here, not by Popen
        out.seek(0)
        err.seek(0)
        return Measured(
            returncode=proc.returncode,
            stdout=out.read().decode(),
            stderr=err.read().decode(),
            wall_s=wall,
            peak_rss_bytes=usage.ru_maxrss * 1024,  # Linux reports KiB
        )
