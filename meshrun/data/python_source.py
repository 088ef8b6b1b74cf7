"""data=python: a dataset made by the user's own code, named as `module:function`.

    data:
      factory: mypackage.data:make_dataset
      kwargs: {path: /data/train.csv}

meshrun calls `function(split=..., seed=..., **kwargs)` with split "train", then "eval". It must
return a tf.data.Dataset, or an iterable, of single (features, labels) or (features, labels,
sample weight) samples; meshrun shuffles, batches and shards them. The module is imported with the
working dir on the import path (meshrun.user_code). A dataset of unknown size (a generator, say)
needs data.num_samples (and data.eval_samples) to know what an epoch is.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from meshrun.data import pipeline
from meshrun.data.registry import DataContext, SourceSpec, register_source
from meshrun import user_code
from meshrun.errors import ConfigError


@dataclass(frozen=True)
class PythonOptions:
    """The factory, its keyword arguments, and the sizes of datasets that do not know theirs."""

    factory: Optional[str] = None
    kwargs: dict = field(default_factory=dict)
    num_samples: Optional[int] = None
    eval_samples: Optional[int] = None
    shuffle: bool = True
    shuffle_buffer: int = 10000

    def __post_init__(self):
        user_code.check_reference("data.factory", self.factory, "mypackage.data:make_dataset")
        if self.shuffle_buffer <= 0:
            raise ConfigError("data.shuffle_buffer", f"got {self.shuffle_buffer}; expected a positive integer")


def make_split(options: PythonOptions, split: str, context: DataContext, size: Optional[int]):
    """The factory's dataset for `split` as a tf.data.Dataset, and how many samples it holds: its
    own count, else `size` (None when neither is known)."""
    import tensorflow as tf

    function = user_code.load_callable("data.factory", options.factory)
    user_code.check_kwargs("data.kwargs", function, options.factory, options.kwargs, fixed=("split", "seed"))

    def call():
        described = f"{options.factory}(split={split!r})"
        return user_code.call("data.factory", described, function, split=split, seed=context.seed, **options.kwargs)

    made = call()
    if not isinstance(made, tf.data.Dataset):
        made = _from_iterable(made, call, options.factory, split)
    count = int(made.cardinality())
    return made, (count if count >= 0 else size)


def _from_iterable(made, call, factory: str, split: str):
    """A dataset of the (features, labels[, sample weight]) tuples an iterable yields; each pass
    over it calls the factory again (a generator can be read only once)."""
    import tensorflow as tf

    try:
        first = tuple(next(iter(made)))
        if len(first) not in (2, 3):
            raise ValueError
    except (TypeError, ValueError, StopIteration):
        raise ConfigError(
            "data.factory",
            f"{factory}(split={split!r}) returned {type(made).__name__}, not a tf.data.Dataset or an iterable of "
            "(features, labels) or (features, labels, sample weight) tuples",
        ) from None
    signature = tf.nest.map_structure(lambda v: tf.TensorSpec.from_tensor(tf.convert_to_tensor(v)), first)
    return tf.data.Dataset.from_generator(lambda: iter(call()), output_signature=signature)


def load(options: PythonOptions, context: DataContext) -> pipeline.Datasets:
    """Calls the factory for both splits, then shards, shuffles and batches what it returns."""
    train, count = make_split(options, "train", context, options.num_samples)
    evaluation, eval_count = make_split(options, "eval", context, options.eval_samples)
    _require_sizes({"train": ("data.num_samples", count), "eval": ("data.eval_samples", eval_count)}, options.factory)
    pipeline.check_enough(count, context.batch_size, "data.num_samples", f"the train dataset from {options.factory}")
    pipeline.check_enough(eval_count, context.batch_size, "data.eval_samples", f"the eval dataset from {options.factory}")
    # Each process reads only its own elements (every shard_count-th), so a global batch holds
    # the same number of samples as with one process, but not the same ones.
    batch = context.process_batch_size
    train_batches = pipeline.element_batches(
        train.shard(context.shard_count, context.shard_index), batch, options.shuffle, context.seed, options.shuffle_buffer, endless=True
    )
    eval_batches = pipeline.element_batches(evaluation.shard(context.shard_count, context.shard_index), batch, False, context.seed, 1)
    return pipeline.Datasets(
        train=train_batches,
        eval=pipeline.exactly(eval_batches, eval_count // context.batch_size),
        steps_per_epoch=count // context.batch_size,
        sample_batch=pipeline.first_batch(train_batches),
        info={"train_samples": count, "eval_samples": eval_count, "factory": options.factory},
    )


def _require_sizes(splits: dict, factory: str) -> None:
    """One error naming every size key still needed (both at once, not one per run)."""
    missing = {split: key for split, (key, count) in splits.items() if count is None}
    if len(missing) == 2:
        raise ConfigError(", ".join(missing.values()),
                          f"are required: the train and eval datasets from {factory} do not know their size; set both")
    for split, key in missing.items():
        raise ConfigError(key, f"is required: the {split} dataset from {factory} does not know its size")


SPEC = register_source(SourceSpec("python", PythonOptions, load, "a dataset from the user's module:function"))
