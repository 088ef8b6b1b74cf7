"""How model=keras_hub builds its task: from a KerasHub preset dir (each weight read straight onto
its shards), from a transformers checkpoint (read shard by shard, meshrun.hf.load), or around a new
backbone made from model.backbone; always with preprocessor=None and compile=False (the data holds
token ids), its Dense and EinsumDense layers quantized as they load under model.quantize
(meshrun.quantize), LoRA adapters on its target layers (meshrun.models.hub.lora), and for pipeline
stages as a functional model whose transformer blocks run as stages. Also the inputs it trains on.
"""

from __future__ import annotations

import contextlib
import logging
from pathlib import Path

from meshrun import user_code
from meshrun.models.hub import presets
from meshrun.models.hub.lora import enable_lora
from meshrun.models.hub.options import KerasHubOptions
from meshrun.models.registry import InputSpec
from meshrun.wording import format_bytes

# Keyword arguments a backbone's **kwargs passes on to keras.Model.
LAYER_KEYWORDS = ("name", "trainable", "dtype")

log = logging.getLogger("meshrun")


def build(options: KerasHubOptions, load_weights: bool = True):
    """The task with preprocessor=None and compile=False: from the preset dir (with its weights
    when `load_weights`), else around a new backbone made from model.backbone; with LoRA
    adapters on its target layers when model.lora.rank is set (enable_lora)."""
    task = _build_task(options, load_weights)
    enable_lora(task.backbone, options.lora)
    return _staged(task, options)


def _staged(task, options: KerasHubOptions):
    """The task as the build asks: itself (its backbone's transformer_layers recomputed in the
    backward pass under train.remat=blocks), or (for pipeline stages) a functional model of the same
    layers on inputs of model.seq_len tokens whose backbone's transformer_layers run as stages,
    stacked under `transformer_layers` (meshrun.pipeline.functional); the task's own blocks are
    then dropped."""
    import keras

    from meshrun.compat.keras.remat import recompute_in_backward
    from meshrun.pipeline.blocks import blocks_recomputed, building_for

    pipeline = building_for()
    blocks = list(getattr(task.backbone, "transformer_layers", None) or [])
    if pipeline is None and blocks_recomputed():
        for block in blocks:
            recompute_in_backward(block)
    if pipeline is None or not blocks:
        return task  # without blocks: meshrun's checks say so in the config's terms
    from meshrun.pipeline.functional import with_pipelined_blocks

    symbolic = {
        name: keras.Input(batch_shape=(None, options.seq_len), dtype=spec.dtype, name=name)
        for name, spec in inputs(options).items()
    }
    return with_pipelined_blocks(task, blocks, pipeline, name="transformer_layers", inputs=symbolic)


def _build_task(options: KerasHubOptions, load_weights: bool):
    """The task, built with its Dense and EinsumDense layers quantized under model.quantize (each
    filled from its float weights as they load; a new backbone's are drawn once it is built:
    meshrun.run.build), and a Gemma backbone's attention scaled as its config says, however it was
    made (a transformers checkpoint, a preset meshrun saved, model.backbone)."""
    from meshrun import quantize
    from meshrun.compat.keras_hub import set_gemma_attention_scales

    with quantize.quantized_layers(options.quantize):
        task = _build_float_or_quantized(options, load_weights)
    set_gemma_attention_scales(task.backbone)  # KerasHub's Gemma blocks drop it (query_pre_attn_scalar)
    return task


def _build_float_or_quantized(options: KerasHubOptions, load_weights: bool):
    from meshrun.compat.keras.sharded_loading import load_onto_shards
    from meshrun.compat.keras_hub import local_preset_loading
    from meshrun.system import load_memory

    task = presets.task_class(options.task)
    checkpoint = presets.transformers_checkpoint(options.preset)
    if checkpoint is not None:
        return _build_from_transformers(checkpoint, options, load_weights)
    if options.preset:
        described = f"{task.__name__}.from_preset({options.preset!r})"
        loading = load_onto_shards(on_placed=load_memory.sample) if load_weights else contextlib.nullcontext()
        with loading, local_preset_loading():  # each weight straight onto its shards
            return user_code.call(
                "model.preset",
                described,
                task.from_preset,
                preset=str(Path(options.preset).expanduser()),
                preprocessor=None,
                compile=False,
                load_weights=load_weights,
                **({"dtype": options.dtype} if options.dtype else {}),
            )
    backbone_cls = task.backbone_cls
    name = backbone_cls.__name__
    user_code.check_kwargs("model.backbone", backbone_cls, name, options.backbone, passed_on=LAYER_KEYWORDS)
    given = {**options.backbone, **({"dtype": options.dtype} if options.dtype else {})}
    arguments = ", ".join(f"{k}={v!r}" for k, v in given.items())
    backbone = user_code.call("model.backbone", f"{name}({arguments})", backbone_cls, **given)
    return task(backbone=backbone, preprocessor=None, compile=False)


def _build_from_transformers(checkpoint, options: KerasHubOptions, load_weights: bool):
    """The task of a transformers checkpoint, read shard by shard (meshrun.hf.load)."""
    from meshrun.hf import load
    from meshrun.system import load_memory

    task, bytes_read = load.build_task(checkpoint, load_weights, options.dtype, on_placed=load_memory.sample)
    if load_weights:
        log.info(
            "read %s of the %s of weights in %s (this process's devices' slices)",
            format_bytes(bytes_read),
            format_bytes(checkpoint.weight_bytes),
            checkpoint.path,
        )
    return task


def build_abstract(options: KerasHubOptions):
    """The task as `build` makes it, without reading a preset's weights (the plan needs shapes)."""
    return build(options, load_weights=False)


def inputs(options: KerasHubOptions) -> dict:
    """token_ids and padding_mask of model.seq_len tokens."""
    return {name: InputSpec(name, (options.seq_len,), "int32") for name in ("token_ids", "padding_mask")}
