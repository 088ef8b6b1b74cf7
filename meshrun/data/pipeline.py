"""What every data source shares: the run's Datasets, and the checks that the data fits the run
(enough samples, shapes and dtypes that fit the model).

Every source delivers full global batches (remainder dropped; Keras splits each over the mesh's
batch axis with jax.make_array_from_process_local_data), each process reading only its share: a
run of adjacent rows of each batch. Every process orders the samples the same way (same seed,
meshrun.data.order), so the shares side by side are exactly the batches one process would train
on. The training data is a stream of pass after pass without end (fit runs `steps_per_epoch`
steps an epoch), each pass shuffled by its own seed, so step g of the stream is the same batch
however it is reached (a resumed run starts at g).

Two pipelines deliver them: numpy Batches (meshrun.data.batches: synthetic, arrays, Python
iterables; no TensorFlow) and tf.data (meshrun.data.tf_data: tfrecord, tf.data factories).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np

from meshrun.data import tf_data
from meshrun.data.batches import ArraySpec, Batches
from meshrun.errors import ConfigError
from meshrun.wording import counted, shape_text


@dataclass(frozen=True)
class Datasets:
    """A run's data: training (endless, reshuffled each pass) and evaluation pipelines of this
    process's share of each global batch (numpy Batches or tf.data datasets), training batches
    per epoch, one global batch as numpy arrays (for cost analysis), and what the report says
    about the pipeline. Elements are (features, labels) or (features, labels, sample weights)."""

    train: object
    eval: object
    steps_per_epoch: int
    sample_batch: tuple
    info: dict = field(default_factory=dict)

    @property
    def weighted(self) -> bool:
        """Whether each batch carries sample weights (a third element)."""
        return len(self.train.element_spec) == 3

    def holds_generator(self) -> bool:
        """Whether the training or evaluation pipeline is a tf.data one holding a generator dataset
        (GeneratorDataset: a Python generator's elements), whose first iterator sets glibc's mmap threshold
        for the whole process (meshrun.system.allocator)."""
        return any(tf_data.is_dataset(p) and tf_data.has_generator(p) for p in (self.train, self.eval))


def weighted_by_input(datasets: Datasets, name: str) -> Datasets:
    """`datasets` with input feature `name` (a padding mask) as every batch's sample weights."""
    features = datasets.sample_batch[0]
    return dataclasses.replace(
        datasets,
        train=_weighted(datasets.train, name),
        eval=_weighted(datasets.eval, name),
        sample_batch=(*datasets.sample_batch, np.asarray(features[name], dtype=np.float32)),
        info={**datasets.info, "sample_weights": f"input {name!r}"},
    )


def _weighted(data, name: str):
    if isinstance(data, Batches):
        features, labels = data.element_spec
        spec = (features, labels, ArraySpec(features[name].shape, np.dtype(np.float32)))
        return data.map(lambda batch: (*batch, np.asarray(batch[0][name], dtype=np.float32)), spec)
    import tensorflow as tf

    return data.map(lambda features, labels: (features, labels, tf.cast(features[name], tf.float32)))


def check_enough(count: int, batch_size: int, key: str, what: str) -> None:
    """ConfigError when `count` samples do not make one global batch."""
    if count < batch_size:
        raise ConfigError(
            key,
            f"{what} holds {counted(count, 'sample')}, fewer than "
            f"one global batch (train.batch_size={batch_size})",
        )


def check_fits_model(element_spec, signature, loss_name: str, input_key: str | None = None) -> None:
    """ConfigError when the data's features do not fit the model's inputs (shape or kind of dtype;
    a size the model leaves open fits any), its labels do not fit the model's output under the
    loss, or its sample weights do not fit the labels, before training starts. `element_spec` is
    the spec of one batch: (features, labels) or (features, labels, sample weights); `signature`
    is the model's (meshrun.run.build.Signature); `input_key`, where given, is the model option that
    sets its input shape (model.input_shape or model.seq_len), named in the fix."""
    features, labels, *weights = element_spec
    if isinstance(features, dict) and signature.named:
        missing = sorted(s.name for s in signature.inputs if s.name not in features)
        if missing:
            raise ConfigError(
                "data",
                f"the model's inputs {missing} are missing from the data, which has {sorted(features)}",
            )
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
                "data",
                f"features of shape {shape_text(spec.shape[1:])} do not fit the model's {what} of shape "
                f"{shape_text(expected.shape)}{_input_fix(input_key, tuple(spec.shape[1:]))}",
            )
        if _kind(spec.dtype.name) != _kind(expected.dtype):
            raise ConfigError(
                "data",
                f"features of dtype {spec.dtype.name} do not fit the model's {what} "
                f"of dtype {expected.dtype}",
            )
    if len(signature.outputs) == 1:
        _check_labels(labels, signature.outputs[0].shape, loss_name)
    if weights and tuple(weights[0].shape[1:]) not in ((), tuple(labels.shape[1:])):
        raise ConfigError(
            "data",
            f"sample weights of shape {shape_text(weights[0].shape[1:])} do not fit labels of shape "
            f"{shape_text(labels.shape[1:])}: give one weight per sample or one per label",
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
    return len(shape) == len(expected) and all(
        e is None or s is None or s == e for s, e in zip(shape, expected, strict=True)
    )


def _check_labels(labels, output: tuple, loss_name: str) -> None:
    shape = tuple(labels.shape[1:])
    sparse = "sparse" in loss_name
    expected = output[:-1] if sparse else output
    if sparse and _fits(shape, output[:-1] + (1,)):
        expected = shape
    if not _fits(shape, expected):
        raise ConfigError(
            "data",
            f"labels of shape {shape_text(shape)} do not fit the loss {loss_name} on the model's output of "
            f"shape {shape_text(output)}; it expects labels of shape {shape_text(expected)}"
            + (" (class indices)" if sparse else "")
            + _loss_fix(labels, shape, output, sparse),
        )
    if sparse and _kind(labels.dtype.name) != "int":
        raise ConfigError(
            "data",
            f"labels of dtype {labels.dtype.name} do not fit the "
            f"loss {loss_name}: it expects integer class indices",
        )


def _loss_fix(labels, shape: tuple, output: tuple, sparse: bool) -> str:
    """The loss that would fit: class indices want a sparse cross-entropy, one-hot rows a dense one."""
    if (
        not sparse
        and _kind(labels.dtype.name) == "int"
        and (_fits(shape, output[:-1]) or _fits(shape, output[:-1] + (1,)))
    ):
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
