"""Benchmarks what loading a KerasHub preset onto a mesh costs in memory: meshrun's loader
(`meshrun.compat.keras.sharded_loading.load_onto_shards`: variables start as zeros on their shards
instead of drawing random values, and each weight read from the preset goes straight onto its
shards) against plain `CausalLM.from_preset` under the same distribution.

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

`--quantize int8|int4` loads the preset into a quantized base instead (QLoRA). meshrun's loader is
meshrun's own path (meshrun.models.hub.build.build with model.quantize and LoRA rank 4: each Dense and
EinsumDense built quantized, each float kernel quantized as it is read, meshrun.quantize); the plain
loader is Keras' way, `from_preset` then `quantize(mode)` on the loaded float model (int4 fails under
a distribution in Keras 3.15: the row says so). Printed per loader: the per-device load peak against
the planned quantized bytes per device (the sum of one device's shard bytes of the loaded arrays,
LoRA adapters included; target for meshrun: at most 1.3x), the host peak against the preset's
largest float tensor (target: at most 1.5x) and the load's wall time.

    python scripts/bench_load.py --quantize int4 --size-gb 1 --mesh 2x4

`--stages S [S ...]` measures instead meshrun's whole run path (`meshrun train`, one step) with the
blocks as pipeline stages: for each S, mesh S x 1 x (8 / S) with axes (stage, data, model) (S = 1: no
stage axis, mesh 1 x 8), a preset of --blocks blocks, each run in a fresh process. Printed per S:
the load peak and the parameters a device holds after it (memory.load_peak_bytes_per_device and
memory.params_bytes_per_device of metrics.json); target: a peak of at most 1.3x the parameters, the
stage axis dividing the blocks' bytes per device by S.

    python scripts/bench_load.py --stages 1 2 4 --blocks 4 --size-gb 0.5

`--transformers` measures instead loading a Hugging Face transformers checkpoint (a Llama of about
--size-gb GB, float32, in safetensors shards, built with meshrun's own writer, or --preset DIR) with
meshrun's reader (meshrun.hf.load: each device's slice read from the files onto that device) under
`llama_tp` on --mesh, once in one process holding all the devices and once in two processes holding
half each (jax.distributed on localhost). Printed per process: the per-device load peak against the
planned bytes (target: at most 1.3x), the host peak against the largest slice any of its devices
holds (target: within 1.5x of it plus a fixed overhead, stated), the bytes it read from the files
(target with two processes: about half each), and its load time against reading every file once
from a warm page cache (target: within 2x).

    python scripts/bench_load.py --transformers --size-gb 1
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import benchlib

LOADERS = ("plain", "meshrun")  # each measured on a KerasHub preset; "transformers": --transformers
QUANTIZE_MODES = ("int8", "int4")
QUANTIZED_LORA_RANK = 4
HIDDEN, HEADS, VOCABULARY = 2048, 8, 16384  # 8 heads of 256; Gemma's MLP 8192 / 2 wide
STAGED_DEVICES = 8


def main() -> None:
    args = parse_args()
    if args.load:
        return load_in_child(args)
    if args.stages:
        return staged_loads(args)
    if args.transformers:
        return transformers_loads(args)
    if args.quantize:
        return quantized_loads(args)
    return plain_loads(args)


def parse_args() -> argparse.Namespace:
    """The command line's settings (--load and --process: those of a loader's child process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--size-gb", type=float, default=1.0, help="size of the preset to build (float32 weights)"
    )
    parser.add_argument("--preset", type=Path, help="load this Gemma preset dir instead of building one")
    parser.add_argument("--mesh", default="2x4", help="mesh shape DATAxMODEL of emulated CPU devices")
    parser.add_argument("--out", type=Path, help="also write the results here as JSON")
    parser.add_argument(
        "--stages",
        type=int,
        nargs="+",
        help="measure meshrun train with this many pipeline stages instead (8 devices)",
    )
    parser.add_argument("--blocks", type=int, default=4, help="the preset's decoder blocks with --stages")
    parser.add_argument(
        "--transformers", action="store_true", help="measure loading a transformers checkpoint instead"
    )
    parser.add_argument(
        "--quantize", choices=QUANTIZE_MODES, help="load into a quantized base (int8 or int4) instead"
    )
    parser.add_argument(
        "--load", choices=(*LOADERS, "transformers"), help=argparse.SUPPRESS
    )  # one loader's child process
    parser.add_argument("--process", default="0/1:0", help=argparse.SUPPRESS)  # ID/COUNT:PORT of a child
    return parser.parse_args()


def load_in_child(args) -> None:
    """The child process of one loader (--load): loads and prints its figures as a JSON line."""
    if args.load == "transformers":
        found = load_transformers(args.preset, args.mesh, args.process)
    elif args.quantize:
        found = load_quantized(args.preset, args.mesh, args.load, args.quantize)
    else:
        found = load(args.preset, args.mesh, args.load)
    print(json.dumps(found))


def plain_loads(args) -> None:
    """Each loader loading the float preset in a fresh process; prints and (--out) writes the
    figures."""
    with tempfile.TemporaryDirectory() as scratch:
        preset = args.preset or build_preset(Path(scratch) / "gemma", preset_of(args.size_gb))
        results = {
            "preset": str(args.preset or f"built: {preset_of(args.size_gb).describe()}"),
            "weights_bytes": benchlib.weights_bytes(preset),
            "mesh": args.mesh,
            "loaders": {loader: run_child(preset, args.mesh, loader) for loader in LOADERS},
        }
    report(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def staged_loads(args) -> None:
    """meshrun train of a preset of args.blocks blocks for each stage count of args.stages; prints
    and (--out) writes each run's load peak and parameters per device."""
    built = benchlib.GemmaPreset.of_blocks(args.size_gb * 1e9, args.blocks, HEADS, VOCABULARY)
    with tempfile.TemporaryDirectory() as scratch:
        preset = args.preset or build_preset(Path(scratch) / "gemma", built)
        rows = [staged_run(preset, stages, Path(scratch)) for stages in args.stages]
    print(
        f"Gemma preset of {args.blocks} blocks, hidden {built.hidden}, about "
        f"{args.size_gb:g} GB; layout gemma_tp on {STAGED_DEVICES} emulated CPU devices"
    )
    print(f"{'stages':>6}{'load peak':>14}{'params':>12}{'peak/params':>13}{'process RSS':>14}")
    for row in rows:
        peak, params = row["load_peak_bytes_per_device"], row["params_bytes_per_device"]
        print(
            f"{row['stages']:>6}{peak / 2**20:>10,.1f} MiB{params / 2**20:>8,.1f} "
            f"MiB{peak / params:>12.2f}x{row['peak_rss_bytes'] / 2**20:>10,.0f} MiB"
        )
    if args.out:
        args.out.write_text(
            json.dumps(
                {"blocks": args.blocks, "hidden": built.hidden, "size_gb": args.size_gb, "rows": rows},
                indent=2,
            )
        )


def staged_run(preset: Path, stages: int, scratch: Path) -> dict:
    """One `meshrun train` step of `preset` with its blocks as `stages` pipeline stages, in a fresh
    process on STAGED_DEVICES emulated CPU devices: its load peak and parameters per device."""
    done, metrics = benchlib.train(
        [
            "model=keras_hub",
            f"model.preset={preset}",
            "layout=gemma_tp",
            *staged_mesh(stages),
            "model.seq_len=16",
            "train.batch_size=8",
            "data.num_samples=8",
            "data.eval_samples=8",
            "train.epochs=1",
            "train.verbose=0",
        ],
        scratch / f"run-{stages}",
        f"the run with {stages} stages",
        cwd=scratch,
        env=benchlib.emulated_cpu_env(STAGED_DEVICES),
    )
    memory = metrics["memory"]
    return {
        "stages": stages,
        "load_peak_bytes_per_device": memory["load_peak_bytes_per_device"],
        "params_bytes_per_device": memory["params_bytes_per_device"],
        "peak_rss_bytes": done.peak_rss_bytes,
    }


def staged_mesh(stages: int) -> list[str]:
    """The mesh overrides of `stages` stages: (stage, data, model) of stages x 1 x the rest; one
    stage: no stage axis, 1 x all the devices."""
    if stages == 1:
        return [f"mesh=1x{STAGED_DEVICES}"]
    return [
        f"mesh={stages}x1x{STAGED_DEVICES // stages}",
        "mesh.axis_names=[stage,data,model]",
        "mesh.batch_axis=data",
    ]


def preset_of(size_gb: float) -> benchlib.GemmaPreset:
    """The Gemma preset of about `size_gb` GB: as many blocks of HIDDEN as make the size."""
    return benchlib.GemmaPreset.of_size(size_gb * 1e9, HIDDEN, HEADS, VOCABULARY)


def build_preset(path: Path, preset: benchlib.GemmaPreset) -> Path:
    """Saves `preset` (random weights) into `path`, in a process of its own."""
    seconds = preset.save(path)
    print(
        f"built a Gemma preset of {preset.blocks} blocks, hidden {preset.hidden}, in {seconds:.0f} s",
        file=sys.stderr,
    )
    return path


def quantized_loads(args) -> None:
    """Each loader loading the preset into a quantized base (args.quantize) in a fresh process;
    prints and (--out) writes the figures."""
    with tempfile.TemporaryDirectory() as scratch:
        preset = args.preset or build_preset(Path(scratch) / "gemma", preset_of(args.size_gb))
        results = {
            "preset": str(args.preset or f"built: {preset_of(args.size_gb).describe()}"),
            "weights_bytes": benchlib.weights_bytes(preset),
            "largest_float_tensor_bytes": largest_float_tensor(preset),
            "mesh": args.mesh,
            "quantize": args.quantize,
            "loaders": {loader: run_child(preset, args.mesh, loader, args.quantize) for loader in LOADERS},
        }
    report_quantized(results)
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def largest_float_tensor(preset: Path) -> int:
    """The bytes of the largest floating-point tensor in the preset's weights files."""
    import h5py
    import numpy as np

    largest = 0

    def visit(_name, item):
        nonlocal largest
        if isinstance(item, h5py.Dataset) and np.dtype(item.dtype).kind == "f":
            largest = max(largest, item.size * item.dtype.itemsize)

    for file in preset.glob("*.weights*.h5"):
        with h5py.File(file, "r") as weights:
            weights.visititems(visit)
    return largest


def load_quantized(preset: Path, mesh: str, loader: str, mode: str) -> dict:
    """Loads `preset` into a base quantized by `mode` under gemma_tp on `mesh`: meshrun's path
    (hub.build, LoRA rank 4) or Keras' (from_preset, then quantize); its peaks, planned bytes, time
    (or the error Keras' way ends in)."""
    import jax

    from meshrun.system.load_memory import LoadWatch, bytes_by_device

    distribute("gemma_tp", mesh)
    started = time.perf_counter()
    with LoadWatch(jax.devices()) as watch:
        try:
            task = _quantized_task(preset, loader, mode)
        except Exception as err:  # Keras' own quantize under a distribution (int4 in Keras 3.15)
            if loader == "meshrun":
                raise
            return {"error": f"{type(err).__name__}: {str(err).splitlines()[0][:200]}"}
    seconds = time.perf_counter() - started
    held = bytes_by_device(jax.live_arrays())
    peaks = watch.peaks()
    return {
        "load_peak_bytes_per_device": peaks.bytes_per_device,
        "planned_bytes_per_device": max(held.get(device, 0) for device in jax.devices()),
        "load_peak_host_bytes": peaks.host_bytes,
        "seconds": seconds,
        "params": int(task.count_params()),
    }


def _quantized_task(preset: Path, loader: str, mode: str):
    """The task of `preset` with its base quantized by `mode` and LoRA on top, built by `loader`."""
    if loader == "meshrun":
        from meshrun.models.hub.build import build
        from meshrun.models.hub.options import KerasHubOptions, LoraOptions

        options = KerasHubOptions(
            preset=str(preset), quantize=mode, lora=LoraOptions(rank=QUANTIZED_LORA_RANK)
        )
        return build(options)
    import keras_hub

    from meshrun.models.hub.lora import enable_lora
    from meshrun.models.hub.options import LoraOptions

    task = keras_hub.models.CausalLM.from_preset(str(preset), preprocessor=None, compile=False)
    task.quantize(mode)
    enable_lora(task.backbone, LoraOptions(rank=QUANTIZED_LORA_RANK))
    return task


def report_quantized(results: dict) -> None:
    largest = results["largest_float_tensor_bytes"]
    print(
        f"preset: {results['preset']}; weights {results['weights_bytes'] / 2**20:,.0f} MiB, largest float "
        f"tensor {largest / 2**20:,.0f} MiB; quantized {results['quantize']}, LoRA rank "
        f"{QUANTIZED_LORA_RANK}; mesh {results['mesh']} (data, model), layout gemma_tp"
    )
    print(
        f"{'loader':<9}{'device peak':>14}{'planned':>11}{'peak/planned':>14}"
        f"{'host peak':>12}{'host/largest':>14}{'load s':>8}"
    )
    for loader, found in results["loaders"].items():
        if "error" in found:
            print(f"{loader:<9}failed: {found['error']}")
            continue
        device, planned, host = (
            found["load_peak_bytes_per_device"],
            found["planned_bytes_per_device"],
            found["load_peak_host_bytes"],
        )
        print(
            f"{loader:<9}{device / 2**20:>10,.1f} MiB{planned / 2**20:>7,.1f} MiB{device / planned:>13.2f}x"
            f"{host / 2**20:>8,.0f} MiB{host / largest:>13.2f}x{found['seconds']:>8.1f}"
        )
    print(
        "targets for meshrun: device peak at most 1.3x planned (quantized); host peak at most 1.5x the "
        "largest float tensor"
    )


def run_child(preset: Path, mesh: str, loader: str, quantize: str | None = None) -> dict:
    """One loader's load of `preset` in a child process of its own on `mesh`'s emulated CPU
    devices: the figures it printed."""
    env = benchlib.emulated_cpu_env(benchlib.mesh_devices(mesh), keras_backend=True)
    command = [sys.executable, __file__, "--load", loader, "--preset", str(preset), "--mesh", mesh]
    done = subprocess.run(
        command + (["--quantize", quantize] if quantize else []),
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise SystemExit(f"the {loader} load failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def load(preset: Path, mesh: str, loader: str) -> dict:
    """Loads `preset` with `loader` under gemma_tp on `mesh`; its peaks, planned bytes and time."""
    import contextlib

    import jax
    import keras_hub

    from meshrun.compat.keras.sharded_loading import load_onto_shards
    from meshrun.system.load_memory import LoadWatch, bytes_by_device

    distribute("gemma_tp", mesh)
    started = time.perf_counter()
    with LoadWatch(jax.devices()) as watch:
        onto_shards = (
            load_onto_shards(on_placed=watch.sample) if loader == "meshrun" else contextlib.nullcontext()
        )
        with onto_shards:
            task = keras_hub.models.CausalLM.from_preset(str(preset), preprocessor=None, compile=False)
    seconds = time.perf_counter() - started
    held = bytes_by_device(jax.live_arrays())
    planned = max(held.get(device, 0) for device in jax.devices())
    peaks = watch.peaks()
    return {
        "load_peak_bytes_per_device": peaks.bytes_per_device,
        "planned_bytes_per_device": planned,
        "load_peak_host_bytes": peaks.host_bytes,
        "seconds": seconds,
        "params": int(task.count_params()),
    }


LLAMA_HIDDEN, LLAMA_HEADS, LLAMA_KV_HEADS, LLAMA_INTERMEDIATE, LLAMA_VOCABULARY = 2048, 16, 8, 5632, 32000


def transformers_loads(args) -> None:
    """Loads a transformers checkpoint in one process, then in two; prints and writes the figures."""
    import socket

    with tempfile.TemporaryDirectory() as scratch:
        checkpoint = args.preset or build_transformers_checkpoint(Path(scratch) / "llama", args.size_gb)
        files = sorted(checkpoint.glob("*.safetensors"))
        weights = sum(f.stat().st_size for f in files)
        read_once = min(time_reading(files) for _ in range(3))  # the first warms the page cache
        results = {"checkpoint": str(checkpoint), "weights_bytes": weights, "read_files_s": read_once}
        results["one_process"] = [run_transformers_child(checkpoint, args.mesh, "0/1:0")]
        with socket.socket() as probe:
            probe.bind(("127.0.0.1", 0))
            port = probe.getsockname()[1]
        children = [_start_transformers_child(checkpoint, args.mesh, f"{i}/2:{port}") for i in range(2)]
        results["two_processes"] = [_finish_child(child) for child in children]
    for name in ("one_process", "two_processes"):
        for found in results[name]:
            print(f"{name} #{found['process']}: {_described(found, weights, read_once)}")
    if args.out:
        args.out.write_text(json.dumps(results, indent=2))


def _described(found: dict, weights: int, read_once: float) -> str:
    mib = 2**20
    device, planned = found["load_peak_bytes_per_device"], found["planned_bytes_per_device"]
    return (
        f"device peak {device / mib:,.1f} MiB ({device / planned:.2f}x planned), host peak "
        f"{found['load_peak_host_bytes'] / mib:,.1f} MiB (largest slice "
        f"{found['largest_slice_bytes'] / mib:,.1f} MiB), read {found['bytes_read'] / mib:,.0f} of "
        f"{weights / mib:,.0f} MiB, {found['seconds']:.1f} s (reading the files once: {read_once:.1f} s)"
    )


def build_transformers_checkpoint(path: Path, size_gb: float) -> Path:
    """Writes a Llama transformers checkpoint of about `size_gb` GB (random float32 weights, shards of
    about 400 MB) with meshrun's own writer."""
    import numpy as np

    from meshrun.hf import families, safetensors

    per_layer = 4 * (
        2 * LLAMA_HIDDEN * LLAMA_HIDDEN + 2 * LLAMA_HIDDEN * LLAMA_HIDDEN * LLAMA_KV_HEADS // LLAMA_HEADS
    )
    per_layer += 4 * 3 * LLAMA_HIDDEN * LLAMA_INTERMEDIATE
    embeddings = 2 * 4 * LLAMA_VOCABULARY * LLAMA_HIDDEN
    layers = max(1, round((size_gb * 1e9 - embeddings) / per_layer))
    config = {
        "model_type": "llama",
        "architectures": ["LlamaForCausalLM"],
        "vocab_size": LLAMA_VOCABULARY,
        "hidden_size": LLAMA_HIDDEN,
        "intermediate_size": LLAMA_INTERMEDIATE,
        "num_hidden_layers": layers,
        "num_attention_heads": LLAMA_HEADS,
        "num_key_value_heads": LLAMA_KV_HEADS,
        "rms_norm_eps": 1e-5,
        "rope_theta": 10000.0,
        "tie_word_embeddings": False,
        "torch_dtype": "float32",
    }
    path.mkdir(parents=True)
    (path / "config.json").write_text(json.dumps(config))
    hf_config = families.HFConfig(config, str(path))
    family = families.family_of(hf_config)
    tensors = family.tensors(family.arguments(hf_config), hf_config)
    planned = [safetensors.PlannedTensor(t.name, "float32", t.transform.hf_shape) for t in tensors]
    rng = np.random.default_rng(0)
    safetensors.write_shards(
        path, planned, lambda name: rng.standard_normal(_shape_of(planned, name), dtype=np.float32), 400 << 20
    )
    print(f"built a Llama transformers checkpoint of {layers} layers, hidden {LLAMA_HIDDEN}", file=sys.stderr)
    return path


def _shape_of(planned, name: str) -> tuple:
    return next(t.shape for t in planned if t.name == name)


def time_reading(files: list[Path]) -> float:
    """Seconds to read every byte of `files` once."""
    started = time.perf_counter()
    for file in files:
        with open(file, "rb") as stream:
            while stream.read(64 << 20):
                pass
    return time.perf_counter() - started


def run_transformers_child(checkpoint: Path, mesh: str, process: str) -> dict:
    return _finish_child(_start_transformers_child(checkpoint, mesh, process))


def _start_transformers_child(checkpoint: Path, mesh: str, process: str):
    count = int(process.split("/")[1].split(":")[0])
    env = benchlib.emulated_cpu_env(benchlib.mesh_devices(mesh) // count, keras_backend=True)
    command = [sys.executable, __file__, "--load", "transformers", "--preset", str(checkpoint)]
    command += ["--mesh", mesh, "--process", process]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _finish_child(child) -> dict:
    out, err = child.communicate()
    if child.returncode:
        raise SystemExit(f"a transformers load failed:\n{err[-3000:]}")
    return json.loads(out.strip().splitlines()[-1])


def load_transformers(checkpoint: Path, mesh: str, process: str) -> dict:
    """Loads `checkpoint` with meshrun's reader under llama_tp on `mesh` as process ID of COUNT
    (`process` is ID/COUNT:PORT); its peaks, planned bytes, bytes read and time."""

    import jax

    identity, rest = process.split("/")
    count, port = (int(part) for part in rest.split(":"))
    if count > 1:
        jax.distributed.initialize(f"127.0.0.1:{port}", num_processes=count, process_id=int(identity))
    from meshrun.hf import checkpoint as hf_checkpoint
    from meshrun.hf import load
    from meshrun.system.load_memory import LoadWatch

    distribute("llama_tp", mesh)
    found = hf_checkpoint.inspect(checkpoint)
    import keras_hub  # noqa: F401  (a run imports it before loading: its plan builds the model abstractly)

    started = time.perf_counter()
    with LoadWatch(jax.local_devices()) as watch:
        task, bytes_read = load.build_task(found, True, on_placed=watch.sample)
    seconds = time.perf_counter() - started
    arrays = [variable.value for variable in task.backbone.weights]
    held = {}
    largest = 0
    for array in arrays:
        for shard in array.addressable_shards:
            held[shard.device] = held.get(shard.device, 0) + shard.data.nbytes
            largest = max(largest, shard.data.nbytes)
    peaks = watch.peaks()
    return {
        "process": int(identity),
        "load_peak_bytes_per_device": peaks.bytes_per_device,
        "planned_bytes_per_device": max(held.values()),
        "load_peak_host_bytes": peaks.host_bytes,
        "largest_slice_bytes": largest,
        "bytes_read": bytes_read,
        "seconds": seconds,
    }


def distribute(layout: str, mesh: str) -> None:
    """Puts in force the distribution of meshrun's layout config `layout` on `mesh` (DATAxMODEL) over
    every device jax has (all processes')."""
    import jax
    import keras

    from meshrun.config.layout_schema import LayoutRule, MeshConfig
    from meshrun.placement.distribution import make_distribution

    rules = tuple(LayoutRule(pattern, tuple(axes)) for pattern, axes in benchlib.layout_rules(layout).items())
    shape = tuple(int(size) for size in mesh.split("x"))
    mesh_config = MeshConfig(shape=shape, axis_names=("data", "model"), batch_axis="data")
    keras.distribution.set_distribution(make_distribution(mesh_config, rules, jax.devices()))


def report(results: dict) -> None:
    weights = results["weights_bytes"]
    print(
        f"preset: {results['preset']}; weights {weights / 2**20:,.0f} "
        f"MiB; mesh {results['mesh']} (data, model), layout gemma_tp"
    )
    print(
        f"{'loader':<9}{'device peak':>14}{'planned':>11}{'peak/planned':>14}"
        f"{'host peak':>12}{'host/preset':>13}{'load s':>8}"
    )
    for loader, found in results["loaders"].items():
        device, planned, host = (
            found["load_peak_bytes_per_device"],
            found["planned_bytes_per_device"],
            found["load_peak_host_bytes"],
        )
        print(
            f"{loader:<9}{device / 2**20:>10,.0f} MiB{planned / 2**20:>7,.0f} MiB{device / planned:>13.2f}x"
            f"{host / 2**20:>8,.0f} MiB{host / weights:>12.2f}x{found['seconds']:>8.1f}"
        )
    print("targets for meshrun: device peak at most 1.3x planned; host peak under 1.5x the preset's weights")


if __name__ == "__main__":
    main()
