"""A trained model whose model.preset was a transformers checkpoint, written back as one: `<run>/hf/`
(safetensors shards with their index, the source's config.json, tokenizer files and
generation_config.json) and, for a LoRA run, `<run>/peft/` (a PEFT adapter on the source dir).

Host memory holds one tensor at a time: each is computed on the devices (a LoRA kernel merged
there, then cast to the written dtype), gathered to the host, put in transformers' layout
(`Transform.to_hf`) and written, before the next is touched. On a job of several processes every
process takes part in every gather (jax's process_allgather, a collective all of them run, in the
same order), and only the first process writes; the others drop the result.

meshrun's adapters are PEFT's (meshrun.compat.keras.lora): A (in_features, r) and B (r,
out_features) over a kernel's reduced and produced axes, which are transformers' weight's input and
output dimensions; `peft/` holds them transposed, their axes in transformers' order, with the run's
`r` and `lora_alpha`.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from meshrun.hf import safetensors
from meshrun.hf.checkpoint import CONFIG_FILE, GENERATION_FILE, HFCheckpoint
from meshrun.hf.families import TensorMap
from meshrun.hf.transforms import Transform

log = logging.getLogger("meshrun")

ADAPTER_CONFIG = "adapter_config.json"
ADAPTER_WEIGHTS = "adapter_model.safetensors"
PEFT_PREFIX = "base_model.model."
DTYPE_KEYS = ("torch_dtype", "dtype")  # transformers 4's and 5's spelling
DEFAULT_SHARD_BYTES = 5 * 1000**3  # transformers' own default max_shard_size, "5GB"


def adapters_by_kernel(backbone) -> dict:
    """The backbone's LoRA adapters (meshrun.compat.keras.lora.LoraAdapter) by the path of the
    kernel they adapt."""
    from meshrun.compat.keras.lora import adapter_of
    from meshrun.compat.keras.models import sublayers

    found = {}
    for layer in sublayers(backbone):
        adapter = adapter_of(layer)
        if adapter is not None:
            found[f"{adapter.a.path.rsplit('/', 1)[0]}/kernel"] = adapter
    return found


def is_writer() -> bool:
    """Whether this process writes the export (the first one)."""
    import jax

    return jax.process_index() == 0


def host_copy(array, writer: bool) -> np.ndarray | None:
    """`array` whole on the host of the writer (None on the others). An array split over processes
    is gathered from all of them (jax's process_allgather, a collective every process must run)."""
    if array.is_fully_addressable:
        return np.asarray(array) if writer else None
    from jax.experimental import multihost_utils

    gathered = multihost_utils.process_allgather(array, tiled=True)
    return gathered if writer else None


def device_value(variable, adapter, dtype: str):
    """The variable's value on its devices, its adapter (a LoraAdapter, or None) merged in float32
    (kernel + alpha / rank * A @ B, reshaped to the kernel), cast to `dtype`."""
    import jax.numpy as jnp

    value = variable.value
    if adapter is not None:
        value = value.astype(jnp.float32) + adapter.delta()
    return value.astype(safetensors.numpy_dtype(dtype))


def quantized_value(layer, writer: bool, dtype: str) -> np.ndarray | None:
    """A quantized layer's kernel in float `dtype` on the writer's host (None on the others), its
    adapter merged: dequantized + alpha / rank * A @ B in float32 (meshrun.quantize.merged_kernel), its
    variables gathered from every process (each runs the same gathers)."""
    from meshrun.quantize import merged_kernel

    kernel = merged_kernel(layer, lambda variable: host_copy(variable.value, True))
    return kernel.astype(safetensors.numpy_dtype(dtype)) if writer else None


def write_hf(backbone, checkpoint: HFCheckpoint, directory: Path, dtype: str | None, shard_bytes: int):
    """Writes the backbone as a transformers checkpoint into `directory` (under a temporary name,
    renamed when complete): every process must call it; the first writes and gets `directory`,
    the others None. A quantized layer's kernel (model.quantize) is written in float: dequantized,
    its adapter merged, on the host (quantized_value)."""
    from meshrun.files import dir_written_whole
    from meshrun.quantize import quantized_by_kernel

    dtype = dtype or checkpoint.dtype
    variables = {variable.path: variable for variable in backbone.weights}
    adapters = adapters_by_kernel(backbone)
    quantized_kernels = quantized_by_kernel(backbone)
    tensors = in_source_order(checkpoint)
    planned = [safetensors.PlannedTensor(t.name, dtype, t.transform.hf_shape) for t in tensors]
    by_name = {t.name: t for t in tensors}
    writer = is_writer()

    def produce(name: str) -> np.ndarray | None:
        tensor = by_name[name]
        layer = quantized_kernels.get(tensor.path)
        if layer is not None:
            whole = quantized_value(layer, writer, dtype)
        else:
            whole = host_copy(device_value(variables[tensor.path], adapters.get(tensor.path), dtype), writer)
        return None if whole is None else tensor.transform.to_hf(whole)

    if not writer:
        for tensor in planned:  # the same gathers, in the same order, as the writer's
            produce(tensor.name)
        return None
    with dir_written_whole(directory) as partial:
        safetensors.write_shards(partial, planned, produce, shard_bytes)
        write_config(checkpoint, partial / CONFIG_FILE, dtype)
        for name in checkpoint.tokenizer_files:
            shutil.copyfile(checkpoint.path / name, partial / name)
        write_generation_config(checkpoint, partial / GENERATION_FILE)
    return directory


def in_source_order(checkpoint: HFCheckpoint) -> list[TensorMap]:
    """The checkpoint's tensors in the order its files hold them."""
    files = {name: i for i, name in enumerate(checkpoint.files)}

    def place(tensor: TensorMap):
        entry = checkpoint.entries[tensor.name]
        return files.get(entry.file.name, len(files)), entry.offset

    return sorted(checkpoint.tensors, key=place)


def write_config(checkpoint: HFCheckpoint, file: Path, dtype: str) -> None:
    """The source's config.json, byte for byte where the dtype is the source's; else with its dtype
    key(s) (torch_dtype and/or dtype, whichever it has; torch_dtype where it has neither) set to
    `dtype`."""
    source = checkpoint.path / CONFIG_FILE
    if dtype == checkpoint.dtype:
        shutil.copyfile(source, file)
        return
    config = json.loads(source.read_text())
    keys = [key for key in DTYPE_KEYS if config.get(key) is not None] or ["torch_dtype"]
    for key in keys:
        config[key] = dtype
    file.write_text(json.dumps(config, indent=2) + "\n")


def write_generation_config(checkpoint: HFCheckpoint, file: Path) -> None:
    """The source's generation_config.json, or, where it has none, one of config.json's bos, eos
    and pad token ids, as transformers makes it from a model config."""
    source = checkpoint.path / GENERATION_FILE
    if source.is_file():
        shutil.copyfile(source, file)
        return
    ids = {
        key: checkpoint.config.values[key]
        for key in ("bos_token_id", "eos_token_id", "pad_token_id")
        if checkpoint.config.values.get(key) is not None
    }
    file.write_text(json.dumps({"_from_model_config": True, **ids}, indent=2) + "\n")


# --- PEFT -------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class PeftFactors:
    """One adapted module in PEFT's layout: its module name (q_proj, ...), lora_A [rank, in] and
    lora_B [out, rank], with B @ A the update of transformers' weight before the scale."""

    tensor: str  # the weight's name: model.layers.0.self_attn.q_proj.weight
    a: np.ndarray
    b: np.ndarray

    @property
    def module(self) -> str:
        return self.tensor.removesuffix(".weight")

    @property
    def rank(self) -> int:
        return self.a.shape[0]


def unmappable(transform: Transform, geometry) -> str | None:
    """Why the adapter of `geometry` (a LoraGeometry) on a kernel of `transform` is no PEFT adapter;
    None where it is one: the kernel's reduced axes must be the weight's input dimension, its
    produced axes the output rows."""
    outputs = len(transform.split[0])
    rows = {axis for axis in range(len(transform.perm)) if transform.perm[axis] < outputs}
    if rows != set(geometry.produced):
        return "its kernel's output axes are not the weight's output rows"
    return None


def peft_factors(
    transform: Transform, geometry, a: np.ndarray, b: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """PEFT's (lora_A [r, in], lora_B [out, r]) of meshrun's adapter A (in_features, r), B (r,
    out_features) on a kernel of `transform` (one `unmappable` passes): the same factors, their
    feature axes put in the order transformers' weight flattens them, so that lora_B @ lora_A
    equals the update A @ B in transformers' layout."""
    rank = a.shape[-1]

    def in_hf_order(factor: np.ndarray, axes: tuple[int, ...]) -> np.ndarray:
        """`factor` (the rank last, the features of `axes` flattened first) with its features in
        transformers' order, (features, rank)."""
        sizes = [geometry.kernel_shape[axis] for axis in axes]
        order = sorted(range(len(axes)), key=lambda i: transform.perm[axes[i]])
        blocks = np.transpose(np.reshape(factor, (*sizes, rank)), (*order, len(axes)))
        return np.reshape(blocks, (-1, rank))

    return in_hf_order(a, geometry.reduced).T, in_hf_order(b.T, geometry.produced)


def write_peft(backbone, checkpoint: HFCheckpoint, directory: Path, dropout: float = 0.0) -> Path | None:
    """Writes the backbone's LoRA adapters as a PEFT adapter on the source dir into `directory`
    (under a temporary name), its config naming the run's rank, alpha and the LoRA `dropout` it
    trained with: every process must call it; the first writes and gets `directory`, the others
    None, as do all where an adapter does not map (the log says why)."""
    from meshrun.files import dir_written_whole

    adapters = adapters_by_kernel(backbone)
    adapted = [tensor for tensor in checkpoint.tensors if tensor.path in adapters]
    for tensor in adapted:
        why = unmappable(tensor.transform, adapters[tensor.path].geometry)
        if why is not None:
            log.warning(f"no peft/ adapter is written: the adapter of {tensor.name} does not map ({why})")
            return None
    writer = is_writer()
    factors = []
    for tensor in adapted:
        adapter = adapters[tensor.path]
        a, b = host_copy(adapter.a.value, writer), host_copy(adapter.b.value, writer)
        if writer:
            mapped = peft_factors(
                tensor.transform, adapter.geometry, a.astype(np.float32), b.astype(np.float32)
            )
            factors.append(PeftFactors(tensor.name, *mapped))
    if not writer or not factors:
        return None
    # meshrun gives every adapter one rank and alpha
    ((rank, alpha),) = {(adapters[t.path].rank, adapters[t.path].alpha) for t in adapted}
    with dir_written_whole(directory) as partial:
        _write_adapter_weights(partial, factors)
        config = adapter_config(checkpoint, factors, rank, alpha, dropout)
        (partial / ADAPTER_CONFIG).write_text(json.dumps(config, indent=2) + "\n")
    return directory


def _write_adapter_weights(directory: Path, factors: list[PeftFactors]) -> None:
    """adapter_model.safetensors: every module's factors in float32."""
    arrays = {}
    for factor in factors:
        arrays[f"{PEFT_PREFIX}{factor.module}.lora_A.weight"] = np.ascontiguousarray(factor.a)
        arrays[f"{PEFT_PREFIX}{factor.module}.lora_B.weight"] = np.ascontiguousarray(factor.b)
    planned = [safetensors.PlannedTensor(name, "float32", array.shape) for name, array in arrays.items()]
    safetensors.write_shards(
        directory,
        planned,
        arrays.__getitem__,
        shard_bytes=1 << 62,
        prefix=ADAPTER_WEIGHTS.removesuffix(".safetensors"),
    )


def adapter_config(
    checkpoint: HFCheckpoint, factors: list[PeftFactors], rank: int, alpha: float, dropout: float = 0.0
) -> dict:
    """PEFT's adapter_config.json: LoRA on a causal LM, `rank` and `alpha` (PEFT scales by alpha /
    r), the adapted modules by their short names (q_proj, v_proj, ...), the `dropout` trained with."""
    modules = sorted({factor.module.rsplit(".", 1)[-1] for factor in factors})
    return {
        "peft_type": "LORA",
        "task_type": "CAUSAL_LM",
        "base_model_name_or_path": str(checkpoint.path),
        "r": rank,
        "lora_alpha": int(alpha) if float(alpha).is_integer() else alpha,
        "target_modules": modules,
        "lora_dropout": dropout,
        "bias": "none",
        "fan_in_fan_out": False,
        "use_rslora": False,
        "use_dora": False,
        "modules_to_save": None,
        "rank_pattern": {},
        "alpha_pattern": {},
        "inference_mode": True,
    }
