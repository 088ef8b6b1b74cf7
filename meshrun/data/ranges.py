"""Values that must lie in the model's range, or the run trains on nonsense without a word: token
ids below a language model's vocabulary (else the embedding lookup clips or the loss turns NaN),
and class indices of a sparse cross-entropy below the model's output width (else accuracy stays at
chance). Checked on the first batch before training, and on every numpy batch as it passes (a
streamed source may hold a bad value anywhere): one line naming the largest value and the limit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from meshrun.data.batches import Batches
from meshrun.errors import ConfigError

TOKEN_INPUT_NAMES = ("token_ids", "tokens", None)  # where a language model's ids come in


@dataclass(frozen=True)
class Limits:
    """What a batch is checked against: the input holding token ids and the vocabulary size (None:
    no such input), the number of classes labels index (None: labels are not indices), and the
    data source named in errors."""

    token_input: str | None
    vocabulary: int | None
    classes: int | None
    source: str

    @property
    def checks(self) -> bool:
        return self.vocabulary is not None or self.classes is not None


def limits(signature, loss_function: str, language_model: bool, source: str) -> Limits:
    """The limits of a model with `signature` trained with `loss_function`: labels of a sparse
    cross-entropy index the output's last dimension; a language model's token ids index it too."""
    width = signature.outputs[0].shape[-1] if signature is not None and signature.outputs else None
    sparse = "sparse_categorical" in loss_function and isinstance(width, int) and width > 1
    names = [s.name for s in signature.inputs] if signature is not None else []
    token_input = (
        next((n for n in TOKEN_INPUT_NAMES if n in names), None) if language_model and sparse else None
    )
    found = language_model and sparse and (token_input is not None or names == [None])
    return Limits(
        token_input=token_input,
        vocabulary=width if found else None,
        classes=width if sparse else None,
        source=source,
    )


def check_batch(batch: tuple, limits: Limits) -> None:
    """ConfigError when a batch holds a token id or class index out of the model's range."""
    features, labels = batch[0], batch[1]
    if limits.vocabulary is not None:
        ids = features[limits.token_input] if isinstance(features, dict) else features
        _check(
            np.asarray(ids),
            limits.vocabulary,
            "token ids",
            "the model's vocabulary holds {} ids",
            limits.source,
            "tokenize with the model's own tokenizer, or give a model whose vocabulary covers them",
        )
    if limits.classes is not None:
        what = "label token ids" if limits.vocabulary is not None else "class labels"
        _check(
            np.asarray(labels),
            limits.classes,
            what,
            "the model's output has {} classes"
            if limits.vocabulary is None
            else "the model's vocabulary holds {} ids",
            limits.source,
            "give a model with as many outputs as there are "
            "classes (model.num_classes), or relabel them from 0"
            if limits.vocabulary is None
            else "tokenize with the model's own tokenizer",
        )


def _check(values: np.ndarray, limit: int, what: str, holds: str, source: str, fix: str) -> None:
    if not values.size or values.dtype.kind not in "iu":
        return
    largest, smallest = int(values.max()), int(values.min())
    if largest >= limit or smallest < 0:
        bad = f"reach {largest}" if largest >= limit else f"go down to {smallest}"
        raise ConfigError(
            "data", f"data={source}: {what} {bad}, but {holds.format(limit)} (valid: 0 to {limit - 1}); {fix}"
        )


def checked(data, limits: Limits):
    """`data` (numpy Batches; a tf.data pipeline is returned as it is) checking every batch as it passes."""
    if not limits.checks or not isinstance(data, Batches):
        return data

    def check(batch: tuple) -> tuple:
        check_batch(batch, limits)
        return batch

    return data.map(check, data.element_spec)
