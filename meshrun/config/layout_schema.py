"""The mesh and layout sections of the typed run configuration (mesh=, layout=): the device
mesh's shape and axis names, the layout rules and where each came from, and the layout options.
`meshrun.config.schema` holds the other sections and the RunConfig that puts them together.

Nothing here imports jax or keras.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Optional

from meshrun.config.fields import setting
from meshrun.errors import ConfigError
from meshrun.wording import format_shape

DEFAULT_AXIS_NAMES = {1: ("data",), 2: ("data", "model")}
FILL = -1  # a mesh dimension of -1 takes every device the others leave


@dataclass(frozen=True)
class MeshConfig:
    """The device mesh: its shape (one dimension may be -1, filled at device setup), axis names,
    the axis the batch is split over, and how many slices each axis spans across the job's
    processes (`dcn`; None: the default for the job, meshrun.config.slices)."""

    shape: tuple[int, ...] = setting(
        doc="The mesh's shape, AxB[xC] or a list of sizes (mesh=2x4, mesh=[2,4]); one dimension may be -1: "
        "every device the others leave."
    )
    axis_names: tuple[str, ...] = setting(
        doc="One name per mesh axis; null: [data] for a 1-D mesh, [data, model] for a 2-D one."
    )
    batch_axis: str = setting(doc="The mesh axis the global batch is split over; null: the first axis.")
    dcn: tuple[int, ...] | None = setting(
        None,
        "Slices per axis across the job's processes, e.g. [2,1] or 2x1 (the first axis spans 2 "
        "processes); null: the default for the job (meshrun.config.slices).",
    )

    def resolved(self, device_count: int) -> MeshConfig:
        """This mesh with a -1 dimension replaced so the product is `device_count`."""
        if FILL not in self.shape:
            return self
        known = 1
        for size in self.shape:
            if size != FILL:
                known *= size
        if device_count % known:
            raise ConfigError(
                "mesh.shape",
                f"got {format_shape(self.shape)}: the other dimensions ({known}) do not divide "
                f"the {device_count} available devices",
            )
        return dataclasses.replace(
            self, shape=tuple(device_count // known if s == FILL else s for s in self.shape)
        )

    @property
    def size(self) -> int | None:
        """How many devices the mesh needs, or None while it still holds a -1."""
        if FILL in self.shape:
            return None
        total = 1
        for size in self.shape:
            total *= size
        return total

    def axis_size(self, axis: str) -> int:
        """The number of devices along mesh axis `axis`."""
        return self.shape[self.axis_names.index(axis)]


AxisSpec = Optional[str]  # noqa: UP045 (a runtime alias, read by get_type_hints like the fields)


# Where a layout rule came from: written in the layout config (a layout file or layout.rules),
# added on top of it (layout.extra_rules), taken from the model's own layout map (from_model), or
# derived from the model's variables and the mesh (auto), or, for a stacked variable of pipelined
# blocks that no rule places, its stage axis alone (pipeline).
RULE_ORIGINS = ("rules", "extra_rules", "from_model", "auto", "pipeline")
DEFAULT_AUTO_MIN_BYTES = 1 << 20
# A replicated variable at least this large, on a mesh of more than one device, gets a warning (the plan's).
LARGE_REPLICATED_BYTES = 1 << 20


@dataclass(frozen=True)
class LayoutRule:
    """One layout rule: a regex matched against variable and `<layer>/output` paths with
    re.fullmatch, and the mesh axis (or None) for each dimension of what it matches. `origin` says
    where it came from (RULE_ORIGINS); an `optional` rule may match nothing (a family layout's rule
    for a variable some members lack, or a rule of the model's own map), where any other rule that
    matches nothing is an error. A rule that may `replicate_if_indivisible` (a family layout's rule
    over attention heads, or one of the model's own map) leaves a dimension whole over a mesh axis
    that does not divide it (Gemma 2B's one key/value head on a model axis of 8), where any other
    rule's indivisible dimension is an error. meshrun derives exact rules (the path as pattern) from
    written ones: for a pipelined stacked weight, and for a path whose dimension a rule left whole;
    `derived_from` names the written rule's pattern (what plans show)."""

    pattern: str
    axes: tuple[AxisSpec, ...]
    origin: str = "rules"
    optional: bool = False
    replicate_if_indivisible: bool = False
    derived_from: str | None = None

    @property
    def key(self) -> str:
        """The config key a problem with this rule is reported under."""
        if self.origin in ("from_model", "auto"):
            return f"layout.{self.origin}"
        return f"layout.{self.origin}.{self.derived_from or self.pattern}"


@dataclass(frozen=True)
class LayoutConfig:
    """The layout rules in the order they were written, those added on top (`extra_rules`), and
    whether the model's own layout map (`from_model`) or rules derived from its variables (`auto`,
    meshrun.placement.auto: variables of at least `min_bytes`, fully sharded over the batch axis
    too with `fsdp`) replace `rules`; both are resolved once the model and mesh are known
    (meshrun.run.prepare.layout_rules)."""

    rules: tuple[LayoutRule, ...] = setting(
        (),
        "The layout option's rules: a regex of variable (or `<layer>/output`) paths, matched whole, -> "
        "one mesh axis or null per dimension.",
        written={},
        composed=False,
    )
    extra_rules: tuple[LayoutRule, ...] = setting(
        (),
        "Rules added on top of the layout's (or of the model's own map with layout=from_model), e.g. "
        "'layout.extra_rules={token_embedding/reverse_embeddings:[null,model]}'.",
        written={},
    )
    from_model: bool = setting(
        False,
        "The model's own layout map gives the rules (layout=from_model; model=keras_hub: the "
        "backbone's get_layout_map).",
        composed=False,
    )
    auto: bool = setting(
        False,
        "Rules derived from the model's variables and the mesh give the rules (layout=auto).",
        composed=False,
    )
    min_bytes: int = setting(
        DEFAULT_AUTO_MIN_BYTES,
        "layout=auto splits every variable of at least this size, in bytes or with a unit (512KiB, "
        "1MiB, 1.5GiB); other layouts ignore it, with a warning.",
        written="1MiB",
    )
    fsdp: bool = setting(
        False,
        "layout=auto also splits each variable over the batch axis along another dimension (fully "
        "sharded); other layouts ignore it, with a warning.",
    )


# Keys a layout option may write that are not fields of LayoutConfig: they mark rules of `rules`.
LAYOUT_OPTION_KEYS = {
    "optional": "Patterns of layout.rules that may match nothing (any other rule that matches nothing is "
    "an error).",
    "replicate_if_indivisible": "Patterns of layout.rules that leave a dimension whole (replicated) "
    "over a mesh axis that does not divide it, where any other rule's indivisible dimension is an error.",
}
