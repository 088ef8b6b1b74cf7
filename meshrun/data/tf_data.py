"""tf.data pipelines, for the sources that need TensorFlow: data=tfrecord, and data=python factories
that return a tf.data.Dataset. TensorFlow is imported here only when such a source loads (2 s of
start-up that the other sources do without, see meshrun.data.batches).

The pipelines read what meshrun.data.batches reads for the same elements: the same seeded order
(each pass shuffled by its own seed, meshrun.data.order), full global batches with the remainder
dropped, this process's share of each. The training pipeline makes pass after pass without end
and fit runs `steps_per_epoch` steps an epoch: one tf.data iterator lives across epochs, where a
new one each epoch sometimes stalled the first step of an epoch by 0.5-1.7 s on 2-core CPU
machines.
"""

from __future__ import annotations

import sys

from meshrun.compat.tensorflow import dataset_ops
from meshrun.data import order

GENERATOR_OP = "GeneratorDataset"  # the op of a tf.data pipeline over a Python generator


def seeded_tensorflow(seed: int):
    """TensorFlow, imported quietly (meshrun.compat.tensorflow.import_tensorflow), its global seed
    set for a run seeded `seed`: the shuffles' seeds derive from it."""
    from meshrun.compat.tensorflow import import_tensorflow

    tf = import_tensorflow()
    tf.random.set_seed(order.tensorflow_global_seed(seed))
    return tf


def share_of_batches(dataset, batch_size: int, share: tuple[int, int]):
    """A dataset of global batches cut down to this process's rows of each (a run of adjacent rows:
    `share = (index, count)` keeps rows index*b to (index+1)*b, b = batch_size/count)."""
    index, count = share
    if count == 1:
        return dataset
    import tensorflow as tf

    size = batch_size // count
    start = index * size

    def cut(*values):
        cut_values = tf.nest.map_structure(lambda v: v[start : start + size], values)
        return cut_values[0] if len(cut_values) == 1 else cut_values

    return dataset.map(cut)


def passes(one_pass, endless: bool):
    """The dataset `one_pass(pass_index)` returns for pass 0, or for passes 0, 1, 2, ... without
    end. Each pass shuffles with its own seed (order.pass_seed), so what the stream holds from step
    g on does not depend on how it was read before: resuming a run skips to g and reads on."""
    import tensorflow as tf

    if not endless:
        return one_pass(tf.constant(0, tf.int64))
    return tf.data.Dataset.range(2**62).flat_map(one_pass)


def element_batches(
    dataset,
    batch_size: int,
    shuffle: bool,
    seed: int,
    buffer: int,
    share: tuple[int, int] = (0, 1),
    endless: bool = False,
):
    """This process's share of each global batch of a dataset of single (x, y) or (x, y, weight)
    elements, for one pass or endless passes: seeded shuffle within `buffer` elements, remainder
    dropped, prefetched."""
    tf = seeded_tensorflow(seed)

    def one_pass(pass_index):
        seeded = order.pass_seed(seed, pass_index)
        elements = (
            dataset.shuffle(buffer, seed=seeded, reshuffle_each_iteration=False) if shuffle else dataset
        )
        return share_of_batches(elements.batch(batch_size, drop_remainder=True), batch_size, share)

    return passes(one_pass, endless).prefetch(tf.data.AUTOTUNE)


def exactly(dataset, batches: int):
    """The first `batches` batches of `dataset`, with that count declared to tf.data (Keras then
    knows where evaluation ends instead of running out of data)."""
    import tensorflow as tf

    return dataset.take(batches).apply(tf.data.experimental.assert_cardinality(batches))


def first_batch(dataset) -> tuple:
    """The first batch of `dataset` (a batched pipeline) as numpy arrays."""
    return next(iter(dataset.take(1).as_numpy_iterator()))


def has_generator(dataset) -> bool:
    """Whether the tf.data pipeline `dataset` holds a GeneratorDataset (a Python generator's
    elements, at any depth), whose first iterator sets glibc's mmap threshold for the whole process
    (meshrun.system.allocator)."""
    return GENERATOR_OP in dataset_ops(dataset)


def is_dataset(value) -> bool:
    """Whether `value` is a tf.data.Dataset (without importing TensorFlow: one can only exist once
    it is imported)."""
    tf = sys.modules.get("tensorflow")
    return tf is not None and isinstance(value, tf.data.Dataset)
