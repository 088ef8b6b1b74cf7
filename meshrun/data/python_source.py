"""data=python: a dataset made by the user's own code, named as `module:function`.

    data:
      factory: mypackage.data:make_dataset
      kwargs: {path: /data/train.csv}

meshrun calls `function(split=..., seed=..., **kwargs)` with split "train", then "eval". It must
return a tf.data.Dataset, or an iterable, of single (features, labels) or (features, labels,
sample weight) samples; meshrun shuffles, batches and shards them: an iterable without TensorFlow
(meshrun.data.batches), a tf.data.Dataset with tf.data, in the same order. The module is imported
with the working dir on the import path (meshrun.user_code). A dataset of unknown size (a
generator, say) needs data.num_samples (and data.eval_samples) to know what an epoch is.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sized
from dataclasses import dataclass

from meshrun import user_code
from meshrun.config.fields import setting
from meshrun.data import pipeline, tf_data
from meshrun.data.batches import Batches, element_batches
from meshrun.data.registry import DataContext, SourceSpec, register_source
from meshrun.errors import ConfigError


@dataclass(frozen=True)
class PythonOptions:
    """The factory, its keyword arguments, and the sizes of datasets that do not know theirs."""

    factory: str | None = setting(
        None,
        'module:function, called as function(split="train"|"eval", seed=..., **kwargs); it returns '
        "a tf.data.Dataset or an iterable of single (features, labels) samples.",
    )
    kwargs: dict = setting(
        doc="The factory's keyword arguments, e.g. +data.kwargs.path=/data/x.csv.", factory=dict
    )
    num_samples: int | None = setting(
        None, "Training samples, needed when the dataset does not know its size; null: its own count."
    )
    eval_samples: int | None = setting(
        None, "Eval samples, needed when the dataset does not know its size; null: its own count."
    )
    shuffle: bool = setting(True, "Shuffle the training samples.")
    shuffle_buffer: int = setting(10000, "Samples in the shuffle buffer.")

    def __post_init__(self):
        user_code.check_reference("data.factory", self.factory, "mypackage.data:make_dataset")
        if self.shuffle_buffer <= 0:
            raise ConfigError(
                "data.shuffle_buffer", f"got {self.shuffle_buffer}; expected a positive integer"
            )


@dataclass(frozen=True)
class Split:
    """What the factory made for one split: a tf.data.Dataset, or else a function that makes its
    iterable again (once per pass) and the iterable's first element (which fixes every array's
    dtype); and how many samples it holds (None: unknown)."""

    count: int | None
    dataset: object = None
    make: Callable[[], Iterable] | None = None
    first: tuple = ()


def make_split(options: PythonOptions, split: str, context: DataContext, size: int | None) -> Split:
    """The factory's dataset for `split` and how many samples it holds: its own count (a
    tf.data.Dataset's cardinality, the length of a list or a grain.MapDataset), else `size`."""
    function = user_code.load_callable("data.factory", options.factory)
    if "tensorflow" in sys.modules:  # the user's module imported it: hide its GPUs before it runs
        tf_data.seeded_tensorflow(context.seed)
    user_code.check_kwargs("data.kwargs", function, options.factory, options.kwargs, fixed=("split", "seed"))

    def call():
        described = f"{options.factory}(split={split!r})"
        return user_code.call(
            "data.factory", described, function, split=split, seed=context.seed, **options.kwargs
        )

    made = call()
    if tf_data.is_dataset(made):
        count = int(made.cardinality())
        return Split(count if count >= 0 else size, dataset=made)
    count = len(made) if isinstance(made, Sized) else size  # a list, a grain.MapDataset
    return Split(count, make=lambda: iter(call()), first=_first_element(made, options.factory, split))


def _first_element(made, factory: str, split: str) -> tuple:
    """The first (features, labels[, sample weight]) tuple of the iterable `made`."""
    try:
        first = tuple(next(iter(made)))
        if len(first) not in (2, 3):
            raise ValueError
    except (TypeError, ValueError, StopIteration):
        raise ConfigError(
            "data.factory",
            f"{factory}(split={split!r}) returned {type(made).__name__}, not a tf.data.Dataset or an "
            "iterable of (features, labels) or (features, labels, sample weight) tuples",
        ) from None
    return first


def _batches(
    made: Split,
    context: DataContext,
    shuffle: bool,
    buffer: int,
    endless: bool = False,
    cap: int | None = None,
):
    """This process's batches of its elements of `made` (every shard_count-th): seeded shuffle in
    `buffer` elements, remainder dropped; at most `cap` batches a pass where given."""
    batch, share = context.process_batch_size, context.share
    if made.dataset is not None:
        batches = tf_data.element_batches(
            made.dataset.shard(share[1], share[0]), batch, shuffle, context.seed, buffer, endless=endless
        )
        return tf_data.exactly(batches, cap) if cap is not None else batches
    per_pass = len(range(share[0], made.count, share[1])) // batch
    return element_batches(
        made.make,
        batch,
        shuffle,
        context.seed,
        buffer,
        share,
        min(per_pass, cap if cap is not None else per_pass),
        made.first,
        endless=endless,
    )


def load(options: PythonOptions, context: DataContext) -> pipeline.Datasets:
    """Calls the factory for both splits, then shards, shuffles and batches what it returns."""
    train = make_split(options, "train", context, options.num_samples)
    evaluation = make_split(options, "eval", context, options.eval_samples)
    _require_sizes(
        {"train": ("data.num_samples", train.count), "eval": ("data.eval_samples", evaluation.count)},
        options.factory,
    )
    pipeline.check_enough(
        train.count, context.batch_size, "data.num_samples", f"the train dataset from {options.factory}"
    )
    pipeline.check_enough(
        evaluation.count, context.batch_size, "data.eval_samples", f"the eval dataset from {options.factory}"
    )
    # Each process reads only its own elements (every shard_count-th), so a global batch holds
    # the same number of samples as with one process, but not the same ones.
    train_batches = _batches(train, context, options.shuffle, options.shuffle_buffer, endless=True)
    return pipeline.Datasets(
        train=train_batches,
        eval=_batches(evaluation, context, False, 1, cap=evaluation.count // context.batch_size),
        steps_per_epoch=train.count // context.batch_size,
        sample_batch=first_batch(train_batches),
        info={"train_samples": train.count, "eval_samples": evaluation.count, "factory": options.factory},
    )


def first_batch(batches) -> tuple:
    """The first batch of a numpy or tf.data pipeline, as numpy arrays."""
    return next(iter(batches)) if isinstance(batches, Batches) else tf_data.first_batch(batches)


SIZE_HINT = "or return a list (or a tf.data.Dataset of known cardinality), whose length meshrun takes"


def _require_sizes(splits: dict, factory: str) -> None:
    """One error naming every size key still needed (both at once, not one per run), and how to
    give them."""
    missing = {split: key for split, (key, count) in splits.items() if count is None}
    if len(missing) == 2:
        keys = list(missing.values())
        raise ConfigError(
            ", ".join(keys),
            f"are required: the train and eval datasets from {factory} do not know their size; "
            f"set both to the samples each yields ({keys[0]}=N {keys[1]}=M), {SIZE_HINT}",
        )
    for split, key in missing.items():
        raise ConfigError(
            key,
            f"is required: the {split} dataset from {factory} does not know its size; "
            f"set {key}=N, the samples it yields, {SIZE_HINT}",
        )


SPEC = register_source(SourceSpec("python", PythonOptions, load, "a dataset from the user's module:function"))
