"""data=synthetic: seeded data generated for the model, in memory, the same on every mesh.

Each registered model names its data family (ModelSpec.data):
- regression: random-normal inputs and targets (the seeds' MLP; nothing to learn),
- images: a fixed random pattern per class under random noise, labelled by class (learnable),
- tokens: arithmetic sequences modulo the vocabulary, input and next-token targets (learnable),
- id_pairs: ids of the 100 most active users and items, clicked when their ids share parity.
`data.task=classes` gives models with an input_shape and num_classes (dense_model, cnn) the images
task with one-hot labels instead: for dense_model, a task a short run learns to a clear accuracy
(train it with train.loss=categorical_crossentropy to have accuracy reported).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshrun.data import pipeline
from meshrun.data.registry import DataContext, SourceSpec, register_source
from meshrun.errors import ConfigError, one_of

TASKS = ("default", "classes")
ACTIVE_IDS = 100


@dataclass(frozen=True)
class SyntheticOptions:
    """How much synthetic data, whether to shuffle it, and which task (default: the model's own
    family; classes: a pattern per class under noise, one-hot labels)."""

    num_samples: int = 1024
    eval_samples: int = 256
    shuffle: bool = True
    task: str = "default"

    def __post_init__(self):
        for key in ("num_samples", "eval_samples"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}", f"got {getattr(self, key)}; expected a positive integer")
        if self.task not in TASKS:
            raise ConfigError("data.task", f"got {self.task!r}; valid: {one_of(TASKS)}")


def regression(options, count: int, seed: int):
    """Random-normal float32 inputs and targets, the same for a given seed on every mesh."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, *options.input_shape), dtype=np.float32)
    y = rng.standard_normal((count, *options.label_shape), dtype=np.float32)
    return x, y


def images(options, count: int, seed: int):
    """Images of a random class's fixed pattern (one random-normal image per class, the same for
    train and eval) under as much random-normal noise; integer class labels."""
    rng = np.random.default_rng(seed)
    patterns = np.random.default_rng(0).standard_normal((options.num_classes, *options.input_shape), dtype=np.float32)
    y = rng.integers(0, options.num_classes, size=count).astype(np.int32)
    x = patterns[y] + rng.standard_normal((count, *options.input_shape), dtype=np.float32)
    return x, y


def tokens(options, count: int, seed: int):
    """Token sequences t_i = (start + i * stride) mod vocab; inputs are the first seq_len tokens,
    targets the next token at each position."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, options.vocab, size=(count, 1))
    stride = rng.integers(1, 8, size=(count, 1))
    sequences = (start + stride * np.arange(options.seq_len + 1)) % options.vocab
    sequences = sequences.astype(np.int32)
    return sequences[:, :-1], sequences[:, 1:]


def id_pairs(options, count: int, seed: int):
    """User and item ids from the 100 most active of each (so every id recurs, and evaluation
    meets ids that training saw); the label (1.0 or 0.0) says whether the two ids share parity."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, min(options.num_users, ACTIVE_IDS), size=count).astype(np.int32)
    items = rng.integers(0, min(options.num_items, ACTIVE_IDS), size=count).astype(np.int32)
    labels = ((users % 2) == (items % 2)).astype(np.float32)[:, None]
    return {"user_id": users, "item_id": items}, labels


def classes(options, count: int, seed: int):
    """The images task (a fixed random pattern per class under noise) with one-hot labels, for
    models whose output is a distribution over classes (dense_model)."""
    x, y = images(options, count, seed)
    return x, np.eye(options.num_classes, dtype=np.float32)[y]


FAMILIES = {"regression": regression, "images": images, "tokens": tokens, "id_pairs": id_pairs, "classes": classes}


def batched(x, y, batch_size: int, shuffle: bool, seed: int, share: tuple[int, int] = (0, 1), endless: bool = False):
    """A tf.data pipeline of this process's share of full global batches of in-memory arrays
    (remainder dropped), one pass or endless, optionally shuffled each pass in a seeded order."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    return pipeline.element_batches(dataset, batch_size, shuffle, seed, buffer=len(y), share=share, endless=endless)


def load(options: SyntheticOptions, context: DataContext) -> pipeline.Datasets:
    """Generates the model's data family (or the classes task) and batches it."""
    family = context.model.data
    if options.task == "classes":
        if not all(hasattr(context.model_options, a) for a in ("input_shape", "num_classes")):
            raise ConfigError("data.task", f"got 'classes', which needs a model with input_shape and num_classes, not {context.model.name}")
        family = "classes"
    generate = FAMILIES[family]  # sizes against the batch are checked with the config (meshrun.schema)
    train_x, train_y = generate(context.model_options, options.num_samples, seed=context.seed)
    eval_x, eval_y = generate(context.model_options, options.eval_samples, seed=context.seed + 1)
    batch = context.batch_size
    return pipeline.Datasets(
        train=batched(train_x, train_y, batch, options.shuffle, context.seed, context.share, endless=True),
        eval=batched(eval_x, eval_y, batch, shuffle=False, seed=context.seed, share=context.share),
        steps_per_epoch=options.num_samples // batch,
        sample_batch=(_rows(train_x, slice(0, context.process_batch_size)), train_y[: context.process_batch_size]),
        info={"family": family, "train_samples": options.num_samples, "eval_samples": options.eval_samples},
    )


def _rows(x, rows):
    return {k: v[rows] for k, v in x.items()} if isinstance(x, dict) else x[rows]


SPEC = register_source(SourceSpec("synthetic", SyntheticOptions, load, "seeded data generated for the model"))
