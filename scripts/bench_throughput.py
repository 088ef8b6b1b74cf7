"""Measures how well a run's reported throughput agrees with the clock outside it:
the README's main job (`meshrun train mesh=2x4 layout=dense_model`) run for --epochs epochs, its
metrics.json `timing.samples_per_s` set against the samples of the epochs after the first divided
by those epochs' wall seconds from epochs.csv (`epoch_s`, start to end of each epoch, as a user
would time them with a stopwatch), and against the figure a median step gives (global batch over
`timing.step_time_s`, what samples/s used to be).

    python scripts/bench_throughput.py --epochs 20 --repeats 3 --out bench_throughput.json

Each repeat is a fresh process; the figures are per repeat and the median over repeats. It is a
measurement: it exits 0 whatever the numbers, 1 only when a run fails.
"""

from __future__ import annotations

import argparse
import csv
import json
import tempfile
from pathlib import Path

import benchlib

RUN = ["mesh=2x4", "layout=dense_model", "train.verbose=0", "logging.csv=true"]  # of `meshrun train`


def one_run(epochs: int, folder: Path) -> dict:
    """The throughput figures of one fresh run of the main job."""
    run_dir = folder / "run"
    _, metrics = benchlib.train([*RUN, f"train.epochs={epochs}"], run_dir, "run", cwd=folder, timeout=3600)
    batch, timing = metrics["train"]["global_batch_size"], metrics["timing"]
    with open(run_dir / "epochs.csv") as rows:
        epochs_rows = list(csv.DictReader(rows))[1:]  # the first epoch holds the compilation
    steps = sum(int(r["epoch_steps"]) for r in epochs_rows)
    wall = sum(float(r["epoch_s"]) for r in epochs_rows)
    outside = steps * batch / wall
    return {
        "reported_samples_per_s": timing["samples_per_s"],
        "epochs_wall_samples_per_s": outside,
        "median_step_samples_per_s": batch / timing["step_time_s"],
        "reported_vs_wall": timing["samples_per_s"] / outside - 1,
        "median_vs_wall": batch / timing["step_time_s"] / outside - 1,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    runs = []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory() as folder:
            runs.append(one_run(args.epochs, Path(folder)))
        print(json.dumps({"repeat": repeat, **runs[-1]}))
    medians = benchlib.medians(runs)
    print("median:", json.dumps(medians, indent=1))
    if args.out:
        benchlib.write_json(args.out, {"epochs": args.epochs, "runs": runs, "median": medians}, indent=1)


if __name__ == "__main__":
    main()
