"""Benchmarks what QLoRA costs and saves: LoRA on a float base against LoRA on an int8 and an int4
base (model.quantize), for the same Gemma preset, mesh and layout: the bytes each device holds (the
parameters split into frozen quantized, frozen float and trainable, and the optimizer state), the
load peak per device and on the host, and the step time.

A Gemma preset of about --size-mib MiB (float32, random weights, no tokenizer: synthetic tokens) is
built in a temp dir, or --preset DIR is read. Each variant is one `meshrun train` in a fresh process
(model=keras_hub, LoRA rank --rank on the default targets, query and value, layout gemma_tp, --mesh of
emulated CPU devices, --warmup + --steps steps of --batch-size sequences of --seq-len tokens); the
variants take turns, --repeats times. The figures are meshrun's own: the byte split from the run's
plan.json (a variable of a quantized layer: its int8 or packed int4 kernel, scales, zero points and
g_idx), memory.* of metrics.json (the parameters and optimizer state held per device after the run,
and the load peaks), and the per-step times of steps.csv (logging.csv=true) after the warm-up steps.
Printed: a table of medians over repeats; --out writes every figure as JSON. It is a measurement: it
exits 0 whatever the numbers, 1 when a run fails.

    python scripts/bench_qlora.py                                  # about 128 MiB, 2x4: 4 minutes
    python scripts/bench_qlora.py --size-mib 64 --repeats 1        # a quick check
    python scripts/bench_qlora.py --size-mib 256 --repeats 3 --out bench_qlora.json

On 2 shared CPU cores the step times swing from run to run (other processes take the cores): compare
medians of interleaved repeats, and read the bytes, which do not swing. On CPU, XLA has no fast int8
or int4 matmul, so the quantized steps are slower there (the kernels are dequantized or the inputs
quantized every step); the step time that matters is a GPU's. On a GPU machine (one device, the
preset big enough to matter, bfloat16 compute as a run would use):

    python scripts/bench_qlora.py --gpu --mesh 1x1 --size-mib 4096 --seq-len 512 --batch-size 8 \
        --precision mixed_bfloat16 --repeats 3 --out bench_qlora_gpu.json
"""

from __future__ import annotations

import argparse
import csv
import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

import benchlib

VARIANTS = ("float", "int8", "int4")
VOCABULARY, HIDDEN, HEADS = 8192, 1024, 8  # Gemma's MLP is 2 * HIDDEN wide (intermediate_dim / 2)
MIB = 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-mib", type=float, default=128, help="size of the preset to build (float32)")
    parser.add_argument("--preset", type=Path, help="a Gemma preset dir to read instead of building one")
    parser.add_argument("--mesh", default="2x4", help="mesh shape DATAxMODEL (emulated CPU devices on CPU)")
    parser.add_argument("--rank", type=int, default=8, help="the LoRA rank")
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--warmup", type=int, default=2, help="steps left out of the step times")
    parser.add_argument("--steps", type=int, default=6, help="steps timed after the warm-up")
    parser.add_argument("--repeats", type=int, default=2, help="fresh runs of each variant, interleaved")
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--precision", help="train.precision (e.g. mixed_bfloat16); default: meshrun's")
    parser.add_argument("--gpu", action="store_true", help="run on the accelerator jax finds (not CPU)")
    parser.add_argument("--out", type=Path, help="also write every figure here as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as scratch:
        preset = args.preset or build_preset(Path(scratch) / "gemma", args.size_mib)
        runs = {variant: [] for variant in args.variants}
        for repeat, variant in benchlib.interleaved(args.repeats, args.variants, alternate=False):
            runs[variant].append(one_run(variant, preset, args, Path(scratch) / f"{variant}-{repeat}"))
            print(f"repeat {repeat} {variant}: {runs[variant][-1]['step_s_median'] * 1e3:.1f} ms a step")
        results = {
            "preset": str(args.preset or f"built: {preset_shape(args.size_mib)}"),
            "weights_bytes": benchlib.weights_bytes(preset),
            "mesh": args.mesh,
            "rank": args.rank,
            "batch_size": args.batch_size,
            "seq_len": args.seq_len,
            "runs": runs,
            "medians": {variant: medians(found) for variant, found in runs.items()},
        }
    report(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def preset_of(size_mib: float) -> benchlib.GemmaPreset:
    """The Gemma preset of about `size_mib` MiB: as many blocks of HIDDEN as make the size."""
    return benchlib.GemmaPreset.of_size(size_mib * MIB, HIDDEN, HEADS, VOCABULARY)


def preset_shape(size_mib: float) -> str:
    return preset_of(size_mib).describe()


def build_preset(path: Path, size_mib: float) -> Path:
    """Saves a Gemma preset of about `size_mib` MiB (random float32 weights) into `path`, in a process
    of its own."""
    seconds = preset_of(size_mib).save(path)
    print(f"built {preset_shape(size_mib)} in {seconds:.0f} s", file=sys.stderr)
    return path


def one_run(variant: str, preset: Path, args, run_dir: Path) -> dict:
    """One fresh `meshrun train` of `variant`; its bytes, load peaks and step times."""
    steps = args.warmup + args.steps
    overrides = [
        "model=keras_hub",
        f"model.preset={preset}",
        *([] if variant == "float" else [f"model.quantize={variant}"]),
        f"model.lora.rank={args.rank}",
        f"mesh={args.mesh}",
        "layout=gemma_tp",
        f"model.seq_len={args.seq_len}",
        f"train.batch_size={args.batch_size}",
        *([f"train.precision={args.precision}"] if args.precision else []),
        f"data.num_samples={steps * args.batch_size}",
        f"data.eval_samples={args.batch_size}",
        "train.epochs=1",
        "train.verbose=0",
        "logging.csv=true",
    ]
    what = f"the {variant} run"
    done, metrics = benchlib.train(overrides, run_dir, what, timeout=3600, env=child_env(args))
    memory = metrics["memory"]
    step_s = [float(row["step_s"]) for row in csv.DictReader((run_dir / "steps.csv").open())][args.warmup :]
    return {
        **bytes_split(json.loads((run_dir / "plan.json").read_text())),
        "params_bytes_per_device": memory["params_bytes_per_device"],
        "optimizer_bytes_per_device": memory["optimizer_bytes_per_device"],
        "load_peak_bytes_per_device": memory["load_peak_bytes_per_device"],
        "load_peak_host_bytes": memory["load_peak_host_bytes"],
        "step_s": step_s,
        "step_s_median": statistics.median(step_s),
        "process_peak_rss_bytes": done.peak_rss_bytes,
    }


def child_env(args) -> dict:
    """The runs' environment: this one on a GPU (--gpu), else the mesh's emulated CPU devices."""
    if args.gpu:
        return dict(os.environ)
    return benchlib.emulated_cpu_env(benchlib.mesh_devices(args.mesh))


def bytes_split(plan: dict) -> dict:
    """The planned bytes on one device (the largest share; a plan's variables give it per variable):
    frozen quantized (the variables of quantized layers, which plan.json marks with their role:
    the int8 or packed int4 kernel, its scales, zero points and g_idx), frozen float (the rest that
    does not train), trainable (the adapters) and optimizer state."""
    split = {"frozen_quantized_bytes": 0, "frozen_float_bytes": 0, "trainable_bytes": 0}
    for v in plan["variables"]:
        if v.get("trainable", True):
            key = "trainable_bytes"
        elif v.get("quantized"):
            key = "frozen_quantized_bytes"
        else:
            key = "frozen_float_bytes"
        split[key] += v["bytes_per_device"]
    split["optimizer_bytes"] = plan["per_device"]["optimizer_bytes"]
    split["planned_total_bytes"] = plan["per_device"]["total_bytes"]
    return split


def medians(found: list[dict]) -> dict:
    """The median over repeats of each figure (step times: of each repeat's median)."""
    return benchlib.medians(found, [key for key in found[0] if key != "step_s"])


def report(results: dict) -> None:
    print(
        f"preset: {results['preset']}; weights {results['weights_bytes'] / MIB:,.0f} MiB; mesh "
        f"{results['mesh']} (data, model), layout gemma_tp; LoRA rank {results['rank']}; batch "
        f"{results['batch_size']} x {results['seq_len']} tokens"
    )
    columns = (
        ("frozen quantized", "frozen_quantized_bytes"),
        ("frozen float", "frozen_float_bytes"),
        ("trainable", "trainable_bytes"),
        ("optimizer", "optimizer_bytes"),
        ("planned total", "planned_total_bytes"),
        ("load peak", "load_peak_bytes_per_device"),
        ("host peak", "load_peak_host_bytes"),
    )
    print("MiB per device (host peak: the process) and median step time over repeats")
    print(f"{'base':<7}" + "".join(f"{title:>18}" for title, _ in columns) + f"{'step ms':>10}")
    for variant, found in results["medians"].items():
        cells = "".join(f"{(found[key] or 0) / MIB:>18,.2f}" for _, key in columns)
        print(f"{variant:<7}{cells}{found['step_s_median'] * 1e3:>10.1f}")


if __name__ == "__main__":
    main()
