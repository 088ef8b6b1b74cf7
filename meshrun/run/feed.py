"""How Keras reads a run's data: a tf.data pipeline as it is, meshrun's numpy Batches as a
keras.utils.PyDataset (Keras fits from it natively, without TensorFlow), or, for a KerasHub task
(whose fit takes only tf.data or Grain datasets), as a Grain dataset over the same batches
(meshrun.run.grain_feed).

No TensorFlow dataset is built here: a tf.data GeneratorDataset would set glibc's mmap
threshold for the whole process and make every XLA step on the host fault its buffers in afresh
(meshrun.system.allocator). A user's own tf.data pipeline may hold one; `AllocatorGuard` then sets
meshrun's allocator policy again once the pipeline's iterators exist.

Importing this module imports keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import logging
import sys

import keras

from meshrun.compat.keras.callbacks import mark_async_safe
from meshrun.data.batches import Batches
from meshrun.system import allocator
from meshrun.wording import format_bytes

log = logging.getLogger("meshrun")

PYDATASET, GRAIN, TF_DATA = "pydataset", "grain", "tf.data"  # data.loader in metrics.json


def loader(data, model) -> str:
    """Which loader feeds `data` (Batches, or a tf.data.Dataset) to `model`: PYDATASET, GRAIN or TF_DATA."""
    if not isinstance(data, Batches):
        return TF_DATA
    return GRAIN if takes_only_datasets(model) else PYDATASET


def keras_input(data, model):
    """What `model`'s fit and evaluate take for `data` (Batches, or a tf.data.Dataset). A Grain
    dataset of a finite stream (evaluation) repeats it: give Keras `evaluation_steps` with it."""
    kind = loader(data, model)
    if kind == GRAIN:
        from meshrun.run.grain_feed import BatchesDataset

        return BatchesDataset(data)
    return BatchesForKeras(data) if kind == PYDATASET else data


def evaluation_steps(data, model) -> int | None:
    """The `steps` (`validation_steps`) to give Keras with the evaluation data `data`: its batches
    where it goes as a Grain dataset, whose end Keras cannot know (it would read to the end and
    warn that the data ran out); None where Keras knows the length itself."""
    return data.num_batches if loader(data, model) == GRAIN else None


def takes_only_datasets(model) -> bool:
    """Whether `model` is a KerasHub task: its fit turns anything but a tf.data or Grain dataset
    into a dataset of slices, which a PyDataset is not."""
    keras_hub = sys.modules.get("keras_hub")
    return keras_hub is not None and isinstance(model, keras_hub.models.Task)


class BatchesForKeras(keras.utils.PyDataset):
    """A Batches stream as Keras reads a PyDataset: batch 0, 1, 2, ... in order, from 0 again for
    each fit and each evaluation. The batches come from one iterator of the stream, started again
    (at the batch asked for) whenever Keras asks for another batch than the next."""

    def __init__(self, batches: Batches):
        super().__init__()
        self.batches = batches
        self._iterator = None
        self._next = 0

    @property
    def num_batches(self):
        """Batches per iteration; None for an endless stream (fit counts steps_per_epoch)."""
        return self.batches.num_batches

    def __len__(self) -> int:
        if self.batches.num_batches is None:
            raise TypeError("an endless stream of batches has no length")
        return self.batches.num_batches

    def __getitem__(self, index: int) -> tuple:
        if self._iterator is None or index != self._next:
            self._iterator = iter(self.batches.skip(index))
        self._next = index + 1
        try:
            return next(self._iterator)
        except StopIteration:
            raise RuntimeError(
                f"the data ran out at batch {index} of a pass; "
                "does the data source hold the samples it declares?"
            ) from None


@mark_async_safe
class AllocatorGuard(keras.callbacks.Callback):
    """Sets meshrun's large-block policy (meshrun.system.allocator.set_training_policy) again after the
    first batch of every epoch and every evaluation of a run whose pipeline holds a tf.data
    generator dataset: a batch read means the pipeline's iterator, and so its generator dataset,
    exists, and each epoch or evaluation may have made a new one. Says so once. `restored` tells
    whether it did (False where the C library is not glibc)."""

    def __init__(self):
        super().__init__()
        self.restored = False

    def on_train_batch_end(self, batch, logs=None):
        if batch == 0:
            self._restore()

    def on_test_batch_end(self, batch, logs=None):
        if batch == 0:
            self._restore()

    def _restore(self) -> None:
        if allocator.set_training_policy() and not self.restored:
            self.restored = True
            log.info(
                "the data pipeline holds a tf.data.Dataset.from_generator, which set glibc's mmap threshold "
                "to 128 KiB for this process (every step would fault its "
                "buffers in afresh); meshrun set it back to %s (trim at %s)",
                format_bytes(allocator.MMAP_THRESHOLD),
                format_bytes(allocator.TRIM_THRESHOLD),
            )
