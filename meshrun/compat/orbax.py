"""Orbax, as meshrun uses it past its public API: the file that tells a complete checkpoint, the
text of the warnings meshrun keeps off the console, and jax.Array's type handler, replaced on CPU
devices. Importing this module imports no Orbax (import_orbax does, for runs that checkpoint).
"""

from __future__ import annotations

import logging
from pathlib import Path

from meshrun.compat.names import PrivateName, ensure, uses

# Orbax's warnings about what meshrun does on purpose, by the start of their text, with the module
# that logs each: a read-only manager finds and reads checkpoints, and jax.Array's type handler is
# registered again on CPU (keep_replicated_arrays_whole_on_cpu).
EXPECTED_WARNINGS = {
    "CheckpointManagerOptions.read_only=True": "orbax.checkpoint.checkpoint_manager",
    "Given directory is read only": "orbax.checkpoint.checkpoint_manager",
    "Type handler registry type": "orbax.checkpoint._src.serialization.type_handler_registry",
}

# The file Orbax writes last into a finished checkpoint (its _STEP_METADATA_FILENAME).
STEP_METADATA_FILE = "_CHECKPOINT_METADATA"

PRIVATE_NAMES = uses(
    "orbax",
    PrivateName(
        "orbax-checkpoint",
        "orbax.checkpoint._src.metadata.checkpoint",
        "step_metadata_file_path",
        "telling a complete checkpoint from a numbered dir that is not one",
    ),
    PrivateName(
        "orbax-checkpoint",
        "orbax.checkpoint._src.metadata.checkpoint",
        "_STEP_METADATA_FILENAME",
        "telling a complete checkpoint without importing Orbax (steps_on_disk)",
    ),
    PrivateName(
        "orbax-checkpoint",
        "orbax.checkpoint.type_handlers",
        "ArrayHandler.__init__",
        "saving replicated arrays without splitting them between their replicas on CPU devices",
        source_contains="use_replica_parallel",
    ),
    *(
        PrivateName(
            "orbax-checkpoint",
            module,
            "",
            "sending a warning about what meshrun does on purpose to train.log, not the console",
            source_contains=text,
        )
        for text, module in EXPECTED_WARNINGS.items()
    ),
)


def import_orbax():
    """orbax.checkpoint, imported only by runs that checkpoint or resume (it adds about 0.2 s to
    start-up), its private names checked once, and its logging quiet: Orbax logs every step of
    every save at INFO through absl (meshrun reports checkpoints itself), and its warnings about
    what meshrun does on purpose go to train.log only."""
    import orbax.checkpoint

    ensure("orbax")
    absl = logging.getLogger("absl")
    absl.setLevel(logging.WARNING)
    if not any(isinstance(f, ExpectedOrbaxWarnings) for f in absl.filters):
        absl.addFilter(ExpectedOrbaxWarnings())
    return orbax.checkpoint


class ExpectedOrbaxWarnings(logging.Filter):
    """Turns Orbax's warnings about what meshrun does on purpose (EXPECTED_WARNINGS) into INFO
    records: they go to train.log, not the console, where they would tell the user nothing."""

    EXPECTED = tuple(EXPECTED_WARNINGS)

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.getMessage().startswith(self.EXPECTED):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


def is_complete_checkpoint(step_dir) -> bool:
    """Whether `step_dir` holds the metadata file Orbax writes last into a finished checkpoint."""
    ensure("orbax")
    from orbax.checkpoint._src.metadata import checkpoint

    return checkpoint.step_metadata_file_path(step_dir).is_file()


def keep_replicated_arrays_whole_on_cpu() -> None:
    """On CPU devices, replaces Orbax's type handler for jax.Array (for every save that follows)
    with one that does not split replicated arrays between their replicas. Orbax splits them with
    one small jitted slice per shard, compiled on the first save (2.5 s for the tiny transformer
    on 8 CPU devices); CPU devices share one host's memory, so there is nothing to split. Orbax
    itself does without on GPUs."""
    import jax

    if jax.default_backend() != "cpu":
        return
    ocp = import_orbax()
    handler = ocp.type_handlers.ArrayHandler(use_replica_parallel=False)
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)


def steps_on_disk(root: Path) -> list[int]:
    """The complete checkpoints under `root` as its files tell, oldest first: the numbered dirs that
    hold STEP_METADATA_FILE. Read without Orbax, and so without jax: a run dir is checked before the
    devices are set (meshrun.launch.reuse). Orbax's own listing is meshrun.training.orbax_io's."""
    if not root.is_dir():
        return []
    return sorted(
        int(p.name) for p in root.iterdir() if p.name.isdigit() and (p / STEP_METADATA_FILE).is_file()
    )
