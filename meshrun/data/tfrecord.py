"""data=tfrecord: TFRecord files of tf.train.Example records, found by glob and parsed with tf.data
by a feature spec written in the config:

    data:
      files: /data/train-*.tfrecord
      eval_files: /data/eval-*.tfrecord
      features: {image: {dtype: float32, shape: [28, 28, 1]}, label: {dtype: int64, shape: []}}
      inputs: [image]      # one name: the model gets a tensor; several: a dict by name
      label: label
      sample_weight: null  # or the name of a feature of per-sample (or per-label) weights

Before training every file is read through once (records counted, CRCs checked), so a corrupt file
or a spec that does not parse is a config error. With several processes each reads its own files
(or, with fewer files than processes, every n-th record).
"""

from __future__ import annotations

import glob
import logging
from dataclasses import dataclass

import numpy as np

from meshrun.config.fields import setting
from meshrun.data import pipeline, tf_data
from meshrun.data.registry import DataContext, SourceSpec, register_source
from meshrun.errors import ConfigError
from meshrun.wording import first_line, one_of

log = logging.getLogger("meshrun")
DTYPES = ("float32", "int64", "string")
COMPRESSION = ("GZIP", "ZLIB")


@dataclass(frozen=True)
class TFRecordOptions:
    """The files, the feature spec, which features the model takes and which is the label."""

    files: str | None = setting(None, "A glob of TFRecord files of tf.train.Example records.")
    eval_files: str | None = setting(None, "A glob of the eval files; null: no evaluation data.")
    features: dict = setting(
        doc="The feature spec, name -> {dtype, shape}, e.g. "
        "'data.features={x:{dtype:float32,shape:[28,28,1]},y:{dtype:int64,shape:[]}}'.",
        factory=dict,
    )
    inputs: tuple[str, ...] = setting(
        ("x",), "The features the model takes (one name: a tensor; several: a dict by name)."
    )
    label: str = setting("y", "The label feature.")
    sample_weight: str | None = setting(None, "A feature of per-sample or per-label weights; null: none.")
    compression: str | None = setting(None, "GZIP or ZLIB; null: none.")
    shuffle: bool = setting(True, "Shuffle the training records.")
    shuffle_buffer: int = setting(10000, "Records in the shuffle buffer.")

    def __post_init__(self):
        if not self.files:
            raise ConfigError(
                "data.files",
                "is required for data=tfrecord: a glob of TFRecord files, e.g. /data/train-*.tfrecord",
            )
        if not self.features:
            raise ConfigError(
                "data.features", "is required: name -> {dtype, shape} for every feature in the records"
            )
        for name, spec in self.features.items():
            if (
                not isinstance(spec, dict)
                or spec.get("dtype") not in DTYPES
                or not isinstance(spec.get("shape"), (list, tuple))
            ):
                raise ConfigError(
                    f"data.features.{name}",
                    f"got {spec!r}; expected {{dtype: {' | '.join(DTYPES)}, shape: [..]}}",
                )
        for key, names in (
            ("data.inputs", self.inputs),
            ("data.label", (self.label,)),
            ("data.sample_weight", (self.sample_weight,) if self.sample_weight else ()),
        ):
            for name in names:
                if name not in self.features:
                    raise ConfigError(
                        key, f"got {name!r}, which is not in data.features ({one_of(sorted(self.features))})"
                    )
        if self.compression not in (None, *COMPRESSION):
            raise ConfigError(
                "data.compression", f"got {self.compression!r}; valid: null, {one_of(COMPRESSION)}"
            )
        if self.shuffle_buffer <= 0:
            raise ConfigError(
                "data.shuffle_buffer", f"got {self.shuffle_buffer}; expected a positive integer"
            )


def _files(pattern: str, key: str) -> list[str]:
    found = sorted(glob.glob(str(pattern)))
    if not found:
        raise ConfigError(key, f"got {pattern!r}, which matches no file")
    return found


def _count(files: list[str], options: TFRecordOptions, key: str) -> int:
    """Records in `files`, reading each through once (which checks every record's CRC)."""
    import tensorflow as tf

    total = 0
    for file in files:
        try:
            total += int(
                tf.data.TFRecordDataset(file, compression_type=options.compression).reduce(
                    np.int64(0), lambda n, _: n + 1
                )
            )
        except (tf.errors.DataLossError, tf.errors.InvalidArgumentError) as err:
            reason = first_line(err, limit=160)
            raise ConfigError(key, f"{file!r} is corrupt or not a TFRecord file ({reason})") from None
    return total


def _parser(options: TFRecordOptions):
    import tensorflow as tf

    spec = {
        name: tf.io.FixedLenFeature(tuple(f["shape"]), tf.as_dtype(f["dtype"]))
        for name, f in options.features.items()
    }

    def parse(record):
        parsed = tf.io.parse_single_example(record, spec)
        inputs = (
            parsed[options.inputs[0]] if len(options.inputs) == 1 else {n: parsed[n] for n in options.inputs}
        )
        if options.sample_weight:
            return inputs, parsed[options.label], parsed[options.sample_weight]
        return inputs, parsed[options.label]

    return parse


def declared_inputs(options: TFRecordOptions) -> dict:
    """The model inputs the feature spec makes (one unnamed input for a single name)."""
    from meshrun.specs.model import InputSpec

    named = len(options.inputs) > 1
    return {
        (name if named else None): InputSpec(
            name if named else None, tuple(options.features[name]["shape"]), options.features[name]["dtype"]
        )
        for name in options.inputs
    }


def _records(
    files: list[str], options: TFRecordOptions, context: DataContext, shuffle: bool, endless: bool = False
):
    import tensorflow as tf

    if len(files) >= context.shard_count:
        files = files[context.shard_index :: context.shard_count]  # file-level sharding
        dataset = tf.data.TFRecordDataset(files, compression_type=options.compression)
    else:
        dataset = tf.data.TFRecordDataset(files, compression_type=options.compression)
        dataset = dataset.shard(context.shard_count, context.shard_index)
    dataset = dataset.map(_parser(options), num_parallel_calls=tf.data.AUTOTUNE)
    return tf_data.element_batches(
        dataset, context.process_batch_size, shuffle, context.seed, options.shuffle_buffer, endless=endless
    )


def _check_parses(files: list[str], options: TFRecordOptions) -> None:
    import tensorflow as tf

    first = (
        tf.data.TFRecordDataset(files[:1], compression_type=options.compression).map(_parser(options)).take(1)
    )
    try:
        for _ in first:
            pass
    except tf.errors.InvalidArgumentError as err:
        reason = first_line(err, limit=200)
        raise ConfigError("data.features", f"does not parse the records of {files[0]!r} ({reason})") from None


def load(options: TFRecordOptions, context: DataContext) -> pipeline.Datasets:
    """Finds and checks the files, then parses and batches them."""
    from meshrun.compat.tensorflow import require_tensorflow

    require_tensorflow("data", "data=tfrecord")
    train_files = _files(options.files, "data.files")
    tf_data.seeded_tensorflow(context.seed)
    count = _count(train_files, options, "data.files")
    pipeline.check_enough(count, context.batch_size, "data.files", f"{options.files!r}")
    _check_parses(train_files, options)
    if options.eval_files:
        eval_files = _files(options.eval_files, "data.eval_files")
        eval_count = _count(eval_files, options, "data.eval_files")
        pipeline.check_enough(eval_count, context.batch_size, "data.eval_files", f"{options.eval_files!r}")
    else:
        eval_files, eval_count = train_files, count
        log.warning("data=tfrecord without data.eval_files: evaluating on the training files")
    train = _records(train_files, options, context, options.shuffle, endless=True)
    evaluation = _records(eval_files, options, context, shuffle=False)
    return pipeline.Datasets(
        train=train,
        eval=tf_data.exactly(evaluation, eval_count // context.batch_size),
        steps_per_epoch=count // context.batch_size,
        sample_batch=tf_data.first_batch(train),
        info={
            "train_samples": count,
            "eval_samples": eval_count,
            "train_file_count": len(train_files),
            "eval_file_count": len(eval_files),
            "sharding": "files" if len(train_files) >= context.shard_count else "records",
        },
    )


SPEC = register_source(
    SourceSpec(
        "tfrecord",
        TFRecordOptions,
        load,
        "TFRecord files by glob, parsed by a feature spec",
        declared_inputs=declared_inputs,
    )
)
