"""What saving checkpoints asks of the OS: the bytes free under a dir, and the OS's error behind a
failed write."""

from __future__ import annotations

import os
from pathlib import Path

from meshrun.errors import chain_of


def free_bytes(root: Path) -> int | None:
    """The bytes free to this user on the file system of `root` (or of its nearest existing
    parent); None where the file system reports no size (some network and FUSE file systems)."""
    path = root
    while not path.exists() and path != path.parent:
        path = path.parent
    try:
        stats = os.statvfs(path)
    except OSError:
        return None
    return stats.f_bavail * stats.f_frsize if stats.f_blocks else None


def os_error_behind(err: BaseException) -> BaseException:
    """The first OSError among `err` and the exceptions it was raised from, else `err`."""
    return next((e for e in chain_of(err) if isinstance(e, OSError)), err)
