"""The batches data=text trains and evaluates on, read from the token cache's rows through the numpy
feed (no TensorFlow): their shapes, this process's share of them a batch at a time, the first one
the model is built with, and the check that each part makes at least a batch."""

from __future__ import annotations

import numpy as np

from meshrun.data import pipeline
from meshrun.data.batches import ArraySpec, indexed_batches
from meshrun.data.registry import DataContext
from meshrun.text import examples
from meshrun.wording import counted


def datasets(
    train: tuple, evaluation: tuple, context: DataContext, seq_len: int, shuffle: bool, info: dict
) -> pipeline.Datasets:
    """The run's Datasets of the train and eval parts' rows (({tokens, lengths}, weights) each):
    endless training batches, shuffled each epoch when `shuffle`, one pass of eval batches."""
    first, spec = _sample_batch(train, context), batch_spec(seq_len)
    return pipeline.Datasets(
        train=_batches(train, context, spec, shuffle, endless=True),
        eval=_batches(evaluation, context, spec, shuffle=False, endless=False),
        steps_per_epoch=len(train[1]) // context.batch_size,
        sample_batch=first,
        info=info,
    )


def check_enough_rows(
    options, context: DataContext, seq_len: int, train: tuple, evaluation: tuple, eval_source
) -> None:
    """A ConfigError when the training or the held-out text makes fewer rows than a batch.
    `options`: the run's TextOptions (meshrun.data.text)."""
    train_rows, eval_rows = len(train[1]), len(evaluation[1])
    pipeline.check_enough(
        train_rows,
        context.batch_size,
        "data.files",
        f"the training text ({counted(train_rows, 'row')} of {seq_len + 1} tokens)",
    )
    pipeline.check_enough(
        eval_rows,
        context.batch_size,
        "data.eval_files" if options.eval_files else "data.eval_fraction",
        f"the held-out text ({eval_source}: {counted(eval_rows, 'row')})",
    )


def batch_spec(seq_len: int) -> tuple:
    """The shapes and dtypes of a model batch: ({token_ids, padding_mask}, labels, weights)."""
    return (
        {
            "token_ids": ArraySpec((None, seq_len), np.dtype(np.int32)),
            "padding_mask": ArraySpec((None, seq_len), np.dtype(np.int32)),
        },
        ArraySpec((None, seq_len), np.dtype(np.int32)),
        ArraySpec((None, seq_len), np.dtype(np.float32)),
    )


def _sample_batch(train: tuple, context: DataContext):
    """The model batch of the first rows of the training part (a process's batch of them)."""
    return examples.model_batch(
        (
            {k: np.asarray(v[: context.process_batch_size]) for k, v in train[0].items()},
            np.asarray(train[1][: context.process_batch_size]),
        )
    )


def _batches(columns: tuple, context: DataContext, spec: tuple, shuffle: bool, endless: bool):
    """The model batches of a part's rows (({tokens, lengths}, weights)), this process's share."""
    features, weights = columns
    rows = np.arange(len(weights))
    made = indexed_batches(
        features, weights, rows, context.batch_size, shuffle, context.seed, context.share, endless=endless
    )
    return made.map(examples.model_batch, spec)
