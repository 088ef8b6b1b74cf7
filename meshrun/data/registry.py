"""The data-source registry: each source module registers a SourceSpec under a name at import.

A spec carries the source's options dataclass (its config keys, checked by meshrun.schema) and a
`load(options, context)` function that imports tensorflow only when called and returns the run's
Datasets. Everything a source may need to know about the run is in the DataContext.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SOURCES: dict[str, "SourceSpec"] = {}


@dataclass(frozen=True)
class DataContext:
    """What a source needs from the run: the model (its spec and options: input shapes, data
    family), the global batch size, the seed, and which of how many processes reads."""

    model: Any
    model_options: Any
    batch_size: int
    seed: int
    process_index: int = 0
    process_count: int = 1

    @property
    def process_batch_size(self) -> int:
        """The batch each process reads: its share of the global batch."""
        return self.batch_size // self.process_count


@dataclass(frozen=True)
class SourceSpec:
    """A registered data source: its options and how to load it."""

    name: str
    options: type
    load: Callable[[Any, DataContext], Any]
    description: str = ""


def register_source(spec: SourceSpec) -> SourceSpec:
    """Adds a source to the registry; a second source of the same name is a programming error."""
    if spec.name in _SOURCES:
        raise ValueError(f"data source {spec.name!r} is registered twice")
    _SOURCES[spec.name] = spec
    return spec


def get_source(name: str) -> SourceSpec:
    """The spec registered under `name` (KeyError if none)."""
    return _SOURCES[name]


def source_names() -> list[str]:
    """Names of every registered source, sorted."""
    return sorted(_SOURCES)
