"""Benchmarks the plan's train-step memory (issue 68): for each model kind, the step's peak per
device that `meshrun plan` works out (the train step compiled on abstract inputs) beside the one a
run measures after fit (metrics.json memory.peak_bytes_per_device, XLA's analysis of the step fit
compiled), on mesh 2x4 of emulated CPU devices; what train.remat saves on a transformer whose
activations dominate, with its step time (median step, runs taking turns); and the plan of a
Llama-3-8B-shaped LlamaCausalLM at 8,192 tokens, batch 16, on 1x8 with llama_tp and 80 GiB a
device: its verdict, wall time and peak RSS (targets: under 60 s and 4 GiB), with and without remat.

    python scripts/bench_step_memory.py                 # writes bench_step_memory.json
    python scripts/bench_step_memory.py --skip-8b --out /tmp/bench_step_memory.json

Every meshrun is a fresh process (benchlib). It is a measurement: it exits 0 whatever the numbers,
1 when a run fails.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import textwrap
from pathlib import Path

import benchlib

MEMORY = "devices.memory_gib=1"
TINY_LLAMA = (
    "model.backbone={vocabulary_size:256,num_layers:2,num_query_heads:8,num_key_value_heads:4,"
    "hidden_dim:64,intermediate_dim:128}"
)
TINY_GEMMA = (
    "model.backbone={vocabulary_size:256,num_layers:2,num_query_heads:8,num_key_value_heads:4,"
    "hidden_dim:64,intermediate_dim:128,head_dim:8}"
)
HUB = ["model=keras_hub", "model.seq_len=32", "train.batch_size=8"]
CASES = {
    "zoo transformer, seq 32": ["model=transformer"],
    "zoo transformer, seq 128": ["model=transformer", "model.seq_len=128"],
    "KerasHub Llama": [*HUB, "model.task=LlamaCausalLM", TINY_LLAMA],
    "KerasHub Llama, LoRA rank 4": [*HUB, "model.task=LlamaCausalLM", TINY_LLAMA, "model.lora.rank=4"],
    "KerasHub Gemma, int8 QLoRA": [
        *HUB,
        "model.task=GemmaCausalLM",
        TINY_GEMMA,
        "model.quantize=int8",
        "model.lora.rank=4",
    ],
    "own model (model=python)": [
        "model=python",
        "model.factory=bench_own_model:tower",
        "model.input_shape=[64]",
    ],
}
COMMON = ["mesh=2x4", "train.verbose=0", "train.epochs=1", "data.num_samples=64", "data.eval_samples=16"]
REMAT_MODEL = [
    "model=transformer",
    "model.seq_len=128",
    "model.vocab=64",
    "model.layers=4",
    "train.batch_size=16",
]
OWN_MODEL = """
import keras

def tower(hidden=256):
    inputs = keras.Input((64,))
    x = keras.layers.Dense(hidden, activation="relu")(inputs)
    x = keras.layers.Dense(hidden, activation="relu")(x)
    return keras.Model(inputs, keras.layers.Dense(4)(x))
"""
BIG_LLAMA = (
    "model.backbone={vocabulary_size:128256,num_layers:32,num_query_heads:32,num_key_value_heads:8,"
    "hidden_dim:4096,intermediate_dim:14336}"
)
EIGHT_B = [
    "model=keras_hub",
    "model.task=LlamaCausalLM",
    BIG_LLAMA,
    "model.seq_len=8192",
    "train.batch_size=16",
    "mesh=1x8",
    "layout=llama_tp",
    "devices.memory_gib=80",
]


def planned_vs_measured(scratch: Path) -> list[dict]:
    """Each case planned and trained: planned and measured step peaks per device."""
    rows = []
    for name, args in CASES.items():
        loss = ["train.loss=sparse_categorical_crossentropy"] if "python" in args[0] else []
        overrides = [*args, *COMMON, *loss, MEMORY]
        planned = benchlib.succeeded(
            benchlib.run_measured(["plan", *overrides, "--json"], scratch, timeout=600), f"planning {name}"
        )
        plan = json.loads(planned.stdout)
        run_dir = scratch / "".join(c if c.isalnum() else "_" for c in name)
        _, metrics = benchlib.train(overrides, run_dir, name, cwd=scratch)
        planned = plan["step"]["step_peak_bytes_per_device"]
        measured = metrics["memory"]["peak_bytes_per_device"]
        rows.append(
            {
                "model": name,
                "planned_step_peak_bytes": planned,
                "measured_step_peak_bytes": measured,
                "relative_difference": (planned - measured) / measured,
                "plan_compile_s": plan["step"]["seconds"],
            }
        )
    return rows


def remat_savings(scratch: Path, repeats: int) -> list[dict]:
    """train.remat none, blocks and full on an activation-heavy transformer, runs taking turns:
    the step's own bytes and peak measured, and the median step time."""
    runs: dict[str, list[dict]] = {policy: [] for policy in ("none", "blocks", "full")}
    for repeat, policy in benchlib.interleaved(repeats, list(runs)):
        overrides = [*REMAT_MODEL, *COMMON, "data.num_samples=256", f"train.remat={policy}"]
        _, metrics = benchlib.train(overrides, scratch / f"remat-{policy}-{repeat}", policy, cwd=scratch)
        runs[policy].append(metrics)
    rows = []
    for policy, metrics in runs.items():
        memory = metrics[0]["memory"]
        rows.append(
            {
                "remat": policy,
                "step_own_bytes": memory["compiled"]["temp_bytes"],
                "step_peak_bytes": memory["peak_bytes_per_device"],
                "median_step_s": statistics.median(m["timing"]["step_time_s"] for m in metrics),
            }
        )
    return rows


def eight_b(remat: str) -> dict:
    """The 8B plan with train.remat=`remat`: its verdict, wall time and peak RSS."""
    done, _ = benchlib.plan([*EIGHT_B, f"train.remat={remat}"], timeout=900)
    error = done.stderr.strip().splitlines()[-1] if done.returncode else ""
    return {
        "remat": remat,
        "exit": done.returncode,
        "wall_s": done.wall_s,
        "peak_rss_bytes": done.peak_rss_bytes,
        "verdict": error,
    }


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--repeats", type=int, default=2, help="runs of each remat policy, taking turns")
    parser.add_argument("--skip-8b", action="store_true", help="leave out the 8B plans (a few GiB, a minute)")
    parser.add_argument("--out", default="bench_step_memory.json")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="bench-step-memory-") as folder:
        scratch = Path(folder)
        (scratch / "bench_own_model.py").write_text(textwrap.dedent(OWN_MODEL))
        results = {
            "planned_vs_measured": planned_vs_measured(scratch),
            "remat": remat_savings(scratch, args.repeats),
            "eight_b": [] if args.skip_8b else [eight_b("none"), eight_b("blocks")],
        }
    print_results(results)
    benchlib.write_json(args.out, results)
    return 0


def print_results(results: dict) -> None:
    """The three tables."""
    console = benchlib.console(100)
    table = benchlib.table(
        "planned vs measured step peak per device (2x4)",
        ["model", "planned", "measured", "diff"],
        left={"model"},
    )
    for row in results["planned_vs_measured"]:
        table.add_row(
            row["model"],
            f"{row['planned_step_peak_bytes']:,}",
            f"{row['measured_step_peak_bytes']:,}",
            f"{row['relative_difference']:+.2%}",
        )
    console.print(table)
    table = benchlib.table(
        "train.remat (transformer, seq 128, 4 blocks)",
        ["remat", "step's own", "peak", "median step"],
        left={"remat"},
    )
    for row in results["remat"]:
        table.add_row(
            row["remat"],
            f"{row['step_own_bytes']:,}",
            f"{row['step_peak_bytes']:,}",
            f"{row['median_step_s'] * 1e3:.1f} ms",
        )
    console.print(table)
    for row in results["eight_b"]:
        rss = row["peak_rss_bytes"] / 2**30
        console.print(
            f"8B plan, remat={row['remat']}: exit {row['exit']}, {row['wall_s']:.1f} s, "
            f"peak RSS {rss:.2f} GiB; {row['verdict']}"
        )


if __name__ == "__main__":
    raise SystemExit(main())
