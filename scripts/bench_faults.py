"""Benchmarks what the data feed and the allocator cost a training step: minor page faults, step
time and resident memory, measured inside fresh `meshrun train` processes, optionally against
another checkout ("before").

Jobs (one device unless named):
  llama-1x1   a KerasHub Llama (2 layers, vocab 512, hidden 64), batches of 8 x 32 tokens, synthetic data
  llama-2x4   the same on a 2x4 mesh of emulated CPU devices
  generator   the zoo transformer (preset tiny, vocab 256, 64 tokens, batch 16) fed by data=python with
              a factory returning a tf.data.Dataset.from_generator
  slices      the same data through tf.data.Dataset.from_tensor_slices
  long        (--long) the generator job for 5,000 steps: resident memory over the run

Every run is a fresh process started through a small wrapper that notes, at the end of every
training step (the hook of meshrun's StepTimer, which every checkout has), the process's minor page
faults, its resident memory and the time; so a checkout that does not report faults itself is
measured the same way. Per job: the median step time and the median and mean faults of the steps
after the first 50 (gaps between step ends inside an epoch), resident memory after step 50 and at
the end, and what metrics.json says of the loader. With --before, each repeat runs the other
checkout right before this one. Timings swing between processes on a shared machine; the fault
counts do not.

    python scripts/bench_faults.py                       # the four short jobs, 2 repeats, about 3 minutes
    python scripts/bench_faults.py --long --jobs long    # 5,000 steps over a generator, about 3 minutes
    git worktree add /tmp/meshrun-before <commit> && ln -s ../configs /tmp/meshrun-before/meshrun/configs
    python scripts/bench_faults.py --before /tmp/meshrun-before --out bench_faults.json

It is a measurement: it exits 0 whatever the figures, 1 when a run fails.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

from rich.console import Console

import benchlib
from meshrun.launch.spawn import Role, spawn

WARMUP_STEPS = 50
LLAMA = [
    "model=keras_hub",
    "model.task=LlamaCausalLM",
    "model.seq_len=32",
    "train.batch_size=8",
    "model.backbone={vocabulary_size:512,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}",
    "data.num_samples=2048",
    "data.eval_samples=64",
    "train.epochs=1",
]
TOKENS = [
    "model=transformer",
    "model.vocab=256",
    "model.seq_len=64",
    "mesh=1x1",
    "data=python",
    "train.batch_size=16",
    "data.eval_samples=320",
    "train.eval_every=1",
]
JOBS = {
    "llama-1x1": [*LLAMA, "mesh=1x1"],
    "llama-2x4": [*LLAMA, "mesh=2x4"],
    "generator": [
        *TOKENS,
        "data.factory=bench_faults_data:generated",
        "+data.kwargs.samples=4096",
        "data.num_samples=4096",
        "train.epochs=2",
    ],
    "slices": [
        *TOKENS,
        "data.factory=bench_faults_data:sliced",
        "+data.kwargs.samples=4096",
        "train.epochs=2",
    ],
    "long": [
        *TOKENS,
        "data.factory=bench_faults_data:generated",
        "+data.kwargs.samples=40000",
        "data.num_samples=40000",
        "train.epochs=2",
    ],
}
SHORT_JOBS = ("llama-1x1", "llama-2x4", "generator", "slices")

DATA_MODULE = '''
"""Token sequences t_i = (start + i * stride) mod vocab, as tf.data pipelines."""
import numpy as np
import tensorflow as tf


def _rows(split, seed, samples, seq_len, vocab):
    rng = np.random.default_rng(seed + (split == "eval"))
    start, stride = rng.integers(0, vocab, size=(samples, 1)), rng.integers(1, 8, size=(samples, 1))
    return ((start + stride * np.arange(seq_len + 1)) % vocab).astype(np.int32)


def generated(split, seed, samples=4096, seq_len=64, vocab=256):
    rows = _rows(split, seed, samples if split == "train" else 320, seq_len, vocab)

    def each():
        for row in rows:
            yield row[:-1], row[1:]

    spec = tf.TensorSpec((seq_len,), tf.int32)
    return tf.data.Dataset.from_generator(each, output_signature=(spec, spec))


def sliced(split, seed, samples=4096, seq_len=64, vocab=256):
    rows = _rows(split, seed, samples if split == "train" else 320, seq_len, vocab)
    return tf.data.Dataset.from_tensor_slices((rows[:, :-1], rows[:, 1:]))
'''

# Runs meshrun with every training step's end noted: (seconds, epoch, minor faults, resident bytes).
# meshrun imports its StepTimer after setting up jax, so the hook is put in when that module loads.
# meshrun ends its process with os._exit, which skips atexit.
_WRAPPER = """
import importlib.abc, importlib.machinery, json, os, resource, runpy, sys, time
NOTES, PAGE = [], os.sysconf('SC_PAGE_SIZE')

def note(timer):
    with open('/proc/self/statm') as statm:
        resident = int(statm.read().split()[1]) * PAGE
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    NOTES.append((time.perf_counter(), timer._epoch, faults, resident))

class Hook(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def find_spec(self, name, path, target=None):
        if name != 'meshrun.logs.step_timer':
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        self.inner = spec.loader
        spec.loader = self
        return spec
    def create_module(self, spec):
        return self.inner.create_module(spec)
    def exec_module(self, module):
        self.inner.exec_module(module)
        timer = module.StepTimer
        original = timer.on_train_batch_end
        def on_train_batch_end(self, batch, logs=None):
            original(self, batch, logs)
            note(self)
        timer.on_train_batch_end = on_train_batch_end

sys.meta_path.insert(0, Hook())
_exit = os._exit
def _exit_with_notes(status):
    with open(os.environ['BENCH_FAULTS_NOTES'], 'w') as out:
        json.dump(NOTES, out)
    _exit(status)
os._exit = _exit_with_notes
sys.argv = ['meshrun', *sys.argv[1:]]
runpy.run_module('meshrun', run_name='__main__', alter_sys=True)
"""


def steady(notes: list, column: int) -> list:
    """Differences of `column` between consecutive step ends inside an epoch, after the first
    WARMUP_STEPS of them."""
    gaps = [b[column] - a[column] for a, b in zip(notes, notes[1:], strict=False) if a[1] == b[1]]
    return gaps[WARMUP_STEPS:]


def run_job(name: str, checkout: str | None, work: Path) -> dict:
    """One fresh process of job `name` with this checkout's code or `checkout`'s; its figures."""
    env = benchlib.checkout_env(checkout)
    folder = Path(tempfile.mkdtemp(dir=work))
    (folder / "bench_faults_data.py").write_text(textwrap.dedent(DATA_MODULE))
    env["BENCH_FAULTS_NOTES"] = str(folder / "notes.json")
    args = ["train", "train.verbose=0", *JOBS[name], f"hydra.run.dir={folder / 'run'}"]
    with open(folder / "stderr.txt", "w") as err:
        process = spawn(
            args,
            Role.USER,
            stdout=subprocess.DEVNULL,
            stderr=err,
            env=env,
            cwd=folder,
            entry=("-c", _WRAPPER),
        )
        try:
            returncode = process.wait(timeout=900)
        except subprocess.TimeoutExpired:
            process.kill()
            returncode = process.wait()
    run_dir = folder / "run"
    metrics = benchlib.read_metrics(run_dir) if (run_dir / "metrics.json").exists() else {}
    if returncode != 0 or metrics.get("status") != "ok":
        return {
            "ok": False,
            "exit": returncode,
            "error": metrics.get("error") or (folder / "stderr.txt").read_text()[-2000:],
        }
    notes = json.loads((folder / "notes.json").read_text())
    faults, seconds = steady(notes, 2), steady(notes, 0)
    data = metrics.get("data", {})
    return {
        "ok": True,
        "steps": len(notes),
        "step_ms": statistics.median(seconds) * 1e3,
        "faults_median": statistics.median(faults),
        "faults_mean": statistics.mean(faults),
        "rss_at_warmup_mib": notes[WARMUP_STEPS][3] / 2**20,
        "rss_end_mib": notes[-1][3] / 2**20,
        "rss_by_step_mib": {
            i + 1: notes[i][3] / 2**20 for i in range(0, len(notes), max(1, len(notes) // 10))
        },
        "loader": data.get("loader", "(not reported)"),
        "allocator_restored": data.get("allocator_restored"),
        "losses": metrics.get("history", {}).get("loss"),
    }


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--jobs", nargs="+", choices=sorted(JOBS), help="jobs to run (default: the four short ones)"
    )
    parser.add_argument("--long", action="store_true", help="also run the 5,000-step generator job")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--before", help="another checkout to run in turns with this one")
    parser.add_argument("--out", help="write every figure to this JSON file")
    args = parser.parse_args()
    jobs = list(args.jobs or SHORT_JOBS) + (["long"] if args.long and "long" not in (args.jobs or ()) else [])
    checkouts = {"this": None, **({"before": args.before} if args.before else {})}
    results: dict = {job: {label: [] for label in checkouts} for job in jobs}
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench_faults-") as work:
        for job in jobs:
            for repeat in range(1 if job == "long" else args.repeats):
                for label, checkout in reversed(checkouts.items()):
                    figures = run_job(job, checkout, Path(work))
                    results[job][label].append(figures)
                    failed |= not figures["ok"]
                    said = (
                        f"{figures['step_ms']:.2f} ms/step, {figures['faults_median']:.0f} faults/step "
                        f"median, {figures['faults_mean']:.0f} mean"
                        if figures["ok"]
                        else f"FAILED: {figures['error'][-300:]}"
                    )
                    print(f"{job} {label} repeat {repeat + 1}: {said}", flush=True)
    report(results)
    if args.out:
        benchlib.write_json(
            args.out, {"machine": platform.node(), "cpus": os.cpu_count(), "results": results}, indent=1
        )
    return 1 if failed else 0


def report(results: dict) -> None:
    """The table of medians per job and checkout, and the long job's memory by step."""
    table = benchlib.table(
        "page faults, step time and memory per job (medians "
        f"of repeats; steps after the first {WARMUP_STEPS})",
        (
            "job",
            "code",
            "loader",
            "ms/step",
            "faults/step median",
            "faults/step mean",
            "RSS after warm-up",
            "RSS at end",
            "losses equal",
        ),
        left=("job", "code", "loader"),
    )
    for job, by_label in results.items():
        losses = {label: runs[0].get("losses") for label, runs in by_label.items() if runs and runs[0]["ok"]}
        for label, runs in by_label.items():
            good = [r for r in runs if r["ok"]]
            if not good:
                table.add_row(job, label, "-", "failed", "", "", "", "", "")
                continue

            def median(key, good=good):
                return statistics.median(r[key] for r in good)

            same = (
                "-"
                if len(losses) < 2
                else ("yes" if len({json.dumps(v) for v in losses.values()}) == 1 else "no")
            )
            table.add_row(
                job,
                label,
                str(good[0]["loader"]),
                f"{median('step_ms'):.2f}",
                f"{median('faults_median'):,.0f}",
                f"{median('faults_mean'):,.0f}",
                f"{median('rss_at_warmup_mib'):.0f} MiB",
                f"{median('rss_end_mib'):.0f} MiB",
                same,
            )
    Console(width=200).print(table)
    long_runs = [r for r in results.get("long", {}).get("this", []) if r["ok"]]
    for run in long_runs:
        curve = ", ".join(f"{step}: {mib:.0f}" for step, mib in run["rss_by_step_mib"].items())
        print(f"long: resident MiB by step: {curve}; end {run['rss_end_mib']:.0f} MiB")


if __name__ == "__main__":
    sys.exit(main())
