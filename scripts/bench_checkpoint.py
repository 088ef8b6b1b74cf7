"""Benchmarks checkpointing: the tiny transformer trained with a sharded checkpoint at the end of
every epoch (written in the background) against the same run without checkpoints.

Runs alternate (fresh processes, compilation cache off). Reported: median step time of each and
their ratio (target: within 5%), time per epoch, the time training spent blocked on checkpoints
(`timing.checkpoint_s`: handing each checkpoint to Orbax plus waiting for the last write at the
end) and its share of the training time, and the same with synchronous writes for comparison.

    python scripts/bench_checkpoint.py
    python scripts/bench_checkpoint.py --repeats 3 --epochs 5 --out bench_checkpoint.json
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from pathlib import Path

import benchlib

VARIANTS = {
    "no checkpoints": [],
    "every epoch, async": ["checkpoint.every_epoch=true"],
    "every epoch, sync": ["checkpoint.every_epoch=true", "checkpoint.async_save=false"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--num-samples", type=int, default=2048)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--mesh", default="2x4")
    parser.add_argument("--out", default="bench_checkpoint.json")
    args = parser.parse_args()
    common = [
        "model=transformer",
        f"mesh={args.mesh}",
        "train.verbose=0",
        "cache.enabled=false",
        f"train.epochs={args.epochs}",
        f"data.num_samples={args.num_samples}",
    ]
    runs = {name: [] for name in VARIANTS}
    with tempfile.TemporaryDirectory(prefix="bench-checkpoint-") as work:
        for repeat, name in benchlib.interleaved(args.repeats, list(VARIANTS), alternate=False):
            run_dir = Path(work) / f"{repeat}-{name.replace(' ', '_').replace(',', '')}"
            runs[name].append(checkpointed_run([*common, *VARIANTS[name]], run_dir, name))
            print(
                f"repeat {repeat + 1}, {name}: step {runs[name][-1]['step_ms']:.2f} "
                f"ms, checkpoints {runs[name][-1]['checkpoint_s']:.3f} s"
            )
    results = {"epochs": args.epochs, "num_samples": args.num_samples, "mesh": args.mesh, "runs": runs}
    base = statistics.median(r["step_ms"] for r in runs["no checkpoints"])
    results["step_ratio"] = {
        name: statistics.median(r["step_ms"] for r in rows) / base for name, rows in runs.items()
    }
    benchlib.write_json(args.out, results)
    show(results)
    print(f"results: {args.out}")


def checkpointed_run(overrides: list[str], run_dir: Path, name: str) -> dict:
    """One fresh `meshrun train` of variant `name`: its step time, epoch time and the time training
    was blocked on checkpoints, alone and as a share of training."""
    _, metrics = benchlib.train(overrides, run_dir, name)
    timing = metrics["timing"]
    train_s = sum(timing["epoch_s"])
    return {
        "step_ms": timing["step_time_s"] * 1e3,
        "epoch_s": statistics.median(timing["epoch_s"]),
        "train_s": train_s,
        "checkpoint_s": timing["checkpoint_s"],
        "checkpoint_share": timing["checkpoint_s"] / train_s,
    }


def show(results: dict) -> None:
    """The table of medians per variant, and the verdict on async checkpoints."""
    console = benchlib.console(110)
    table = benchlib.table(
        f"checkpointing the tiny transformer on {results['mesh']} ({results['epochs']} epochs, medians)",
        ("variant", "step ms", "step ratio", "epoch s", "blocked on checkpoints s", "share of training"),
    )
    for name, rows in results["runs"].items():
        median = benchlib.medians(rows)
        table.add_row(
            name,
            f"{median['step_ms']:.2f}",
            f"{results['step_ratio'][name]:.3f}",
            f"{median['epoch_s']:.2f}",
            f"{median['checkpoint_s']:.3f}",
            f"{median['checkpoint_share']:.1%}",
        )
    console.print(table)
    ratio = results["step_ratio"]["every epoch, async"]
    console.print(
        "step time with async checkpoints every epoch / without: "
        f"{ratio:.3f} (target <= 1.05: {'PASS' if ratio <= 1.05 else 'FAIL'})"
    )


if __name__ == "__main__":
    main()
