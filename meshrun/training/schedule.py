"""Learning-rate schedules: the Keras schedule an optimizer trains with, and the same curve in plain
Python for the step log (reading the optimizer's own rate would wait on the devices every step).
A test holds the two to each other."""

from __future__ import annotations

import math

from meshrun.config.schema import TrainConfig


def learning_rate_at(train: TrainConfig, step: int, total_steps: int) -> float:
    """The learning rate of training step `step` (0-based) of `total_steps`."""
    rate, low = train.learning_rate, train.min_learning_rate
    if train.lr_schedule == "constant":
        return rate
    if train.lr_schedule == "linear":
        done = min(step, total_steps) / max(total_steps, 1)
        return rate + (low - rate) * done
    warmup = train.warmup_steps
    if step < warmup:
        return rate * step / warmup
    decay_steps = max(total_steps - warmup, 1)
    done = min(step - warmup, decay_steps) / decay_steps
    alpha = low / rate
    return rate * ((1 - alpha) * 0.5 * (1 + math.cos(math.pi * done)) + alpha)


def keras_schedule(train: TrainConfig, total_steps: int):
    """The learning rate to give a Keras optimizer: a number, or a Keras schedule object (built-in
    classes only, so an exported model loads without meshrun)."""
    import keras

    schedules = keras.optimizers.schedules
    rate, low = train.learning_rate, train.min_learning_rate
    if train.lr_schedule == "constant":
        return rate
    if train.lr_schedule == "linear":
        return schedules.PolynomialDecay(
            rate, decay_steps=max(total_steps, 1), end_learning_rate=low, power=1.0
        )
    warmup = train.warmup_steps
    return schedules.CosineDecay(
        initial_learning_rate=0.0 if warmup else rate,
        decay_steps=max(total_steps - warmup, 1),
        alpha=low / rate,
        warmup_target=rate if warmup else None,
        warmup_steps=warmup,
    )
