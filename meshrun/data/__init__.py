"""Input pipelines: the data sources (`data=` config group) and what they share.

Every source registers itself (meshrun.data.registry) with its options dataclass; `get_source(name)`
imports that source's module alone. Nothing here imports TensorFlow (only data=tfrecord and tf.data
factories import it, when they load; meshrun.data.pipeline says which pipeline feeds which).
"""

from __future__ import annotations

from meshrun.data.pipeline import Datasets
from meshrun.data.registry import DataContext, get_source, source_names


def make_datasets(source: str, options, context: DataContext) -> Datasets:
    """Loads data source `source` with its options for the run described by `context`."""
    return get_source(source).load(options, context)


def declared_inputs(data) -> dict | None:
    """The model inputs (InputSpecs by name) the features of the data source of `data` (a
    DataConfig) make, where the source can tell without loading; else None."""
    spec = get_source(data.name)
    return spec.declared_inputs(data.options) if spec.declared_inputs else None


def notes(data) -> list[str]:
    """What `meshrun plan` says about how the data source of `data` (a DataConfig) feeds the model."""
    spec = get_source(data.name)
    return list(spec.notes(data.options)) if spec.notes else []


__all__ = [
    "DataContext",
    "Datasets",
    "declared_inputs",
    "get_source",
    "make_datasets",
    "notes",
    "source_names",
]
