"""Benchmarks how soon `meshrun train` honours a stop signal: from the signal to the process's exit,
with the checkpoint written, for the tiny transformer (`model=transformer mesh=2x4`), in one
process and in a job of two local processes.

Each repeat is a fresh `python -m meshrun train ... checkpoint.dir=<temp>` process; once its step
log holds 50 steps it gets SIGTERM. Measured: seconds from the signal to the exit (the process's
status must be 143 and its metrics.json say preempted), the step it stopped after, the run's median
step time and the seconds its checkpoint took (`timing.checkpoint_s`). Medians of --repeats.

    python scripts/bench_preemption.py                 # 3 repeats each, about 2 minutes
    python scripts/bench_preemption.py --repeats 5 --out bench_preemption.json

It is a measurement: it exits 0 whatever the numbers, 1 only when a run does not stop as it should.
"""

from __future__ import annotations

import argparse
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

import benchlib

JOBS = {
    "one process": ["model=transformer", "mesh=2x4"],
    "two processes": ["model=transformer", "mesh=2x4", "distributed.local_processes=2"],
}
COMMON = ["train", "train.epochs=50", "train.verbose=0", "data.num_samples=2048"]


def stop_once(args: list[str], folder: Path) -> dict:
    run_dir, checkpoints = folder / "run", folder / "checkpoints"
    process = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "meshrun",
            *COMMON,
            *args,
            f"checkpoint.dir={checkpoints}",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=folder,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    log = run_dir / "log.jsonl"
    while not (log.exists() and log.read_text().count('"step"') >= 50):
        if process.poll() is not None:
            return {"ok": False, "stderr": process.communicate()[1][-2000:]}
        time.sleep(0.01)
    signalled = time.perf_counter()
    process.send_signal(signal.SIGTERM)
    _, stderr = process.communicate(timeout=300)
    exit_s = time.perf_counter() - signalled
    metrics = benchlib.read_metrics(run_dir) if (run_dir / "metrics.json").exists() else {}
    ok = process.returncode == 143 and metrics.get("status") == "preempted"
    if not ok:
        return {"ok": False, "returncode": process.returncode, "stderr": stderr[-2000:]}
    timing = metrics["timing"]
    return {
        "ok": True,
        "signal_to_exit_s": exit_s,
        "step": metrics["train"]["stopped"]["step"],
        "step_time_ms": timing["step_time_s"] * 1e3 if timing["step_time_s"] else None,
        "checkpoint_s": timing["checkpoint_s"],
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", default="bench_preemption.json")
    args = parser.parse_args()
    console = Console()
    results: dict = {name: [] for name in JOBS}
    failed = False
    for repeat in range(args.repeats):
        for name, job in JOBS.items():
            with tempfile.TemporaryDirectory(prefix="bench-preemption-") as scratch:
                outcome = stop_once(job, Path(scratch))
            results[name].append(outcome)
            failed |= not outcome["ok"]
            console.print(f"{name} #{repeat + 1}: {outcome}")
    table = benchlib.table(
        f"SIGTERM to exit, tiny transformer on 2x4, median of {args.repeats}",
        ("job", "signal to exit", "stopped after step", "step time", "checkpoint write"),
        left=("job",),
    )
    summary = {}
    for name, runs in results.items():
        good = [r for r in runs if r["ok"]]
        if not good:
            table.add_row(name, "failed", "", "", "")
            continue
        figures = benchlib.medians(good, ("signal_to_exit_s", "step_time_ms", "checkpoint_s"))
        summary[name] = {**figures, "steps": [r["step"] for r in good]}
        table.add_row(
            name,
            f"{figures['signal_to_exit_s']:.2f} s",
            ", ".join(str(r["step"]) for r in good),
            f"{figures['step_time_ms']:.1f} ms",
            f"{figures['checkpoint_s']:.2f} s",
        )
    console.print(table)
    benchlib.write_json(args.out, {"repeats": args.repeats, "summary": summary, "runs": results})
    console.print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
