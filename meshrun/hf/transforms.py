"""How a transformers tensor becomes a KerasHub variable, and back: each of the tensor's dimensions
is split into one or more (a projection's `heads * head_dim` rows into heads and head_dim), then the
dimensions are permuted (`Linear`'s (out, in) weight into `Dense`'s (in, out) kernel). Both steps
map a slice of the variable to a block of the tensor, so a device's slice is read from the file
without reading the rest (`Transform.read_slice`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class Transform:
    """`split[j]` is the sizes dimension j of the transformers tensor is split into (one size: left
    whole); `perm` orders the split dimensions as the Keras variable has them."""

    split: tuple[tuple[int, ...], ...]
    perm: tuple[int, ...]

    @property
    def hf_shape(self) -> tuple[int, ...]:
        return tuple(math.prod(sizes) for sizes in self.split)

    @property
    def split_shape(self) -> tuple[int, ...]:
        return tuple(size for sizes in self.split for size in sizes)

    @property
    def keras_shape(self) -> tuple[int, ...]:
        return tuple(self.split_shape[axis] for axis in self.perm)

    def to_hf(self, variable: np.ndarray) -> np.ndarray:
        """The whole tensor from the whole variable."""
        return np.reshape(np.transpose(variable, np.argsort(self.perm)), self.hf_shape)

    def read_slice(self, read, index: tuple[slice, ...]) -> np.ndarray:
        """The variable's block `index` (one slice per dimension), from `read(hf_index)`, which
        returns the tensor's block `hf_index`: the rows of every split dimension's outermost part
        that the block covers, with the inner parts whole (they are sliced after reading, where the
        block cuts them: never by meshrun's layouts, which leave head_dim whole)."""
        in_split = [slice(None)] * len(self.split_shape)
        for axis, part in zip(self.perm, _bounded(index, self.keras_shape), strict=True):
            in_split[axis] = part
        hf_index, inner, block_shape = [], [], []
        position = 0
        for sizes in self.split:
            outer = in_split[position]
            rows = math.prod(sizes[1:])
            hf_index.append(slice(outer.start * rows, outer.stop * rows))
            block_shape.append(outer.stop - outer.start)
            inner.append(slice(None))
            for offset, size in enumerate(sizes[1:], start=1):
                block_shape.append(size)
                inner.append(in_split[position + offset])
            position += len(sizes)
        block = np.reshape(read(tuple(hf_index)), block_shape)
        return np.transpose(block[tuple(inner)], self.perm)


def _bounded(index: tuple[slice, ...], shape: tuple[int, ...]) -> list[slice]:
    """`index` with every slice's start and stop made explicit (step 1) for `shape`."""
    index = tuple(index) + (slice(None),) * (len(shape) - len(index))
    bounded = []
    for part, size in zip(index, shape, strict=True):
        start, stop, step = part.indices(size)
        if step != 1:
            raise ValueError(f"a slice with step {step}")
        bounded.append(slice(start, stop))
    return bounded


def same(shape: tuple[int, ...]) -> Transform:
    """The variable is the tensor (embeddings, norm scales)."""
    return Transform(tuple((size,) for size in shape), tuple(range(len(shape))))


def dense(out_features: int, in_features: int) -> Transform:
    """`Linear` (out, in) to `Dense` (in, out)."""
    return Transform(((out_features,), (in_features,)), (1, 0))


def heads_in(heads: int, head_dim: int, hidden: int, heads_first: bool = False) -> Transform:
    """A q/k/v projection (heads * head_dim, hidden) to an EinsumDense kernel (hidden, heads,
    head_dim), or (heads, hidden, head_dim) where `heads_first` (Gemma's)."""
    return Transform(((heads, head_dim), (hidden,)), (0, 2, 1) if heads_first else (2, 0, 1))


def heads_out(heads: int, head_dim: int, hidden: int) -> Transform:
    """The output projection (hidden, heads * head_dim) to (heads, head_dim, hidden)."""
    return Transform(((hidden,), (heads, head_dim)), (1, 2, 0))


def head_bias(heads: int, head_dim: int) -> Transform:
    """A q/k/v bias (heads * head_dim,) to (heads, head_dim)."""
    return Transform(((heads, head_dim),), (0, 1))
