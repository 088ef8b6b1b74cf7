"""meshrun's Batches as a Grain dataset: how a KerasHub task, whose fit takes only tf.data or Grain
datasets, reads them without TensorFlow (meshrun.run.feed).

The dataset reads the stream in order on the thread that asks for the next batch, as the PyDataset
feed of other models does: the batches are already this process's share of each global batch in the
seeded order, so Grain neither shuffles, shards nor prefetches (its thread pool's defaults, 16
threads reading ahead, are sized for pipelines that decode, not for a 2-core machine). Its state is
the position in the stream: `set_state` starts reading there without reading the batches before it,
where the source can seek.

Keras cannot tell where a Grain dataset ends, and keeps one iterator of the validation data across
a fit's validations when it is told their `validation_steps`; so a finite stream (evaluation) is
read pass after pass, and Keras takes one pass (`steps`) at a time.

Importing this module imports grain.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import grain

from meshrun.data.batches import Batches


class BatchesDataset(grain.IterDataset):
    """A Batches stream as a grain.IterDataset: each iterator reads it from its start; a finite
    stream again and again."""

    def __init__(self, batches: Batches):
        super().__init__()
        self.batches = batches

    def __iter__(self) -> BatchesIterator:
        return BatchesIterator(self.batches)

    def __str__(self) -> str:
        return f"BatchesDataset(batches per pass: {self.batches.num_batches or 'endless'})"


class BatchesIterator(grain.DatasetIterator):
    """An iterator over a Batches stream (a finite one repeated) whose state is the number of
    batches read."""

    def __init__(self, batches: Batches):
        super().__init__()
        self._batches = batches
        self._position = 0
        self._iterator = self._read_from(0)

    def _read_from(self, position: int) -> Iterator[tuple]:
        per_pass = self._batches.num_batches
        if per_pass is None:
            return iter(self._batches.skip(position))
        if per_pass == 0:
            return iter(())
        first = position % per_pass
        return itertools.chain(
            self._batches.skip(first), itertools.chain.from_iterable(itertools.repeat(self._batches))
        )

    def __next__(self) -> tuple:
        batch = next(self._iterator)
        self._position += 1
        return batch

    def get_state(self) -> dict:
        return {"position": self._position}

    def set_state(self, state: dict) -> None:
        self._position = int(state["position"])
        self._iterator = self._read_from(self._position)
