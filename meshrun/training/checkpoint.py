"""Sharded checkpoints with Orbax, and resuming from them on any mesh.

A checkpoint holds every variable of the model, the optimizer (its step counter included) and the
compiled metrics, each as placed on the mesh (every process writes only its own shards), plus the
run's progress: global step, epoch, step within the epoch, and the per-epoch history so far, and
which model wrote it (ModelIdentity: its config name, label and options). The
random state is a model variable (Keras' seed generators), and the data position is the global
step: every data source reads a seeded, endless stream, which resuming skips forward.

Orbax writes a checkpoint into a temporary dir and renames it to its step number once every
process has finished, so a checkpoint cut short by a kill is never listed and never resumed from.
Restoring reads each array straight into the sharding of the current run, so a checkpoint written
on one mesh (or layout) resumes on another.
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import json
import logging
import os
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import jax
import keras

from meshrun import compat
from meshrun.config.schema import CheckpointConfig
from meshrun.errors import ConfigError
from meshrun.specs.rundir import CHECKPOINTS_DIR
from meshrun.training.callbacks import finite
from meshrun.wording import error_text, first_line, format_bytes, format_shape

log = logging.getLogger("meshrun")

STATE, PROGRESS, MODEL = "state", "progress", "model"


def _ocp():
    """Orbax, imported only by runs that checkpoint or resume (it adds about 0.2 s to start-up), its
    private names checked once (meshrun.compat)."""
    import orbax.checkpoint

    compat.ensure("orbax")

    # Orbax logs every step of every save at INFO through absl; meshrun reports checkpoints itself.
    absl = logging.getLogger("absl")
    absl.setLevel(logging.WARNING)
    if not any(isinstance(f, _ExpectedOrbaxWarnings) for f in absl.filters):
        absl.addFilter(_ExpectedOrbaxWarnings())

    return orbax.checkpoint


class _ExpectedOrbaxWarnings(logging.Filter):
    """Turns Orbax's warnings about what meshrun does on purpose (a read-only manager to find
    checkpoints, jax.Array's type handler registered again) into INFO records: they go to
    train.log, not the console, where they would tell the user nothing."""

    EXPECTED = ("CheckpointManagerOptions.read_only=True", "Given directory is read only", "Type handler registry type")

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno == logging.WARNING and record.getMessage().startswith(self.EXPECTED):
            record.levelno, record.levelname = logging.INFO, "INFO"
        return True


@dataclass
class Progress:
    """Where training stood at a checkpoint: global step, completed epochs, steps into the current
    epoch, and the per-epoch logs of the completed epochs."""

    global_step: int = 0
    epoch: int = 0
    step_in_epoch: int = 0
    history: dict = field(default_factory=dict)


@dataclass(frozen=True)
class ModelIdentity:
    """Which model a checkpoint holds the variables of, saved beside them: the model config's name
    (`model=`), how reports name it (`label`: the KerasHub class and preset, the factory) and its
    options, so that resuming with another model says so instead of failing on a variable."""

    name: str
    label: str
    options: dict = field(default_factory=dict)

    @classmethod
    def of(cls, name: str, label: str, options) -> ModelIdentity:
        """The identity of model config `name` built with the options dataclass `options`."""
        return cls(name, label, json.loads(json.dumps(dataclasses.asdict(options), default=str)))

    def __str__(self) -> str:
        """`model=transformer (preset tiny)`, `model=keras_hub GemmaCausalLM (preset /models/gemma2)`."""
        text = f"model={self.name}" + (f" {self.label}" if self.label != self.name else "")
        shown = [f"{key} {self.options[key]}" for key in ("preset", "task") if self.options.get(key) and str(self.options[key]) not in text]
        return text + (f" ({', '.join(shown)})" if shown else "")

    def changes_to(self, other: ModelIdentity, limit: int = 3) -> list[str]:
        """The options that differ from `other`'s: `model.hidden=200 there, 100 here`."""
        keys = [k for k in self.options if k in other.options and self.options[k] != other.options[k]]
        return [f"model.{k}={self.options[k]} there, {other.options[k]} here" for k in keys[:limit]]


@dataclass(frozen=True)
class ResumePoint:
    """A complete checkpoint to resume from: its root dir and step."""

    directory: Path
    step: int

    def __str__(self) -> str:
        return str(self.directory / str(self.step))


def directory(config: CheckpointConfig, run_dir: str) -> Path:
    """Where the run's checkpoints go: checkpoint.dir, else <run dir>/checkpoints."""
    return Path(config.dir).expanduser().resolve() if config.dir else Path(run_dir).resolve() / CHECKPOINTS_DIR


def check_writable(path: Path) -> None:
    """ConfigError when checkpoints cannot be written into `path` (created if missing)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".meshrun-write-check-{os.getpid()}"  # one per process of a job
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError("checkpoint.dir", f"got {str(path)!r}, which is not a writable dir ({err.strerror or err})") from None


def _steps(root: Path) -> list[int]:
    """The complete checkpoints under `root`, oldest first: Orbax's own listing (which leaves out
    writes cut short), less numbered dirs that are not checkpoints at all."""
    ocp = _ocp()
    if not root.is_dir():
        return []
    return [step for step in ocp.utils.checkpoint_steps(root) if (root / str(step)).is_dir() and compat.is_complete_checkpoint(root / str(step))]


class UnreadableCheckpoint(RuntimeError):
    """A checkpoint that was complete when saved cannot be restored (its files were truncated or
    changed since): `point` names it, `reason` says what failed."""

    def __init__(self, point: ResumePoint, reason: str):
        super().__init__(f"checkpoint {point} cannot be read ({reason})")
        self.point = point
        self.reason = reason


class CheckpointNotSaved(RuntimeError):
    """Saving a checkpoint failed (a full disk, a dir that vanished): the message names the step,
    the dir and the OS's error, and the newest checkpoint that is complete."""


def find(resume: str, default_dir: Path, unreadable: frozenset = frozenset()) -> ResumePoint | None:
    """The checkpoint `resume` names: None for never (or auto with none yet in `default_dir`),
    the newest in `default_dir` for auto, else the path given: a checkpoint dir (its newest) or one
    numbered step in it. A path that does not exist or holds no complete checkpoint is a
    ConfigError."""
    if resume == "never":
        return None
    if resume == "auto":
        steps = [step for step in _steps(default_dir) if step not in unreadable]
        return ResumePoint(default_dir, max(steps)) if steps else None
    path = Path(resume).expanduser().resolve()
    if not path.exists():
        raise ConfigError("resume", f"got {resume!r}, which does not exist; valid: auto, never, or a checkpoint dir")
    if path.name.isdigit() and int(path.name) in _steps(path.parent):
        return ResumePoint(path.parent, int(path.name))
    steps = _steps(path)
    if not steps:
        raise ConfigError(
            "resume",
            f"got {resume!r}, which holds no complete checkpoint; give a run's checkpoint dir (with numbered steps) or one of its steps",
        )
    return ResumePoint(path, max(steps))


def _manager(root: Path, config: CheckpointConfig):
    ocp = _ocp()
    if jax.default_backend() == "cpu":
        # Orbax splits replicated arrays between their replicas with one small jitted slice per
        # shard, compiled on the first save (2.5 s for the tiny transformer on 8 CPU devices). CPU
        # devices share one host's memory, so there is nothing to split; Orbax itself does
        # without on GPUs.
        handler = ocp.type_handlers.ArrayHandler(use_replica_parallel=False)
        ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
    options = ocp.CheckpointManagerOptions(max_to_keep=config.keep, enable_async_checkpointing=config.async_save, create=True)
    return ocp.CheckpointManager(root, options=options)


def _reader(point: ResumePoint, partial: bool = False):
    """A manager that reads (never writes or prunes) the checkpoints of `point`'s dir; `partial`:
    one that can read part of the state."""
    ocp = _ocp()
    state = ocp.PyTreeCheckpointHandler() if partial else ocp.StandardCheckpointHandler()
    handlers = {STATE: state, PROGRESS: ocp.JsonCheckpointHandler(), MODEL: ocp.JsonCheckpointHandler()}
    options = ocp.CheckpointManagerOptions(read_only=True)
    return ocp.CheckpointManager(point.directory, options=options, item_handlers=handlers)


def read_progress(point: ResumePoint) -> Progress:
    """The progress saved with a checkpoint."""
    return Progress(**_read_json(point, PROGRESS))


def read_model(point: ResumePoint) -> ModelIdentity | None:
    """The model that wrote a checkpoint (None for checkpoints saved before meshrun recorded it)."""
    if not (point.directory / str(point.step) / MODEL).is_dir():
        return None
    return ModelIdentity(**_read_json(point, MODEL))


def check_same_model(point: ResumePoint, current: ModelIdentity) -> None:
    """ConfigError when checkpoint `point` was written by another model (config) than `current`,
    naming both: its variables are another model's, whatever their shapes."""
    saved = read_model(point)
    if saved is not None and saved.name != current.name:
        raise ConfigError(
            "resume",
            f"checkpoint {point} was written by {saved}, and this run builds {current}; resume it with model={saved.name}, "
            "or start afresh with resume=never or another checkpoint.dir",
        )


def _read_json(point: ResumePoint, item: str) -> dict:
    ocp = _ocp()
    manager = _reader(point)
    try:
        return manager.restore(point.step, args=ocp.args.Composite(**{item: ocp.args.JsonRestore()}))[item]
    finally:
        manager.close()


def restore_weights(model, point: ResumePoint) -> None:
    """Reads the model variables of checkpoint `point` into `model` (built under the distribution it
    is to run with), each straight into its variable's sharding as resuming does; the optimizer's
    and the metrics' state stay on disk (meshrun generate needs the weights alone)."""
    groups = {"model": {v.path: v for v in model.variables}}
    restored = _read(point, groups, partial=True)
    for path, variable in groups["model"].items():
        variable.assign(restored["model"][path])


def _read(point: ResumePoint, groups: dict, partial: bool = False, model: ModelIdentity | None = None) -> dict:
    """The arrays of checkpoint `point` for `groups` (variables by group and path), each read
    straight into its variable's sharding; `partial`: only those groups, the rest left on disk.
    A checkpoint that does not fit them is a ConfigError (naming the model that wrote it and
    `model`, this run's, where both are known), one that cannot be read UnreadableCheckpoint."""
    ocp = _ocp()
    reader = _reader(point, partial)
    try:
        try:
            _check_fits(reader.item_metadata(point.step)[STATE], groups, point)
        except ConfigError as err:
            raise _with_models(err, point, model) from None
        target = {
            group: {path: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.value.sharding) for path, v in variables.items()}
            for group, variables in groups.items()
        }
        if partial:
            restore = ocp.args.PyTreeRestore(item=target, restore_args=ocp.checkpoint_utils.construct_restore_args(target), partial_restore=True)
        else:
            restore = ocp.args.StandardRestore(target)
        try:
            with _stderr_held_back():
                return reader.restore(point.step, args=ocp.args.Composite(**{STATE: restore}))[STATE]
        except Exception as err:  # TensorStore's errors, for files changed after the save
            raise UnreadableCheckpoint(point, first_line(err, limit=120)) from err
    finally:
        reader.close()


def _groups(model) -> dict:
    """The variables a checkpoint holds, by group and path."""
    return {
        "model": {v.path: v for v in model.variables},
        "optimizer": {v.path: v for v in model.optimizer.variables},
        "metrics": {f"{i}:{v.path}": v for i, v in enumerate(model.metrics_variables)},
    }


def _check_fits(saved: dict, groups: dict, point: ResumePoint) -> None:
    """ConfigError naming the first variable whose shape (or presence) differs."""
    for group, variables in groups.items():
        stored = saved.get(group) or {}
        for path, variable in variables.items():
            if path not in stored:
                raise ConfigError("resume", f"checkpoint {point} does not fit this model: it has no {group} variable {path!r}")
            shape = tuple(stored[path].shape)
            if shape != tuple(variable.shape):
                raise ConfigError(
                    "resume",
                    f"checkpoint {point} does not fit this model: {path} is {format_shape(shape, scalar='a scalar')} there "
                    f"but {format_shape(variable.shape, scalar='a scalar')} here",
                )


def _with_models(err: ConfigError, point: ResumePoint, current: ModelIdentity | None) -> ConfigError:
    """`err`, a checkpoint that does not fit, saying which model wrote it and which this run
    builds, with the options that differ."""
    saved = read_model(point)
    if saved is None or current is None:
        return err
    changes = "; ".join(saved.changes_to(current))
    if str(saved) != str(current):
        models = f"it was written by {saved} and this run builds {current}" + (f" ({changes})" if changes else "")
    elif changes:
        models = f"it was written by {saved} with other options ({changes})"
    else:
        return err
    return ConfigError(err.key, f"{str(err).removeprefix(err.key + ': ')}; {models}")


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

    def __init__(self, config: CheckpointConfig, root: Path, start: Progress, resume: ResumePoint | None, stopper=None,
                 model: ModelIdentity | None = None):
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
        if config.every_steps:
            self.on_train_batch_end = self._after_step

    def on_train_begin(self, logs=None):
        if self._resume is None:
            return
        point, self._resume = self._resume, None
        groups = _groups(self.model)
        restored = _read(point, groups, model=self.model_identity)
        for group in ("model", "optimizer"):
            for path, variable in groups[group].items():
                variable.assign(restored[group][path])
        self._metrics_to_restore = restored["metrics"]
        log.info(f"resumed from checkpoint {point} (step {self.progress.global_step}, epoch {self.progress.epoch + 1})")

    def on_epoch_begin(self, epoch, logs=None):
        self._epoch_start = (self.progress.global_step, self.progress.step_in_epoch)
        if self._metrics_to_restore is not None and self.progress.step_in_epoch:
            for path, variable in _groups(self.model)["metrics"].items():
                variable.assign(self._metrics_to_restore[path])
        self._metrics_to_restore = None

    def _after_step(self, batch, logs=None):
        first_step, first_in_epoch = self._epoch_start
        self.progress.global_step = first_step + batch + 1
        self.progress.step_in_epoch = first_in_epoch + batch + 1
        if self.progress.global_step % self.config.every_steps == 0 and finite(logs):
            self._save()

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
        if self.config.saves_every_epoch and finite(logs):  # a diverged state is never kept
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
        ocp = _ocp()
        started = time.perf_counter()
        compat.sync_training_state(self.model)  # the JAX trainer keeps the live state off the variables during an epoch
        state = {group: {path: v.value for path, v in variables.items()} for group, variables in _groups(self.model).items()}
        progress = asdict(self.progress)  # history: completed epochs only
        items = {STATE: ocp.args.StandardSave(state), PROGRESS: ocp.args.JsonSave(progress)}
        if self.model_identity is not None:
            items[MODEL] = ocp.args.JsonSave(asdict(self.model_identity))
        self._check_space(state, self.progress.global_step)
        with self._saving(self.progress.global_step):
            if self._manager is None:
                self._manager = _manager(self.root, self.config)
            self._manager.save(self.progress.global_step, args=ocp.args.Composite(**items))
        self.saved_steps.append(self.progress.global_step)
        self.seconds += time.perf_counter() - started

    def _check_space(self, state: dict, step: int) -> None:
        """CheckpointNotSaved, before anything is written, when the disk under the checkpoint dir
        has less room than the checkpoint takes (its arrays' bytes): a write that runs out of
        space in Orbax's background thread leaves a half-written dir and a burst of tracebacks
        from its event loop."""
        needed = sum(int(array.nbytes) for group in state.values() for array in group.values())
        free = _free_bytes(self.root)
        if free is not None and free < needed:
            full = OSError(errno.ENOSPC, f"{os.strerror(errno.ENOSPC)}: the checkpoint takes about {format_bytes(needed)}, "
                                         f"{format_bytes(free)} are free")
            raise CheckpointNotSaved(f"saving step {step} into {self.root} failed ({error_text(full)}); {self._newest_complete()}")

    @contextlib.contextmanager
    def _saving(self, step: int | None):
        """Turns a failed save (this one, or an earlier one still being written in the background,
        whose error Orbax raises now) into CheckpointNotSaved, naming the dir, the OS's error and
        the newest complete checkpoint."""
        try:
            yield
        except Exception as err:
            cause = next((e for e in _causes(err) if isinstance(e, OSError)), err)
            what = f"saving step {step}" if step is not None else "finishing the checkpoints being written"
            raise CheckpointNotSaved(f"{what} into {self.root} failed ({error_text(cause)}); {self._newest_complete()}") from err

    def _newest_complete(self) -> str:
        kept = _steps(self.root) if self.root.is_dir() else []
        return f"the newest complete checkpoint is {self.root / str(max(kept))}" if kept else "no complete checkpoint is there"

    def finish(self) -> None:
        """Waits for checkpoints still being written, then releases Orbax's resources."""
        if self._manager is None:
            return
        started = time.perf_counter()
        with self._saving(None):
            self._manager.wait_until_finished()
        self._manager.close()
        self.seconds += time.perf_counter() - started


@contextlib.contextmanager
def _stderr_held_back(quiet_s: float = 0.2, wait_s: float = 2.0):
    """Holds back what is written to file descriptor 2 while an Orbax read runs. When a read fails,
    TensorStore's reads still in flight call back into the event loop Orbax has already closed
    and each prints a traceback straight from C++ ("Event loop is closed"), around meshrun's one
    line. On success what was held back is written out; on failure it waits until the output
    has been quiet for `quiet_s` (at most `wait_s`) and logs it at debug level instead."""
    sys.stderr.flush()
    saved = os.dup(2)
    failed = False
    with tempfile.TemporaryFile() as held:
        os.dup2(held.fileno(), 2)
        try:
            yield
        except BaseException:
            failed = True
            raise
        finally:
            if failed:
                _wait_until_quiet(held, quiet_s, wait_s)
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            held.seek(0)
            text = held.read()
            if text and not failed:
                os.write(2, text)
            elif text:
                log.debug(f"held back from stderr after a failed read: {text.decode(errors='replace')}")


def _wait_until_quiet(held, quiet_s: float, wait_s: float) -> None:
    deadline, size, quiet_since = time.monotonic() + wait_s, -1, time.monotonic()
    while time.monotonic() < deadline:
        now_size = os.fstat(held.fileno()).st_size
        if now_size != size:
            size, quiet_since = now_size, time.monotonic()
        elif time.monotonic() - quiet_since >= quiet_s:
            return
        time.sleep(0.02)


def _free_bytes(root: Path) -> int | None:
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


def _causes(err: BaseException):
    """`err` and the exceptions it was raised from, outermost first."""
    seen = set()
    while err is not None and id(err) not in seen:
        seen.add(id(err))
        yield err
        err = err.__cause__ or err.__context__
