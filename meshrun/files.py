"""Files a reader never sees half-written: every JSON and summary file meshrun writes goes through
here (metrics.json, plan.json, summaries, the epochs' CSV)."""

from __future__ import annotations

import json
import os
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
