"""Benchmarks meshrun's GPipe schedule (meshrun.pipeline.schedule) on its own, before it is wired to
the config: compile time and step time (forward and backward) of a stack of residual tanh blocks
for several stage counts and microbatch counts on a (stage, data) mesh, beside the bubble GPipe's
formula predicts, (S - 1) / (M + S - 1).

On emulated CPU devices every "device" shares the machine's cores, so stages do not run at the same
time and the step time measures the schedule's overhead, not its bubble; on a GPU (one device per
stage) the fit of step time across microbatch counts to the formula is the measured bubble.

    python scripts/bench_pipeline.py --stages 1 2 4 --microbatches 1 2 4 8 16 --out bench_pipeline.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--devices", type=int, default=8, help="emulated CPU devices (ignored on an accelerator)")
    parser.add_argument("--stages", type=int, nargs="+", default=[1, 2, 4])
    parser.add_argument("--microbatches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--blocks", type=int, default=8)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=10)
    parser.add_argument("--out", help="also write the rows to this JSON file")
    args = parser.parse_args()
    os.environ.setdefault("JAX_NUM_CPU_DEVICES", str(args.devices))
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

    import jax

    rows = [measure(stages, microbatches, args) for stages in args.stages for microbatches in args.microbatches]
    print(f"{jax.devices()[0].device_kind}, {len(jax.devices())} devices; {args.blocks} blocks of {args.width}x{args.width}, "
          f"batch {args.batch}, median of {args.repeats}")
    print(f"{'stages':>6} {'micro':>5} {'compile s':>9} {'step ms':>8} {'bubble (formula)':>16}")
    for row in rows:
        print(f"{row['stages']:>6} {row['microbatches']:>5} {row['compile_s']:>9.2f} {row['step_ms']:>8.1f} {row['bubble_formula']:>16.2f}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=2) + "\n")


def measure(stages: int, microbatches: int, args) -> dict:
    """Compile and step times of one (stages, microbatches) pair."""
    import jax
    import jax.numpy as jnp
    import numpy as np
    from jax import lax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from meshrun.pipeline.schedule import bubble_fraction, gpipe

    devices = jax.devices()
    data = len(devices) // stages
    mesh = jax.sharding.Mesh(np.array(devices[: stages * data]).reshape(stages, data), ("stage", "data"))
    rng = np.random.default_rng(0)
    weights = jax.device_put(jnp.asarray(rng.normal(size=(args.blocks, args.width, args.width)) / args.width**0.5, jnp.float32),
                             NamedSharding(mesh, P("stage")))
    x = jax.device_put(jnp.asarray(rng.normal(size=(args.batch, args.width)), jnp.float32), NamedSharding(mesh, P("data")))

    def stage_fn(w, h):
        return lax.scan(lambda h, w: (jnp.tanh(h @ w) + h, None), h, w)[0]

    step = jax.jit(jax.value_and_grad(lambda w, x: jnp.mean(gpipe(stage_fn, w, x, mesh, "stage", microbatches) ** 2)))
    started = time.perf_counter()
    compiled = step.lower(weights, x).compile()
    compile_s = time.perf_counter() - started
    jax.block_until_ready(compiled(weights, x))
    times = []
    for _ in range(args.repeats):
        started = time.perf_counter()
        jax.block_until_ready(compiled(weights, x))
        times.append(time.perf_counter() - started)
    return {"stages": stages, "microbatches": microbatches, "compile_s": round(compile_s, 3),
            "step_ms": round(statistics.median(times) * 1e3, 2), "bubble_formula": round(bubble_fraction(stages, microbatches), 4)}


if __name__ == "__main__":
    main()
