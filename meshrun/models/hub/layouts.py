"""Where model=keras_hub's variables go: layout=from_model (the backbone's own get_layout_map turned
into layout rules, for any mesh with a batch axis and one model axis), the hint for a backbone
without a map (meshrun's own layouts of its family, layout=auto), and the plan's advice about the
placements KerasHub's maps are known to get wrong (attention heads over the batch axis, keras-hub
#2795; an untied output head left whole, #2807). meshrun's own layouts (llama_tp, gemma_2d, ...) are
configs under configs/layout/.
"""

from __future__ import annotations

import math
import re

from meshrun.errors import ConfigError
from meshrun.models.hub import presets
from meshrun.models.hub.options import KerasHubOptions
from meshrun.wording import format_bytes

# Backbones whose variable paths meshrun's own layouts are written for, by layout family.
FAMILIES = {
    "LlamaBackbone": "llama",
    "MistralBackbone": "llama",
    "QwenBackbone": "llama",
    "Qwen3Backbone": "llama",
    "GemmaBackbone": "gemma",
    "Gemma3Backbone": "gemma",
}
# Attention kernels and the dimension that holds their heads: Llama-style (hidden, heads, head_dim),
# Gemma-style (heads, hidden, head_dim).
HEAD_DIMENSIONS = (
    (re.compile(r".*self_attention/(query|key|value)/kernel"), 1),
    (re.compile(r".*decoder_block_\d+/attention/(query|key|value)/kernel"), 0),
)
UNTIED_HEAD = "token_embedding/reverse_embeddings"


def layout_rules(options: KerasHubOptions, mesh) -> tuple:
    """The backbone's own layout map (get_layout_map) as LayoutRules of origin from_model, for the
    batch axis and the mesh's other axis as the model axis."""
    from keras import distribution as kd

    from meshrun.config.layout_schema import LayoutRule

    backbone_cls = presets.backbone_class(options.task, options.preset)
    if not hasattr(backbone_cls, "get_layout_map"):
        raise ConfigError(
            "layout.from_model",
            f"got true, but KerasHub's {backbone_cls.__name__} has no get_layout_map (KerasHub writes one "
            f"for Llama, Gemma, Qwen, QwenMoe and Qwen3Moe); {_layouts_hint(backbone_cls)}",
        )
    model_axis = _model_axis(mesh)
    # The map only needs the mesh's shape and axis names: placeholders stand in for devices, so a
    # mesh is planned on any machine.
    device_mesh = kd.DeviceMesh(
        tuple(mesh.shape),
        list(mesh.axis_names),
        devices=[f"device:{i}" for i in range(math.prod(mesh.shape))],
    )
    layouts = backbone_cls.get_layout_map(
        device_mesh, model_parallel_dim_name=model_axis, data_parallel_dim_name=mesh.batch_axis
    )
    # Written for a whole family (one map for Gemma 2B's one key/value head and Gemma 7B's sixteen),
    # so a dimension the mesh cannot divide stays whole (the plan notes it) rather than failing.
    return tuple(
        LayoutRule(
            pattern,
            tuple(layouts[pattern].axes),
            origin="from_model",
            optional=True,
            replicate_if_indivisible=True,
        )
        for pattern in layouts
    )


def _model_axis(mesh) -> str:
    """The axis KerasHub's map shards weights over: `model`, else the one axis besides the batch's."""
    others = [a for a in mesh.axis_names if a != mesh.batch_axis]
    if "model" in others:
        return "model"
    if len(others) == 1:
        return others[0]
    raise ConfigError(
        "layout.from_model",
        f"got true on mesh axes {list(mesh.axis_names)}: KerasHub's map needs the batch axis and one model "
        "axis (a 2-D mesh, or an axis named model)",
    )


def _layouts_hint(backbone_cls) -> str:
    """What to use for a backbone without a layout map: meshrun's layouts for its family, layout=auto."""
    family = next(
        (f for name, f in FAMILIES.items() if any(c.__name__ == name for c in backbone_cls.__mro__)), None
    )
    if family:
        return (
            f"use meshrun's layout={family}_tp ({family}_fsdp, "
            f"{family}_2d) or layout=auto, or write layout.rules"
        )
    return (
        "use layout=auto (rules derived from its variables and the mesh; `meshrun plan layout=auto` shows "
        "them), write layout.rules for its variable paths (meshrun plan lists them), or use layout=replicated"
    )


def layout_advice(options: KerasHubOptions, variables, mesh) -> list[str]:
    """Warnings about placements KerasHub's maps are known to get wrong: attention heads split over
    the batch axis, and an untied output head left whole on every device."""
    warnings = []
    batch_size = mesh.axis_size(mesh.batch_axis)
    on_batch = {}
    for p in variables:
        heads = next((dim for pattern, dim in HEAD_DIMENSIONS if pattern.fullmatch(p.path)), None)
        if heads is not None and batch_size > 1 and p.spec[heads] == mesh.batch_axis:
            on_batch.setdefault(p.rule, []).append(p)
    for rule, placed in on_batch.items():
        first = placed[0]
        warnings.append(
            f"rule {rule!r} ({first.origin}) splits the attention heads of {first.path} and "
            f"{len(placed) - 1} more kernels over the batch axis {mesh.batch_axis!r}: every step gathers "
            "them across data replicas, and the batch axis must divide the heads; KerasHub's Llama and Qwen "
            "maps put q/k/v axes in Gemma's order (keras-hub #2795): "
            "use layout=llama_tp for heads over the model axis"
        )
    from meshrun.config.layout_schema import LARGE_REPLICATED_BYTES

    head = next((p for p in variables if p.path == UNTIED_HEAD), None)
    if head is not None and head.replicated and head.bytes >= LARGE_REPLICATED_BYTES and (mesh.size or 1) > 1:
        warnings.append(
            f"{UNTIED_HEAD}, the untied output head ({format_bytes(head.bytes)}), matches no rule, so every "
            "device holds all of it (KerasHub's maps have none, keras-hub #2807): add "
            f"layout.extra_rules={{{UNTIED_HEAD}:[null,model]}} or use layout=llama_tp"
        )
    return warnings
