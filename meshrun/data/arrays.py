"""data=arrays: features and labels from .npy or .npz files, read a batch of rows at a time, never
whole into memory.

Rows are read on demand with os.pread from where the array's bytes lie in the file (a .npy's body,
or an uncompressed .npz member), not through a memory map: mapped pages a pass over the file touches
would count in the process's resident memory until the kernel reclaims them, so a pass over a file
larger than half the RAM would look like (and compete as) a process that large. Read through
pread, the file's pages stay in the kernel's page cache and the process holds one batch.

- `data.path`: a .npz holding `data.features_key` and `data.labels_key` (compressed members, and
  Fortran-ordered arrays, have to be read into memory; meshrun warns), or a .npy of features with
  the labels in `data.labels_path`. A list of features keys feeds a model that takes a dict of
  inputs by those names (a KerasHub model: [token_ids, padding_mask]); `data.sample_weight_key`
  names a member of per-sample (or per-label) weights. Files are told apart by their suffix
  (any case); a path with another suffix is a ConfigError, not read as a .npy.
- Evaluation data: `data.eval_path` (and `data.eval_labels_path`) laid out the same way, or else
  the last `data.validation_split` of the samples, or else none (the run evaluates on training data
  and says so).
"""

from __future__ import annotations

import logging
import os
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from meshrun.config.fields import setting
from meshrun.data import pipeline
from meshrun.data.batches import indexed_batches
from meshrun.data.registry import DataContext, SourceSpec, register_source
from meshrun.errors import ConfigError
from meshrun.wording import one_of

log = logging.getLogger("meshrun")


@dataclass(frozen=True)
class ArraysOptions:
    """Where the arrays are and how to read them."""

    path: str | None = setting(
        None, "A .npz with members features_key and labels_key, or a .npy of features plus labels_path."
    )
    features_key: Any = setting(
        "x",
        "The .npz member of the features, or a list of members: the model gets a dict of inputs by "
        "those names (KerasHub: [token_ids, padding_mask]).",
    )
    labels_key: str = setting("y", "The .npz member of the labels.")
    sample_weight_key: str | None = setting(
        None, "A .npz member of per-sample or per-label weights; null: none."
    )
    labels_path: str | None = setting(None, "The labels' .npy, with a .npy path.")
    eval_path: str | None = setting(
        None, "The eval data, like path; null: the last validation_split of path."
    )
    eval_labels_path: str | None = setting(None, "The eval labels' .npy, with a .npy eval_path.")
    validation_split: float = setting(0.0, "The share of path held out for evaluation when no eval_path.")
    shuffle: bool = setting(True, "Shuffle the training rows each epoch.")

    def __post_init__(self):
        if not self.path:
            raise ConfigError(
                "data.path",
                "is required for data=arrays: a .npz file, or a .npy of features with data.labels_path",
            )
        if not 0.0 <= self.validation_split < 1.0:
            raise ConfigError(
                "data.validation_split", f"got {self.validation_split}; expected 0 <= validation_split < 1"
            )
        keys = [self.features_key] if isinstance(self.features_key, str) else self.features_key
        if not isinstance(keys, (list, tuple)) or not keys or not all(isinstance(k, str) and k for k in keys):
            raise ConfigError(
                "data.features_key", f"got {self.features_key!r}; expected a member name, or a list of them"
            )
        for key in ("path", "eval_path", "labels_path", "eval_labels_path"):
            _check_suffix(f"data.{key}", getattr(self, key))
        if not is_npz(self.path) and (not isinstance(self.features_key, str) or self.sample_weight_key):
            key = "data.sample_weight_key" if self.sample_weight_key else "data.features_key"
            raise ConfigError(key, f"needs a .npz file (several members), not {self.path!r}")

    @property
    def input_names(self) -> list[str] | None:
        """The input names of a model taking a dict of inputs (None: one tensor)."""
        return None if isinstance(self.features_key, str) else list(self.features_key)


def is_npz(path: str) -> bool:
    """Whether `path` names a .npz file (by its suffix, in any case); else it is read as a .npy."""
    return Path(path).suffix.lower() == ".npz"


def _check_suffix(key: str, path: str | None) -> None:
    """ConfigError unless `path` (config key `key`) is None or ends in a suffix that data=arrays
    reads: .npz or .npy for data.path and data.eval_path, .npy for the labels' paths. Any other
    file would be read as a .npy and fail on its bytes, or worse, pass as one."""
    if path is None:
        return
    suffix = Path(path).suffix.lower()
    if "labels" in key:
        if suffix != ".npy":
            raise ConfigError(key, f"got {path!r}; expected a .npy file of labels (as np.save writes)")
    elif suffix not in (".npz", ".npy"):
        raise ConfigError(
            key,
            f"got {path!r}; data=arrays reads .npz files (np.savez) or a .npy of features "
            "(np.save) with its labels in data.labels_path",
        )


class FileRows:
    """The rows of an array whose C-ordered bytes lie in a file at `offset`, read when indexed:
    `rows[indices]` reads just those rows (runs of consecutive rows in one read)."""

    def __init__(self, path: Path, offset: int, dtype, shape: tuple):
        self.path, self.offset, self.dtype, self.shape = path, offset, np.dtype(dtype), tuple(shape)
        self.row_bytes = int(np.prod(self.shape[1:], dtype=np.int64)) * self.dtype.itemsize
        self._fd = os.open(path, os.O_RDONLY)

    def __len__(self) -> int:
        return self.shape[0]

    def __getitem__(self, index) -> np.ndarray:
        rows = np.arange(len(self))[index] if isinstance(index, slice) else np.asarray(index, dtype=np.int64)
        out = np.empty((len(rows), *self.shape[1:]), dtype=self.dtype)
        flat = (
            out.reshape(len(rows), -1).view(np.uint8).reshape(len(rows), self.row_bytes)
            if self.row_bytes
            else None
        )
        start = 0
        while start < len(rows):
            stop = start + 1
            while stop < len(rows) and rows[stop] == rows[stop - 1] + 1:
                stop += 1
            data = os.pread(
                self._fd, self.row_bytes * (stop - start), self.offset + int(rows[start]) * self.row_bytes
            )
            flat[start:stop] = np.frombuffer(data, dtype=np.uint8).reshape(stop - start, self.row_bytes)
            start = stop
        return out

    def __del__(self):
        if getattr(self, "_fd", None) is not None:
            os.close(self._fd)


def open_array(path: str, path_key: str, member: str | None = None, member_key: str = ""):
    """The array in a .npy file, or `member` of a .npz file, as FileRows where its bytes can be
    read in place. `path_key` and `member_key` name the config keys a ConfigError blames."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise ConfigError(path_key, f"got {path!r}, which is not a file")
    try:
        if is_npz(path):
            return _npz_member(file, member, member_key)
        with open(file, "rb") as raw:
            shape, fortran, dtype = _read_header(raw)
            offset = raw.tell()
        return _rows_or_whole(
            file, offset, dtype, shape, fortran, lambda: np.load(file, allow_pickle=False)
        )  # a pickle would run code
    except (ValueError, OSError, EOFError, zipfile.BadZipFile) as err:
        raise ConfigError(path_key, f"cannot read {path!r} as a numpy file ({err})") from None


def _read_header(stream):
    major, _ = np.lib.format.read_magic(stream)
    read = np.lib.format.read_array_header_1_0 if major == 1 else np.lib.format.read_array_header_2_0
    return read(stream)


def _rows_or_whole(file: Path, offset: int, dtype, shape, fortran: bool, read_whole):
    if fortran or np.dtype(dtype).hasobject or not shape:
        log.warning(
            f"{file}: this array cannot be read row by row (Fortran "
            "order, objects or a scalar); reading it into memory"
        )
        return read_whole()
    return FileRows(file, offset, dtype, shape)


def _npz_member(file: Path, key: str, member_key: str):
    with zipfile.ZipFile(file) as archive:
        names = [n.removesuffix(".npy") for n in archive.namelist()]
        if key not in names:
            raise ConfigError(
                member_key, f"got {key!r}, which is not in {str(file)!r}; keys present: {one_of(names)}"
            )
        info = archive.getinfo(f"{key}.npy")
        if info.compress_type != zipfile.ZIP_STORED:
            log.warning(
                f"{file}: member {key!r} is compressed, so it is read "
                "into memory; save with np.savez to read it row by row"
            )
            with archive.open(info) as member:
                return np.lib.format.read_array(member, allow_pickle=False)
        with archive.open(info) as member:
            shape, fortran, dtype = _read_header(member)
            header = member.tell()
    # A stored member's bytes lie in the file right after its local header.
    with open(file, "rb") as raw:
        raw.seek(info.header_offset + 26)
        name_length, extra_length = np.frombuffer(raw.read(4), dtype="<u2")
    offset = info.header_offset + 30 + int(name_length) + int(extra_length) + header

    def read_whole():
        with zipfile.ZipFile(file) as archive, archive.open(info) as member:
            return np.lib.format.read_array(member, allow_pickle=False)

    return _rows_or_whole(file, offset, dtype, shape, fortran, read_whole)


def _features_and_labels(path, labels_path, options: ArraysOptions, key: str):
    """Features (one array, or a dict of them by input name), labels and sample weights (or None)
    from `path` (config key data.<key>) and, for .npy, `labels_path`."""
    labels_key = f"data.{key.replace('path', 'labels_path')}"
    weights = None
    if is_npz(path):
        names = options.input_names
        if names:
            x = {name: open_array(path, f"data.{key}", name, "data.features_key") for name in names}
        else:
            x = open_array(path, f"data.{key}", options.features_key, "data.features_key")
        y = open_array(path, f"data.{key}", options.labels_key, "data.labels_key")
        if options.sample_weight_key:
            weights = open_array(path, f"data.{key}", options.sample_weight_key, "data.sample_weight_key")
    else:
        if not labels_path:
            raise ConfigError(labels_key, f"is required with a .npy file ({path!r} holds the features only)")
        x = open_array(path, f"data.{key}")
        y = open_array(labels_path, labels_key)
    for name, column in _columns(x).items():
        if len(column) != len(y):
            raise ConfigError(
                f"data.{key}", f"{path!r} has {len(column)} rows of {name or 'features'} but {len(y)} labels"
            )
    if weights is not None and len(weights) != len(y):
        raise ConfigError(
            "data.sample_weight_key", f"{path!r} has {len(weights)} sample weights but {len(y)} labels"
        )
    return x, y, weights


def declared_inputs(options: ArraysOptions) -> dict:
    """The model inputs the features make, read from the file's headers alone."""
    from meshrun.specs.model import InputSpec

    x = _features_and_labels(options.path, options.labels_path, options, "path")[0]
    return {
        name: InputSpec(name, tuple(column.shape[1:]), np.dtype(column.dtype).name)
        for name, column in _columns(x).items()
    }


def _columns(x) -> dict:
    """The feature arrays by input name (None for the one unnamed input)."""
    return x if isinstance(x, dict) else {None: x}


@dataclass(frozen=True)
class _Part:
    """The training or the evaluation data: the columns it reads from and the rows of them it holds."""

    x: Any
    y: Any
    weights: Any
    rows: np.ndarray


def load(options: ArraysOptions, context: DataContext) -> pipeline.Datasets:
    """Opens the files, checks sizes, and batches them by index (a batch read at a time)."""
    train, evaluation, eval_source = _train_and_eval(options)
    pipeline.check_enough(
        len(train.rows), context.batch_size, "data.path", f"{options.path!r} (training part)"
    )
    pipeline.check_enough(
        len(evaluation.rows),
        context.batch_size,
        "data.eval_path" if options.eval_path else "data.validation_split",
        f"the evaluation data ({eval_source})",
    )
    batch, share = context.batch_size, context.share
    return pipeline.Datasets(
        train=indexed_batches(
            train.x,
            train.y,
            train.rows,
            batch,
            options.shuffle,
            context.seed,
            share,
            endless=True,
            weights=train.weights,
        ),
        eval=indexed_batches(
            evaluation.x,
            evaluation.y,
            evaluation.rows,
            batch,
            shuffle=False,
            seed=context.seed,
            share=share,
            weights=evaluation.weights,
        ),
        steps_per_epoch=len(train.rows) // batch,
        sample_batch=_first_batch(train, context.process_batch_size),
        info={
            "train_samples": len(train.rows),
            "eval_samples": len(evaluation.rows),
            "eval_source": eval_source,
            "read_by_rows": all(isinstance(column, FileRows) for column in _columns(train.x).values()),
        },
    )


def _train_and_eval(options: ArraysOptions) -> tuple[_Part, _Part, str]:
    """The training and evaluation data, and where the latter comes from: data.eval_path, else the last
    data.validation_split of the samples, else the training data itself (with a warning)."""
    x, y, weights = _features_and_labels(options.path, options.labels_path, options, "path")
    rows = np.arange(len(y))
    if options.eval_path:
        eval_x, eval_y, eval_weights = _features_and_labels(
            options.eval_path, options.eval_labels_path, options, "eval_path"
        )
        evaluation = _Part(eval_x, eval_y, eval_weights, np.arange(len(eval_y)))
        return _Part(x, y, weights, rows), evaluation, options.eval_path
    if options.validation_split:
        cut = int(round(len(y) * (1 - options.validation_split)))
        return (
            _Part(x, y, weights, rows[:cut]),
            _Part(x, y, weights, rows[cut:]),
            f"last {options.validation_split:.0%} of {options.path}",
        )
    log.warning(
        "data=arrays without data.eval_path or data.validation_split: evaluating on the training data"
    )
    train = _Part(x, y, weights, rows)
    return train, train, "training data"


def _first_batch(train: _Part, size: int) -> tuple:
    """The first `size` training samples as a batch: (features, labels[, weights])."""
    rows = slice(0, size)
    x = train.x
    first = [
        {k: np.asarray(v[rows]) for k, v in x.items()} if isinstance(x, dict) else np.asarray(x[rows]),
        np.asarray(train.y[rows]),
    ]
    return tuple(first + ([np.asarray(train.weights[rows])] if train.weights is not None else []))


SPEC = register_source(
    SourceSpec(
        "arrays",
        ArraysOptions,
        load,
        ".npy/.npz files, read a batch of rows at a time",
        declared_inputs=declared_inputs,
    )
)
