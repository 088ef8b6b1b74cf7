"""Runs `python -m meshrun ...` in a fresh process and measures it: for benchmarks under scripts/
and for tests that hold meshrun to a time or memory bound. Also makes the venv without TensorFlow
both compare meshrun against."""

from __future__ import annotations

import os
import site
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from meshrun.launch.spawn import Role, spawn


@dataclass(frozen=True)
class Measured:
    """One finished meshrun process: exit status, output, wall seconds, and its own peak RSS."""

    returncode: int
    stdout: str
    stderr: str
    wall_s: float
    peak_rss_bytes: int


# Runs meshrun and, at exit, writes the process's own peak resident memory (VmHWM) to a file. The
# rusage of a child is no good for this: Linux carries the parent's high-water mark into a child
# started by fork/vfork + exec, so a child of a big parent would look big.
_WRAPPER = """
import atexit, os, runpy, sys
def _peak():
    with open('/proc/self/status') as status, open(os.environ['MESHRUN_PEAK_FILE'], 'w') as out:
        out.write(next(line.split()[1] for line in status if line.startswith('VmHWM:')))
atexit.register(_peak)
_exit = os._exit
def _exit_with_peak(status):  # meshrun ends its process with os._exit, which skips atexit
    _peak()
    _exit(status)
os._exit = _exit_with_peak
sys.argv = ['meshrun', *sys.argv[1:]]
runpy.run_module('meshrun', run_name='__main__', alter_sys=True)
"""


def run_measured(args: list[str], cwd, timeout: float = 120, env=None, python: str | None = None) -> Measured:
    """Runs `python -m meshrun ARGS` in `cwd` (with interpreter `python`, default this process's),
    killed after `timeout` seconds; the peak RSS is the process's own (its VmHWM at exit; -1 if it
    was killed before it could say)."""
    with (
        tempfile.TemporaryFile() as out,
        tempfile.TemporaryFile() as err,
        tempfile.TemporaryDirectory() as scratch,
    ):
        peak_file = os.path.join(scratch, "peak")
        child_env = {**(os.environ if env is None else env), "MESHRUN_PEAK_FILE": peak_file}
        started = time.perf_counter()
        proc = spawn(
            args,
            Role.USER,
            stdout=out,
            stderr=err,
            env=child_env,
            cwd=cwd,
            entry=("-c", _WRAPPER),
            python=python,
        )
        try:
            proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        wall = time.perf_counter() - started
        out.seek(0)
        err.seek(0)
        peak_kib = int(open(peak_file).read()) if os.path.exists(peak_file) else -1
        return Measured(
            returncode=proc.returncode,
            stdout=out.read().decode(),
            stderr=err.read().decode(),
            wall_s=wall,
            peak_rss_bytes=peak_kib * 1024 if peak_kib >= 0 else -1,
        )


# site-packages entries of TensorFlow's distributions (tensorflow, tensorflow-cpu, tensorflow-text,
# tensorflow-io-gcs-filesystem: packages and dist-info dirs)
TENSORFLOW_ENTRIES = ("tensorflow",)


def venv_without_tensorflow(folder: Path) -> Path:
    """The python of a venv made in `folder` that links in every entry of this interpreter's
    site-packages but TensorFlow's: the packages installed here (meshrun's editable install
    included), TensorFlow not installed, as an install without it has them."""
    venv = Path(folder) / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", "--without-pip", str(venv)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    python = venv / "bin" / "python"
    target = Path(
        subprocess.run(
            [python, "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            check=True,
            capture_output=True,
            text=True,
        ).stdout.strip()
    )
    for source in map(Path, site.getsitepackages()):
        for entry in source.iterdir():
            if not entry.name.lower().startswith(TENSORFLOW_ENTRIES) and not (target / entry.name).exists():
                (target / entry.name).symlink_to(entry)
    return python
