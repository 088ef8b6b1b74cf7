"""Caches are code: meshrun uses XLA's compilation cache and the token cache only in a directory
no one but its owner can write to (its group too with cache.shared=true, with a warning); anything
wider is one line naming the directory and the chmod that fixes it, exit 2."""

from __future__ import annotations

import logging
import os

import pytest

from conftest import FAST, error_line_here, run_meshrun
from meshrun.errors import ConfigError
from meshrun.system.trust import private_dir

XLA = "XLA's compiled code"


def made(tmp_path, mode: int):
    path = tmp_path / f"cache-{mode:o}"
    path.mkdir()
    os.chmod(path, mode)
    return path


def test_a_missing_cache_dir_passes_and_is_left_for_the_cache_to_make(tmp_path):
    assert (
        private_dir(tmp_path / "new" / "xla", "cache.dir", shared=False, what=XLA) == tmp_path / "new" / "xla"
    )
    assert list(tmp_path.iterdir()) == []


def test_a_dir_only_its_owner_can_write_is_used(tmp_path):
    assert private_dir(made(tmp_path, 0o755), "cache.dir", shared=False, what=XLA) == tmp_path / "cache-755"


def test_a_dir_its_group_can_write_is_refused_unless_shared_then_a_warning(tmp_path, caplog):
    group = made(tmp_path, 0o770)
    with pytest.raises(ConfigError) as caught:
        private_dir(group, "cache.dir", shared=False, what=XLA)
    assert str(caught.value) == (
        f"cache.dir: got {group}, which its group can write to (mode 0770); meshrun loads XLA's compiled "
        "code from it only when no one but its owner can write to it: "
        f"chmod g-w {group}, or cache.shared=true if you trust that group"
    )
    with caplog.at_level(logging.WARNING, logger="meshrun"):
        assert private_dir(group, "cache.dir", shared=True, what=XLA) == group
    assert [r.getMessage() for r in caplog.records] == [
        f"cache.dir: {group} is writable by its group (mode "
        "0770); using it since cache.shared=true trusts that group"
    ]


@pytest.mark.parametrize("shared", [False, True])
def test_a_dir_everyone_can_write_is_always_refused(tmp_path, shared):
    everyone = made(tmp_path, 0o777)
    with pytest.raises(ConfigError) as caught:
        private_dir(everyone, "data.cache_dir", shared=shared, what="the tokens a run trains on")
    assert str(caught.value) == (
        f"data.cache_dir: got {everyone}, which everyone can write to (mode 0777); meshrun loads the tokens "
        "a run trains on from it only when no one but its owner can write to it: "
        f"chmod o-w,g-w {everyone} (cache.shared=true trusts a group, never everyone)"
    )


@pytest.mark.e2e
def test_a_run_refuses_a_compilation_cache_others_can_write_and_takes_a_shared_one(in_tmp, capsys):
    """The refusal by the CLI in this process; the shared cache taken in a process of its own (jax's
    compilation cache dir is set once a process)."""
    everyone = made(in_tmp, 0o777)
    line = error_line_here(["train", "mesh=2x4", f"cache.dir={everyone}", *FAST], capsys)
    assert line.startswith(
        f"meshrun: error: cache.dir: got {everyone}, which everyone can write to (mode 0777)"
    )
    assert list(everyone.iterdir()) == []  # nothing compiled into it
    group = made(in_tmp, 0o770)
    done = run_meshrun(
        [
            "train",
            "mesh=2x4",
            f"cache.dir={group}",
            "cache.shared=true",
            *FAST,
            f"hydra.run.dir={in_tmp / 'run'}",
        ],
        in_tmp,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert (
        f"cache.dir: {group} is writable by its group (mode "
        "0770); using it since cache.shared=true trusts that group" in done.stdout + done.stderr
    )
    assert any(group.iterdir())  # the compiled programs went there


def test_cached_arrays_never_unpickle(tmp_path):
    """A .npy that holds pickled objects (which could run code when loaded) is refused."""
    import numpy as np

    from meshrun.data.arrays import open_array

    path = tmp_path / "rows.npy"
    np.save(path, np.array([{"a": 1}, None], dtype=object), allow_pickle=True)
    with pytest.raises(ConfigError) as caught:
        open_array(str(path), "data.cache_dir")
    assert caught.value.key == "data.cache_dir" and "allow_pickle=False" in str(caught.value)
