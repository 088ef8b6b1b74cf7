"""Benchmarks `meshrun sweep` against separate runs, and the persistent compilation cache.

1. Sweep vs separate runs: the wall time of one `meshrun sweep` over the 4 mesh shapes of 8
   devices (one process: imports and jax start-up are paid once) against the sum of
   4 separate `meshrun train mesh=...` processes of the same shapes. The compilation cache is off
   for both, so the difference is the shared start-up alone. Target: the sweep is faster.
2. Compilation cache: `timing.compile_s` (first step, compilation included) and the time to the
   first step of the same run twice in fresh processes with an empty cache dir: the second run loads
   its compiled programs.

    python scripts/bench_sweep.py                    # dense_model, 3 epochs, 2 repeats
    python scripts/bench_sweep.py --model transformer --repeats 1 --out bench_sweep.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from meshrun.measure import run_measured

SHAPES = ("8x1", "4x2", "2x4", "1x8")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dense_model")
    parser.add_argument(
        "--layout", default=None, help="default: the model's own layout (dense_model: dense_model)"
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-samples", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="bench_sweep.json")
    args = parser.parse_args()
    layout = args.layout or ("dense_model" if args.model == "dense_model" else None)
    common = [
        f"model={args.model}",
        *([f"layout={layout}"] if layout else []),
        "train.verbose=0",
        f"train.epochs={args.epochs}",
        f"data.num_samples={args.num_samples}",
    ]

    sweeps, separates = [], []
    for repeat in range(args.repeats):
        with tempfile.TemporaryDirectory(prefix="bench-sweep-") as work:
            sweep = run_measured(
                ["sweep", *common, "cache.enabled=false", f"hydra.sweep.dir={work}/sweep"], work, timeout=1800
            )
            check(sweep, "sweep")
            sweeps.append(sweep.wall_s)
            walls = []
            for shape in SHAPES:
                single = run_measured(
                    [
                        "train",
                        f"mesh={shape}",
                        *common,
                        "cache.enabled=false",
                        f"hydra.run.dir={work}/{shape}",
                    ],
                    work,
                    timeout=1800,
                )
                check(single, f"train mesh={shape}")
                walls.append(single.wall_s)
            separates.append(sum(walls))
        print(
            f"repeat {repeat + 1}/{args.repeats}: sweep "
            f"{sweeps[-1]:.1f} s, separate runs {separates[-1]:.1f} s"
        )

    cache_runs = []
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as work:
        for attempt in ("first (empty cache)", "second (cache filled)"):
            run_dir = Path(work) / attempt.split()[0]
            done = run_measured(
                ["train", "mesh=2x4", *common, f"cache.dir={work}/xla", f"hydra.run.dir={run_dir}"],
                work,
                timeout=1800,
            )
            check(done, f"cache {attempt}")
            timing = json.loads((run_dir / "metrics.json").read_text())["timing"]
            cache_runs.append(
                {
                    "run": attempt,
                    "compile_s": timing["compile_s"],
                    "time_to_first_step_s": timing["time_to_first_step_s"],
                    "wall_s": done.wall_s,
                }
            )

    results = {
        "model": args.model,
        "layout": layout,
        "epochs": args.epochs,
        "num_samples": args.num_samples,
        "sweep_wall_s": sweeps,
        "separate_runs_wall_s": separates,
        "sweep_over_separate": statistics.median(sweeps) / statistics.median(separates),
        "cache": cache_runs,
    }
    Path(args.out).write_text(json.dumps(results, indent=2) + "\n")
    show(results)
    print(f"results: {args.out}")


def check(done, what: str) -> None:
    if done.returncode != 0:
        raise SystemExit(f"{what} failed with status {done.returncode}:\n{done.stderr[-2000:]}")


def show(results: dict) -> None:
    console = Console(width=max(Console().width, 100))
    table = Table(title=f"meshrun sweep vs separate runs ({results['model']}, {results['epochs']} epochs)")
    for column in ("measure", "value"):
        table.add_column(column)
    sweep, separate = (
        statistics.median(results["sweep_wall_s"]),
        statistics.median(results["separate_runs_wall_s"]),
    )
    table.add_row("sweep of 4 shapes, wall (median)", f"{sweep:.1f} s")
    table.add_row("4 separate runs, summed wall (median)", f"{separate:.1f} s")
    verdict = "PASS" if sweep < separate else "FAIL"
    table.add_row("sweep / separate", f"{results['sweep_over_separate']:.2f} (target < 1: {verdict})")
    for run in results["cache"]:
        table.add_row(
            f"mesh 2x4, {run['run']}",
            f"compile {run['compile_s']:.2f} s, first step at "
            f"{run['time_to_first_step_s']:.2f} s, wall {run['wall_s']:.1f} s",
        )
    console.print(table)


if __name__ == "__main__":
    main()
