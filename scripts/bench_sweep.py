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
import statistics
import tempfile
from pathlib import Path

import benchlib
from meshrun.measure import run_measured

SHAPES = ("8x1", "4x2", "2x4", "1x8")


def main() -> None:
    args = parse_args()
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
        sweep, separate = sweep_and_separate_walls(common)
        sweeps.append(sweep)
        separates.append(separate)
        print(
            f"repeat {repeat + 1}/{args.repeats}: sweep "
            f"{sweeps[-1]:.1f} s, separate runs {separates[-1]:.1f} s"
        )
    results = {
        "model": args.model,
        "layout": layout,
        "epochs": args.epochs,
        "num_samples": args.num_samples,
        "sweep_wall_s": sweeps,
        "separate_runs_wall_s": separates,
        "sweep_over_separate": statistics.median(sweeps) / statistics.median(separates),
        "cache": cache_runs(common),
    }
    benchlib.write_json(args.out, results)
    show(results)
    print(f"results: {args.out}")


def parse_args():
    """The command line's settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="dense_model")
    parser.add_argument(
        "--layout", default=None, help="default: the model's own layout (dense_model: dense_model)"
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--num-samples", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--out", default="bench_sweep.json")
    return parser.parse_args()


def sweep_and_separate_walls(common: list[str]) -> tuple[float, float]:
    """The wall seconds of one `meshrun sweep` over SHAPES and the sum of those of one `meshrun
    train` per shape, the compilation cache off."""
    with tempfile.TemporaryDirectory(prefix="bench-sweep-") as work:
        sweep = run_measured(
            ["sweep", *common, "cache.enabled=false", f"hydra.sweep.dir={work}/sweep"], work, timeout=1800
        )
        benchlib.succeeded(sweep, "sweep")
        separate = 0.0
        for shape in SHAPES:
            single, _ = benchlib.train(
                [f"mesh={shape}", *common, "cache.enabled=false"],
                Path(work) / shape,
                f"train mesh={shape}",
                cwd=work,
            )
            separate += single.wall_s
    return sweep.wall_s, separate


def cache_runs(common: list[str]) -> list[dict]:
    """The same run twice with one compilation cache dir, empty at first: compile time, time to the
    first step and wall of each."""
    runs = []
    with tempfile.TemporaryDirectory(prefix="bench-cache-") as work:
        for attempt in ("first (empty cache)", "second (cache filled)"):
            done, metrics = benchlib.train(
                ["mesh=2x4", *common, f"cache.dir={work}/xla"],
                Path(work) / attempt.split()[0],
                f"cache {attempt}",
                cwd=work,
            )
            timing = metrics["timing"]
            runs.append(
                {
                    "run": attempt,
                    "compile_s": timing["compile_s"],
                    "time_to_first_step_s": timing["time_to_first_step_s"],
                    "wall_s": done.wall_s,
                }
            )
    return runs


def show(results: dict) -> None:
    """The table of walls and cache figures, with the verdict."""
    console = benchlib.console(100)
    title = f"meshrun sweep vs separate runs ({results['model']}, {results['epochs']} epochs)"
    table = benchlib.table(title, ("measure", "value"))
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
