"""The seeded order in which a run reads its samples, the same with or without TensorFlow.

meshrun's sources shuffle each pass over the data with `tf.data.Dataset.shuffle(buffer, seed)`'s
algorithm, reproduced here in numpy so that the sources that need no TensorFlow (synthetic,
arrays, a Python iterable) read exactly the order tf.data reads (runs keep their losses whichever
path feeds them; tests/test_data_sources.py compares the two):

- the random stream is Philox4x32-10 keyed by the pair (seed, seed2) that TensorFlow derives
  from its global seed (the run's seed) and the op seed (`pass_seed`), both taken modulo 2**31-1;
- the buffer holds up to `buffer` elements; each output draws one uint32 r and takes the element
  at offset r % (elements held) from the oldest, moving the oldest into the gap, then refills.

A global seed that is 0 modulo 2**31-1 cannot key a tf.data shuffle whose op seed is a tensor
(TensorFlow fails comparing the pair to (0, 0)), so for such seeds TensorFlow's global seed is left
unset and both paths use its default graph seed instead (`tensorflow_global_seed`).
"""

from __future__ import annotations

import array
from collections.abc import Iterable, Iterator

import numpy as np

SEED_MODULUS = 2**31 - 1  # TensorFlow truncates seeds modulo this
DEFAULT_GRAPH_SEED = 87654321  # TensorFlow's global seed when none is set
PASS_SEED_STRIDE = 1_000_003

_LOW32 = np.uint64(0xFFFFFFFF)
_MULTIPLIERS = (np.uint64(0xD2511F53), np.uint64(0xCD9E8D57))
_KEY_STEPS = (np.uint64(0x9E3779B9), np.uint64(0xBB67AE85))


def pass_seed(seed: int, pass_index):
    """The op seed of pass `pass_index`'s shuffle: each pass has its own, so the batch at global
    step g is the same however the stream was read before (a resumed run starts at g)."""
    return seed * PASS_SEED_STRIDE + pass_index


def tensorflow_global_seed(seed: int):
    """What meshrun sets as TensorFlow's global seed for run seed `seed` (None: leave it unset)."""
    return seed if seed % SEED_MODULUS else None


def seed_pair(seed: int, pass_index: int) -> tuple[int, int]:
    """The (seed, seed2) keying pass `pass_index`'s shuffle of a run seeded `seed`."""
    first = seed % SEED_MODULUS or DEFAULT_GRAPH_SEED
    return first, pass_seed(seed, pass_index) % SEED_MODULUS


def philox_blocks(key: int, counter_high: int, first_block: int, count: int) -> np.ndarray:
    """`count` blocks (4 uint32 each, flattened) of Philox4x32-10 with the 64-bit `key`, the upper
    64 counter bits `counter_high` and the lower 64 running from `first_block`."""
    blocks = np.arange(first_block, first_block + count, dtype=np.uint64)
    c0, c1 = blocks & _LOW32, blocks >> np.uint64(32)
    c2 = np.full(count, counter_high & 0xFFFFFFFF, np.uint64)
    c3 = np.full(count, (counter_high >> 32) & 0xFFFFFFFF, np.uint64)
    k0, k1 = np.uint64(key & 0xFFFFFFFF), np.uint64((key >> 32) & 0xFFFFFFFF)
    for _ in range(10):
        p0, p1 = _MULTIPLIERS[0] * c0, _MULTIPLIERS[1] * c2
        c0, c1, c2, c3 = (
            (p1 >> np.uint64(32)) ^ c1 ^ k0,
            p1 & _LOW32,
            (p0 >> np.uint64(32)) ^ c3 ^ k1,
            p0 & _LOW32,
        )
        k0, k1 = (k0 + _KEY_STEPS[0]) & _LOW32, (k1 + _KEY_STEPS[1]) & _LOW32
    return np.stack([c0, c1, c2, c3], axis=1).reshape(-1)


def random_stream(seeds: tuple[int, int], chunk: int = 4096) -> Iterator[int]:
    """The uint32 values a tf.data shuffle keyed by `seeds` draws, one at a time."""
    block = 0
    while True:
        yield from philox_blocks(seeds[0], seeds[1], block, chunk // 4).tolist()
        block += chunk // 4


def shuffled_indices(count: int, seeds: tuple[int, int]) -> np.ndarray:
    """0..count-1 in the order a shuffle whose buffer holds them all puts them (a permutation):
    step s swaps the element at s with the one at s + draw_s % (count - s). The swaps run in
    Python over arrays of 8-byte ints (about 0.2 s a million rows, once a pass)."""
    steps = np.arange(count, dtype=np.int64)
    draws = philox_blocks(seeds[0], seeds[1], 0, (count + 3) // 4)[:count].astype(np.int64)
    targets = array.array("q", (steps + draws % (count - steps)).tobytes())
    held = array.array("q", steps.tobytes())
    for start, index in enumerate(targets):
        held[start], held[index] = held[index], held[start]
    return np.frombuffer(held, dtype=np.int64).copy()


def buffer_shuffled(elements: Iterable, buffer: int, seeds: tuple[int, int]) -> Iterator:
    """`elements` in the order a shuffle of `buffer` elements puts them (a stream of any length)."""
    source, draws = iter(elements), random_stream(seeds)
    held: list = []
    start = 0  # held[start:] are the elements not yet given out, oldest first
    exhausted = False
    while True:
        while not exhausted and len(held) - start < buffer:
            try:
                held.append(next(source))
            except StopIteration:
                exhausted = True
        remaining = len(held) - start
        if not remaining:
            return
        index = start + next(draws) % remaining
        chosen = held[index]
        held[index] = held[start]
        held[start] = None
        start += 1
        if start > buffer:  # drop the given-out prefix now and then
            del held[:start]
            start = 0
        yield chosen
