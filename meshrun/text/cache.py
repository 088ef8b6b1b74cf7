"""The token cache: a corpus tokenized once, kept on disk as numpy files, read by rows.

An entry is a directory named by a key over everything its tokens depend on: every byte of every
file, the tokenizer's files, the templates, separator, field, packing, seq_len, the special
tokens and the evaluation split. A changed input is a new key, so an entry is never stale. An
entry is written into a temporary directory and renamed into place when complete: two runs
tokenizing the same corpus at once both finish (the second rename finds the first one's entry,
which holds the same tokens), and a run killed halfway leaves only a temporary directory, which
a later run removes once the process that made it is gone.

Beside the entries, in `tokenizer-probes/`, are the verdicts of the check meshrun.text.tokenizer_check makes
of a KerasHub preset's tokenizer (whether its library encoder encodes as KerasHub's TensorFlow graph
does): a small JSON file each, under a key over everything the verdict depends on, written under a
temporary name and renamed into place (ProbeVerdicts).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import socket
from pathlib import Path

import numpy as np

FORMAT = 1  # raise when what an entry holds changes
META = "meta.json"
TEMPORARY = ".tmp-"
PROBES = "tokenizer-probes"  # the folder of the tokenizer check's verdicts, in the root


def root(cache_dir: str | None) -> Path:
    """Where entries live: `cache_dir`, else $XDG_CACHE_HOME/meshrun/tokens (~/.cache without it)."""
    if cache_dir:
        return Path(cache_dir).expanduser()
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "meshrun" / "tokens"


def key(settings: dict, files: tuple[Path, ...]) -> str:
    """The key of the tokens of `files` made with `settings` (JSON-ready): sha256 over both,
    every byte of every file included."""
    digest = hashlib.sha256(json.dumps({"format": FORMAT, **settings}, sort_keys=True).encode())
    for path in files:
        digest.update(str(path.name).encode() + b"\0")
        with open(path, "rb") as stream:
            for block in iter(lambda: stream.read(1 << 20), b""):
                digest.update(block)
        digest.update(b"\0")
    return digest.hexdigest()


def find(directory: Path) -> dict | None:
    """The metadata of the complete entry at `directory`, or None (no entry, or one that cannot
    be read: it is rebuilt)."""
    try:
        meta = json.loads((directory / META).read_text())
    except (OSError, ValueError):
        return None
    if meta.get("format") != FORMAT or not all(
        (directory / name).is_file() for name in meta.get("arrays", [])
    ):
        return None
    return meta


def write(directory: Path, arrays: dict[str, np.ndarray], meta: dict) -> None:
    """Writes an entry (arrays as .npy files, then the metadata) into a temporary directory beside
    `directory` and renames it into place; an entry already there (another run's) is kept."""
    directory.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned(directory.parent)
    staging = directory.parent / _staging_name(directory.name)
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        for name, array in arrays.items():
            np.save(staging / name, array, allow_pickle=False)
        (staging / META).write_text(
            json.dumps({**meta, "format": FORMAT, "arrays": [f"{n}.npy" for n in arrays]}, indent=2)
        )
        try:
            os.rename(staging, directory)
        except OSError:
            if find(directory) is None:  # not another run's complete entry: replace it
                shutil.rmtree(directory, ignore_errors=True)
                os.rename(staging, directory)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def remove_abandoned(parent: Path) -> None:
    """Removes temporary directories and files of this host's processes that are gone (killed mid-write)."""
    host = socket.gethostname()
    for staging in parent.glob(f"{TEMPORARY}*"):
        name, _, pid = staging.name.rpartition("-")
        if name.endswith(f"-{host}") and pid.isdigit() and not _alive(int(pid)):
            if staging.is_dir():
                shutil.rmtree(staging, ignore_errors=True)
            else:
                staging.unlink(missing_ok=True)


def _staging_name(name: str) -> str:
    """The temporary name this process writes `name` under."""
    return f"{TEMPORARY}{name}-{socket.gethostname()}-{os.getpid()}"


class ProbeVerdicts:
    """The tokenizer check's verdicts in the token cache at `root`: `get(key)` is True or False as
    written by `put`, None when there is none (or it cannot be read: the check is made again)."""

    def __init__(self, root: Path):
        self.folder = Path(root) / PROBES

    def get(self, key: str) -> bool | None:
        try:
            stored = json.loads((self.folder / f"{key}.json").read_text())
        except (OSError, ValueError):
            return None
        agrees = stored.get("agrees") if isinstance(stored, dict) else None
        return agrees if isinstance(agrees, bool) else None

    def put(self, key: str, agrees: bool, about: dict) -> None:
        """Writes the verdict `agrees` under `key`, with `about` (JSON-ready) for whoever reads the
        file, into a temporary file renamed into place. Raises OSError where it cannot be written."""
        self.folder.mkdir(parents=True, exist_ok=True)
        remove_abandoned(self.folder)
        staging = self.folder / _staging_name(key)
        try:
            staging.write_text(json.dumps({"agrees": agrees, **about}, indent=2))
            os.replace(staging, self.folder / f"{key}.json")
        finally:
            staging.unlink(missing_ok=True)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
