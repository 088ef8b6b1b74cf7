"""Orbax's checkpoint managers as meshrun's checkpoints use them: the items a checkpoint holds, the
complete steps under a dir, a manager that writes and one that only reads, and reading arrays with
TensorStore's stray tracebacks held back. Orbax is imported by the first call
(meshrun.compat.orbax.import_orbax), not by importing this module."""

from __future__ import annotations

import contextlib
import logging
import os
import time
from pathlib import Path

from meshrun.compat.orbax import import_orbax, is_complete_checkpoint, keep_replicated_arrays_whole_on_cpu
from meshrun.config.schema import CheckpointConfig
from meshrun.system.process import stderr_captured

log = logging.getLogger("meshrun")

# The items of a checkpoint; STACKS: the per-block paths of pipelined blocks' stacked variables
# (meshrun.training.restack)
STATE, PROGRESS, MODEL, STACKS = "state", "progress", "model", "stacks"


def complete_steps(root: Path) -> list[int]:
    """The complete checkpoints under `root`, oldest first: Orbax's own listing (which leaves out
    writes cut short), less numbered dirs that are not checkpoints at all."""
    ocp = import_orbax()
    if not root.is_dir():
        return []
    return [
        step
        for step in ocp.utils.checkpoint_steps(root)
        if (root / str(step)).is_dir() and is_complete_checkpoint(root / str(step))
    ]


def writing_manager(root: Path, config: CheckpointConfig):
    """A manager that saves into `root` as checkpoint.keep and checkpoint.async_save ask."""
    ocp = import_orbax()
    keep_replicated_arrays_whole_on_cpu()
    options = ocp.CheckpointManagerOptions(
        max_to_keep=config.keep, enable_async_checkpointing=config.async_save, create=True
    )
    return ocp.CheckpointManager(root, options=options)


def save_args(state: dict, progress: dict, model: dict | None, stacks: dict | None = None):
    """What a manager saves for one checkpoint: the arrays, the progress, (when known) the model
    that wrote it, and (for pipelined blocks) the per-block paths of its stacked variables."""
    ocp = import_orbax()
    items = {STATE: ocp.args.StandardSave(state), PROGRESS: ocp.args.JsonSave(progress)}
    if model is not None:
        items[MODEL] = ocp.args.JsonSave(model)
    if stacks:
        items[STACKS] = ocp.args.JsonSave({path: list(blocks) for path, blocks in stacks.items()})
    return ocp.args.Composite(**items)


@contextlib.contextmanager
def reading(directory: Path, partial: bool = False):
    """A manager that reads (never writes or prunes) the checkpoints in `directory`, closed when
    the block ends; `partial`: one that can read part of the state."""
    ocp = import_orbax()
    state = ocp.PyTreeCheckpointHandler() if partial else ocp.StandardCheckpointHandler()
    handlers = {
        STATE: state,
        PROGRESS: ocp.JsonCheckpointHandler(),
        MODEL: ocp.JsonCheckpointHandler(),
        STACKS: ocp.JsonCheckpointHandler(),
    }
    options = ocp.CheckpointManagerOptions(read_only=True)
    manager = ocp.CheckpointManager(directory, options=options, item_handlers=handlers)
    try:
        yield manager
    finally:
        manager.close()


def read_json(directory: Path, step: int, item: str) -> dict:
    """JSON item `item` (PROGRESS, MODEL) of checkpoint `step` in `directory`."""
    ocp = import_orbax()
    with reading(directory) as reader:
        return reader.restore(step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))[item]


def saved_arrays(reader, step: int) -> dict:
    """The metadata (shapes) of the arrays checkpoint `step` holds, by group and path."""
    return reader.item_metadata(step)[STATE]


def restore_args(target: dict, partial: bool):
    """How to read the arrays of `target` (jax.ShapeDtypeStruct by group and path, each with the
    sharding to read it into); `partial`: those alone, the rest left on disk."""
    ocp = import_orbax()
    if partial:
        return ocp.args.PyTreeRestore(
            item=target,
            restore_args=ocp.checkpoint_utils.construct_restore_args(target),
            partial_restore=True,
        )
    return ocp.args.StandardRestore(target)


def restore_arrays(reader, step: int, restore) -> dict:
    """The arrays of checkpoint `step`, read as `restore` (restore_args) says."""
    ocp = import_orbax()
    with stderr_held_back():
        return reader.restore(step, args=ocp.args.Composite(**{STATE: restore}))[STATE]


@contextlib.contextmanager
def stderr_held_back(quiet_s: float = 0.2, wait_s: float = 2.0):
    """Holds back what is written to file descriptor 2 while an Orbax read runs. When a read fails,
    TensorStore's reads still in flight call back into the event loop Orbax has already closed
    and each prints a traceback straight from C++ ("Event loop is closed"), around meshrun's one
    line. On success what was held back is written out; on failure it waits until the output
    has been quiet for `quiet_s` (at most `wait_s`) and logs it at debug level instead."""
    held = None
    try:
        with stderr_captured() as held:
            try:
                yield
            except BaseException:
                _wait_until_quiet(held.file, quiet_s, wait_s)
                raise
    except BaseException:
        if held is not None and held.data:
            log.debug(f"held back from stderr after a failed read: {held.data.decode(errors='replace')}")
        raise
    if held.data:
        os.write(2, held.data)


def _wait_until_quiet(file, quiet_s: float, wait_s: float) -> None:
    """Returns once `file` has not grown for `quiet_s`, or after `wait_s`."""
    deadline, size, quiet_since = time.monotonic() + wait_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        now_size = os.fstat(file.fileno()).st_size
        if now_size != size:
            size, quiet_since = now_size, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.02)
