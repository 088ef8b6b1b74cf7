"""The data-source registry: each source module registers a SourceSpec under a name at import.

A spec carries the source's options dataclass (its config keys, checked by meshrun.schema) and a
`load(options, context)` function that imports tensorflow only when called and returns the run's
Datasets. Everything a source may need to know about the run is in the DataContext.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshrun.registry import Registry


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


_REGISTRY: Registry["SourceSpec"] = Registry("data source")
register_source = _REGISTRY.register
get_source = _REGISTRY.get
source_names = _REGISTRY.names