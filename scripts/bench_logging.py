"""Benchmarks what meshrun's logging and progress display cost per training step on the seeds'
model (dense_model with its layout), against the same training with neither.

One process, 8 emulated CPU devices, two measurements:

1. Interleaved (the verdict). One run of 9 epochs with the default logging (log.jsonl and the
   progress bar), and one with everything (TensorBoard and CSV too), in which the step log and
   the bar take steps only in epochs 2, 4, 6 and 8,
   against epochs 3, 5, 7 and 9 without (epoch 1 warms up). Each step's time is the gap between
   consecutive step ends; the cost is the mean step with logging over the mean without (means,
   so that the step log's writer thread, which writes in batches, is counted). Both halves share
   one run, so the drift between runs (about 10% over minutes on a 2-core machine) cancels out.
   The bar's redraws (twice a second, on rich's own thread) happen in both halves and are not
   counted; the last batch of an epoch's records may be written early in the next epoch.
2. Separate runs. Whole runs with nothing (no run dir, quiet), log.jsonl, log.jsonl and the bar,
   and everything alternate, their order rotated each repeat; each run's median step
   (timing.step_time_s) against nothing's. This includes the redraws, but run-to-run noise is
   larger than the effect.

The progress bar renders as on a terminal (TTY_COMPATIBLE=1), into /dev/null.

    python scripts/bench_logging.py                          # meshes 8x1 and 2x4
    python scripts/bench_logging.py --meshes 2x4 --repeats 3 --out bench_logging.json

Target: logging and progress cost at most 2% of step time (the verdict is on the default logging;
everything is reported beside it).
"""

from __future__ import annotations

import os

os.environ.setdefault("TTY_COMPATIBLE", "1")

import argparse
import contextlib
import statistics
import sys
import tempfile
import time
from pathlib import Path

from rich.console import Console

import benchlib

# (writes a run dir with log.jsonl, train.verbose, logging.tensorboard, logging.csv)
VARIANTS = {
    "nothing": (False, 0, False, False),
    "log.jsonl": (True, 0, False, False),
    "log.jsonl + progress bar": (True, 1, False, False),
    "everything": (True, 1, True, True),
}
INTERLEAVED_EPOCHS = 9
INTERLEAVED = {"default (log.jsonl + bar)": (False, False), "everything": (True, True)}  # (tensorboard, csv)
TARGET = 1.02


def arguments() -> argparse.Namespace:
    """The command line's settings."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--meshes", default="8x1,2x4")
    parser.add_argument(
        "--repeats", type=int, default=3, help="separate runs of each variant, and interleaved runs, per mesh"
    )
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument(
        "--num-samples",
        type=int,
        default=4096,
        help="per epoch of the separate runs (x2 for interleaved runs)",
    )
    parser.add_argument("--out", default="bench_logging.json")
    return parser.parse_args()


def ratios(runs: dict) -> dict:
    """Each variant's median step time and training seconds over those of the run that logs nothing."""
    base = {key: statistics.median(r[key] for r in runs["nothing"]) for key in ("step_ms", "train_s")}
    return {
        name: {key: statistics.median(r[key] for r in rows) / base[key] for key in base}
        for name, rows in runs.items()
    }


def main() -> None:
    args = arguments()
    meshes = args.meshes.split(",")
    from meshrun.placement import devices

    bench = Bench(benchlib.layout_rules("dense_model"), args.num_samples, args.epochs)
    first = bench.config(meshes[0], 0, False, False)
    devices.prepare(first.devices, first.mesh)  # the runs' emulated CPU devices, before jax is imported
    results = {
        "epochs": args.epochs,
        "num_samples": args.num_samples,
        "repeats": args.repeats,
        "interleaved": {mesh: {name: [] for name in INTERLEAVED} for mesh in meshes},
        "runs": {mesh: {name: [] for name in VARIANTS} for mesh in meshes},
    }
    with tempfile.TemporaryDirectory(prefix="bench-logging-") as work:
        for repeat in range(args.repeats):
            for mesh in meshes:
                for name in INTERLEAVED:
                    found = bench.interleaved_run(mesh, name, Path(work) / f"interleaved-{mesh}-{repeat}")
                    results["interleaved"][mesh][name].append(found)
                    print(
                        f"repeat {repeat + 1}, {mesh}, interleaved {name}: on {found['on_ms']:.3f} ms, "
                        f"off {found['off_ms']:.3f} ms, ratio {found['ratio']:.4f}",
                        flush=True,
                    )
            for mesh in meshes:
                for name in benchlib.rotated(list(VARIANTS), repeat):
                    found = bench.separate_run(mesh, name, Path(work) / f"{mesh}-{repeat}")
                    results["runs"][mesh][name].append(found)
                    print(f"repeat {repeat + 1}, {mesh}, {name}: step {found['step_ms']:.3f} ms", flush=True)
    results["ratios"] = {mesh: ratios(results["runs"][mesh]) for mesh in meshes}
    results["hook_us_per_step"] = hook_cost()
    benchlib.write_json(args.out, results)
    show(results)
    print(f"results: {args.out}")


class Bench:
    """The runs of the benchmark, all in this process: the seeds' model with its layout's `rules`,
    `samples` synthetic samples an epoch over `epochs` epochs (the interleaved runs: twice the
    samples over INTERLEAVED_EPOCHS). Their output goes to /dev/null."""

    def __init__(self, rules: dict, samples: int, epochs: int):
        self.rules, self.samples, self.epochs = rules, samples, epochs

    def config(self, mesh: str, verbose: int, tensorboard: bool, csv: bool, interleaved: bool = False):
        """The run config of one run on `mesh` with that logging."""
        from meshrun.config.parse import parse_run_config

        samples = self.samples * 2 if interleaved else self.samples
        return parse_run_config(
            {
                "mesh": {"shape": mesh},
                "layout": {"rules": self.rules},
                "model": {"name": "dense_model"},
                "data": {"name": "synthetic", "num_samples": samples, "eval_samples": 256},
                "train": {"epochs": INTERLEAVED_EPOCHS if interleaved else self.epochs, "verbose": verbose},
                "logging": {"tensorboard": tensorboard, "csv": csv},
            }
        )

    def interleaved_run(self, mesh: str, name: str, run_dir: Path) -> dict:
        """One run with logging `name` of INTERLEAVED taking steps in alternate epochs: the mean
        steps with and without, their ratio and the steps timed."""
        from meshrun.run.phases import RunContext, train

        tensorboard, csv = INTERLEAVED[name]
        config = self.config(mesh, 1, tensorboard, csv, interleaved=True)
        with gated_hooks() as gaps, quiet():
            train(config, RunContext(run_dir=f"{run_dir}-{tensorboard}"))
        on, off = statistics.mean(gaps[True]), statistics.mean(gaps[False])
        return {
            "on_ms": on * 1e3,
            "off_ms": off * 1e3,
            "ratio": on / off,
            "steps": len(gaps[True]) + len(gaps[False]),
        }

    def separate_run(self, mesh: str, name: str, run_dir: Path) -> dict:
        """One whole run with logging variant `name`: its median step and its training seconds after
        the first epoch."""
        from meshrun.run.phases import RunContext, train

        writes, verbose, tensorboard, csv = VARIANTS[name]
        with quiet():
            config = self.config(mesh, verbose, tensorboard, csv)
            where = f"{run_dir}-{name.replace(' ', '_')}" if writes else ""
            timing = train(config, RunContext(run_dir=where)).metrics.timing
        return {"step_ms": timing.step_time_s * 1e3, "train_s": sum(timing.epoch_s[1:])}


@contextlib.contextmanager
def quiet():
    """Sends stdout (the progress bar, Keras) to /dev/null while entered."""
    with open(os.devnull, "w") as devnull, contextlib.redirect_stdout(devnull):
        yield


@contextlib.contextmanager
def gated_hooks():
    """Lets the step log and the progress bar take steps only in even epochs (2, 4, ... counted
    from 1) and yields the step gaps measured meanwhile, by whether they did: {True: [...],
    False: [...]} in seconds. Epoch 1 and the first step of each epoch are left out."""
    from meshrun.logs.progress import EpochProgress
    from meshrun.training.steplog import StepLog

    gaps = {True: [], False: []}
    state = {"batch": None, "at": 0.0, "on": False}
    log_hook, bar_hook = StepLog.on_train_batch_end, EpochProgress.on_train_batch_end

    def timed_log_hook(self, batch, logs=None):  # the step log comes before the bar in the callbacks
        now = time.perf_counter()
        state["on"] = self._epoch % 2 == 1
        if self._epoch and batch and state["batch"] == batch - 1:
            gaps[state["on"]].append(now - state["at"])
        state.update(batch=batch, at=now)
        if state["on"]:
            log_hook(self, batch, logs)

    def gated_bar_hook(self, batch, logs=None):
        if state["on"]:
            bar_hook(self, batch, logs)

    StepLog.on_train_batch_end, EpochProgress.on_train_batch_end = timed_log_hook, gated_bar_hook
    try:
        yield gaps
    finally:
        StepLog.on_train_batch_end, EpochProgress.on_train_batch_end = log_hook, bar_hook


def hook_cost(calls: int = 5000) -> dict:
    """Microseconds of work per step of the step log (every sink; its hook and writing the records
    until closed) and of the progress bar (its hook), for `calls` steps outside training."""
    from meshrun.config.schema import TrainConfig
    from meshrun.logs.progress import EpochProgress
    from meshrun.logs.sinks import open_sinks
    from meshrun.training.steplog import StepLog

    costs = {}
    with tempfile.TemporaryDirectory(prefix="bench-logging-hooks-") as work, open(os.devnull, "w") as devnull:
        hooks = {
            "step log, every sink": StepLog(
                lambda: open_sinks(Path(work), {"tensorboard", "csv"}), TrainConfig(), calls, 0
            ),
            "progress bar": EpochProgress("bar", 1, 16, console=Console(file=devnull, force_terminal=True)),
        }
        for name, hook in hooks.items():
            hook.set_params({"steps": calls, "epochs": 1})
            hook.on_train_begin()
            hook.on_epoch_begin(0)
            started = time.perf_counter()
            for batch in range(calls):
                hook.on_train_batch_end(batch, {"loss": 0.5, "accuracy": 0.25})
            if isinstance(hook, StepLog):
                hook.close()  # waits for the writer thread to write every record
            costs[name] = (time.perf_counter() - started) / calls * 1e6
            hook.on_train_end()
    return costs


def show(results: dict) -> None:
    """The tables of both measurements, the hooks' own cost and the verdicts."""
    console = Console(
        width=max(Console().width, 110), force_terminal=sys.stdout.isatty()
    )  # TTY_COMPATIBLE is for the bar only
    console.print(interleaved_table(results))
    console.print(separate_table(results))
    hooks = results["hook_us_per_step"]
    console.print(
        "the hooks alone, outside training: "
        + ", ".join(f"{k} {v:.1f} µs per step" for k, v in hooks.items())
    )
    for mesh, variants in results["interleaved"].items():
        for name, rows in variants.items():
            ratio = statistics.median(r["ratio"] for r in rows)
            verdict = (
                f"target <= {TARGET}: {'PASS' if ratio <= TARGET else 'FAIL'}"
                if name.startswith("default")
                else "no target"
            )
            console.print(
                f"{mesh}, {name}: step time with logging and progress "
                f"/ without (interleaved): {ratio:.4f} ({verdict})"
            )


def interleaved_table(results: dict):
    """The interleaved runs: mean steps with and without logging, and their ratio (median of runs)."""
    table = benchlib.table(
        f"logging and progress in alternate epochs of one run ({INTERLEAVED_EPOCHS} epochs; mean steps)",
        (
            "mesh",
            "logging",
            "runs",
            "steps timed",
            "step ms, logging",
            "step ms, none",
            "ratio (median of runs)",
        ),
    )
    for mesh, variants in results["interleaved"].items():
        for name, rows in variants.items():
            table.add_row(
                mesh,
                name,
                str(len(rows)),
                str(rows[0]["steps"]),
                f"{statistics.median(r['on_ms'] for r in rows):.3f}",
                f"{statistics.median(r['off_ms'] for r in rows):.3f}",
                f"{statistics.median(r['ratio'] for r in rows):.4f}",
            )
    return table


def separate_table(results: dict):
    """The separate runs: each variant's median step and training time, and their ratios to nothing's."""
    table = benchlib.table(
        f"separate runs, order rotated ({results['epochs']} epochs, medians of {results['repeats']})",
        ("mesh", "variant", "step ms", "step ratio", "train s (epochs 2+)", "train ratio"),
    )
    for mesh, variants in results["runs"].items():
        for name, rows in variants.items():
            ratio = results["ratios"][mesh][name]
            table.add_row(
                mesh,
                name,
                f"{statistics.median(r['step_ms'] for r in rows):.3f}",
                f"{ratio['step_ms']:.3f}",
                f"{statistics.median(r['train_s'] for r in rows):.3f}",
                f"{ratio['train_s']:.3f}",
            )
    return table


if __name__ == "__main__":
    main()
