"""What a data source declares to meshrun (SourceSpec), what it is told about the run (DataContext),
and which module registers each source name (SOURCES).

A spec carries the source's options dataclass (its config keys, checked by meshrun.config) and a
`load(options, context)` function that returns the run's Datasets (importing TensorFlow only where
the source reads through tf.data). Everything a source may need to know about the run is in the
DataContext. A new source is a module of meshrun.data that calls `register_source(SourceSpec(...))`,
and a line in SOURCES.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from meshrun.registry import Registry


@dataclass(frozen=True)
class DataContext:
    """What a source needs from the run: the model (its spec and options: input shapes, data
    family; the built model's signature and loss), the global batch size, the seed, and which
    share of each global batch this process
    feeds. The mesh decides the shares: each global batch is cut into `shard_count` equal, adjacent
    parts over the batch axis and this process feeds part `shard_index` (with the batch axis inside
    one process, or one process, that is the whole batch; processes that share batch-axis devices
    feed the same part)."""

    model: Any
    model_options: Any
    batch_size: int
    seed: int
    shard_index: int = 0
    shard_count: int = 1
    process_count: int = 1
    signature: Any = None  # what the built model takes and gives (meshrun.run.build.Signature)
    loss: str = ""  # the Keras loss function the run trains with, e.g. sparse_categorical_crossentropy
    shared_caches: bool = (
        False  # cache.shared: a cache dir its group can write to is trusted (meshrun.system.trust)
    )

    @property
    def process_batch_size(self) -> int:
        """The batch each process reads: its share of the global batch."""
        return self.batch_size // self.shard_count

    @property
    def share(self) -> tuple[int, int]:
        """(shard_index, shard_count), as the pipeline functions take it."""
        return self.shard_index, self.shard_count


@dataclass(frozen=True)
class SourceSpec:
    """A registered data source: its options and how to load it, and, for a source that can say so
    without loading anything (reading file headers or its own config), the model inputs its
    features make: `declared_inputs(options)` -> InputSpecs by name (None for one unnamed tensor),
    or None; `notes(options)`: lines `meshrun plan` prints about how the data is fed."""

    name: str
    options: type
    load: Callable[[Any, DataContext], Any]
    description: str = ""
    declared_inputs: Callable[[Any], dict | None] | None = None
    notes: Callable[[Any], list] | None = None  # what `meshrun plan` says about the data, a line each


SOURCES: Registry[SourceSpec] = Registry(
    "data source",
    {
        "arrays": "meshrun.data.arrays",
        "python": "meshrun.data.python_source",
        "synthetic": "meshrun.data.synthetic",
        "text": "meshrun.data.text",
        "tfrecord": "meshrun.data.tfrecord",
    },
)
