"""data=text's train/eval split: the held-out examples data.eval_fraction chooses before tokenizing
(a fixed seeded choice, the same whatever train.seed), and the train and eval parts of the token
cache's arrays a run reads (its training text twice, with a warning, when nothing is held out)."""

from __future__ import annotations

import logging

import numpy as np

log = logging.getLogger("meshrun")

EVAL_SPLIT_SEED = 0  # the held-out examples do not change with train.seed


def hold_out(items: list, fraction: float) -> tuple[list, list]:
    """`items` split into kept and held-out ones: a seeded choice of `fraction` of them (at least one), in
    file order."""
    count = max(1, int(round(len(items) * fraction)))
    chosen = set(
        np.random.default_rng(EVAL_SPLIT_SEED)
        .choice(len(items), size=min(count, len(items) - 1), replace=False)
        .tolist()
    )
    return [e for i, e in enumerate(items) if i not in chosen], [
        e for i, e in enumerate(items) if i in chosen
    ]


def train_and_eval(arrays: dict) -> tuple[tuple, tuple]:
    """The train and eval parts of the cached arrays; with no held-out part, the training part twice
    (and a warning that the perplexity is not held-out)."""
    train, evaluation = part_of(arrays, "train"), part_of(arrays, "eval")
    if evaluation is None:
        evaluation = train
        log.warning(
            "data=text without data.eval_files or data.eval_fraction: "
            "evaluating on the training text (the perplexity is not held-out)"
        )
    return train, evaluation


def part_of(arrays: dict, part: str) -> tuple | None:
    """({tokens, lengths}, weights) of part `part` of the cached arrays (None: the entry has none)."""
    if f"{part}_tokens" not in arrays:
        return None
    return {"tokens": arrays[f"{part}_tokens"], "lengths": arrays[f"{part}_lengths"]}, arrays[
        f"{part}_weights"
    ]
