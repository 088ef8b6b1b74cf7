"""Benchmarks what a `meshrun train` process costs beyond the wall time it reports: the seconds
between the end of the run's own figures and the process's exit.

For each job (the seeds' MLP, `meshrun train mesh=2x4 layout=dense_model`, and the tiny
transformer, `meshrun train model=transformer mesh=2x4`), each repeat is a fresh `python -m meshrun
train` process; the jobs take turns (MLP, transformer, MLP, ...) so that the machine's drift
reaches both alike. Measured per process:

- outside wall: from just before the process is started to its exit, seen from here;
- `timing.wall_s` from its metrics.json (job start, which is process start, to the end of the run);
- `timing.teardown_s` from its metrics.json (clearing the Keras session and the distribution);
- exit after write: from metrics.json's modification time to the process's exit.

The target (issue 15): outside wall minus `timing.wall_s` at most 0.5 s for both jobs, median of 5.

    python scripts/bench_teardown.py                 # 5 repeats, writes bench_teardown.json
    python scripts/bench_teardown.py --repeats 3 --out /tmp/teardown.json

It is a measurement: it exits 0 whatever the numbers, 1 only when a run fails.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

import benchlib

TARGET_S = 0.5
COMMON = ["train.verbose=0", "train.epochs=2", "data.num_samples=1024", "data.eval_samples=128"]
JOBS = {
    "mlp (dense_model, 2x4)": ["mesh=2x4", "layout=dense_model"],
    "tiny transformer (2x4)": ["model=transformer", "mesh=2x4"],
}


def run_once(args: list[str], run_dir: Path) -> dict:
    """One `python -m meshrun train` process: its outside wall and the figures of its metrics.json."""
    started = time.time()
    done = subprocess.run(
        [sys.executable, "-m", "meshrun", "train", *args, *COMMON, f"hydra.run.dir={run_dir}"],
        capture_output=True,
        text=True,
        check=False,
    )
    ended = time.time()
    if done.returncode != 0:
        sys.exit(f"bench_teardown: the run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    metrics_file = run_dir / "metrics.json"
    timing = benchlib.read_metrics(run_dir)["timing"]
    return {
        "outside_wall_s": ended - started,
        "wall_s": timing["wall_s"],
        "gap_s": ended - started - timing["wall_s"],
        "teardown_s": timing.get("teardown_s"),
        "exit_after_write_s": ended - metrics_file.stat().st_mtime,
    }


def summarise(samples: list[dict]) -> dict:
    """Medians (and the gap's maximum) over the repeats of one job."""
    summary = benchlib.medians(samples)
    summary["gap_max_s"] = max(s["gap_s"] for s in samples)
    summary["meets_target"] = summary["gap_s"] <= TARGET_S
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", default="bench_teardown.json")
    options = parser.parse_args()

    samples: dict[str, list] = {name: [] for name in JOBS}
    with tempfile.TemporaryDirectory() as scratch:
        for repeat in range(options.repeats):
            for index, (name, args) in enumerate(JOBS.items()):
                samples[name].append(run_once(args, Path(scratch) / f"{index}-{repeat}"))
    results = {name: summarise(runs) for name, runs in samples.items()}

    table = benchlib.table(
        "meshrun train: outside wall vs reported wall, median "
        f"of {options.repeats} (target: gap <= {TARGET_S} s)",
        (
            "job",
            "outside wall s",
            "timing.wall_s",
            "gap s",
            "gap max s",
            "teardown_s",
            "exit after write s",
            "target",
        ),
        left=("job",),
    )
    for name, r in results.items():
        teardown = "-" if r["teardown_s"] is None else f"{r['teardown_s']:.2f}"
        table.add_row(
            name,
            f"{r['outside_wall_s']:.2f}",
            f"{r['wall_s']:.2f}",
            f"{r['gap_s']:.2f}",
            f"{r['gap_max_s']:.2f}",
            teardown,
            f"{r['exit_after_write_s']:.2f}",
            "met" if r["meets_target"] else "missed",
        )
    Console(width=160).print(table)
    report = {
        "python": platform.python_version(),
        "machine": platform.machine(),
        "cpus": os.cpu_count(),
        "repeats": options.repeats,
        "target_gap_s": TARGET_S,
        "jobs": results,
        "samples": samples,
    }
    benchlib.write_json(options.out, report)
    print(f"wrote {options.out}")


if __name__ == "__main__":
    main()
