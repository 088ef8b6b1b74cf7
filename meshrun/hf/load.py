"""A transformers checkpoint as a KerasHub causal LM (`build_task`), each variable read from the
safetensors files a device's slice at a time, straight onto that device.

The backbone is built under meshrun.compat.keras.sharded_loading.load_onto_shards(every_weight_read=True), so
variables with a layout start without a value (no initializer runs, no zeros are made), and each is
then assigned a `TensorSource`:
an array-like whose slices are read from the file through the tensor's transform, which the
assignment asks for once per distinct slice this process's devices hold. A process therefore reads
only its own devices' slices, and the host holds one slice at a time.
"""

from __future__ import annotations

import numpy as np

from meshrun.hf import safetensors
from meshrun.hf.checkpoint import HFCheckpoint
from meshrun.hf.families import TensorMap


class TensorSource:
    """A checkpoint tensor seen as the backbone variable it fills: `shape` is the variable's,
    `source[index]` reads that block of it from the file, and `numpy.asarray(source)` the whole."""

    def __init__(self, tensor: TensorMap, entry: safetensors.TensorEntry, reader: safetensors.SliceReader):
        self.tensor = tensor
        self.entry = entry
        self.reader = reader
        self.shape = tensor.transform.keras_shape
        self.dtype = safetensors.numpy_dtype(entry.dtype)

    def __getitem__(self, index) -> np.ndarray:
        index = index if isinstance(index, tuple) else (index,)
        return self.tensor.transform.read_slice(
            lambda hf_index: self.reader.read(self.entry, hf_index), index
        )

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        whole = self[tuple(slice(None) for _ in self.shape)]
        return whole if dtype is None else whole.astype(dtype)


def variable_dtype(checkpoint: HFCheckpoint, requested: str | None) -> str | None:
    """The backbone's dtype: `requested` (model.dtype), else the checkpoint's own where Keras' global
    policy is plain float32 (a bfloat16 checkpoint stays bfloat16), else None: the global policy
    (train.precision=mixed_bfloat16 keeps float32 variables and computes in bfloat16)."""
    import keras

    if requested:
        return requested
    if keras.config.dtype_policy().name == "float32" and checkpoint.dtype != "float32":
        return checkpoint.dtype
    return None


def build_task(checkpoint: HFCheckpoint, load_weights: bool, dtype: str | None = None, on_placed=None):
    """The family's CausalLM (preprocessor None, not compiled) around a backbone of the checkpoint's
    architecture (a Gemma one's attention scaled as query_pre_attn_scalar says:
    meshrun.compat.keras_hub.set_gemma_attention_scales), its variables filled from the files when
    `load_weights`. Returns (task, bytes read from the files)."""
    from meshrun.compat.keras.sharded_loading import load_onto_shards
    from meshrun.compat.keras_hub import import_keras_hub, set_gemma_attention_scales

    keras_hub = import_keras_hub()  # model=keras_hub has checked it is installed
    backbone_cls = getattr(keras_hub.models, checkpoint.family.backbone)
    task_cls = getattr(keras_hub.models, checkpoint.family.task)
    arguments = dict(checkpoint.arguments, dtype=variable_dtype(checkpoint, dtype))
    bytes_read = 0
    if not load_weights:
        backbone = backbone_cls(**arguments)
    else:
        reader = safetensors.SliceReader()
        with load_onto_shards(on_placed=on_placed, every_weight_read=True):
            backbone = backbone_cls(**arguments)
            fill(backbone, checkpoint, reader)
        reader.close()
        bytes_read = reader.bytes_read
    set_gemma_attention_scales(backbone)  # query_pre_attn_scalar: KerasHub's Gemma blocks drop it
    return task_cls(backbone=backbone, preprocessor=None, compile=False), bytes_read


def fill(backbone, checkpoint: HFCheckpoint, reader: safetensors.SliceReader) -> None:
    """Assigns every backbone variable its tensor; a variable without one, or a tensor without a
    variable, is an error in meshrun's map (the checkpoint itself was checked by `inspect`). A
    quantized layer's kernel (model.quantize) is read one layer at a time and quantized into its
    kernel, scales and zero points (meshrun.quantize.quantize_into)."""
    from meshrun.quantize import quantize_into, quantized_by_kernel, variable_facts

    variables = {variable.path: variable for variable in backbone.weights}
    facts = variable_facts(backbone)
    by_kernel = quantized_by_kernel(backbone)
    filled_with_kernels = {path for path, q in facts.items() if q.role != "kernel"}
    mapped = {tensor.path for tensor in checkpoint.tensors}
    if mapped | filled_with_kernels != set(variables):
        unfilled = sorted(set(variables) - mapped)[:3]
        unknown = sorted(mapped - set(variables))[:3]
        raise RuntimeError(
            f"meshrun's {checkpoint.model_type} map is off: unfilled {unfilled}, unknown {unknown}"
        )
    for tensor in checkpoint.tensors:
        source = TensorSource(tensor, checkpoint.entries[tensor.name], reader)
        layer = by_kernel.get(tensor.path)
        if layer is None:
            variables[tensor.path].assign(source)
        else:
            quantize_into(layer, source)
