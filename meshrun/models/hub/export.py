"""checkpoint.export and checkpoint.keep_adapter for model=keras_hub (the spec's export and
save_adapter hooks): the trained task in KerasHub's own format, loadable with no meshrun installed,
and the adapter file `meshrun generate` puts back on the base (load_adapter).

- `<run dir>/preset/`: a KerasHub preset, LoRA adapters merged into the kernels, with the
  preprocessor and tokenizer of model.preset (save_preset).
- `<run dir>/adapter.lora.h5` for a LoRA run: the adapters as trained (save_adapter: PEFT's
  adapters, which KerasHub's own load_lora_weights does not take). A LoRA fine-tune of
  model.preset writes it without an export too (checkpoint.keep_adapter: keep_adapter), and
  `meshrun generate` puts it back on the base preset (load_adapter).

For a model.preset that is a transformers checkpoint, the export is one again instead of a
KerasHub preset (meshrun.hf.export): `<run dir>/hf/` (which `meshrun generate` and model.preset
load, as they loaded the source) and, for a LoRA run, `<run dir>/peft/` (a PEFT adapter on the
source) besides adapter.lora.h5.

For a QLoRA run (model.quantize=int8|int4) the adapters are written as for a float base: they
apply to model.preset as it is, in float; `preset/` and `hf/` hold the base in its float dtype,
each quantized kernel dequantized with its adapter merged (kernel + alpha / rank * A @ B), a plain
float model with no quantized dtype policy (float_task; the log says which file is which).

All are written under a temporary name and renamed when complete.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
from pathlib import Path

import numpy as np

from meshrun.compat.keras_hub import local_preset_loading
from meshrun.config.schema import CheckpointConfig
from meshrun.files import dir_written_whole
from meshrun.models.hub import build as building
from meshrun.models.hub.lora import adapted_layers, enable_lora
from meshrun.models.hub.options import KerasHubOptions, LoraOptions
from meshrun.models.hub.presets import import_keras_hub, transformers_checkpoint
from meshrun.specs.rundir import ADAPTER_FILE, HF_DIR, PEFT_DIR, PRESET_DIR
from meshrun.system.process import native_info_lines_dropped
from meshrun.wording import error_text

log = logging.getLogger("meshrun")

PREPROCESSOR_FILES = ("preprocessor.json", "tokenizer.json")  # a preset holding either brings a preprocessor


def export(task, options: KerasHubOptions, run_dir: Path, checkpoint=None) -> dict[str, str]:
    """KerasHub's own formats of the trained task, written into `run_dir` beside model.keras:
    `preset/` (save_preset) and, for a LoRA run, `adapter.lora.h5` (save_adapter); for a
    transformers model.preset, `hf/` and `peft/` instead of `preset/` (export_transformers).
    Returns their paths by name (preset, adapter, hf, peft): preset names what `meshrun generate`
    loads. `checkpoint` is the run's CheckpointConfig (None: its defaults)."""
    source = transformers_checkpoint(options.preset)
    checkpoint = checkpoint or CheckpointConfig()
    if source is not None:
        exported = export_transformers(task, source, options, run_dir, checkpoint)
        dtype = checkpoint.hf_dtype or source.dtype
    else:
        merged = task if options.quantize is None else float_task(task, options)
        exported = {"preset": str(save_preset(merged, options, run_dir / PRESET_DIR))}
        dtype = float_dtype(merged)
    if options.lora.enabled:
        exported["adapter"] = str(save_adapter(task.backbone, options.lora, run_dir / ADAPTER_FILE))
    if options.quantize is not None:
        log.info(quantized_export_note(options.quantize, dtype, exported))
    return exported


def quantized_export_note(mode: str, dtype: str, exported: dict[str, str]) -> str:
    """The log line that says what each file of a QLoRA run's export holds (`dtype`: the merged
    model's)."""
    merged = exported.get("hf") or exported.get("preset")
    said = (
        [f"{Path(merged).name}/: {dtype} base (dequantized {mode}) with the adapters merged"]
        if merged
        else []
    )
    if "adapter" in exported:
        said.append(adapter_note(Path(exported["adapter"]).name, mode))
    if "peft" in exported:
        said.append(f"{Path(exported['peft']).name}/: the PEFT form of those adapters, on the float base")
    return "the QLoRA export: " + "; ".join(said)


def float_dtype(task) -> str:
    """The dtype of the task's float weights (its first float variable's)."""
    import keras

    dtypes = [keras.backend.standardize_dtype(v.dtype) for v in task.backbone.weights]
    return next((dtype for dtype in dtypes if "float" in dtype), "float32")


def adapter_note(name: str, mode: str) -> str:
    """What a QLoRA run's adapter file is, for the log."""
    return f"{name}: LoRA adapters for the float base (model.preset), trained on its {mode} form"


def float_task(trained, options: KerasHubOptions):
    """The trained QLoRA task as a float model of the same architecture (model.preset's, in its
    float dtype, no LoRA, no quantized layer), built without a distribution: every quantized
    kernel dequantized with its adapter merged (kernel + alpha / rank * A @ B, in float32, then
    cast), every other weight copied. The host reads one quantized layer at a time; the float
    model lives on the host (off_the_mesh_on_the_host), not on the accelerators."""
    float_options = dataclasses.replace(options, quantize=None, lora=LoraOptions())
    with off_the_mesh_on_the_host():
        task = building.build(float_options, load_weights=False)
        _fill_float(task, trained)
    return task


def _fill_float(task, trained) -> None:
    """Assigns the float `task` the trained QLoRA task's weights (float_task), one at a time: a
    quantized layer's kernel merged (merged_kernel) as it is assigned, every other weight copied."""
    import keras

    from meshrun.quantize import merged_kernel, quantized_by_kernel

    targets = {v.path: v for v in task.weights}
    layers = quantized_by_kernel(trained.backbone)
    skipped = {v.path for layer in layers.values() for v in layer.weights}
    sources = {v.path: (lambda v=v: v.value) for v in trained.weights if v.path not in skipped}
    for path, layer in layers.items():
        sources[path] = lambda layer=layer: merged_kernel(layer)
        if layer.bias is not None:
            sources[layer.bias.path] = lambda bias=layer.bias: bias.value
    if set(sources) != set(targets):
        lacks, extra = sorted(set(targets) - set(sources))[:3], sorted(set(sources) - set(targets))[:3]
        raise RuntimeError(
            f"the float model of the QLoRA export does not match the trained one: {lacks}, {extra}"
        )
    for path, variable in targets.items():
        dtype = keras.backend.standardize_dtype(variable.dtype)
        variable.assign(np.asarray(sources[path]()).astype(dtype))


@contextlib.contextmanager
def off_the_mesh_on_the_host():
    """While in force, no distribution, and new arrays are made on the host's CPU device where
    jax has one beside the accelerators: a float model built here takes no accelerator memory."""
    import jax
    import keras

    distribution = keras.distribution.distribution()
    keras.distribution.set_distribution(None)
    try:
        cpus = jax.devices("cpu")
    except RuntimeError:  # no CPU backend: the default device
        cpus = []
    try:
        with jax.default_device(cpus[0]) if cpus else contextlib.nullcontext():
            yield
    finally:
        keras.distribution.set_distribution(distribution)


def export_transformers(task, source, options: KerasHubOptions, run_dir: Path, checkpoint) -> dict[str, str]:
    """The trained task as a transformers checkpoint in `hf/` (in checkpoint.hf_dtype, else the
    source's dtype, in files of at most checkpoint.hf_shard_bytes) and, for a LoRA run, a PEFT
    adapter in `peft/` (meshrun.hf.export). No KerasHub preset: KerasHub's own preset of some such
    models does not load back (tied heads), and its tokenizer would not be the source's files."""
    from meshrun.hf import export as hf_export

    hf = hf_export.write_hf(
        task.backbone, source, run_dir / HF_DIR, checkpoint.hf_dtype, checkpoint.hf_shard_bytes
    )
    exported = {"preset": str(hf), "hf": str(hf)} if hf is not None else {}
    if options.lora.enabled:
        peft = hf_export.write_peft(task.backbone, source, run_dir / PEFT_DIR, options.lora.dropout)
        if peft is not None:
            exported["peft"] = str(peft)
    return exported


def save_preset(task, options: KerasHubOptions, directory: Path) -> Path:
    """Writes the task as a KerasHub preset that plain `keras_hub.models.CausalLM.from_preset(dir)`
    loads, no meshrun needed: LoRA adapters are merged into the kernels (an adapted layer saves its
    kernel + alpha / rank * A @ B: meshrun.models.hub.lora; the config holds the backbone's
    arguments, no LoRA),
    with the preprocessor and tokenizer of model.preset where it has them (none otherwise, which
    the log says). The preset is written into a temporary dir renamed to `directory` once complete,
    so a failed export leaves nothing half-written."""
    preprocessor = preset_preprocessor(options)
    exporting = (
        type(task)(backbone=task.backbone, preprocessor=preprocessor, compile=False)
        if preprocessor is not None
        else task
    )
    with dir_written_whole(directory) as partial:
        exporting.save_to_preset(str(partial))
        if options.lora.enabled:
            _count_merged_parameters(partial, task.backbone)
    return directory


def preset_preprocessor(options: KerasHubOptions):
    """The CausalLMPreprocessor (with its tokenizer) of model.preset, or None when there is no
    preset, it holds neither a preprocessor nor a tokenizer, or KerasHub cannot load them (said in
    the log: the trained weights are still exported)."""
    if options.preset is None or not any(
        (Path(options.preset).expanduser() / name).is_file() for name in PREPROCESSOR_FILES
    ):
        source = f"model.preset {options.preset}" if options.preset else "a model built from model.backbone"
        log.info(
            f"the exported preset has no tokenizer or preprocessor ({source} has none); "
            "give CausalLM.from_preset(..., preprocessor=...) one, or feed it token ids"
        )
        return None
    keras_hub = import_keras_hub()
    preset = str(Path(options.preset).expanduser())
    try:
        with (
            local_preset_loading(),
            native_info_lines_dropped(),
        ):  # SentencePiece's LOG(INFO) lines on loading the tokenizer
            return keras_hub.models.CausalLMPreprocessor.from_preset(preset)
    except Exception as err:  # the preset's own files decide; the export goes on without them
        log.warning(
            "the exported preset has no tokenizer or preprocessor: "
            f"CausalLMPreprocessor.from_preset({preset!r}) raised {error_text(err)}"
        )
        return None


def _count_merged_parameters(preset: Path, backbone) -> None:
    """Sets the preset's metadata.json parameter_count to the weights it holds: KerasHub counts the
    backbone's variables, LoRA adapters included, which the merged preset does not hold (nor seed
    generators' states, such as LoRA dropout's: not weights)."""
    import json
    import math

    adapters = {
        id(v) for layer in adapted_layers(backbone) for v in (layer.lora_kernel_a, layer.lora_kernel_b)
    }
    path = preset / "metadata.json"
    metadata = json.loads(path.read_text())
    metadata["parameter_count"] = sum(math.prod(v.shape) for v in backbone.weights if id(v) not in adapters)
    path.write_text(json.dumps(metadata, indent=4))


def keep_adapter(trained, options: KerasHubOptions, run_dir: Path) -> str | None:
    """The adapters of a LoRA fine-tune of model.preset, written as adapter.lora.h5 into `run_dir`
    (save_adapter) from the trained task (`trained()`, None where it cannot be had here); returns
    its path. None for a run without LoRA, or without a preset (its frozen weights were drawn from
    the seed: there is no base to put the adapters back on), or whose adapters are split over
    processes (none of them holds them whole; the log says so)."""
    if not options.lora.enabled or options.preset is None:
        return None
    task = trained()
    if task is None:
        return None
    split = [
        v.path
        for layer in adapted_layers(task.backbone)
        for v in (layer.lora_kernel_a, layer.lora_kernel_b)
        if not (v.value.is_fully_addressable or v.value.is_fully_replicated)
    ]
    if split:
        log.warning(
            f"checkpoint.keep_adapter: {split[0]} is split over processes, "
            "so no adapter file is written (its checkpoints hold it)"
        )
        return None
    path = save_adapter(task.backbone, options.lora, run_dir / ADAPTER_FILE)
    if options.quantize is not None:
        log.info(adapter_note(path.name, options.quantize))
    return str(path)


ADAPTER_FORMAT = "meshrun-lora"  # the adapter file's `format` attribute


class AdapterFileMismatch(ValueError):
    """An adapter file that holds no adapters for the model it is loaded on (load_adapter)."""


def load_adapter(task, lora: LoraOptions, path: Path):
    """`task` (the base model, model.preset) with the adapters of `path` (as save_adapter wrote
    them) on its target layers: LoRA enabled at `lora`'s rank and targets with the file's alpha and
    no dropout (it samples, never trains; sampling_lora), unless the task was built with them
    already (a quantized base), then each adapter's A and B assigned from the file. Returns `task`;
    AdapterFileMismatch where the file holds other adapters (another rank or alpha, other layers,
    not meshrun's)."""
    import h5py

    from meshrun.compat.keras.lora import adapter_of

    with h5py.File(path, "r") as file:
        said = {key: file.attrs.get(key) for key in ("format", "rank", "alpha")}
        if said["format"] != ADAPTER_FORMAT:
            raise AdapterFileMismatch(
                f"{path.name} is not an adapter file meshrun writes (format {said['format']!r}, valid: "
                f"{ADAPTER_FORMAT!r}; the KerasHub save_lora_weights files that runs kept before meshrun's "
                "LoRA took PEFT's rank are not): train the fine-tune again"
            )
        if not adapted_layers(task.backbone):
            enable_lora(task.backbone, sampling_lora(dataclasses.replace(lora, alpha=float(said["alpha"]))))
        adapters = [adapter_of(layer) for layer in adapted_layers(task.backbone)]
        found, held = {_layer_path(adapter) for adapter in adapters}, _held_layers(file)
        alpha = adapters[0].alpha if adapters else None
        expected = {"format": ADAPTER_FORMAT, "rank": lora.rank, "alpha": alpha}
        if said != expected or not found or held != found:
            raise AdapterFileMismatch(
                f"{path.name} holds no adapters of rank {lora.rank} on this model's {len(found)} target "
                f"layers (it has rank {said['rank']}, {len(held)} layers)"
            )
        for adapter in adapters:
            group = file[_layer_path(adapter)]
            adapter.a.assign(group["lora_kernel_a"][...])
            adapter.b.assign(group["lora_kernel_b"][...])
    return task


def _layer_path(adapter) -> str:
    """The path of the layer an adapter is on (its variables' paths less their names)."""
    return adapter.a.path.rsplit("/", 1)[0]


def _held_layers(file) -> set[str]:
    """The layer paths an adapter file holds adapters of (the groups with a lora_kernel_a)."""
    held = set()
    file.visititems(
        lambda name, item: held.add(name.rsplit("/", 1)[0]) if name.endswith("/lora_kernel_a") else None
    )
    return held


def sampling_lora(lora: LoraOptions) -> LoraOptions:
    """The LoRA options an adapter file is loaded with: `lora`'s rank, alpha and targets, no
    dropout."""
    return dataclasses.replace(lora, dropout=0.0)


def save_adapter(backbone, lora: LoraOptions, path: Path) -> Path:
    """Writes the LoRA adapters as trained into the HDF5 file `path`: for each adapted layer a
    group named by its path, holding lora_kernel_a (in_features, rank) and lora_kernel_b (rank,
    out_features) in float32; the file's attributes say its format, rank and alpha (each update is
    alpha / rank * A @ B, reshaped to the kernel: PEFT's adapter, meshrun.compat.keras.lora).
    load_adapter puts it back on the base. Written under a temporary name, renamed when complete."""
    import os

    import h5py

    from meshrun.compat.keras.lora import adapter_of

    partial = path.with_name(f".partial-{path.name}")
    try:
        with h5py.File(partial, "w") as file:
            file.attrs.update(format=ADAPTER_FORMAT, rank=lora.rank, alpha=float(lora.alpha or lora.rank))
            for layer in adapted_layers(backbone):
                adapter = adapter_of(layer)
                group = file.create_group(_layer_path(adapter))
                group["lora_kernel_a"] = np.asarray(adapter.a.value, dtype="float32")
                group["lora_kernel_b"] = np.asarray(adapter.b.value, dtype="float32")
        os.replace(partial, path)
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    return path
