"""Benchmarks meshrun's GPipe schedule (meshrun.pipeline.schedule) on its own, without Keras or the
launcher: compile time, step time (forward and backward) and memory per device of a stack of
residual tanh blocks for several stage counts and microbatch counts on a (stage, data) mesh, beside
the bubble GPipe's formula predicts, (S - 1) / (M + S - 1).

Memory is the compiled step's own account (`memory_analysis()`): argument, output and temporary
bytes of the SPMD program, which is one device's program, so the figures are per device (the script
checks that the argument bytes are one device's shard of the weights and the batch). `--remat`
recomputes each block's activations in the backward pass (`jax.checkpoint` around the block, as
PipelinedBlocks does with pipeline.remat): run once with and once without to compare temp bytes.

At the end, for each stage count above 1, a least-squares fit of step time across the microbatch
counts, step(M) = a + (M + S - 1) * (b / M + c) (a fixed cost, then M + S - 1 ticks each costing a
microbatch's compute b / M and a hand-on c), gives the share of the step its S - 1 extra ticks take:
the measured bubble, beside the formula. On emulated CPU devices every "device" shares the machine's
cores, so stages do not run at the same time and the fit measures the schedule's overhead, not a real
bubble; on a GPU (one device per stage) it is the measured bubble.

    python scripts/bench_pipeline.py --stages 1 2 4 --microbatches 1 2 4 8 16 --out bench_pipeline.json
    python scripts/bench_pipeline.py --remat --out bench_pipeline_remat.json
    # the circular schedule:
    python scripts/bench_pipeline.py --pipeline-repeats 2 --stages 2 4 --microbatches 4 8 16
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

KIB = 1024


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--devices", type=int, default=8, help="emulated CPU devices (ignored on an accelerator)"
    )
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument(
        "--pipeline-repeats",
        type=int,
        default=1,
        help="stages per device (pipeline.repeats: the circular schedule; pairs it cannot run are left out)",
    )
    parser.add_argument(
        "--remat",
        action="store_true",
        help="recompute each block's activations in the backward pass (jax.checkpoint)",
    )
    parser.add_argument("--out", help="also write the rows to this JSON file")
    args = parser.parse_args()
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(args.devices))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    import jax

    started = time.perf_counter()
    rows = [
        measure(stages, microbatches, args)
        for stages in args.stages
        for microbatches in args.microbatches
        if args.pipeline_repeats == 1
        or (microbatches % stages == 0 and args.blocks % (stages * args.pipeline_repeats) == 0)
    ]
    print(
        f"{jax.devices()[0].device_kind}, {len(jax.devices())} devices; {args.blocks} blocks of "
        f"{args.width}x{args.width}, batch {args.batch}, remat {'on' if args.remat else 'off'}, "
        f"{args.repeats} repeats; memory per device"
    )
    print_rows(rows)
    print_fits(fit_bubbles(rows))
    print(f"took {time.perf_counter() - started:.0f} s")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


def measure(stages: int, microbatches: int, args) -> dict:
    """Compile and step times and per-device memory of one (stages, microbatches) pair."""
    import jax

    from meshrun.pipeline.bubble import bubble_fraction

    mesh, weights, x = pipeline_inputs(stages, args)
    step = pipeline_step(mesh, microbatches, args)
    started = time.perf_counter()
    compiled = step.lower(weights, x).compile()
    compile_s = time.perf_counter() - started
    jax.block_until_ready(compiled(weights, x))
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        jax.block_until_ready(compiled(weights, x))
        times.append(time.perf_counter() - started)
    return {
        "stages": stages,
        "microbatches": microbatches,
        "remat": args.remat,
        "compile_s": round(compile_s, 3),
        "step_ms": round(statistics.median(times) * 1e3, 2),
        "step_min_ms": round(min(times) * 1e3, 2),
        "repeats": args.pipeline_repeats,
        "bubble_formula": round(bubble_fraction(stages, microbatches, args.pipeline_repeats), 4),
        **memory(compiled),
        "argument_bytes_expected": weights.nbytes // stages + x.nbytes // mesh.shape["data"],
    }


def pipeline_inputs(stages: int, args):
    """The (stage, data) mesh of `stages` stages over the devices, the blocks' weights sharded over
    its stage axis (with --pipeline-repeats, each device's share in rounds) and the batch over its
    data axis."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    devices = jax.devices()
    data = len(devices) // stages
    mesh = jax.sharding.Mesh(np.array(devices[: stages * data]).reshape(stages, data), ("stage", "data"))
    rng = np.random.default_rng(0)
    rounds = args.pipeline_repeats
    lead = (rounds, args.blocks // rounds) if rounds > 1 else (args.blocks,)
    weights = jax.device_put(
        jnp.asarray(rng.normal(size=(*lead, args.width, args.width)) / args.width**0.5, jnp.float32),
        NamedSharding(mesh, P(None, "stage") if rounds > 1 else P("stage")),
    )
    x = jax.device_put(
        jnp.asarray(rng.normal(size=(args.batch, args.width)), jnp.float32), NamedSharding(mesh, P("data"))
    )
    return mesh, weights, x


def pipeline_step(mesh, microbatches: int, args):
    """The jitted forward and backward of the blocks (residual tanh, each recomputed in the backward
    pass with --remat) through meshrun's GPipe schedule in `microbatches` microbatches."""
    import jax
    import jax.numpy as jnp
    from jax import lax

    from meshrun.pipeline.schedule import gpipe

    def block(h, w):
        return jnp.tanh(h @ w) + h, None

    if args.remat:
        block = jax.checkpoint(block)

    def stage_fn(w, h, side):
        return lax.scan(block, h, w)[0]

    rounds = args.pipeline_repeats
    return jax.jit(
        jax.value_and_grad(
            lambda w, x: jnp.mean(gpipe(stage_fn, w, x, mesh, "stage", microbatches, repeats=rounds) ** 2)
        )
    )


def memory(compiled) -> dict:
    """The compiled step's temp, argument and output bytes (per device: the SPMD program is one
    device's); None where the backend gives no memory analysis."""
    analysis = compiled.memory_analysis()
    fields = {
        "temp_bytes": "temp_size_in_bytes",
        "argument_bytes": "argument_size_in_bytes",
        "output_bytes": "output_size_in_bytes",
    }
    return {key: None if analysis is None else int(getattr(analysis, name)) for key, name in fields.items()}


def print_rows(rows: list[dict]) -> None:
    """The measurements as a table (memory in KiB per device), then whether the argument bytes are
    one device's shard of weights and batch, i.e. whether the memory figures are per device."""
    print(
        f"{'stages':>6} {'micro':>5} {'compile s':>9} {'step ms':>8} {'min ms':>7} {'temp KiB':>9} "
        f"{'args KiB':>9} {'out KiB':>8} {'bubble (formula)':>16}"
    )
    for row in rows:
        print(
            f"{row['stages']:>6} {row['microbatches']:>5} {row['compile_s']:>9.2f} {row['step_ms']:>8.1f} "
            f"{row['step_min_ms']:>7.1f} {kib(row['temp_bytes']):>9} {kib(row['argument_bytes']):>9} "
            f"{kib(row['output_bytes']):>8} {row['bubble_formula']:>16.2f}"
        )
    off = [row for row in rows if row["argument_bytes"] != row["argument_bytes_expected"]]
    if not off:
        print(
            "argument bytes = one device's shard of the weights and the batch in every row: "
            "the figures are per device"
        )
    print("(the data axis is devices / stages: each device's share of the batch grows with the stage count)")
    for row in off:
        print(
            f"stages {row['stages']}, micro {row['microbatches']}: argument bytes {row['argument_bytes']}, "
            f"one device's shard {row['argument_bytes_expected']}"
        )


def kib(size: int | None) -> str:
    """`size` bytes in KiB, or '-' when unknown."""
    return "-" if size is None else f"{size / KIB:.0f}"


def fit_bubbles(rows: list[dict]) -> list[dict]:
    """For each stage count above 1, the fit of the fastest step time across the microbatch counts
    (meshrun.pipeline.bubble.fit_bubble: a + (RM + S - 1) * (b / RM + c), no term negative), and for
    each M the share of the fitted step the S - 1 extra ticks take."""
    from meshrun.pipeline.bubble import fit_bubble

    fits = []
    for stages in sorted({row["stages"] for row in rows if row["stages"] > 1}):
        group = {row["microbatches"]: row for row in rows if row["stages"] == stages}
        fit = fit_bubble(
            stages, next(iter(group.values()))["repeats"], {m: row["step_min_ms"] for m, row in group.items()}
        )
        if fit is None:
            continue
        for m in sorted(group):
            fits.append(
                {
                    "stages": stages,
                    "microbatches": m,
                    "a_ms": fit.fixed,
                    "b_ms": fit.work,
                    "c_ms": fit.per_tick,
                    "step_min_ms": group[m]["step_min_ms"],
                    "fitted_ms": fit.fitted[m],
                    "bubble_fit": fit.shares[m],
                    "bubble_formula": group[m]["bubble_formula"],
                }
            )
    return fits


def print_fits(fits: list[dict]) -> None:
    """The fitted bubble beside the formula, with the fit's terms and what they mean here."""
    if not fits:
        return
    print(
        "\nfit of the fastest step time: step(M) = a + (M + S - 1) * (b / M + c), a, b, c >= 0;\n"
        "bubble (fit) = the S - 1 extra ticks' share of the fitted step"
    )
    print(
        f"{'stages':>6} {'micro':>5} {'min ms':>7} {'fit ms':>7} {'bubble (fit)':>12} "
        f"{'bubble (formula)':>16}"
    )
    for fit in fits:
        if fit["microbatches"] == min(f["microbatches"] for f in fits if f["stages"] == fit["stages"]):
            print(
                f"stages {fit['stages']}: a {fit['a_ms']:.1f} ms fixed, b {fit['b_ms']:.1f} ms compute per "
                f"batch, c {fit['c_ms']:.2f} ms per tick"
            )
        print(
            f"{fit['stages']:>6} {fit['microbatches']:>5} {fit['step_min_ms']:>7.1f} "
            f"{fit['fitted_ms']:>7.1f} {fit['bubble_fit']:>12.2f} {fit['bubble_formula']:>16.2f}"
        )
    print(
        "caveat: on emulated CPU devices the stages share the machine's cores and do not run at the\n"
        "same time, so this fit measures the schedule's overhead (the extra ticks' compute and\n"
        "hand-ons), not a real bubble; on a GPU with one device per stage it is the measured bubble."
    )


if __name__ == "__main__":
    main()
