"""Files a reader never sees half-written: every JSON and summary file meshrun writes goes through
here (metrics.json, plan.json, summaries, the epochs' CSV). An output path a user gives (`--out`,
`--save-layout`) is checked before any work (`unwritable`) and gets its missing parent dirs when
it is written (`write_output`), as `mkdir -p` would make them."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
from pathlib import Path


def write_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def write_json(data, directory: str | os.PathLike, name: str) -> Path:
    """Writes `data` (plain JSON data: meshrun.specs.jsondata.to_json makes it of a record) as JSON
    file `name` into `directory` (a run dir, a sweep dir) atomically; returns its path."""
    path = Path(directory) / name
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())
    return path


def unwritable(path: str | os.PathLike, directory: bool = False) -> str | None:
    """Why a file (with `directory`, a dir) could not be written at `path`, its missing parent dirs
    made first, in a few words; None when it can."""
    target = Path(path).expanduser().absolute()
    if target.is_dir() != directory and target.exists():
        return "it is a directory" if target.is_dir() else "it is a file"
    folder = target if directory else target.parent
    existing = next(p for p in (folder, *folder.parents) if p.exists())
    if not existing.is_dir():
        return f"{existing} is a file, not a directory"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing} is not writable"
    return None


def write_output(path: str | os.PathLike, data: bytes) -> None:
    """Writes an output file a user named, making its missing parent dirs first, atomically."""
    path = Path(path).expanduser()
    path.parent.mkdir(parents=True, exist_ok=True)
    write_atomic(path, data)


@contextlib.contextmanager
def dir_written_whole(directory: Path):
    """A new dir beside `directory` for the block to write into (the context's value), renamed to
    `directory` when the block ends without error, replacing whatever was there; removed when it
    raises. A reader sees the old dir or the complete new one, never a half-written one (a preset:
    the export's, meshrun preset's). The missing parent dirs of `directory` are made."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    partial = directory.with_name(f".partial-{directory.name}-{os.getpid()}")
    shutil.rmtree(partial, ignore_errors=True)  # left by a process killed while it wrote
    partial.mkdir()
    try:
        yield partial
        if directory.exists():
            shutil.rmtree(directory)
        os.replace(partial, directory)
    except BaseException:
        shutil.rmtree(partial, ignore_errors=True)
        raise
