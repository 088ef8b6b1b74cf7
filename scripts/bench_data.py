"""Benchmarks meshrun's `data=arrays` source: its input pipeline against training, and its memory.

a. Throughput, the seeds' MLP (`model=dense_model`, 28x28x1 inputs, 10 regression targets, loss
   mse) on 8 devices, meshes 8x1 and 2x4. A .npz of --samples samples (and one of --eval-samples
   for evaluation) is written to a temp dir. Then:
   - pipeline: in this process, the training dataset `meshrun.data.make_datasets("arrays", ...)`
     builds for the run is iterated and every batch placed on the run's data sharding (the
     layout Keras gives a batch of that shape, `jax.make_array_from_process_local_data`, as Keras'
     jax trainer does), blocking on each: the samples/s the source delivers *sharded onto the
     devices* (median of --repeats passes of --epochs epochs). The same without placing (host
     numpy batches) is shown beside it.
   - training: `timing.samples_per_s` (global batch / median steady step) of real
     `meshrun train ... data=arrays` runs and of the same runs with `data=synthetic` (same sample
     counts, batch --batch, --epochs epochs, cache off), each a fresh process
     (meshrun.measure.run_measured), the two alternating, --repeats each (medians reported).
   Targets: pipeline / training >= 5 (the input pipeline is never the bottleneck) and arrays
   training within 5% of synthetic.
b. Memory: a .npy of float32 features of --big-gib GiB (shape (rows, 28, 28, 1), written in chunks
   through np.lib.format.open_memmap, so writing needs no RAM) and a .npy of labels, then
   `meshrun train model=dense_model data=arrays data.path=... data.labels_path=...
   data.validation_split=0.01 train.epochs=1 mesh=8x1 cache.enabled=false`. meshrun has no option
   that caps the steps of an epoch, so the run is bounded by a large global batch (--big-batch)
   over one whole epoch (every training row read once). Reported: the child's peak RSS (its own
   VmHWM, read from /proc; beside it the rusage figure of run_measured, which can include this
   process's peak, see RssSampler) against the file size, and, sampled every 0.2 s, its peak
   anonymous RSS (memory the process allocated) and file-backed RSS (pages of files it maps: a
   memory-mapped data file's touched pages count here, page cache the kernel could drop but RSS
   all the same). Target: peak RSS well under the file size. The big files are deleted
   afterwards; the part is skipped (and says so) when the disk lacks room.

    python scripts/bench_data.py --skip-big                     # part a only (about 3 minutes)
    python scripts/bench_data.py                                # a and b, 13 GiB file (about 7 minutes)
    python scripts/bench_data.py --only-big --big-gib 13        # part b only
    python scripts/bench_data.py --samples 16384 --repeats 3 --big-gib 4 --out bench_data.json
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import resource
import shutil
import statistics
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

import benchlib
from meshrun.measure import run_measured

BASE_ENV = dict(os.environ)  # the children's environment, before this process sets up jax
INPUT_SHAPE = (28, 28, 1)
CLASSES = 10
ROW_BYTES = int(np.prod(INPUT_SHAPE)) * 4
GiB = 2**30


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16384, help="training samples in the .npz (part a)")
    parser.add_argument("--eval-samples", type=int, default=256)
    parser.add_argument("--batch", type=int, default=16, help="global batch size (part a)")
    parser.add_argument("--epochs", type=int, default=2, help="epochs of each training run (part a)")
    parser.add_argument("--meshes", nargs="+", default=["8x1", "2x4"])
    parser.add_argument(
        "--layout", default="dense_model", help="layout of every run (dense_model: the seeds' rules)"
    )
    parser.add_argument("--repeats", type=int, default=2, help="training runs per mesh and source (part a)")
    parser.add_argument("--big-gib", type=float, default=13.0, help="size of the big feature file (part b)")
    parser.add_argument("--big-batch", type=int, default=8192, help="global batch of the big run (part b)")
    parser.add_argument("--big-dir", default=None, help="where the big files go (default: the temp dir)")
    parser.add_argument("--skip-big", action="store_true", help="skip part b")
    parser.add_argument("--only-big", action="store_true", help="skip part a")
    parser.add_argument(
        "--timeout", type=float, default=900, help="seconds before a training process is killed"
    )
    parser.add_argument("--out", default="bench_data.json")
    args = parser.parse_args()

    # Other processes on the machine skew every figure here: the load averages say how busy it was.
    results = {
        "throughput": None,
        "memory": None,
        "args": vars(args),
        "cpus": os.cpu_count(),
        "loadavg_start": os.getloadavg(),
    }
    if not args.only_big:
        with tempfile.TemporaryDirectory(prefix="bench-data-") as work:
            results["throughput"] = throughput(args, Path(work))
        benchlib.write_json(args.out, results)
    if args.skip_big:
        results["memory"] = {"skipped": "--skip-big"}
    else:
        results["memory"] = memory(args)
    results["loadavg_end"] = os.getloadavg()
    benchlib.write_json(args.out, results)
    show(results)
    print(f"results: {args.out}")


# --- a. throughput ------------------------------------------------------------------------------


def throughput(args, work: Path) -> dict:
    """Part a: for each mesh, the pipeline's rate and the training runs' of both sources."""
    train_file, eval_file = work / "train.npz", work / "eval.npz"
    rng = np.random.default_rng(0)
    write_npz(train_file, args.samples, rng)
    write_npz(eval_file, args.eval_samples, rng)
    print(f"wrote {train_file} ({train_file.stat().st_size / 2**20:.1f} MiB, {args.samples} samples)")
    rows = []
    for shape in args.meshes:
        pipeline = pipeline_rate(shape, args, train_file, eval_file)
        print(
            f"mesh {shape}: pipeline {pipeline['sharded_samples_per_s']:,.0f} samples/s sharded, "
            f"{pipeline['host_samples_per_s']:,.0f} on the host"
        )
        runs = train_rates(shape, args, train_file, eval_file, work)
        arrays = statistics.median(r["samples_per_s"] for r in runs["arrays"])
        synthetic = statistics.median(r["samples_per_s"] for r in runs["synthetic"])
        rows.append(
            {
                "mesh": shape,
                **pipeline,
                "train_arrays_samples_per_s": arrays,
                "train_synthetic_samples_per_s": synthetic,
                "pipeline_over_training": pipeline["sharded_samples_per_s"] / arrays,
                "arrays_over_synthetic": arrays / synthetic,
                "runs": runs,
            }
        )
    return {
        "samples": args.samples,
        "eval_samples": args.eval_samples,
        "batch": args.batch,
        "epochs": args.epochs,
        "layout": args.layout,
        "file_bytes": train_file.stat().st_size,
        "meshes": rows,
    }


def write_npz(path: Path, count: int, rng) -> None:
    """A .npz of `count` random samples: x (the MLP's inputs) and y (its regression targets)."""
    np.savez(
        path,
        x=rng.standard_normal((count, *INPUT_SHAPE), dtype=np.float32),
        y=rng.standard_normal((count, CLASSES), dtype=np.float32),
    )


def pipeline_rate(shape: str, args, train_file: Path, eval_file: Path) -> dict:
    """Samples/s of the run's arrays training dataset in this process: host batches alone, and
    batches placed on the run's data sharding (blocking on each)."""
    train, shardings, steps = arrays_pipeline(shape, args, train_file, eval_file)
    hosts = [samples_per_s(train, None, steps, args.batch) for _ in range(args.repeats)]
    sharded = [samples_per_s(train, shardings, steps, args.batch) for _ in range(args.repeats)]
    return {
        "host_samples_per_s": statistics.median(hosts),
        "sharded_samples_per_s": statistics.median(sharded),
        "host_runs": hosts,
        "sharded_runs": sharded,
        "pipeline_steps": steps,
        "x_sharding": str(shardings[0].spec),
        "y_sharding": str(shardings[1].spec),
    }


def arrays_pipeline(shape: str, args, train_file: Path, eval_file: Path):
    """The training dataset data=arrays makes for a run on mesh `shape` (this process set up with
    its emulated CPU devices), the shardings of its batches' x and y, and the steps of --epochs."""
    from meshrun.config.parse import parse_run_config
    from meshrun.placement import devices

    config = parse_run_config(
        {
            "mesh": {"shape": shape},
            "layout": {"rules": benchlib.layout_rules(args.layout)},
            "model": {"name": "dense_model"},
            "data": {"name": "arrays", "path": str(train_file), "eval_path": str(eval_file)},
            "train": {"batch_size": args.batch},
            "devices": {"platform": "cpu"},
        }
    )
    devices.prepare(config.devices, config.mesh)  # before jax is imported: 8 emulated CPU devices
    from meshrun import data as data_lib
    from meshrun.models import get_model
    from meshrun.placement import distribution as distribution_lib

    device_set = devices.discover(config.devices, config.mesh)
    distribution = distribution_lib.make_distribution(
        device_set.mesh, config.layout.rules, device_set.devices
    )
    context = data_lib.DataContext(
        model=get_model("dense_model"),
        model_options=config.model.options,
        batch_size=args.batch,
        seed=config.train.seed,
    )
    datasets = data_lib.make_datasets("arrays", config.data.options, context)
    x_spec, y_spec = datasets.train.element_spec
    shardings = (
        distribution.get_data_layout(tuple(x_spec.shape)).backend_layout,
        distribution.get_data_layout(tuple(y_spec.shape)).backend_layout,
    )
    return datasets.train, shardings, datasets.steps_per_epoch * args.epochs


def samples_per_s(train, shardings, steps: int, batch_size: int) -> float:
    """Samples/s of `steps` batches of `train` after 20 of warm-up (the first reads and
    placements): each placed on `shardings` and waited for, or (None) the host batches alone."""
    import jax

    batches = iter(train)
    for _ in range(20):
        batch = next(batches)
    started = time.perf_counter()
    for _ in range(steps):
        batch = next(batches)
        if shardings is not None:
            jax.block_until_ready(
                [jax.make_array_from_process_local_data(s, b) for s, b in zip(shardings, batch, strict=True)]
            )
    return steps * batch_size / (time.perf_counter() - started)


def train_rates(shape: str, args, train_file: Path, eval_file: Path, work: Path) -> dict:
    """--repeats training runs on mesh `shape` of each source, the two alternating: their figures."""
    runs = {"arrays": [], "synthetic": []}
    for repeat, source in benchlib.interleaved(args.repeats, ("arrays", "synthetic")):
        run = train_rate(shape, source, args, train_file, eval_file, work / f"{shape}-{source}-{repeat}")
        runs[source].append(run)
        print(
            f"mesh {shape}, {source} run {repeat + 1}/{args.repeats}: {run['samples_per_s']:,.0f} "
            f"samples/s (step {run['step_time_s'] * 1e3:.2f} ms over "
            f"{run['steady_steps']} steps), wall {run['wall_s']:.1f} s"
        )
    return runs


def train_rate(shape: str, source: str, args, train_file: Path, eval_file: Path, run_dir: Path) -> dict:
    data = (
        ["data=arrays", f"data.path={train_file}", f"data.eval_path={eval_file}"]
        if source == "arrays"
        else ["data=synthetic", f"data.num_samples={args.samples}", f"data.eval_samples={args.eval_samples}"]
    )
    done, metrics = benchlib.train(
        [
            "model=dense_model",
            f"layout={args.layout}",
            f"mesh={shape}",
            *data,
            f"train.batch_size={args.batch}",
            f"train.epochs={args.epochs}",
            "train.verbose=0",
            "cache.enabled=false",
            "devices.platform=cpu",
        ],
        run_dir,
        f"train mesh={shape} data={source}",
        timeout=args.timeout,
        env=BASE_ENV,
    )
    assert metrics["data"]["train_samples"] == args.samples, metrics["data"]
    timing = metrics["timing"]
    return {
        "samples_per_s": timing["samples_per_s"],
        "step_time_s": timing["step_time_s"],
        "steady_steps": timing["steady_steps"],
        "wall_s": done.wall_s,
        "peak_rss_bytes": done.peak_rss_bytes,
    }


# --- b. memory ----------------------------------------------------------------------------------


def memory(args) -> dict:
    """Part b: one epoch over a big .npy (written first, deleted after); the run's memory against
    the file's size. Skipped when the disk lacks room."""
    folder = Path(args.big_dir or tempfile.gettempdir())
    rows = int(args.big_gib * GiB) // ROW_BYTES
    needed = rows * (ROW_BYTES + CLASSES * 4) + 2 * GiB
    free = shutil.disk_usage(folder).free
    if free < needed:
        print(f"part b skipped: {folder} has {free / GiB:.1f} GiB free, {needed / GiB:.1f} GiB needed")
        return {"skipped": f"{free / GiB:.1f} GiB free in {folder}, {needed / GiB:.1f} GiB needed"}
    work = Path(tempfile.mkdtemp(prefix="bench-data-big-", dir=folder))
    try:
        x_file, y_file = work / "features.npy", work / "labels.npy"
        write_s = write_big_files(x_file, y_file, rows)
        return {
            "file_bytes": x_file.stat().st_size,
            "labels_bytes": y_file.stat().st_size,
            "rows": rows,
            "write_s": write_s,
            **big_run(args, x_file, y_file, work),
        }
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print(f"deleted {work}")


def write_big_files(x_file: Path, y_file: Path, rows: int) -> float:
    """Writes the big features and labels (write_big) in a process of its own; the seconds it took.
    The pages it writes through the map count in the writer's RSS, and a child meshrun started from
    a process with a high RSS mark would report that mark (see RssSampler), so this process stays
    small."""
    started = time.perf_counter()
    writer = multiprocessing.get_context("spawn").Process(target=write_big, args=(x_file, y_file, rows))
    writer.start()
    writer.join()
    if writer.exitcode != 0:
        raise SystemExit(f"writing the big files failed with status {writer.exitcode}")
    write_s = time.perf_counter() - started
    size = x_file.stat().st_size
    print(f"wrote {x_file} ({size / GiB:.2f} GiB, {rows:,} rows) and {y_file} in {write_s:.0f} s")
    return write_s


def big_run(args, x_file: Path, y_file: Path, work: Path) -> dict:
    """One epoch of `meshrun train` over the big files, its child's memory sampled meanwhile: the
    run's figures."""
    run_dir = work / "run"
    command = [
        "train",
        "model=dense_model",
        f"layout={args.layout}",
        "data=arrays",
        f"data.path={x_file}",
        f"data.labels_path={y_file}",
        "data.validation_split=0.01",
        "train.epochs=1",
        "mesh=8x1",
        f"train.batch_size={args.big_batch}",
        "train.verbose=0",
        "cache.enabled=false",
        "devices.platform=cpu",
        f"hydra.run.dir={run_dir}",
    ]
    own_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    sampler = RssSampler()
    sampler.start()
    try:
        done = run_measured(command, work, timeout=args.timeout, env=BASE_ENV)
    finally:
        sampler.stop()
    benchlib.succeeded(done, "the big run")
    metrics = benchlib.read_metrics(run_dir)
    data = metrics["data"]
    return {
        "batch": args.big_batch,
        "steps": metrics["train"]["steps_per_epoch"],
        "train_samples": data["train_samples"],
        "eval_samples": data["eval_samples"],
        # read in place: `read_by_rows` (the pread reader), `memory_mapped` in earlier meshrun
        "read_in_place": data.get("read_by_rows", data.get("memory_mapped")),
        "wall_s": done.wall_s,
        "samples_per_s": metrics["timing"]["samples_per_s"],
        "epoch_s": metrics["timing"]["epoch_s"],
        # The child's own peak: its VmHWM (its memory since exec), read at the last sample.
        "peak_rss_bytes": sampler.peak.get("VmHWM"),
        "peak_rss_over_file": (sampler.peak.get("VmHWM") or 0) / x_file.stat().st_size,
        "rusage_peak_rss_bytes": done.peak_rss_bytes,
        "bench_process_peak_rss_bytes": own_peak,
        "peak_sampled_rss_bytes": sampler.peak.get("VmRSS"),
        "peak_anon_rss_bytes": sampler.peak.get("RssAnon"),
        "peak_file_rss_bytes": sampler.peak.get("RssFile"),
        "samples_taken": sampler.samples,
    }


def write_big(x_file: Path, y_file: Path, rows: int, chunk: int = 65536) -> None:
    """Random-normal features and labels, the features written a chunk at a time through a memory
    map (one random chunk, reused: the content does not matter here)."""
    rng = np.random.default_rng(0)
    block = rng.standard_normal((chunk, *INPUT_SHAPE), dtype=np.float32)
    features = np.lib.format.open_memmap(x_file, mode="w+", dtype=np.float32, shape=(rows, *INPUT_SHAPE))
    for start in range(0, rows, chunk):
        stop = min(rows, start + chunk)
        features[start:stop] = block[: stop - start]
        if (start // chunk) % 64 == 63:
            features.flush()  # written back as we go, so dirty pages do not pile up
    features.flush()
    del features
    np.save(y_file, rng.standard_normal((rows, CLASSES), dtype=np.float32))


class RssSampler:
    """Samples the memory of this process's child (the meshrun run started from the main thread)
    from /proc every `interval` seconds, keeping the peak of each figure.

    VmHWM is the child's own high-water mark since its exec, so its last sample is the child's
    peak RSS whatever the sampling missed. The rusage figure of run_measured (ru_maxrss from
    os.wait4) is not always the child's own: Python starts children with vfork, and at exec the
    kernel folds the high-water mark of the memory the child borrowed, this process's, into the
    child's ru_maxrss; so it reads max(child, this process)."""

    FIELDS = ("VmRSS", "RssAnon", "RssFile", "RssShmem", "VmHWM")

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.peak: dict[str, int] = {}
        self.samples = 0
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._children = Path(f"/proc/{os.getpid()}/task/{threading.main_thread().native_id}/children")

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._done.set()
        self._thread.join()

    def _run(self) -> None:
        while not self._done.wait(self.interval):
            try:
                for pid in self._children.read_text().split():
                    self._sample(Path(f"/proc/{pid}/status"))
            except OSError:
                continue

    def _sample(self, status: Path) -> None:
        try:
            text = status.read_text()
        except OSError:
            return
        self.samples += 1
        for line in text.splitlines():
            name, _, value = line.partition(":")
            if name in self.FIELDS:
                size = int(value.split()[0]) * 1024
                self.peak[name] = max(self.peak.get(name, 0), size)


# --- reporting ----------------------------------------------------------------------------------


def show_throughput(console, a: dict) -> None:
    """Part a's table: per mesh, the pipeline's rates and the training runs', with the targets."""
    table = benchlib.table(
        f"data=arrays vs training: dense_model, {a['samples']} samples, batch {a['batch']}, "
        f"{a['epochs']} epochs, layout {a['layout']}",
        (
            "mesh",
            "pipeline host",
            "pipeline sharded",
            "train arrays",
            "train synthetic",
            "pipeline / train (>= 5)",
            "arrays / synthetic (>= 0.95)",
        ),
        left=(),
    )
    for row in a["meshes"]:
        ratio, parity = row["pipeline_over_training"], row["arrays_over_synthetic"]
        table.add_row(
            row["mesh"],
            f"{row['host_samples_per_s']:,.0f}/s",
            f"{row['sharded_samples_per_s']:,.0f}/s",
            f"{row['train_arrays_samples_per_s']:,.0f}/s",
            f"{row['train_synthetic_samples_per_s']:,.0f}/s",
            f"{ratio:.1f} {'PASS' if ratio >= 5 else 'FAIL'}",
            f"{parity:.3f} {'PASS' if parity >= 0.95 else 'FAIL'}",
        )
    console.print(table)


def show(results: dict) -> None:
    """Both parts' tables."""
    console = benchlib.console(120)
    if results["throughput"] is not None:
        show_throughput(console, results["throughput"])
    b = results["memory"]
    table = benchlib.table(
        "data=arrays memory: one epoch over a big .npy, mesh 8x1", ("measure", "value"), left=("measure",)
    )
    if b.get("skipped"):
        table.add_row("skipped", b["skipped"])
    else:
        table.add_row(
            "feature file",
            f"{b['file_bytes'] / GiB:.2f} GiB ({b['rows']:,} rows; labels {b['labels_bytes'] / GiB:.2f} GiB)",
        )
        table.add_row(
            "run",
            f"batch {b['batch']}, {b['steps']} steps, {b['train_samples']:,} train + "
            f"{b['eval_samples']:,} eval samples, wall {b['wall_s']:.0f} s",
        )
        table.add_row("read in place (not loaded whole)", str(b["read_in_place"]))
        table.add_row(
            "peak RSS of the run (its VmHWM)",
            f"{b['peak_rss_bytes'] / GiB:.2f} GiB = {b['peak_rss_over_file']:.3f} x the file",
        )
        table.add_row(
            "peak RSS by rusage (run_measured)",
            f"{b['rusage_peak_rss_bytes'] / GiB:.2f} GiB "
            f"(this process's own peak: {b['bench_process_peak_rss_bytes'] / GiB:.2f} GiB)",
        )
        for key, label in (
            ("peak_anon_rss_bytes", "peak anonymous RSS (sampled)"),
            ("peak_file_rss_bytes", "peak file-backed RSS (sampled)"),
        ):
            table.add_row(label, "n/a" if b[key] is None else f"{b[key] / GiB:.2f} GiB")
    console.print(table)


if __name__ == "__main__":
    main()
