"""Batches of numpy arrays, made without TensorFlow: the pipeline of data=synthetic, data=arrays and
data=python factories that return an iterable (tf.data pipelines are in meshrun.data.tf_data).

`Batches` is a stream a pass over the data at a time, in the seeded order of meshrun.data.order,
each batch this process's share of a full global batch (remainder dropped). Reading is lazy and
starts anywhere: `skip(g)` begins at global step g without reading the steps before it where the
source can seek (arrays in memory or in files), so a resumed run starts at once. Keras reads it
through meshrun.run.feed (a keras.utils.PyDataset).
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from meshrun.data import order

# Rows are read for up to this many batches at once (and at most READ_BYTES): one numpy call per
# group, not per batch, keeps the pipeline's share of a 2-core machine small next to the training
# step; rows of a file are read in file order (meshrun.data.arrays.FileRows).
BATCHES_PER_READ = 32
READ_BYTES = 64 << 20


@dataclass(frozen=True)
class ArraySpec:
    """The shape (None for the batch dimension) and dtype of one array of a batch."""

    shape: tuple
    dtype: np.dtype


@dataclass(frozen=True)
class Batches:
    """A stream of batches, each a tuple (features, labels[, sample weights]) of numpy arrays
    (features: one array or a dict of them by input name). `read_pass(p, first)` yields the
    batches of pass p from its batch `first` on; a pass holds `per_pass` of them (more are not
    read). Endless: pass after pass; else one pass. `start` counts the batches skipped from the
    stream's beginning, `transforms` apply to every batch."""

    read_pass: Callable[[int, int], Iterator[tuple]]
    per_pass: int
    element_spec: tuple
    endless: bool = False
    start: int = 0
    transforms: tuple = ()

    @property
    def num_batches(self) -> int | None:
        """Batches in the stream; None when it is endless."""
        return None if self.endless else max(self.per_pass - self.start, 0)

    def __iter__(self) -> Iterator[tuple]:
        if self.per_pass <= 0:
            return
        first_pass, first = divmod(self.start, self.per_pass)
        for pass_index in itertools.count(first_pass) if self.endless else range(first_pass, 1):
            skipped = first if pass_index == first_pass else 0
            for batch in itertools.islice(self.read_pass(pass_index, skipped), self.per_pass - skipped):
                for transform in self.transforms:
                    batch = transform(batch)
                yield batch

    def skip(self, count: int) -> Batches:
        """The stream from `count` batches on."""
        return dataclasses.replace(self, start=self.start + count)

    def map(self, transform: Callable[[tuple], tuple], element_spec: tuple) -> Batches:
        """The stream with `transform` applied to every batch, whose batches then fit `element_spec`."""
        return dataclasses.replace(self, transforms=self.transforms + (transform,), element_spec=element_spec)


def spec_of(batch) -> Any:
    """The ArraySpecs of `batch` (a structure of arrays), with the batch dimension left open."""
    if isinstance(batch, dict):
        return {name: spec_of(value) for name, value in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(spec_of(value) for value in batch)
    return ArraySpec((None, *batch.shape[1:]), batch.dtype)


def indexed_batches(
    x,
    y,
    indices: np.ndarray,
    batch_size: int,
    shuffle: bool,
    seed: int,
    share: tuple[int, int] = (0, 1),
    endless: bool = False,
    weights=None,
) -> Batches:
    """This process's share of each global batch of rows `indices` of the arrays x (an array, a
    FileRows or a dict of them), y and the sample `weights` if given, for one pass or endless
    passes. Each pass takes the indices in its seeded order (`shuffle`) and cuts them into global
    batches; a process's share of a batch is a run of adjacent rows (`share = (index, count)`:
    rows index*b to (index+1)*b, b = batch_size/count). Rows are read a group of batches at a time
    (in file order, then put back in the batch's order), never the whole array."""
    share_index, share_count = share
    size = batch_size // share_count
    names = sorted(x) if isinstance(x, dict) else None
    columns = [x[n] for n in names] if names else [x]
    targets = [y] if weights is None else [y, weights]
    columns += targets
    per_pass = len(indices) // batch_size
    batch_bytes = size * sum(int(np.prod(c.shape[1:])) * np.dtype(c.dtype).itemsize for c in columns)
    group = max(1, min(BATCHES_PER_READ, READ_BYTES // max(batch_bytes, 1)))

    def assemble(values: list) -> tuple:
        features = dict(zip(names, values[: len(names)], strict=False)) if names else values[0]
        return (features, *values[len(columns) - len(targets) :])

    def read_pass(pass_index: int, first: int) -> Iterator[tuple]:
        ordered = (
            indices[order.shuffled_indices(len(indices), order.seed_pair(seed, pass_index))]
            if shuffle
            else indices
        )
        mine = ordered[: per_pass * batch_size].reshape(per_pass, share_count, size)[:, share_index]
        for start in range(first, per_pass, group):
            rows = mine[start : start + group].reshape(-1)
            values = [_read_rows(column, rows) for column in columns]
            for k in range(len(rows) // size):
                yield assemble([v[k * size : (k + 1) * size] for v in values])

    sample = assemble([np.asarray(c[indices[:1]]) for c in columns]) if len(indices) else None
    return Batches(read_pass, per_pass, spec_of(sample) if sample is not None else (), endless=endless)


def _read_rows(column, rows: np.ndarray) -> np.ndarray:
    """column[rows], reading the rows in ascending order (a file is read front to back)."""
    in_order = np.argsort(rows, kind="stable")
    values = np.asarray(column[rows[in_order]])
    restored = np.empty_like(values)
    restored[in_order] = values
    return restored


def element_batches(
    make_elements: Callable[[], Iterable],
    batch_size: int,
    shuffle: bool,
    seed: int,
    buffer: int,
    share: tuple[int, int],
    per_pass: int,
    first_element: tuple,
    endless: bool = False,
) -> Batches:
    """Batches of `batch_size` single (features, labels[, weight]) elements that each call of
    `make_elements()` yields (once per pass): this process keeps every share[1]-th element from
    share[0] on, shuffles them in a seeded buffer of `buffer` elements (the order tf.data's
    shuffle makes), stacks them (remainder dropped). A pass holds `per_pass` batches;
    `first_element` gives every array's dtype (Python floats become float32 and ints int32, as
    tf.data makes them)."""
    dtypes = _leaf_dtypes(first_element)

    def read_pass(pass_index: int, first: int) -> Iterator[tuple]:
        elements = itertools.islice(make_elements(), share[0], None, share[1])
        if shuffle:
            elements = order.buffer_shuffled(elements, buffer, order.seed_pair(seed, pass_index))
        while True:
            chunk = list(itertools.islice(elements, batch_size))
            if len(chunk) < batch_size:
                return
            if first:
                first -= 1
                continue
            yield _stack(chunk, dtypes)

    return Batches(read_pass, per_pass, spec_of(_stack([first_element], dtypes)), endless=endless)


def _leaf_dtypes(element):
    if isinstance(element, dict):
        return {name: _leaf_dtypes(value) for name, value in element.items()}
    if isinstance(element, tuple):
        return tuple(_leaf_dtypes(value) for value in element)
    if isinstance(element, (np.ndarray, np.generic)):
        return element.dtype
    dtype = np.asarray(element).dtype
    return {np.dtype(np.float64): np.dtype(np.float32), np.dtype(np.int64): np.dtype(np.int32)}.get(
        dtype, dtype
    )


def _stack(elements: list, dtypes):
    if isinstance(dtypes, dict):
        return {name: _stack([e[name] for e in elements], dtype) for name, dtype in dtypes.items()}
    if isinstance(dtypes, tuple):
        return tuple(_stack([e[i] for e in elements], dtype) for i, dtype in enumerate(dtypes))
    return np.asarray(np.stack([np.asarray(e) for e in elements]), dtype=dtypes)
