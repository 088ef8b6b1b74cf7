"""The one place a config key's default and its doc line are written: `setting`, a field of a config
dataclass (the schema's sections, each model's and data source's options) that carries both.

`defaults_of` reads a dataclass's defaults as plain config data: what Hydra composes under each
group's options (meshrun.hydra_sources registers them), so that a group's YAML options hold only what differs
from the schema. `doc_of` reads a field's doc line, as the config reference page shows it
(meshrun.config.reference). Nothing here imports Hydra.
"""

from __future__ import annotations

import dataclasses
from dataclasses import MISSING, Field
from typing import Any

DOC = "doc"
WRITTEN = "written"  # the default as a config writes it, where the field holds it parsed (1MiB)
COMPOSED = "composed"  # False: the key is left out of the composed defaults (a group's options write it)


def setting(
    default: Any = MISSING,
    doc: str = "",
    *,
    factory: Any = None,
    written: Any = MISSING,
    composed: bool = True,
) -> Any:
    """A config field: its `default` (or a `factory` for a mutable or nested one; neither: the key
    is required) and its one-line `doc`. `written` is the default as configs write it, where the
    field holds the parsed value; `composed=False` leaves the key out of the composed config."""
    if not doc or "\n" in doc:
        raise ValueError(f"a config setting needs a one-line doc (got {doc!r})")
    metadata = {DOC: doc, COMPOSED: composed}
    if written is not MISSING:
        metadata[WRITTEN] = written
    if factory is not None:
        return dataclasses.field(default_factory=factory, metadata=metadata)
    return dataclasses.field(default=default, metadata=metadata)


def doc_of(f: Field) -> str:
    """The field's one-line doc ('' when it has none)."""
    return f.metadata.get(DOC, "")


def has_default(f: Field) -> bool:
    """Whether the field has a default (else the key is required)."""
    return f.default is not MISSING or f.default_factory is not MISSING


def default_of(f: Field) -> Any:
    """The field's default as configs write it: plain data (lists for tuples, mappings for nested
    dataclasses), its `written` form where it has one."""
    if WRITTEN in f.metadata:
        return f.metadata[WRITTEN]
    if f.default_factory is not MISSING:
        made = f.default_factory()
        return defaults_of(type(made)) if dataclasses.is_dataclass(made) else as_config(made)
    return as_config(f.default)


def defaults_of(cls) -> dict[str, Any]:
    """Every composed key of dataclass `cls` that has a default, with that default (nested
    dataclasses as mappings), in the order of the fields."""
    return {
        f.name: default_of(f)
        for f in dataclasses.fields(cls)
        if has_default(f) and f.metadata.get(COMPOSED, True)
    }


def as_config(value: Any) -> Any:
    """`value` as config data: tuples as lists, sets as sorted lists, dataclasses as mappings."""
    if dataclasses.is_dataclass(value):
        return defaults_of(type(value))
    if isinstance(value, (tuple, list)):
        return [as_config(v) for v in value]
    if isinstance(value, (set, frozenset)):
        return sorted(value)
    if isinstance(value, dict):
        return {k: as_config(v) for k, v in value.items()}
    return value
