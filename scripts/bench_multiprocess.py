"""Benchmarks a job of several processes on this machine against the same job in one process.

For each mesh shape the same run (seeds' model, or the `--overrides` given; same seed and global
batch, compilation cache off) goes once as one process with 8 emulated CPU devices and once as
`distributed.local_processes=2` (2 processes x 4 devices, gloo collectives between them). Reported:
wall time, start-up to the first step, median step time and the ratio of step times, and whether
the per-epoch losses agree. Then (unless `--no-kill`) one process of a 2-process job is killed with
SIGKILL mid-training, and the time until meshrun has stopped the other one and exited is measured
(target: under 60 s).

    python scripts/bench_multiprocess.py
    python scripts/bench_multiprocess.py --shapes 2x4 --epochs 2 --out bench_multiprocess.json
    # another run than the seeds' model (these overrides replace layout=dense_model), without the kill:
    python scripts/bench_multiprocess.py --shapes 2x4 --no-kill --overrides model=transformer \
        'mesh.axis_names=[stage,data]' mesh.batch_axis=data layout=replicated
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from rich.markup import escape

import benchlib

PROCESSES = {"one": [], "two": ["distributed.local_processes=2"]}


def main() -> None:
    args = parse_args()
    common = [
        *args.overrides,
        "train.verbose=0",
        "cache.enabled=false",
        f"train.epochs={args.epochs}",
        f"data.num_samples={args.num_samples}",
    ]
    with tempfile.TemporaryDirectory(prefix="bench-multiprocess-") as work:
        rows = [one_and_two_processes(shape, common, Path(work)) for shape in args.shapes]
        kill_s = None if args.no_kill else time_to_stop_after_a_kill(Path(work))
    results = {
        "epochs": args.epochs,
        "num_samples": args.num_samples,
        "overrides": args.overrides,
        "runs": rows,
        "stop_after_kill_s": kill_s,
    }
    benchlib.write_json(args.out, results)
    show(results)
    print(f"results: {args.out}")


def parse_args():
    """The command line's settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", nargs="+", default=["8x1", "2x4", "1x8"])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-samples", type=int, default=1024)
    parser.add_argument("--out", default="bench_multiprocess.json")
    parser.add_argument(
        "--overrides", nargs="+", default=["layout=dense_model"], help="the run's model and layout"
    )
    parser.add_argument("--no-kill", action="store_true", help="skip the SIGKILL test")
    return parser.parse_args()


def one_and_two_processes(shape: str, common: list[str], work: Path) -> dict:
    """The run on mesh `shape` in one process, then in two: each one's figures, the ratio of their
    step times and the largest difference of their per-epoch losses."""
    row = {"mesh": shape}
    for label, extra in PROCESSES.items():
        done, metrics = benchlib.train(
            [f"mesh={shape}", *common, *extra], work / f"{shape}-{label}", f"mesh={shape} {label}", cwd=work
        )
        row[label] = {
            "wall_s": done.wall_s,
            "first_step_s": metrics["timing"]["time_to_first_step_s"],
            "step_ms": metrics["timing"]["step_time_s"] * 1e3,
            "losses": metrics["history"]["loss"],
        }
    row["step_ratio"] = row["two"]["step_ms"] / row["one"]["step_ms"]
    row["max_loss_difference"] = max(
        abs(a - b) for a, b in zip(row["one"]["losses"], row["two"]["losses"], strict=False)
    )
    print(
        f"mesh {shape}: step {row['one']['step_ms']:.2f} ms "
        f"-> {row['two']['step_ms']:.2f} ms with 2 processes"
    )
    return row


def time_to_stop_after_a_kill(work: Path) -> float:
    """Seconds from SIGKILL of process 1 (mid-training) to the launcher's exit."""
    run_dir = work / "killed"
    launcher = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "meshrun",
            "train",
            "distributed.local_processes=2",
            "mesh=2x4",
            "train.epochs=100",
            "data.num_samples=4096",
            f"hydra.run.dir={run_dir}",
        ],
        cwd=work,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while (
        not (run_dir / "process-1.log").exists() or "Epoch 2/" not in (run_dir / "process-1.log").read_text()
    ):
        if time.monotonic() > deadline or launcher.poll() is not None:
            launcher.kill()
            raise SystemExit("the job to kill never reached its second epoch")
        time.sleep(0.2)
    pid = json.loads((run_dir / "processes.json").read_text())["processes"][1]["pid"]
    killed_at = time.monotonic()
    os.kill(pid, signal.SIGKILL)
    _, stderr = launcher.communicate(timeout=120)
    seconds = time.monotonic() - killed_at
    print(
        f"after SIGKILL of process 1: exit {launcher.returncode} "
        f"in {seconds:.2f} s; {stderr.strip().splitlines()[-1]}"
    )
    return seconds


def show(results: dict) -> None:
    """The table of both ways per mesh, and the time to stop after the kill with its verdict."""
    console = benchlib.console(110)
    title = (
        f"one process vs 2 local processes ({' '.join(results['overrides'])}, "
        f"{results['epochs']} epochs, 8 CPU devices)"
    )
    table = benchlib.table(
        escape(title),  # overrides such as 'mesh.axis_names=[stage,data]' are not rich's markup
        ("mesh", "wall s (1 / 2)", "first step s (1 / 2)", "step ms (1 / 2)", "step ratio", "max loss diff"),
    )
    for row in results["runs"]:
        one, two = row["one"], row["two"]
        table.add_row(
            row["mesh"],
            f"{one['wall_s']:.1f} / {two['wall_s']:.1f}",
            f"{one['first_step_s']:.1f} / {two['first_step_s']:.1f}",
            f"{one['step_ms']:.2f} / {two['step_ms']:.2f}",
            f"{row['step_ratio']:.1f}",
            f"{row['max_loss_difference']:.1e}",
        )
    console.print(table)
    if results["stop_after_kill_s"] is None:
        return
    verdict = "PASS" if results["stop_after_kill_s"] < 60 else "FAIL"
    console.print(
        f"job stopped {results['stop_after_kill_s']:.2f} s "
        f"after SIGKILL of process 1 (target < 60 s: {verdict})"
    )


if __name__ == "__main__":
    main()
