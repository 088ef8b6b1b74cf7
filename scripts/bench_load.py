"""Benchmarks what loading a KerasHub preset onto a mesh costs in memory: meshrun's loader
(`meshrun.compat.keras.load_onto_shards`: variables start as zeros on their shards instead of drawing
random values, and each weight read from the preset goes straight onto its shards) against plain
`CausalLM.from_preset` under the same distribution.

A Gemma preset of about --size-gb GB (float32, no tokenizer: the load reads weights alone) is built
in a temp dir, or --preset DIR is read. Each loader then runs in a fresh process of its own on
--mesh emulated CPU devices (axes data, model) under meshrun's `gemma_tp` layout, inside
`meshrun.system.load_memory.LoadWatch`, which samples every 5 ms (and after each weight meshrun
places) the bytes on each device and the host memory the process took beyond what it held before
(what malloc holds less the CPU devices' buffers). Printed per loader:

- the per-device load peak against the bytes the layout puts on one device (the planned bytes,
  read from the loaded arrays); target for meshrun: at most 1.3x;
- the host load peak against the preset's weights file; target: under 1.5x;
- the load's wall time.

    python scripts/bench_load.py                       # about 1 GB, about 2 minutes on 2 cores
    python scripts/bench_load.py --size-gb 0.25 --mesh 2x4 --out bench_load.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

LOADERS = ("plain", "meshrun")
HIDDEN, HEADS, HEAD_DIM, INTERMEDIATE, VOCABULARY = 2048, 8, 256, 8192, 16384


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--size-gb", type=float, default=1.0, help="size of the preset to build (float32 weights)")
    parser.add_argument("--preset", type=Path, help="load this Gemma preset dir instead of building one")
    parser.add_argument("--mesh", default="2x4", help="mesh shape DATAxMODEL of emulated CPU devices")
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    parser.add_argument("--load", choices=LOADERS, help=argparse.SUPPRESS)  # one loader's child process
    args = parser.parse_args()
    if args.load:
        print(json.dumps(load(args.preset, args.mesh, args.load)))
        return
    with tempfile.TemporaryDirectory() as scratch:
        preset = args.preset or build_preset(Path(scratch) / "gemma", args.size_gb)
        weights = sum(f.stat().st_size for f in preset.glob("*.weights*.h5"))
        results = {"preset": str(args.preset or f"built: {preset_shape(args.size_gb)}"), "weights_bytes": weights, "mesh": args.mesh,
                   "loaders": {loader: run_child(preset, args.mesh, loader) for loader in LOADERS}}
    report(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def layers_for(size_gb: float) -> int:
    """How many decoder blocks make the preset about `size_gb` GB."""
    per_block = 4 * (4 * HIDDEN * HEADS * HEAD_DIM + 3 * HIDDEN * INTERMEDIATE // 2)  # Gemma's MLP is intermediate_dim / 2 wide
    embedding = 4 * VOCABULARY * HIDDEN
    return max(1, round((size_gb * 1e9 - embedding) / per_block))


def preset_shape(size_gb: float) -> str:
    return f"Gemma, {layers_for(size_gb)} blocks, hidden {HIDDEN}, {HEADS} heads of {HEAD_DIM}, MLP {INTERMEDIATE // 2}, vocabulary {VOCABULARY}"


def build_preset(path: Path, size_gb: float) -> Path:
    """Saves a Gemma preset of about `size_gb` GB (random weights) into `path`, in a process of its own."""
    code = (
        "import sys, keras_hub\n"
        f"backbone = keras_hub.models.GemmaBackbone(vocabulary_size={VOCABULARY}, num_layers={layers_for(size_gb)}, "
        f"num_query_heads={HEADS}, num_key_value_heads={HEADS}, hidden_dim={HIDDEN}, intermediate_dim={INTERMEDIATE}, head_dim={HEAD_DIM})\n"
        "keras_hub.models.GemmaCausalLM(backbone=backbone, preprocessor=None).save_to_preset(sys.argv[1])\n"
    )
    started = time.perf_counter()
    subprocess.run([sys.executable, "-c", code, str(path)], check=True, env={**os.environ, "KERAS_BACKEND": "jax"},
                   stderr=subprocess.DEVNULL)
    print(f"built {preset_shape(size_gb)} in {time.perf_counter() - started:.0f} s", file=sys.stderr)
    return path


def run_child(preset: Path, mesh: str, loader: str) -> dict:
    devices = 1
    for size in mesh.split("x"):
        devices *= int(size)
    env = {**os.environ, "KERAS_BACKEND": "jax", "XLA_FLAGS": f"--xla_force_host_platform_device_count={devices}", "JAX_PLATFORMS": "cpu"}
    done = subprocess.run([sys.executable, __file__, "--load", loader, "--preset", str(preset), "--mesh", mesh],
                          env=env, capture_output=True, text=True, check=False)
    if done.returncode:
        raise SystemExit(f"the {loader} load failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load(preset: Path, mesh: str, loader: str) -> dict:
    """Loads `preset` with `loader` under gemma_tp on `mesh`; its peaks, planned bytes and time."""
    import contextlib
    import importlib.resources

    import jax
    import keras
    import keras_hub
    import yaml

    from meshrun.compat.keras import load_onto_shards
    from meshrun.config.schema import LayoutRule, MeshConfig
    from meshrun.placement.distribution import make_distribution
    from meshrun.system.load_memory import LoadWatch, bytes_by_device

    rules_text = (importlib.resources.files("meshrun.configs") / "layout" / "gemma_tp.yaml").read_text()
    rules = tuple(LayoutRule(pattern, tuple(axes)) for pattern, axes in yaml.safe_load(rules_text)["rules"].items())
    shape = tuple(int(size) for size in mesh.split("x"))
    mesh_config = MeshConfig(shape=shape, axis_names=("data", "model"), batch_axis="data")
    keras.distribution.set_distribution(make_distribution(mesh_config, rules, jax.devices()))
    started = time.perf_counter()
    with LoadWatch(jax.devices()) as watch:
        onto_shards = load_onto_shards(on_placed=watch.sample) if loader == "meshrun" else contextlib.nullcontext()
        with onto_shards:
            task = keras_hub.models.CausalLM.from_preset(str(preset), preprocessor=None, compile=False)
    seconds = time.perf_counter() - started
    held = bytes_by_device()
    planned = max(held.get(device, 0) for device in jax.devices())
    peaks = watch.peaks()
    return {"load_peak_bytes_per_device": peaks.bytes_per_device, "planned_bytes_per_device": planned,
            "load_peak_host_bytes": peaks.host_bytes, "seconds": seconds, "params": int(task.count_params())}


def report(results: dict) -> None:
    weights = results["weights_bytes"]
    print(f"preset: {results['preset']}; weights {weights / 2**20:,.0f} MiB; mesh {results['mesh']} (data, model), layout gemma_tp")
    print(f"{'loader':<9}{'device peak':>14}{'planned':>11}{'peak/planned':>14}{'host peak':>12}{'host/preset':>13}{'load s':>8}")
    for loader, found in results["loaders"].items():
        device, planned, host = found["load_peak_bytes_per_device"], found["planned_bytes_per_device"], found["load_peak_host_bytes"]
        print(f"{loader:<9}{device / 2**20:>10,.0f} MiB{planned / 2**20:>7,.0f} MiB{device / planned:>13.2f}x"
              f"{host / 2**20:>8,.0f} MiB{host / weights:>12.2f}x{found['seconds']:>8.1f}")
    print("targets for meshrun: device peak at most 1.3x planned; host peak under 1.5x the preset's weights")


if __name__ == "__main__":
    main()
