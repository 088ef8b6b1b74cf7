"""The parts every data source shares: tf.data pipelines of full global batches (seeded shuffle,
remainder dropped, prefetch, the training side endless), each process reading only its share, and
the checks that the data fits the run (enough samples, shapes and dtypes that fit the model).

A process's share of a global batch is a run of adjacent rows (`share = (index, count)`: rows
index*b to (index+1)*b, b = batch/count). Every process orders the samples the same way (same
seed), so the shares side by side are exactly the batches one process would train on.

Keras splits each global batch over the mesh's batch axis (jax.make_array_from_process_local_data),
so batches are always full. The training pipeline makes pass after pass without end and fit runs
`steps_per_epoch` steps an epoch: one tf.data iterator lives across epochs, where a new one each
epoch sometimes stalled the first step of an epoch by 0.5-1.7 s on 2-core CPU machines. Each pass
is shuffled by its own seed, so step g of the stream is the same batch however it is reached
(a resumed run skips straight to it).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from meshrun.errors import ConfigError
from meshrun.wording import shape_text


@dataclass(frozen=True)
class Datasets:
    """A run's data: training (endless, reshuffled each pass) and evaluation tf.data pipelines of
    this process's share of each global batch, training batches per epoch, one global batch as
    numpy arrays (for cost analysis), and what the report says about the pipeline. Elements are
    (features, labels) or (features, labels, sample weights)."""

    train: object
    eval: object
    steps_per_epoch: int
    sample_batch: tuple
    info: dict = field(default_factory=dict)

    @property
    def weighted(self) -> bool:
        """Whether each batch carries sample weights (a third element)."""
        return len(self.train.element_spec) == 3


def weighted_by_input(datasets: Datasets, name: str) -> Datasets:
    """`datasets` with input feature `name` (a padding mask) as every batch's sample weights."""
    import tensorflow as tf

    def add(features, labels):
        return features, labels, tf.cast(features[name], tf.float32)

    features = datasets.sample_batch[0]
    return dataclasses.replace(
        datasets,
        train=datasets.train.map(add),
        eval=datasets.eval.map(add),
        sample_batch=(*datasets.sample_batch, np.asarray(features[name], dtype=np.float32)),
        info={**datasets.info, "sample_weights": f"input {name!r}"},
    )


def check_enough(count: int, batch_size: int, key: str, what: str) -> None:
    """ConfigError when `count` samples do not make one global batch."""
    if count < batch_size:
        raise ConfigError(key, f"{what} holds {count} samples, fewer than one global batch (train.batch_size={batch_size})")


def share_of_batches(dataset, batch_size: int, share: tuple[int, int]):
    """A dataset of global batches cut down to this process's rows of each (see the module doc)."""
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


# Rows are read for up to this many batches at once (and at most READ_BYTES): one numpy call per
# group, not per batch, keeps the pipeline's share of a 2-core machine small next to the training
# step (per batch it took about 10% of the seeds' step time).
BATCHES_PER_READ = 32
READ_BYTES = 64 << 20


def passes(one_pass, endless: bool):
    """The dataset `one_pass(pass_index)` returns for pass 0, or for passes 0, 1, 2, ... without
    end. Each pass shuffles with its own seed (`pass_seed`), so what the stream holds from step g
    on does not depend on how it was read before: resuming a run skips to g and reads on."""
    import tensorflow as tf

    if not endless:
        return one_pass(tf.constant(0, tf.int64))
    return tf.data.Dataset.range(2**62).flat_map(one_pass)


def pass_seed(seed: int, pass_index):
    """The shuffle seed of one pass over the data (`reshuffle_each_iteration` would instead draw
    from a generator shared by every iterator of the dataset, Keras' peek at the first batch
    included)."""
    return seed * 1_000_003 + pass_index


def indexed_batches(x, y, indices: np.ndarray, batch_size: int, shuffle: bool, seed: int, share: tuple[int, int] = (0, 1), endless: bool = False,
                    weights=None):
    """This process's share of each global batch of rows `indices` of the arrays x (an array,
    FileRows or a dict of them), y and the sample `weights` if given, for one pass or endless
    passes. The indices are shuffled and cut into shares; the rows are read a group of batches at
    a time with numpy (in file order, then put back in the shuffled order), so files are read a
    group of batches at a time, never whole, and only the share."""
    import tensorflow as tf

    global_batch, batch_size = batch_size, batch_size // share[1]
    names = sorted(x) if isinstance(x, dict) else None
    features = [x[n] for n in names] if names else [x]
    targets = [y] if weights is None else [y, weights]
    columns = features + targets

    def gather(group_indices):
        usable = len(group_indices) - len(group_indices) % batch_size
        wanted = group_indices[:usable]
        order = np.argsort(wanted, kind="stable")
        values = []
        for column in columns:
            rows = np.asarray(column[wanted[order]])
            restored = np.empty_like(rows)
            restored[order] = rows
            values.append(restored.reshape(usable // batch_size, batch_size, *rows.shape[1:]))
        return tuple(values)

    signature = [tf.TensorSpec((None, batch_size, *c.shape[1:]), tf.as_dtype(c.dtype)) for c in columns]
    batch_bytes = batch_size * sum(int(np.prod(c.shape[1:])) * np.dtype(c.dtype).itemsize for c in columns)
    batches_per_read = max(1, min(BATCHES_PER_READ, READ_BYTES // max(batch_bytes, 1)))

    def to_tensors(group_indices):
        values = tf.numpy_function(gather, [group_indices], [s.dtype for s in signature], stateful=False)
        values = [tf.ensure_shape(v, s.shape) for v, s in zip(values, signature)]
        inputs = dict(zip(names, values[: len(features)])) if names else values[0]
        return tf.data.Dataset.from_tensor_slices((inputs, *values[len(features):]))

    def one_pass(pass_index):
        dataset = tf.data.Dataset.from_tensor_slices(indices)
        if shuffle:
            dataset = dataset.shuffle(len(indices), seed=pass_seed(seed, pass_index), reshuffle_each_iteration=False)
        dataset = dataset.batch(global_batch, drop_remainder=True)
        return share_of_batches(dataset, global_batch, share).unbatch()

    dataset = passes(one_pass, endless).batch(batch_size * batches_per_read)  # groups of whole batches
    return dataset.flat_map(to_tensors).prefetch(tf.data.AUTOTUNE)


def element_batches(dataset, batch_size: int, shuffle: bool, seed: int, buffer: int, share: tuple[int, int] = (0, 1), endless: bool = False):
    """This process's share of each global batch of a dataset of single (x, y) or (x, y, weight)
    elements, for one pass or endless passes: seeded shuffle within `buffer` elements, remainder dropped, prefetched."""
    import tensorflow as tf

    def one_pass(pass_index):
        elements = dataset.shuffle(buffer, seed=pass_seed(seed, pass_index), reshuffle_each_iteration=False) if shuffle else dataset
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


def check_fits_model(element_spec, signature, loss_name: str, input_key: str | None = None) -> None:
    """ConfigError when the data's features do not fit the model's inputs (shape or kind of dtype;
    a size the model leaves open fits any), its labels do not fit the model's output under the
    loss, or its sample weights do not fit the labels, before training starts. `element_spec` is
    the spec of one batch: (features, labels) or (features, labels, sample weights); `signature`
    is the model's (meshrun.models.build.Signature); `input_key`, where given, is the model option that
    sets its input shape (model.input_shape or model.seq_len), named in the fix."""
    features, labels, *weights = element_spec
    if isinstance(features, dict) and signature.named:
        missing = sorted(s.name for s in signature.inputs if s.name not in features)
        if missing:
            raise ConfigError("data", f"the model's inputs {missing} are missing from the data, which has {sorted(features)}")
        pairs = [(f"input {s.name!r}", features[s.name], s) for s in signature.inputs]
    elif isinstance(features, dict) or signature.named:
        given = sorted(features) if isinstance(features, dict) else "one unnamed tensor"
        wanted = [s.name for s in signature.inputs] if signature.named else "one unnamed tensor"
        raise ConfigError("data", f"the data's features ({given}) do not fit the model's inputs ({wanted})")
    else:
        pairs = [("input", features, signature.inputs[0])]
    for what, spec, expected in pairs:
        if not _fits(tuple(spec.shape[1:]), expected.shape):
            raise ConfigError(
                "data", f"features of shape {shape_text(spec.shape[1:])} do not fit the model's {what} of shape "
                f"{shape_text(expected.shape)}{_input_fix(input_key, tuple(spec.shape[1:]))}"
            )
        if _kind(spec.dtype.name) != _kind(expected.dtype):
            raise ConfigError(
                "data", f"features of dtype {spec.dtype.name} do not fit the model's {what} of dtype {expected.dtype}"
            )
    if len(signature.outputs) == 1:
        _check_labels(labels, signature.outputs[0].shape, loss_name)
    if weights and tuple(weights[0].shape[1:]) not in ((), tuple(labels.shape[1:])):
        raise ConfigError(
            "data", f"sample weights of shape {shape_text(weights[0].shape[1:])} do not fit labels of shape {shape_text(labels.shape[1:])}: "
            "give one weight per sample or one per label"
        )


def _input_fix(input_key: str | None, shape: tuple) -> str:
    """How to build the model for data of `shape` instead, where one option sets the input shape."""
    if input_key == "model.seq_len" and len(shape) == 1 and shape[0]:
        return f"; set model.seq_len={shape[0]} to build the model for this data"
    if input_key == "model.input_shape" and None not in shape:
        return f"; set model.input_shape=[{','.join(map(str, shape))}] to build the model for this data"
    return ""


def _fits(shape: tuple, expected: tuple) -> bool:
    """Whether a shape fits an expected one in which None stands for any size."""
    return len(shape) == len(expected) and all(e is None or s is None or s == e for s, e in zip(shape, expected))


def _check_labels(labels, output: tuple, loss_name: str) -> None:
    shape = tuple(labels.shape[1:])
    sparse = "sparse" in loss_name
    expected = output[:-1] if sparse else output
    if sparse and _fits(shape, output[:-1] + (1,)):
        expected = shape
    if not _fits(shape, expected):
        raise ConfigError(
            "data",
            f"labels of shape {shape_text(shape)} do not fit the loss {loss_name} on the model's output of shape "
            f"{shape_text(output)}; it expects labels of shape {shape_text(expected)}"
            + (" (class indices)" if sparse else "") + _loss_fix(labels, shape, output, sparse),
        )
    if sparse and _kind(labels.dtype.name) != "int":
        raise ConfigError("data", f"labels of dtype {labels.dtype.name} do not fit the loss {loss_name}: it expects integer class indices")


def _loss_fix(labels, shape: tuple, output: tuple, sparse: bool) -> str:
    """The loss that would fit: class indices want a sparse cross-entropy, one-hot rows a dense one."""
    if not sparse and _kind(labels.dtype.name) == "int" and (_fits(shape, output[:-1]) or _fits(shape, output[:-1] + (1,))):
        return "; for integer class labels set train.loss=sparse_categorical_crossentropy"
    if sparse and _fits(shape, output):
        return "; for one-hot labels set train.loss=categorical_crossentropy"
    return ""


def _kind(dtype: str) -> str:
    if "int" in dtype or dtype == "bool":
        return "int"
    if dtype == "string":
        return "string"
    return "float"
