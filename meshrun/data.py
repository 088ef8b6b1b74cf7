"""Input pipelines: seeded synthetic data matching each model family, batched with tf.data at the
global batch size.

Each registered model names its data family (ModelSpec.data); `data=synthetic` generates that
family from the model's options:
- regression: random-normal inputs and targets (the seeds' MLP),
- images: random-normal images labelled by a fixed random linear map (learnable classes),
- tokens: arithmetic sequences modulo the vocabulary, input and next-token targets (learnable),
- id_pairs: user and item ids, clicked when their ids share parity (learnable by the embeddings).

Keras splits each global batch over the mesh's batch axis (jax.make_array_from_process_local_data),
so batches are always full: remainders are dropped. The training pipeline repeats forever and fit
runs `steps_per_epoch` steps an epoch: one tf.data iterator lives across epochs, where a new one each
epoch sometimes stalled the first step of an epoch by 0.5-1.7 s on 2-core CPU machines.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshrun.schema import DataConfig


@dataclass(frozen=True)
class Datasets:
    """Training (endless, reshuffled each pass) and evaluation tf.data pipelines, how many
    training batches make one epoch, and one global batch as numpy arrays (for cost analysis)."""

    train: object
    eval: object
    steps_per_epoch: int
    sample_batch: tuple


def regression(options, count: int, seed: int):
    """Random-normal float32 inputs and targets, the same for a given seed on every mesh."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, *options.input_shape), dtype=np.float32)
    y = rng.standard_normal((count, *options.label_shape), dtype=np.float32)
    return x, y


def images(options, count: int, seed: int):
    """Random-normal images with integer class labels from a fixed random linear map of the pixels
    (the map depends on the image shape only, so train and eval share it)."""
    rng = np.random.default_rng(seed)
    x = rng.standard_normal((count, *options.input_shape), dtype=np.float32)
    projection = np.random.default_rng(0).standard_normal((int(np.prod(options.input_shape)), options.num_classes))
    y = np.argmax(x.reshape(count, -1) @ projection, axis=1).astype(np.int32)
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
    """Uniform user and item ids; the label (1.0 or 0.0) says whether the two ids share parity."""
    rng = np.random.default_rng(seed)
    users = rng.integers(0, options.num_users, size=count).astype(np.int32)
    items = rng.integers(0, options.num_items, size=count).astype(np.int32)
    labels = ((users % 2) == (items % 2)).astype(np.float32)[:, None]
    return {"user_id": users, "item_id": items}, labels


FAMILIES = {"regression": regression, "images": images, "tokens": tokens, "id_pairs": id_pairs}


def batched(x, y, batch_size: int, shuffle: bool, seed: int):
    """A tf.data pipeline of full global batches (remainder dropped), optionally reshuffled each
    epoch in a seeded order."""
    import tensorflow as tf

    dataset = tf.data.Dataset.from_tensor_slices((x, y))
    if shuffle:
        dataset = dataset.shuffle(len(y), seed=seed, reshuffle_each_iteration=True)
    return dataset.batch(batch_size, drop_remainder=True).prefetch(tf.data.AUTOTUNE)


def make_datasets(config: DataConfig, family: str, model_options, batch_size: int, seed: int) -> Datasets:
    """Builds the train and eval pipelines of synthetic data family `family` for the model."""
    generate = FAMILIES[family]
    train_x, train_y = generate(model_options, config.num_samples, seed=seed)
    eval_x, eval_y = generate(model_options, config.eval_samples, seed=seed + 1)
    return Datasets(
        train=batched(train_x, train_y, batch_size, config.shuffle, seed).repeat(),
        eval=batched(eval_x, eval_y, batch_size, shuffle=False, seed=seed),
        steps_per_epoch=config.num_samples // batch_size,
        sample_batch=(_first(train_x, batch_size), train_y[:batch_size]),
    )


def _first(x, count: int):
    if isinstance(x, dict):
        return {key: value[:count] for key, value in x.items()}
    return x[:count]
