"""The Keras callback that saves a run's checkpoints during fit and, when resuming, restores one
as training begins (meshrun.training.checkpoint: what a checkpoint holds and how it is read)."""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import time
from dataclasses import asdict
from pathlib import Path

import keras

from meshrun.compat.keras.jax_trainer import sync_training_state
from meshrun.compat.orbax import import_orbax
from meshrun.config.schema import CheckpointConfig
from meshrun.system.disk import free_bytes, os_error_behind
from meshrun.training import orbax_io, restack
from meshrun.training.callbacks import finite
from meshrun.training.checkpoint import ModelIdentity, Progress, ResumePoint, read_state, variable_groups
from meshrun.wording import error_text, format_bytes

log = logging.getLogger("meshrun")


class CheckpointNotSaved(RuntimeError):
    """Saving a checkpoint failed (a full disk, a dir that vanished): the message names the step,
    the dir and the OS's error, and the newest checkpoint that is complete."""


class Checkpointing(keras.callbacks.Callback):
    """Saves checkpoints during fit and, when resuming, restores one at the start of training.

    Restoring happens in on_train_begin, after fit has built the optimizer and metrics; the metrics
    (the running means of a half-done epoch) are put back in on_epoch_begin, after fit has reset
    them. Keep one instance across the fit calls of a run.

    A per-step hook exists only with every_steps: saving reads the live state, so Keras must call
    it between steps, on the loop's thread. Without it Keras may fetch step logs asynchronously.

    When training is stopped early the state at the stop is saved too: by early stopping when
    checkpoints are configured, by the graceful `stopper` (the wall-clock budget, a stop signal;
    it may stop mid-epoch) always. Orbax's manager is made at the first save."""

    def __init__(
        self,
        config: CheckpointConfig,
        root: Path,
        start: Progress,
        resume: ResumePoint | None,
        stopper=None,
        model: ModelIdentity | None = None,
    ):
        super().__init__()
        self.config = config
        self.model_identity = model  # saved with every checkpoint
        self.root = root
        self.progress = Progress(**asdict(start))
        self.seconds = 0.0
        self.saved_steps: list[int] = []
        self._manager = None
        self._resume = resume
        self._stopper = stopper
        self._metrics_to_restore: dict | None = None
        self._epoch_start = (start.global_step, start.step_in_epoch)
        self._due_at_epoch_end = False  # a step schedule's save that fell on an epoch's last step
        if config.every_steps:
            self.on_train_batch_end = self._after_step

    def on_train_begin(self, logs=None):
        if self._resume is None:
            return
        point, self._resume = self._resume, None
        groups = variable_groups(self.model)
        restored = read_state(point, groups, model=self.model_identity, stacks=restack.stacks_of(self.model))
        for group in ("model", "optimizer"):
            for path, variable in groups[group].items():
                variable.assign(restored[group][path])
        self._metrics_to_restore = restored["metrics"]
        log.info(
            f"resumed from checkpoint {point} (step "
            f"{self.progress.global_step}, epoch {self.progress.epoch + 1})"
        )

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = (self.progress.global_step, self.progress.step_in_epoch)
        if self._metrics_to_restore is not None and self.progress.step_in_epoch:
            for path, variable in variable_groups(self.model)["metrics"].items():
                variable.assign(self._metrics_to_restore[path])
        self._metrics_to_restore = None

    def _after_step(self, batch, logs=None):
        first_step, first_in_epoch = self._epoch_start
        self.progress.global_step = first_step + batch + 1
        self.progress.step_in_epoch = first_in_epoch + batch + 1
        if self.progress.global_step % self.config.every_steps == 0 and finite(logs):
            if batch + 1 < self.params["steps"]:
                self._save()
            else:  # the epoch's last step: saved at the epoch's end, as a whole epoch with its logs
                self._due_at_epoch_end = True

    def on_epoch_end(self, epoch, logs=None):
        steps = self.params["steps"]  # this fit's steps per epoch
        done = self._stopper.batches_done(steps) if self._stopper else steps
        self.progress.global_step = self._epoch_start[0] + done
        if done < steps:  # stopped mid-epoch: resuming finishes this epoch
            self.progress.step_in_epoch = self._epoch_start[1] + done
            return
        for name, value in (logs or {}).items():
            self.progress.history.setdefault(name, []).append(float(value))
        self.progress.epoch = epoch + 1
        self.progress.step_in_epoch = 0
        due, self._due_at_epoch_end = self._due_at_epoch_end, False
        if (self.config.saves_every_epoch or due) and finite(logs):  # a diverged state is never kept
            self._save()

    def on_train_end(self, logs=None):
        stopped_gracefully = self._stopper is not None and self._stopper.stopped_at is not None
        if self.model.stop_training and finite(logs) and (self.config.saves or stopped_gracefully):
            self._save()

    @property
    def last_saved(self) -> str | None:
        """The newest checkpoint this run saved, as a path."""
        return str(self.root / str(self.saved_steps[-1])) if self.saved_steps else None

    def _save(self) -> None:
        if self.progress.global_step in self.saved_steps[-1:]:
            return
        import_orbax()  # before the clock starts: the save's seconds leave out importing Orbax
        started = time.perf_counter()
        sync_training_state(
            self.model
        )  # the JAX trainer keeps the live state off the variables during an epoch
        state = {
            group: {path: v.value for path, v in variables.items()}
            for group, variables in variable_groups(self.model).items()
        }
        progress = asdict(self.progress)  # history: completed epochs only
        model = asdict(self.model_identity) if self.model_identity is not None else None
        items = orbax_io.save_args(state, progress, model, restack.stacks_of(self.model))
        self._check_space(state, self.progress.global_step)
        with self._saving(self.progress.global_step):
            if self._manager is None:
                self._manager = orbax_io.writing_manager(self.root, self.config)
            self._manager.save(self.progress.global_step, args=items)
        self.saved_steps.append(self.progress.global_step)
        self.seconds += time.perf_counter() - started

    def _check_space(self, state: dict, step: int) -> None:
        """CheckpointNotSaved, before anything is written, when the disk under the checkpoint dir
        has less room than the checkpoint takes (its arrays' bytes): a write that runs out of
        space in Orbax's background thread leaves a half-written dir and a burst of tracebacks
        from its event loop."""
        needed = sum(int(array.nbytes) for group in state.values() for array in group.values())
        free = free_bytes(self.root)
        if free is not None and free < needed:
            full = OSError(
                errno.ENOSPC,
                f"{os.strerror(errno.ENOSPC)}: the checkpoint takes about {format_bytes(needed)}, "
                f"{format_bytes(free)} are free",
            )
            raise CheckpointNotSaved(
                f"saving step {step} into {self.root} failed ({error_text(full)}); {self._newest_complete()}"
            )

    @contextlib.contextmanager
    def _saving(self, step: int | None):
        """Turns a failed save (this one, or an earlier one still being written in the background,
        whose error Orbax raises now) into CheckpointNotSaved, naming the dir, the OS's error and
        the newest complete checkpoint."""
        try:
            yield
        except Exception as err:
            cause = os_error_behind(err)
            what = f"saving step {step}" if step is not None else "finishing the checkpoints being written"
            raise CheckpointNotSaved(
                f"{what} into {self.root} failed ({error_text(cause)}); {self._newest_complete()}"
            ) from err

    def _newest_complete(self) -> str:
        kept = orbax_io.complete_steps(self.root) if self.root.is_dir() else []
        return (
            f"the newest complete checkpoint is {self.root / str(max(kept))}"
            if kept
            else "no complete checkpoint is there"
        )

    def finish(self) -> None:
        """Waits for checkpoints still being written, then releases Orbax's resources."""
        if self._manager is None:
            return
        started = time.perf_counter()
        with self._saving(None):
            self._manager.wait_until_finished()
        self._manager.close()
        self.seconds += time.perf_counter() - started
