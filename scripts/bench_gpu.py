"""Benchmarks meshrun on whatever accelerators jax finds, against the same model hand-written in
plain Keras and, for the language models, as a pure `jax.jit` train step: how much the launcher
costs per step, and how far each is from the hardware's limit.

    python scripts/bench_gpu.py                                  # accelerators: 125m, 1b, MLP, Llama ~1B
    python scripts/bench_gpu.py --json-out bench_gpu.json        # also the figures as JSON
    python scripts/bench_gpu.py --models transformer-1b --repeats 5 --batch-size 4
    python scripts/bench_gpu.py --scale small                    # the small (CPU) set, anywhere
    python scripts/bench_gpu.py --profile                        # also a profiled meshrun run per model

Models (`--models`; without accelerators the small set runs, which CI runs so that it does not rot):
  full:  transformer-125m, transformer-1b (the zoo's presets; bf16 where the device has it),
         mlp (the seeds' MLP, a large batch), llama-1b (a KerasHub Llama of TinyLlama-1.1B's sizes)
  small: transformer-tiny, mlp, llama-tiny (float32, a few dozen steps each)

Each model runs as up to three variants, every run a fresh process (so the live peak memory,
a process's high-water mark, is each run's own), in alternating order across repeats:
  meshrun  the real CLI, `python -m meshrun train ...`, one epoch of synthetic data; read back
           from its metrics.json and log.jsonl
  keras    the same Keras model (built by meshrun's model code: plain Keras layers), compiled with the
           same loss, metrics and optimizer, trained by `model.fit` on numpy arrays with a small
           callback that notes when each step's results are ready
  jax      (language models) a jitted step from Keras' stateless APIs (`model.stateless_call`,
           `jax.value_and_grad`, `optimizer.stateless_apply`) on batches already on the devices

Step times are the gaps between consecutive step ends inside one process, the first `--warmup`
gaps after the first step left out; a run gives a median and a p90, and a variant the median of
those over the repeats. Ratios (meshrun/keras, meshrun/jax) are taken within each repeat and
their median reported, so slow drift between repeats cancels. Compile time is the first step
less a steady step, in the variant's first run: each variant has a compilation cache of its own,
from which its later repeats load the step (--no-cache: every run compiles). MFU is computed two ways, with
XLA's cost analysis of the step and with the analytic 6·N·tokens + attention (12·layers·d_model·seq_len per
token, PaLM's appendix B), each over the device's dense bf16 peak from meshrun's hardware table (n/a where it
has none, CPUs among them). Memory: the live peak the device reports (`memory_stats()`, n/a on CPU) against
the plan's parameters + optimizer state and XLA's compiled estimate of the step.

A run that runs out of device memory is retried with half the batch (every variant of that model
then uses it). It is a measurement: it exits 0 whatever the figures, 1 when a run failed (the
other models are still measured, and the JSON says which failed and why).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))  # meshrun's pure-Python parts (hardware table, model sizes), without installing

import benchlib
from meshrun.measure import run_measured

VARIANTS = ("meshrun", "keras", "jax")
OOM_MARKERS = ("RESOURCE_EXHAUSTED", "Out of memory", "out of memory")
RUN_TIMEOUT_S = 4 * 3600  # a meshrun run still going after this is killed (and counts as failed)
LANGUAGE_MODELS = ("transformer", "llama")
# Targets of issue 20 on one H100 (checked where the devices have a known peak, i.e. not on CPU).
TARGET_TAX = 1.03  # meshrun / keras step time
TARGET_MFU_1B = 0.40  # transformer-1b, XLA's FLOPs
TARGET_MEMORY = 0.20  # live peak within 20% of the plan's estimate
TINY_LLAMA = dict(
    vocabulary_size=512,
    num_layers=2,
    num_query_heads=8,
    num_key_value_heads=4,
    hidden_dim=64,
    intermediate_dim=128,
)
# TinyLlama-1.1B's sizes: 1.10e9 parameters, 4 KV heads (grouped-query attention), untied head.
LLAMA_1B = dict(
    vocabulary_size=32000,
    num_layers=22,
    num_query_heads=32,
    num_key_value_heads=4,
    hidden_dim=2048,
    intermediate_dim=5632,
)


@dataclass(frozen=True)
class Model:
    """One benchmarked model: its kind (transformer, mlp, llama), its options, the batch per device,
    steps per run and the variants it runs as."""

    name: str
    kind: str
    options: dict
    batch_per_device: int
    steps: int
    variants: tuple = VARIANTS[:2]

    @property
    def seq_len(self) -> int | None:
        """Tokens per sample of a language model (None for the MLP)."""
        if self.kind == "transformer":
            return _transformer_options(self.options).seq_len
        return self.options.get("seq_len") if self.kind == "llama" else None


CATALOG = {
    "full": (
        Model("transformer-125m", "transformer", {"preset": "125m"}, 32, 30, VARIANTS),
        Model("transformer-1b", "transformer", {"preset": "1b"}, 8, 20, VARIANTS),
        Model("mlp", "mlp", {}, 2048, 100),
        Model("llama-1b", "llama", {"backbone": LLAMA_1B, "seq_len": 2048}, 8, 20, VARIANTS),
    ),
    "small": (
        Model("transformer-tiny", "transformer", {"preset": "tiny"}, 16, 24, VARIANTS),
        Model("mlp", "mlp", {}, 16, 30),
        Model("llama-tiny", "llama", {"backbone": TINY_LLAMA, "seq_len": 32}, 8, 16),
    ),
}


# --- the orchestrator ------------------------------------------------------------------------------


def main():
    args = parse_args()
    if args.worker:
        return run_worker(json.loads(args.worker))
    started = time.perf_counter()
    try:
        environment = probe()
    except RunFailed as err:
        print(f"{err}\n{err.stderr[-4000:]}", file=sys.stderr)
        sys.exit(1)
    if environment["platform"] == "cpu":
        environment["device_count"] = args.cpu_devices
    scale = args.scale if args.scale != "auto" else ("small" if environment["platform"] == "cpu" else "full")
    args.repeats = args.repeats or (1 if scale == "small" else 2)
    args.warmup = args.warmup if args.warmup is not None else (2 if scale == "small" else 3)
    models, skipped = choose_models(args, scale)
    precision = args.precision or default_precision(environment)
    print(
        f"{environment['device_count']} x {environment['device_kind']} ({environment['platform']}), {scale} "
        f"set, precision {precision}, {args.repeats} repeat(s)",
        flush=True,
    )
    workdir = Path(args.workdir) if args.workdir else Path(tempfile.mkdtemp(prefix="bench_gpu-"))
    workdir.mkdir(parents=True, exist_ok=True)
    out = Path(args.json_out) if args.json_out else workdir / "bench_gpu.json"
    results, failed = {}, {}

    def report(complete: bool) -> dict:
        return {
            "environment": environment,
            "scale": scale,
            "precision": precision,
            "settings": settings(args),
            "models": results,
            "skipped": skipped,
            "failed": failed,
            "targets": targets(results, environment),
            "complete": complete,
            "wall_s": time.perf_counter() - started,
        }

    for model in models:
        model_started = time.perf_counter()
        try:
            results[model.name] = bench_model(model, environment, precision, args, workdir)
            results[model.name]["wall_s"] = time.perf_counter() - model_started
        except RunFailed as err:  # the other models are still measured
            print(f"{err}\n{err.stderr[-4000:]}", file=sys.stderr, flush=True)
            failed[model.name] = str(err)
        benchlib.write_json(out, report(complete=False))  # what is measured survives a benchmark cut short
    final = report(complete=True)
    print_report(final)
    benchlib.write_json(out, final)
    print(f"results: {out} ({final['wall_s']:.1f} s)")
    if failed:
        sys.exit(1)


def parse_args():
    """The command line's settings: what is measured, how the runs run, where the results go."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    add_measure_flags(parser)
    add_run_flags(parser)
    add_output_flags(parser)
    return parser.parse_args()


def add_measure_flags(parser: argparse.ArgumentParser) -> None:
    """What is measured: the models, their steps and batch, the repeats and the warm-up left out."""
    parser.add_argument(
        "--models", default=None, help="comma-separated names from the set (default: all of it)"
    )
    parser.add_argument(
        "--scale",
        choices=("auto", "small", "full"),
        default="auto",
        help="which set of models: full on accelerators, small on CPU (auto)",
    )
    parser.add_argument(
        "--steps", type=int, default=None, help="training steps per run (default: each model's)"
    )
    parser.add_argument(
        "--batch-size", type=int, default=None, help="batch per device (default: each model's)"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="runs of each variant (default: 2, small set 1)"
    )
    parser.add_argument(
        "--warmup",
        type=int,
        default=None,
        help="steady gaps left out after the first step (default: 3, small set 2)",
    )


def add_run_flags(parser: argparse.ArgumentParser) -> None:
    """How the runs run: precision, devices, the peak MFU is taken over, caching, profiles and
    meshrun's own overrides."""
    parser.add_argument(
        "--precision",
        default=None,
        help="float32 or mixed_bfloat16 (default: mixed_bfloat16 on GPUs of compute capability 8+ and TPUs)",
    )
    parser.add_argument(
        "--cpu-devices",
        type=int,
        default=1,
        help="without accelerators: how many CPU devices to "
        "emulate (more than 1 runs the data-parallel paths)",
    )
    parser.add_argument(
        "--peak-flops",
        type=float,
        default=None,
        help="peak FLOP/s of one device, where meshrun's table lacks the kind",
    )
    parser.add_argument(
        "--no-cache",
        action="store_true",
        help="compile in every run (default: each variant's "
        "later repeats load its first run's compiled steps)",
    )
    parser.add_argument(
        "--profile", action="store_true", help="also one untimed meshrun run per model with a profiler trace"
    )
    parser.add_argument(
        "--meshrun-override",
        action="append",
        default=[],
        help="extra Hydra override for meshrun (repeatable)",
    )


def add_output_flags(parser: argparse.ArgumentParser) -> None:
    """Where the results, the runs' dirs and caches go (and the internal flag of a worker)."""
    parser.add_argument("--json-out", default=None, help="results JSON (default: in the work dir)")
    parser.add_argument(
        "--workdir",
        default=None,
        help="where the runs' dirs, traces and caches go (default: a new temp dir, kept)",
    )
    parser.add_argument(
        "--worker", default=None, help=argparse.SUPPRESS
    )  # one run in this process (internal)


def settings(args) -> dict:
    """The command-line settings, as the JSON records them."""
    return {k: v for k, v in vars(args).items() if k != "worker"}


def choose_models(args, scale: str) -> tuple[list[Model], dict]:
    """The models of the set to run (with --steps and --batch-size applied) and those skipped, with why."""
    catalog = {m.name: m for m in CATALOG[scale]}
    names = args.models.split(",") if args.models else list(catalog)
    unknown = [n for n in names if n not in catalog]
    if unknown:
        sys.exit(f"unknown model(s) {unknown} in the {scale} set; valid: {', '.join(catalog)}")
    models, skipped = [], {}
    for name in names:
        model = catalog[name]
        if model.kind == "llama" and not _installed("keras_hub"):
            skipped[name] = "keras-hub is not installed (pip install -e '.[hub]')"
            continue
        model = replace(
            model, steps=args.steps or model.steps, batch_per_device=args.batch_size or model.batch_per_device
        )
        if model.steps < args.warmup + 4:
            sys.exit(
                f"--steps {model.steps} leaves too few steady steps after "
                f"--warmup {args.warmup}; use at least {args.warmup + 4}"
            )
        models.append(model)
    return models, skipped


def _installed(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is not None


def default_precision(environment: dict) -> str:
    """bf16 (Keras' mixed_bfloat16) where the device has bf16 tensor cores (NVIDIA compute
    capability 8.0 and up, TPUs), else float32."""
    if environment["platform"] == "tpu":
        return "mixed_bfloat16"
    capability = environment.get("compute_capability")
    if environment["platform"] == "gpu" and capability and float(capability) >= 8.0:
        return "mixed_bfloat16"
    return "float32"


def probe() -> dict:
    """The devices and versions, from a process of their own (jax here would hold the devices'
    memory for the whole benchmark)."""
    environment = worker_run({"role": "probe"})
    environment["python"] = platform.python_version()
    environment["driver"] = nvidia_driver()
    return environment


def nvidia_driver() -> str | None:
    """The NVIDIA driver version nvidia-smi reports, or None without one."""
    if not shutil.which("nvidia-smi"):
        return None
    done = subprocess.run(
        ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"], capture_output=True, text=True
    )
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() else None


def bench_model(model: Model, environment: dict, precision: str, args, workdir: Path) -> dict:
    """Every variant of `model`, `args.repeats` times in alternating order; on running out of device
    memory, all of it again with half the batch."""
    batch = model.batch_per_device
    while True:
        try:
            return measure_model(
                replace(model, batch_per_device=batch), environment, precision, args, workdir
            )
        except OutOfMemory as err:
            if batch == 1:
                raise RunFailed(
                    f"{model.name}: out of device memory even at batch 1 per device", err.stderr
                ) from None
            batch //= 2
            print(f"{model.name}: out of device memory; again with batch {batch} per device", flush=True)


def measure_model(model: Model, environment: dict, precision: str, args, workdir: Path) -> dict:
    """Runs the variants of `model` and summarises them."""
    devices, cpu = environment["device_count"], environment["platform"] == "cpu"
    runs = {variant: [] for variant in model.variants}
    tag = f"{model.name}-b{model.batch_per_device}"
    for repeat, variant in benchlib.interleaved(args.repeats, model.variants):
        # A compilation cache of the variant's own: its first run compiles, later ones load.
        cache = None if args.no_cache else workdir / "xla-cache" / f"{tag}-{variant}"
        run = run_variant(
            variant, model, devices, cpu, precision, args, workdir / f"{tag}-{variant}-{repeat}", cache
        )
        runs[variant].append(run)
        print(
            f"{model.name} {variant} repeat {repeat + 1}/{args.repeats}: step {_ms(run['step_s'])} "
            f"median, {_ms(run['step_p90_s'])} p90, first step {run['first_step_s']:.2f} s",
            flush=True,
        )
    profile = None
    if args.profile:
        profiled = run_meshrun(
            model, devices, precision, args, workdir / f"{tag}-profile", None, profile=True
        )
        profile = profiled["profile"]
    return summarise(model, devices, precision, runs, environment, args.peak_flops, profile)


def run_variant(
    variant: str,
    model: Model,
    devices: int,
    cpu: bool,
    precision: str,
    args,
    run_dir: Path,
    cache: Path | None,
) -> dict:
    """One run of one variant: its step statistics and what it reports. On CPU the hand-written
    variants get as many devices as meshrun emulates for its mesh."""
    if variant == "meshrun":
        return run_meshrun(model, devices, precision, args, run_dir, cache)
    spec = {
        "role": variant,
        "model": asdict(model),
        "devices": devices,
        "precision": precision,
        "batch_size": model.batch_per_device * devices,
    }
    run = worker_run(spec, cpu_devices=devices if cpu else None, cache=cache)
    run.update(step_stats(run["first_step_s"], run.pop("gaps"), args.warmup))
    return run


def run_meshrun(
    model: Model, devices: int, precision: str, args, run_dir: Path, cache: Path | None, profile: bool = False
) -> dict:
    """`python -m meshrun train` of `model` for one epoch of `steps` batches (meshrun.measure); its
    figures from metrics.json, its steps from log.jsonl."""
    command = meshrun_command(model, devices, precision, args, run_dir, cache, profile)
    done = run_measured(command, REPO, timeout=RUN_TIMEOUT_S, env=_child_env())
    if done.returncode != 0:
        _raise_if_out_of_memory(done.stderr)
        raise RunFailed(
            f"meshrun {model.name} failed (exit {done.returncode}): "
            f"{' '.join([sys.executable, '-m', 'meshrun', *command])}",
            done.stderr,
        )
    metrics = benchlib.read_metrics(run_dir)
    run = meshrun_figures(metrics, step_gaps(run_dir), args.warmup)
    run.update(
        run_dir=str(run_dir),
        process_wall_s=done.wall_s,
        profile=(metrics.get("profile") or {}).get("dir"),
    )
    return run


def meshrun_command(
    model: Model, devices: int, precision: str, args, run_dir: Path, cache: Path | None, profile: bool
) -> list[str]:
    """The `meshrun train` command and overrides of one run of `model` (with a profile of two
    steady steps where `profile`)."""
    batch = model.batch_per_device * devices
    command = [
        "train",
        *meshrun_model_overrides(model),
        f"mesh={devices}x1",
        f"train.batch_size={batch}",
        "train.epochs=1",
        f"data.num_samples={batch * model.steps}",
        f"data.eval_samples={batch}",
        "data.shuffle=false",
        "train.verbose=0",
        f"train.precision={precision}",
        "devices.platform=auto",
        *(["cache.enabled=true", f"cache.dir={cache}"] if cache else ["cache.enabled=false"]),
        f"hydra.run.dir={run_dir}",
        *args.meshrun_override,
    ]
    if profile:
        command.append(f"profile.steps=[{args.warmup + 2},{args.warmup + 4}]")
    return command


def step_gaps(run_dir: Path) -> list[float]:
    """The step times of a run's log.jsonl after its first step, in step order."""
    records = [json.loads(line) for line in (run_dir / "log.jsonl").read_text().splitlines() if line.strip()]
    return [
        r["step_s"]
        for r in sorted((r for r in records if "epoch_end" not in r), key=lambda r: r["step"])
        if r["step"] > 1
    ]


def meshrun_figures(metrics: dict, gaps: list[float], warmup: int) -> dict:
    """A meshrun run's step statistics (of `gaps`) and what its metrics.json reports."""
    timing, flops, memory = metrics["timing"], metrics["flops"], metrics["memory"]
    run = step_stats(timing["compile_s"], gaps, warmup)
    run.update(
        reported_step_s=timing["step_time_s"],
        reported_step_p90_s=timing["step_time_p90_s"],
        async_log_fetch=timing["async_log_fetch"],
        platform=metrics["devices"]["platform"],
        device_count=metrics["devices"]["count"],
        params=metrics["model"]["params"],
        xla_flops_per_step=flops["per_step"],
        reported_mfu=flops["mfu"],
        reported_analytic_per_step=flops["analytic_per_step"],
        live_peak_bytes=memory["live_peak_bytes_per_device"],
        compiled_peak_bytes=memory["peak_bytes_per_device"],
        planned_bytes=_sum(
            memory["planned_params_bytes_per_device"], memory["planned_optimizer_bytes_per_device"]
        ),
        precision=metrics["train"]["precision"],
    )
    return run


def meshrun_model_overrides(model: Model) -> list[str]:
    """The Hydra overrides that pick `model` (replicated layout: every device holds the whole model,
    as in the hand-written variants)."""
    if model.kind == "transformer":
        return [
            "model=transformer",
            *(f"model.{k}={v}" for k, v in model.options.items()),
            "layout=replicated",
        ]
    if model.kind == "mlp":
        return ["model=dense_model", "layout=replicated"]
    backbone = ",".join(f"{k}:{v}" for k, v in model.options["backbone"].items())
    return [
        "model=keras_hub",
        "model.task=LlamaCausalLM",
        f"model.backbone={{{backbone}}}",
        f"model.seq_len={model.options['seq_len']}",
        "layout=replicated",
    ]


def worker_run(spec: dict, cpu_devices: int | None = None, cache: Path | None = None) -> dict:
    """Runs this script as a worker on `spec` in a fresh process (with jax's compilation cache in
    `cache`, set up as meshrun sets up its own); returns what it wrote."""
    with tempfile.TemporaryDirectory() as scratch:
        out = Path(scratch) / "result.json"
        env = _child_env(cpu_devices)
        if cache:
            env.update(
                JAX_ENABLE_COMPILATION_CACHE="true",
                JAX_COMPILATION_CACHE_DIR=str(cache),
                JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS="0",
                JAX_PERSISTENT_CACHE_MIN_ENTRY_SIZE_BYTES="0",
            )
        env["BENCH_GPU_OUT"] = str(out)
        started = time.perf_counter()
        done = subprocess.run(
            [sys.executable, str(Path(__file__).resolve()), "--worker", json.dumps(spec)],
            capture_output=True,
            text=True,
            env=env,
            cwd=REPO,
        )
        wall = time.perf_counter() - started
        if done.returncode != 0:
            _raise_if_out_of_memory(done.stderr)
            raise RunFailed(
                f"worker {spec['role']} {spec.get('model', {}).get('name', '')} "
                f"failed (exit {done.returncode})",
                done.stderr,
            )
        return {**json.loads(out.read_text()), "process_wall_s": wall}


def _child_env(cpu_devices: int | None = None) -> dict:
    env = {
        **os.environ,
        "KERAS_BACKEND": "jax",
        "TF_CPP_MIN_LOG_LEVEL": os.environ.get("TF_CPP_MIN_LOG_LEVEL", "2"),
    }
    if cpu_devices:  # the hand-written variants use as many CPU devices as meshrun emulates
        env["JAX_NUM_CPU_DEVICES"] = str(cpu_devices)
    return env


class OutOfMemory(Exception):
    """A run ran out of device memory."""

    def __init__(self, stderr: str):
        super().__init__("out of device memory")
        self.stderr = stderr


def _raise_if_out_of_memory(stderr: str) -> None:
    if any(marker in stderr for marker in OOM_MARKERS):
        raise OutOfMemory(stderr)


class RunFailed(Exception):
    """A run failed: the benchmark goes on with the next model and exits 1 at the end."""

    def __init__(self, message: str, stderr: str = ""):
        super().__init__(message)
        self.stderr = stderr


def step_stats(first_step_s: float, gaps: list[float], warmup: int) -> dict:
    """A run's step figures: median and p90 of the steady gaps (the first `warmup` left out), and the
    first step's time (compilation included)."""
    steady = gaps[warmup:]
    if len(steady) < 2:
        raise ValueError(f"only {len(steady)} steady steps after {warmup} warm-up steps")
    from meshrun.logs.timing import percentile

    return {
        "first_step_s": first_step_s,
        "step_s": statistics.median(steady),
        "step_p90_s": percentile(steady, 90),
        "steady_steps": len(steady),
    }


# --- the figures -------------------------------------------------------------------------------------


def summarise(
    model: Model,
    devices: int,
    precision: str,
    runs: dict,
    environment: dict,
    peak_flops: float | None,
    profile: str | None,
) -> dict:
    """A model's figures: per variant the medians over its runs and the rates and MFU they give; the
    ratios between variants (medians of the per-repeat ratios); memory against the plan."""
    from meshrun.run import hardware

    batch = model.batch_per_device * devices
    tokens = batch * model.seq_len if model.seq_len else None
    meshrun_run = runs["meshrun"][0]
    analytic = analytic_flops(model, batch, meshrun_run["reported_analytic_per_step"])
    peak = peak_flops or (
        hardware.peak_flops(environment["device_kind"]) if environment["platform"] != "cpu" else None
    )
    variants = {
        name: variant_figures(variant_runs, batch, tokens, analytic["per_step"], devices, peak)
        for name, variant_runs in runs.items()
    }
    return {
        "kind": model.kind,
        "options": model.options,
        "batch_size": batch,
        "batch_per_device": model.batch_per_device,
        "tokens_per_step": tokens,
        "steps": model.steps,
        "precision": precision,
        "params": meshrun_run["params"],
        "analytic_flops": analytic,
        "peak_flops_per_device": peak,
        "variants": variants,
        "ratios": ratios(runs),
        "memory": memory_figures(runs),
        "profile": profile,
    }


def variant_figures(
    runs: list[dict], batch: int, tokens: int | None, analytic: float, devices: int, peak: float | None
) -> dict:
    """One variant's figures over its runs: step median and p90 (medians of the runs'), rates,
    compile time (of the first run: later ones may load it from the compilation cache), FLOPs and
    MFU both ways, live peak memory; and the runs themselves."""
    from meshrun.run import hardware

    step = statistics.median(r["step_s"] for r in runs)
    xla = benchlib.median_of(runs, "xla_flops_per_step")
    return {
        "step_s": step,
        "step_p90_s": statistics.median(r["step_p90_s"] for r in runs),
        "samples_per_s": batch / step,
        "tokens_per_s": tokens / step if tokens else None,
        "compile_s": max(runs[0]["first_step_s"] - runs[0]["step_s"], 0.0),
        "xla_flops_per_step": xla,
        "mfu_xla": hardware.mfu(xla / step, devices, peak) if xla else None,
        "mfu_analytic": hardware.mfu(analytic / step, devices, peak),
        "live_peak_bytes": benchlib.median_of(runs, "live_peak_bytes"),
        "runs": runs,
    }


def analytic_flops(model: Model, batch: int, meshrun_six_n: float | None) -> dict:
    """FLOPs of one train step by formula: 6·N per sample or token (N the parameters in matmuls)
    plus, for the language models, attention's score and value products, 12·layers·d_model·seq_len
    per token (PaLM, appendix B; a causal mask computes the full square all the same)."""
    if model.kind == "mlp":
        six_n = 6.0 * mlp_matmul_params(model.options) * batch
        return {"six_n": six_n, "attention": 0.0, "per_step": six_n}
    if model.kind == "transformer":
        from meshrun.models import transformer

        options = _transformer_options(model.options)
        six_n = transformer.analytic_flops(options, batch)
        layers, width = options.layers, options.d_model
    else:  # KerasHub: meshrun's own count of the built model's matmul parameters
        six_n = meshrun_six_n
        layers, width = model.options["backbone"]["num_layers"], model.options["backbone"]["hidden_dim"]
    attention = 12.0 * layers * width * model.seq_len * batch * model.seq_len
    return {
        "six_n": six_n,
        "attention": attention,
        "per_step": six_n + attention,
        "meshrun_six_n": meshrun_six_n,
    }


def mlp_matmul_params(options: dict) -> int:
    """Weights of the seeds' MLP that take part in a matmul: both kernels and the biases."""
    from meshrun.models.dense_model import DenseModelOptions

    o = DenseModelOptions(**options)
    inputs = math.prod(o.input_shape)
    return inputs * o.hidden + (o.hidden if o.d1_bias else 0) + o.hidden * o.num_classes + o.num_classes


def _transformer_options(options: dict):
    from meshrun.models.transformer import TransformerOptions

    return TransformerOptions(**options)


def ratios(runs: dict) -> dict:
    """Step-time ratios meshrun/keras, meshrun/jax and keras/jax: the median of the ratios within
    each repeat (the runs of one repeat are neighbours in time)."""
    pairs = [("meshrun", "keras"), ("meshrun", "jax"), ("keras", "jax")]
    return {
        f"{a}/{b}": statistics.median(
            x["step_s"] / y["step_s"] for x, y in zip(runs[a], runs[b], strict=False)
        )
        for a, b in pairs
        if a in runs and b in runs
    }


def memory_figures(runs: dict) -> dict:
    """Bytes per device: meshrun's plan (parameters + optimizer state), XLA's compiled estimate and
    the live peak of each variant; the live peak over each estimate."""
    meshrun_runs = runs["meshrun"]
    planned = benchlib.median_of(meshrun_runs, "planned_bytes")
    compiled = benchlib.median_of(meshrun_runs, "compiled_peak_bytes")
    live = benchlib.median_of(meshrun_runs, "live_peak_bytes")
    return {
        "planned_bytes": planned,
        "compiled_peak_bytes": compiled,
        "live_peak_bytes": live,
        "live_over_planned": live / planned if live and planned else None,
        "live_over_compiled": live / compiled if live and compiled else None,
        "live_peak_bytes_by_variant": {v: benchlib.median_of(r, "live_peak_bytes") for v, r in runs.items()},
    }


def targets(results: dict, environment: dict) -> list[dict]:
    """Issue 20's targets on one H100, each with its value and verdict: met, missed (by how much) or
    n/a (no accelerator with a known peak, or the model was not run)."""
    measurable = environment["platform"] != "cpu"
    rows = []
    for name, model in results.items():
        tax = model["ratios"].get("meshrun/keras")
        rows.append(
            _target(
                f"{name}: meshrun/keras step",
                tax,
                f"<= {TARGET_TAX}",
                tax is not None and tax <= TARGET_TAX,
                measurable,
                tax - 1 if tax else None,
            )
        )
        # The plan counts parameters and optimizer state only; XLA's compiled estimate adds the
        # step's activations and scratch, so it is held to the same bound beside it.
        for estimate, key in (("plan", "live_over_planned"), ("compiled estimate", "live_over_compiled")):
            memory = model["memory"][key]
            rows.append(
                _target(
                    f"{name}: live peak / {estimate}",
                    memory,
                    f"within {TARGET_MEMORY:.0%}",
                    memory is not None and abs(memory - 1) <= TARGET_MEMORY,
                    measurable and memory is not None,
                    memory - 1 if memory else None,
                )
            )
    if "transformer-1b" in results:
        mfu = results["transformer-1b"]["variants"]["meshrun"]["mfu_xla"]
        rows.append(
            _target(
                "transformer-1b: MFU (XLA FLOPs)",
                mfu,
                f">= {TARGET_MFU_1B:.0%}",
                mfu is not None and mfu >= TARGET_MFU_1B,
                mfu is not None,
                mfu - TARGET_MFU_1B if mfu is not None else None,
            )
        )
    return rows


def _target(name, value, target, met, measurable, off_by) -> dict:
    verdict = ("met" if met else "missed") if measurable else "n/a"
    return {
        "target": name,
        "value": value,
        "wanted": target,
        "verdict": verdict,
        "off_by": off_by if verdict == "missed" else None,
    }


def _sum(*values):
    return None if any(v is None for v in values) else sum(values)


# --- the report --------------------------------------------------------------------------------------


def print_report(report: dict) -> None:
    """The speed, memory and target tables on stdout."""
    console = benchlib.console(180)
    env = report["environment"]
    console.print(
        f"meshrun GPU benchmark: {env['device_count']} x {env['device_kind']} ({env['platform']}), "
        f"precision {report['precision']}; jax {env['jax']}, jaxlib {env['jaxlib']}, keras {env['keras']}, "
        f"keras-hub {env['keras_hub']}, meshrun {env['meshrun']}, driver {env['driver'] or 'n/a'} "
        f"({env['platform_version']})"
    )
    console.print(speed_table(report))
    console.print(memory_table(report))
    console.print(target_table(report))
    for name, why in report["skipped"].items():
        console.print(f"skipped {name}: {why}")
    for name, why in report["failed"].items():
        console.print(f"[red]failed[/] {name}: {why}")


SPEED_COLUMNS = (
    "model",
    "variant",
    "batch",
    "step ms",
    "p90 ms",
    "samples/s",
    "tokens/s",
    "compile s",
    "XLA flop/step",
    "6N+attn flop/step",
    "MFU XLA",
    "MFU 6N+attn",
    "x keras",
    "x jax",
)


def speed_table(report: dict):
    """Per model and variant: step times, rates, compile time, FLOPs, MFU and the ratios."""
    table = benchlib.table(
        f"step time per variant ({report['settings']['repeats']} "
        "repeat(s); ratios: median of per-repeat ratios)",
        SPEED_COLUMNS,
        left=("model", "variant"),
    )
    table.columns[0].no_wrap = True
    for name, model in report["models"].items():
        for index, (variant, v) in enumerate(model["variants"].items()):
            last = index == len(model["variants"]) - 1
            table.add_row(
                name if index == 0 else "",
                variant,
                str(model["batch_size"]),
                _ms(v["step_s"]),
                _ms(v["step_p90_s"]),
                f"{v['samples_per_s']:,.0f}",
                f"{v['tokens_per_s']:,.0f}" if v["tokens_per_s"] else "-",
                f"{v['compile_s']:.2f}",
                _flops(v["xla_flops_per_step"]),
                _flops(model["analytic_flops"]["per_step"]),
                _pct(v["mfu_xla"]),
                _pct(v["mfu_analytic"]),
                _ratio(model["ratios"].get(f"{variant}/keras")),
                _ratio(model["ratios"].get(f"{variant}/jax")),
                end_section=last,
            )
    return table


def memory_table(report: dict):
    """Per model: the plan's bytes, XLA's estimate and the live peaks, and their ratios."""
    table = benchlib.table(
        "memory per device: meshrun's plan (parameters + "
        "optimizer state), XLA's compiled estimate, live peaks",
        (
            "model",
            "planned",
            "compiled",
            "live meshrun",
            "live / planned",
            "live / compiled",
            "live keras",
            "live jax",
        ),
        left=("model",),
    )
    for name, model in report["models"].items():
        m, by = model["memory"], model["memory"]["live_peak_bytes_by_variant"]
        table.add_row(
            name,
            _bytes(m["planned_bytes"]),
            _bytes(m["compiled_peak_bytes"]),
            _bytes(m["live_peak_bytes"]),
            _ratio(m["live_over_planned"]),
            _ratio(m["live_over_compiled"]),
            _bytes(by.get("keras")),
            _bytes(by.get("jax")),
        )
    return table


def target_table(report: dict):
    """Each target with its value and verdict."""
    table = benchlib.table(
        "the GPU targets (one H100); n/a without an accelerator of known peak",
        ("target", "value", "wanted", "verdict"),
        left=("target",),
    )
    for row in report["targets"]:
        value = row["value"]
        text = "-" if value is None else (_pct(value) if "MFU" in row["target"] else _ratio(value))
        verdict = {"met": "[green]met[/]", "missed": "[red]missed[/]"}.get(row["verdict"], row["verdict"])
        table.add_row(row["target"], text, row["wanted"], verdict)
    return table


def _ms(seconds):
    return "-" if seconds is None else f"{seconds * 1e3:.2f}"


def _flops(value):
    return "-" if not value else f"{value:.3g}"


def _pct(value):
    return "n/a" if value is None else f"{value:.1%}"


def _ratio(value):
    return "-" if value is None else f"{value:.3f}"


def _bytes(count):
    from meshrun.wording import format_bytes

    return "n/a" if count is None else format_bytes(int(count))


# --- the workers: one run each, in a process of its own -------------------------------------------


def run_worker(spec: dict) -> None:
    """Runs one role (probe, keras, jax) and writes its result as JSON to $BENCH_GPU_OUT."""
    if spec["role"] != "probe":
        from meshrun.compat.keras.startup import import_keras

        # Keras without scikit-learn and matplotlib, as meshrun imports it: start-up only, not steps.
        import_keras()
    roles = {"probe": worker_probe, "keras": worker_keras, "jax": worker_jax}
    result = roles[spec["role"]](spec)
    Path(os.environ["BENCH_GPU_OUT"]).write_text(json.dumps(result))


def worker_probe(spec: dict) -> dict:
    """The accelerators jax finds (or the CPU) and the versions of what runs on them (keras and
    meshrun not imported: their start-up is the runs' to pay)."""
    import jax
    import jaxlib

    devices = jax.devices()
    first = devices[0]
    return {
        "platform": first.platform,
        "device_kind": first.device_kind,
        "device_count": len(devices),
        "compute_capability": getattr(first, "compute_capability", None),
        "platform_version": first.client.platform_version,
        "jax": jax.__version__,
        "jaxlib": jaxlib.__version__,
        "keras": _version("keras"),
        "meshrun": _version("meshrun"),
        "keras_hub": _version("keras_hub"),
    }


def _version(module: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(module.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return None


def worker_keras(spec: dict) -> dict:
    """The model trained by plain `model.fit` on numpy arrays, each step's end noted by a small
    callback; then XLA's FLOPs of the compiled step and the live peak memory."""
    import keras

    from meshrun.run import costs

    devices, model_spec = _worker_devices(spec), spec["model"]
    batch, steps = spec["batch_size"], model_spec["steps"]
    _distribute_keras(devices)
    model, loss, metrics = build_model(model_spec, spec["precision"])
    model.compile(
        optimizer=keras.optimizers.Adam(1e-3),
        loss=loss,
        **({"weighted_metrics": metrics} if model_spec["kind"] == "llama" else {"metrics": metrics}),
    )
    x, y, weights = make_data(model_spec, batch * steps)
    timer = step_timer(
        async_safe=devices[0].platform != "cpu"
    )  # as meshrun: Keras' own async log fetch, except on CPU
    model.fit(
        x, y, sample_weight=weights, batch_size=batch, epochs=1, shuffle=False, verbose=0, callbacks=[timer]
    )
    head = (_head(x, batch), _head(y, batch)) + ((_head(weights, batch),) if weights is not None else ())
    return {
        "first_step_s": timer.first_step_s(),
        "gaps": timer.gaps(),
        "xla_flops_per_step": costs.train_step_costs(model, head).flops_per_step,
        "live_peak_bytes": costs.live_peak_bytes(devices),
        "params": int(model.count_params()),
    }


def worker_jax(spec: dict) -> dict:
    """A pure jax.jit train step from Keras' stateless APIs (the limit for this model in Keras):
    loss and gradients by jax.value_and_grad over model.stateless_call, the update by
    optimizer.stateless_apply, the state donated; batches are placed on the devices beforehand.
    Steps are dispatched one ahead of the one waited for, so the devices never idle on Python."""
    import jax
    import keras
    import numpy as np
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from meshrun.run import costs

    devices, model_spec = _worker_devices(spec), spec["model"]
    batch, steps = spec["batch_size"], model_spec["steps"]
    model, loss_fn, _ = build_model(model_spec, spec["precision"])
    optimizer = keras.optimizers.Adam(1e-3)
    optimizer.build(model.trainable_variables)
    mesh = Mesh(np.array(devices), ("data",))
    whole, split = NamedSharding(mesh, PartitionSpec()), NamedSharding(mesh, PartitionSpec("data"))
    state = jax.device_put(
        (
            [v.value for v in model.trainable_variables],
            [v.value for v in model.non_trainable_variables],
            [v.value for v in optimizer.variables],
        ),
        whole,
    )
    x, y, weights = make_data(model_spec, batch * 4)  # four distinct batches, cycled
    batches = [
        jax.device_put(tuple(_rows(a, i * batch, batch) for a in (x, y, weights)), split) for i in range(4)
    ]
    step = jax.jit(stateless_train_step(model, optimizer, loss_fn), donate_argnums=0)

    started = time.perf_counter()
    state, loss = step(state, *batches[0])
    loss.block_until_ready()
    ends = [time.perf_counter()]
    waiting = []
    for index in range(1, steps):
        state, loss = step(state, *batches[index % 4])
        waiting.append(loss)
        if len(waiting) > 1:
            waiting.pop(0).block_until_ready()
            ends.append(time.perf_counter())
    waiting.pop(0).block_until_ready()
    ends.append(time.perf_counter())
    flops = step.lower(state, *batches[0]).cost_analysis()
    return {
        "first_step_s": ends[0] - started,
        "gaps": [b - a for a, b in zip(ends, ends[1:], strict=False)],
        "xla_flops_per_step": float(flops["flops"]) if flops and flops.get("flops", -1) >= 0 else None,
        "live_peak_bytes": costs.live_peak_bytes(devices),
        "params": int(model.count_params()),
    }


def stateless_train_step(model, optimizer, loss_fn):
    """step(state, x, y, weights) -> (state, loss), state = (trainable, non-trainable, optimizer
    variables): one Adam update of `model` on `loss_fn`, with no Keras trainer in between."""
    import jax

    def loss_of(trainable, non_trainable, x, y, weights):
        outputs, non_trainable = model.stateless_call(trainable, non_trainable, x, training=True)
        return loss_fn(y, outputs, sample_weight=weights), non_trainable

    gradient = jax.value_and_grad(loss_of, has_aux=True)

    def step(state, x, y, weights):
        trainable, non_trainable, optimizer_variables = state
        (loss, non_trainable), grads = gradient(trainable, non_trainable, x, y, weights)
        trainable, optimizer_variables = optimizer.stateless_apply(optimizer_variables, grads, trainable)
        return (trainable, non_trainable, optimizer_variables), loss

    return step


def _worker_devices(spec: dict) -> list:
    import jax

    return jax.devices()[: spec["devices"]]


def _distribute_keras(devices: list) -> None:
    """Several devices: Keras' DataParallel over them, as a user would write; one: no distribution."""
    import keras

    if len(devices) > 1:
        keras.distribution.set_distribution(keras.distribution.DataParallel(devices=devices))


def build_model(model_spec: dict, precision: str):
    """The model of `model_spec` under dtype policy `precision`, built by meshrun's model code (plain
    Keras), with the loss and metrics meshrun compiles it with."""
    import keras

    from meshrun.compat.keras.startup import set_random_seed

    keras.config.set_dtype_policy(precision)
    set_random_seed(
        1337, tensorflow_seed=None
    )  # keras.utils.set_random_seed, without importing TensorFlow to seed it
    kind, options = model_spec["kind"], model_spec["options"]
    if kind == "transformer":
        from meshrun.models import transformer
        from meshrun.models.registry import class_accuracy

        built = _transformer_options(options)
        return (
            transformer.build(built),
            keras.losses.SparseCategoricalCrossentropy(from_logits=True),
            class_accuracy(built),
        )
    if kind == "mlp":
        from meshrun.models import dense_model

        return (
            dense_model.build(dense_model.DenseModelOptions(**options)),
            keras.losses.MeanSquaredError(),
            [],
        )
    from meshrun.models.hub.build import build
    from meshrun.models.hub.objective import next_token_loss
    from meshrun.models.hub.options import KerasHubOptions
    from meshrun.models.registry import class_accuracy

    built = KerasHubOptions(task="LlamaCausalLM", backbone=options["backbone"], seq_len=options["seq_len"])
    return build(built), next_token_loss(built), class_accuracy(built)


def make_data(model_spec: dict, count: int):
    """`count` random samples for `model_spec`: (inputs, targets, sample weights or None)."""
    import numpy as np

    rng = np.random.default_rng(1337)
    kind = model_spec["kind"]
    if kind == "mlp":
        return (
            rng.standard_normal((count, 28, 28, 1), dtype=np.float32),
            rng.standard_normal((count, 10), dtype=np.float32),
            None,
        )
    if kind == "transformer":
        options = _transformer_options(model_spec["options"])
        tokens = rng.integers(0, options.vocab, (count, options.seq_len + 1), dtype=np.int32)
        return tokens[:, :-1], tokens[:, 1:], None
    seq_len, vocab = model_spec["options"]["seq_len"], model_spec["options"]["backbone"]["vocabulary_size"]
    tokens = rng.integers(0, vocab, (count, seq_len + 1), dtype=np.int32)
    ones = np.ones((count, seq_len), dtype=np.int32)
    return {"token_ids": tokens[:, :-1], "padding_mask": ones}, tokens[:, 1:], ones.astype(np.float32)


def _rows(array, start: int, count: int):
    if array is None:
        return None
    if isinstance(array, dict):
        return {k: v[start : start + count] for k, v in array.items()}
    return array[start : start + count]


def _head(array, count: int):
    return _rows(array, 0, count)


def step_timer(async_safe: bool):
    """A Keras callback that notes when each training step's results are ready: Keras calls
    on_train_batch_end once it has fetched the step's logs, from its worker threads when
    `async_safe` (as meshrun lets it on accelerators), in the loop otherwise."""
    import threading

    import keras

    class StepEnds(keras.callbacks.Callback):
        def __init__(self):
            super().__init__()
            self.async_safe = async_safe  # read by Keras' CallbackList
            self._lock = threading.Lock()
            self._ends = {}
            self._first_begin = None

        def on_train_batch_begin(self, batch, logs=None):
            if self._first_begin is None:
                self._first_begin = time.perf_counter()

        def on_train_batch_end(self, batch, logs=None):
            now = time.perf_counter()
            with self._lock:
                self._ends[batch] = now

        def _ordered(self) -> list[float]:
            ends = []
            for _, end in sorted(self._ends.items()):
                ends.append(
                    max(end, ends[-1]) if ends else end
                )  # worker threads may note a hair out of order
            return ends

        def first_step_s(self) -> float:
            return self._ordered()[0] - self._first_begin

        def gaps(self) -> list[float]:
            ends = self._ordered()
            return [b - a for a, b in zip(ends, ends[1:], strict=False)]

    return StepEnds()


if __name__ == "__main__":
    main()
