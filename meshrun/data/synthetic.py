"""data=synthetic: seeded data generated for the model, in memory, the same on every mesh.

Each registered model names its data family (ModelSpec.data):
- regression: random-normal inputs and targets (the seeds' MLP; nothing to learn),
- images: a fixed random pattern per class under random noise, labelled by class (learnable),
- tokens: arithmetic sequences modulo the vocabulary, input and next-token targets (learnable),
- id_pairs: ids of the 100 most active users and items, clicked when their ids share parity,
- padded_tokens: the tokens task right-padded to the model's sequence length, as a dict of
  token_ids and padding_mask, with sample weights that leave padding out of the loss (KerasHub),
- shaped: random data shaped like the built model's inputs and outputs, labels as the loss
  expects them (the user's own models; a smoke run and a plan before real data exists).
`data.task=classes` gives models with an input_shape and num_classes (dense_model, cnn) the images
task with one-hot labels instead: for dense_model, a task a short run learns to a clear accuracy
(train it with train.loss=categorical_crossentropy to have accuracy reported).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshrun.config.fields import setting
from meshrun.data import pipeline
from meshrun.data.batches import indexed_batches
from meshrun.data.registry import DataContext, SourceSpec, register_source
from meshrun.errors import ConfigError
from meshrun.wording import one_of, shape_text

TASKS = ("default", "classes")
ACTIVE_IDS = 100


@dataclass(frozen=True)
class SyntheticOptions:
    """How much synthetic data, whether to shuffle it, and which task (default: the model's own
    family; classes: a pattern per class under noise, one-hot labels)."""

    num_samples: int = setting(1024, "Training samples (at least one global batch).")
    eval_samples: int = setting(256, "Eval samples (at least one global batch).")
    shuffle: bool = setting(True, "Shuffle the training samples each epoch.")
    task: str = setting(
        "default",
        "default: the model's own family; classes: a pattern per class under noise, one-hot labels "
        "(dense_model and cnn; train with a cross-entropy loss).",
    )

    def __post_init__(self):
        for key in ("num_samples", "eval_samples"):
            if getattr(self, key) <= 0:
                raise ConfigError(f"data.{key}", f"got {getattr(self, key)}; expected a positive integer")
        if self.task not in TASKS:
            raise ConfigError("data.task", f"got {self.task!r}; valid: {one_of(TASKS)}")


def regression(context: DataContext, count: int, seed: int):
    """Random-normal float32 inputs and targets, the same for a given seed on every mesh."""
    options = context.model_options
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, *options.input_shape), dtype=np.float32)
    y = rng.standard_normal((count, *options.label_shape), dtype=np.float32)
    return x, y


def images(context: DataContext, count: int, seed: int):
    """Images of a random class's fixed pattern (one random-normal image per class, the same for
    train and eval) under as much random-normal noise; integer class labels."""
    options = context.model_options
    rng = np.random.default_rng(seed)
    patterns = np.random.default_rng(0).standard_normal(
        (options.num_classes, *options.input_shape), dtype=np.float32
    )
    y = rng.integers(0, options.num_classes, size=count).astype(np.int32)
    x = patterns[y] + rng.standard_normal((count, *options.input_shape), dtype=np.float32)
    return x, y


def _sequences(count: int, length: int, vocab: int, seed: int) -> np.ndarray:
    """Sequences t_i = (start + i * stride) mod vocab of `length` tokens, int32."""
    rng = np.random.default_rng(seed)
    start = rng.integers(0, vocab, size=(count, 1))
    stride = rng.integers(1, 8, size=(count, 1))
    return ((start + stride * np.arange(length)) % vocab).astype(np.int32)


def tokens(context: DataContext, count: int, seed: int):
    """Token sequences t_i = (start + i * stride) mod vocab; inputs are the first seq_len tokens,
    targets the next token at each position."""
    options = context.model_options
    sequences = _sequences(count, options.seq_len + 1, options.vocab, seed)
    return sequences[:, :-1], sequences[:, 1:]


def padded_tokens(context: DataContext, count: int, seed: int):
    """The tokens task for a language model taking {token_ids, padding_mask} (KerasHub): each
    sequence holds from half the model's sequence length to all of it in real tokens (of seq_len + 1,
    counting the last target), right-padded with token 0. A label's sample weight is 1 where the
    token it predicts is real, so padding counts neither in the loss nor in accuracy."""
    length = context.signature.inputs[0].shape[0]
    vocab = context.signature.outputs[0].shape[-1]
    sequences = _sequences(count, length + 1, vocab, seed)
    real = np.random.default_rng(seed + 7).integers(length // 2 + 1, length + 2, size=(count, 1))
    mask = (np.arange(length + 1) < real).astype(np.int32)
    sequences = sequences * mask
    features = {"token_ids": sequences[:, :-1], "padding_mask": mask[:, :-1]}
    return features, sequences[:, 1:], mask[:, 1:].astype(np.float32)


def id_pairs(context: DataContext, count: int, seed: int):
    """User and item ids from the 100 most active of each (so every id recurs, and evaluation
    meets ids that training saw); the label (1.0 or 0.0) says whether the two ids share parity."""
    options = context.model_options
    rng = np.random.default_rng(seed)
    users = rng.integers(0, min(options.num_users, ACTIVE_IDS), size=count).astype(np.int32)
    items = rng.integers(0, min(options.num_items, ACTIVE_IDS), size=count).astype(np.int32)
    labels = ((users % 2) == (items % 2)).astype(np.float32)[:, None]
    return {"user_id": users, "item_id": items}, labels


def classes(context: DataContext, count: int, seed: int):
    """The images task (a fixed random pattern per class under noise) with one-hot labels, for
    models whose output is a distribution over classes (dense_model)."""
    x, y = images(context, count, seed)
    return x, np.eye(context.model_options.num_classes, dtype=np.float32)[y]


def shaped(context: DataContext, count: int, seed: int):
    """Random data shaped like the built model's inputs and output (its signature): float inputs
    random normal, integer inputs 0 or 1 (valid ids for any embedding); labels as the loss expects
    them: class indices for a sparse cross-entropy, one-hot rows for a categorical one, 0 or 1 for
    a binary one, random normal otherwise. Nothing to learn: a smoke run, before real data."""
    signature = context.signature
    if len(signature.outputs) != 1:
        raise ConfigError(
            "data",
            "data=synthetic makes labels for a model with one output; this one "
            f"has {len(signature.outputs)}: use data=arrays, tfrecord or python",
        )
    rng = np.random.default_rng(seed)
    features = {spec.name: _random(rng, spec, count) for spec in signature.inputs}
    output = signature.outputs[0]
    _check_sized(output, "output")
    if "sparse" in context.loss:
        labels = rng.integers(0, output.shape[-1], size=(count, *output.shape[:-1])).astype(np.int32)
    elif "categorical" in context.loss:
        labels = np.eye(output.shape[-1], dtype=np.float32)[
            rng.integers(0, output.shape[-1], size=(count, *output.shape[:-1]))
        ]
    elif "binary" in context.loss or "hinge" in context.loss:
        labels = rng.integers(0, 2, size=(count, *output.shape)).astype(np.float32)
    else:
        labels = rng.standard_normal((count, *output.shape), dtype=np.float32)
    return (features[None] if None in features else features), labels


def _random(rng, spec, count: int) -> np.ndarray:
    _check_sized(spec, f"input {spec.name!r}" if spec.name else "input")
    shape = (count, *spec.shape)
    if spec.dtype.startswith(("int", "uint")) or spec.dtype == "bool":
        return rng.integers(0, 2, size=shape).astype(spec.dtype)
    return rng.standard_normal(shape).astype(
        np.float32 if spec.dtype in ("bfloat16", "float16") else spec.dtype
    )


def _check_sized(spec, what: str) -> None:
    if None in spec.shape:
        raise ConfigError(
            "data",
            f"data=synthetic cannot size the model's {what} of shape {shape_text(spec.shape)}: "
            "give model.input_shape with every size, or use real data",
        )


FAMILIES = {
    "regression": regression,
    "images": images,
    "tokens": tokens,
    "id_pairs": id_pairs,
    "classes": classes,
    "padded_tokens": padded_tokens,
    "shaped": shaped,
}


def batched(
    columns: tuple,
    batch_size: int,
    shuffle: bool,
    seed: int,
    share: tuple[int, int] = (0, 1),
    endless: bool = False,
):
    """This process's share of full global batches of in-memory arrays (features, labels[, sample
    weights]), remainder dropped, one pass or endless, optionally shuffled each pass in a seeded
    order."""
    x, y, *weights = columns
    rows = np.arange(len(y))
    return indexed_batches(
        x, y, rows, batch_size, shuffle, seed, share, endless=endless, weights=weights[0] if weights else None
    )


def load(options: SyntheticOptions, context: DataContext) -> pipeline.Datasets:
    """Generates the model's data family (or the classes task) and batches it."""
    family = context.model.data
    if options.task == "classes":
        if not all(hasattr(context.model_options, a) for a in ("input_shape", "num_classes")):
            raise ConfigError(
                "data.task",
                "got 'classes', which needs a model with input_shape "
                f"and num_classes, not {context.model.name}",
            )
        family = "classes"
    generate = FAMILIES[family]  # sizes against the batch are checked with the config (meshrun.config.checks)
    train = generate(context, options.num_samples, seed=context.seed)
    evaluation = generate(context, options.eval_samples, seed=context.seed + 1)
    batch, rows = context.batch_size, slice(0, context.process_batch_size)
    return pipeline.Datasets(
        train=batched(train, batch, options.shuffle, context.seed, context.share, endless=True),
        eval=batched(evaluation, batch, shuffle=False, seed=context.seed, share=context.share),
        steps_per_epoch=options.num_samples // batch,
        sample_batch=tuple(_rows(column, rows) for column in train),
        info={"family": family, "train_samples": options.num_samples, "eval_samples": options.eval_samples},
    )


def _rows(x, rows):
    return {k: v[rows] for k, v in x.items()} if isinstance(x, dict) else x[rows]


SPEC = register_source(SourceSpec("synthetic", SyntheticOptions, load, "seeded data generated for the model"))
