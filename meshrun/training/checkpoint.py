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
on one mesh (or layout) resumes on another; one of pipelined blocks resumes without them and the
reverse (meshrun.training.restack: its stacked variables and the blocks' own are recast).

This module holds what a checkpoint records, where a run's checkpoints go, which one to resume
from, and reading one back; meshrun.training.checkpoint_callback saves them during fit and
restores one when training begins, and meshrun.training.orbax_io is the Orbax underneath.
"""

from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import jax

from meshrun.config.schema import CheckpointConfig
from meshrun.errors import ConfigError
from meshrun.training import orbax_io, restack
from meshrun.training.orbax_io import MODEL, PROGRESS, STACKS
from meshrun.wording import first_line, format_shape


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
        shown = [
            f"{key} {self.options[key]}"
            for key in ("preset", "task")
            if self.options.get(key) and str(self.options[key]) not in text
        ]
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
    return config.directory(run_dir)


def check_writable(path: Path) -> None:
    """ConfigError when checkpoints cannot be written into `path` (created if missing)."""
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe = path / f".meshrun-write-check-{os.getpid()}"  # one per process of a job
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as err:
        raise ConfigError(
            "checkpoint.dir", f"got {str(path)!r}, which is not a writable dir ({err.strerror or err})"
        ) from None


class UnreadableCheckpoint(RuntimeError):
    """A checkpoint that was complete when saved cannot be restored (its files were truncated or
    changed since): `point` names it, `reason` says what failed."""

    def __init__(self, point: ResumePoint, reason: str):
        super().__init__(f"checkpoint {point} cannot be read ({reason})")
        self.point = point
        self.reason = reason


def find(resume: str, default_dir: Path, unreadable: frozenset = frozenset()) -> ResumePoint | None:
    """The checkpoint `resume` names: None for never (or auto with none yet in `default_dir`),
    the newest in `default_dir` for auto, else the path given: a checkpoint dir (its newest) or one
    numbered step in it. A path that does not exist or holds no complete checkpoint is a
    ConfigError."""
    if resume == "never":
        return None
    if resume == "auto":
        steps = [step for step in orbax_io.complete_steps(default_dir) if step not in unreadable]
        return ResumePoint(default_dir, max(steps)) if steps else None
    path = Path(resume).expanduser().resolve()
    if not path.exists():
        raise ConfigError(
            "resume", f"got {resume!r}, which does not exist; valid: auto, never, or a checkpoint dir"
        )
    if path.name.isdigit() and int(path.name) in orbax_io.complete_steps(path.parent):
        return ResumePoint(path.parent, int(path.name))
    steps = orbax_io.complete_steps(path)
    if not steps:
        raise ConfigError(
            "resume",
            f"got {resume!r}, which holds no complete checkpoint; give a "
            "run's checkpoint dir (with numbered steps) or one of its steps",
        )
    return ResumePoint(path, max(steps))


def read_progress(point: ResumePoint) -> Progress:
    """The progress saved with a checkpoint."""
    return Progress(**orbax_io.read_json(point.directory, point.step, PROGRESS))


def read_model(point: ResumePoint) -> ModelIdentity | None:
    """The model that wrote a checkpoint (None for checkpoints saved before meshrun recorded it)."""
    if not (point.directory / str(point.step) / MODEL).is_dir():
        return None
    return ModelIdentity(**orbax_io.read_json(point.directory, point.step, MODEL))


def check_same_model(point: ResumePoint, current: ModelIdentity) -> None:
    """ConfigError when checkpoint `point` was written by another model (config) than `current`,
    naming both: its variables are another model's, whatever their shapes."""
    saved = read_model(point)
    if saved is not None and saved.name != current.name:
        raise ConfigError(
            "resume",
            f"checkpoint {point} was written by {saved}, and this run builds {current}; resume it with "
            f"model={saved.name}, or start afresh with resume=never or another checkpoint.dir",
        )


def read_stacks(point: ResumePoint) -> dict[str, tuple[str, ...]]:
    """The per-block paths of the stacked variables checkpoint `point` holds (empty: none)."""
    if not (point.directory / str(point.step) / STACKS).is_dir():
        return {}
    return {
        path: tuple(blocks)
        for path, blocks in orbax_io.read_json(point.directory, point.step, STACKS).items()
    }


def restore_weights(model, point: ResumePoint) -> None:
    """Reads the model variables of checkpoint `point` into `model` (built under the distribution it
    is to run with), each straight into its variable's sharding as resuming does; the optimizer's
    and the metrics' state stay on disk (meshrun generate needs the weights alone)."""
    groups = {"model": {v.path: v for v in model.variables}}
    restored = read_state(point, groups, partial=True, stacks=restack.stacks_of(model))
    for path, variable in groups["model"].items():
        variable.assign(restored["model"][path])


def read_state(
    point: ResumePoint,
    groups: dict,
    partial: bool = False,
    model: ModelIdentity | None = None,
    stacks: dict | None = None,
) -> dict:
    """The arrays of checkpoint `point` for `groups` (variables by group and path), each read
    straight into its variable's sharding; `partial`: only those groups, the rest left on disk.
    Variables of pipelined blocks in the other form than the checkpoint's are recast (`stacks`:
    this model's stacked variables and their per-block paths). A checkpoint that does not fit them
    is a ConfigError (naming the model that wrote it and `model`, this run's, where both are known),
    one that cannot be read UnreadableCheckpoint."""
    all_stacks = {**read_stacks(point), **(stacks or {})}
    with orbax_io.reading(point.directory, partial or bool(all_stacks)) as reader:
        saved = orbax_io.saved_arrays(reader, point.step)
        plans = (
            {
                group: _recasts(variables, saved.get(group) or {}, all_stacks)
                for group, variables in groups.items()
            }
            if all_stacks
            else {}
        )
        try:
            _check_fits(saved, groups, point, plans)
        except ConfigError as err:
            raise _with_models(err, point, model) from None
        target = {
            group: _read_as(variables, plans.get(group, {}), saved.get(group) or {})
            for group, variables in groups.items()
        }
        restore = orbax_io.restore_args(target, partial or bool(all_stacks))
        try:
            restored = orbax_io.restore_arrays(reader, point.step, restore)
        except Exception as err:  # TensorStore's errors, for files changed after the save
            raise UnreadableCheckpoint(point, first_line(err, limit=120)) from err
    for group, recasts in plans.items():
        read = dict(
            restored[group]
        )  # a stack's rows go to several variables: take them all before dropping it
        for path, recast in recasts.items():
            sources = [read[source] for source in recast.sources]
            restored[group][path] = restack.recast_array(recast, sources, groups[group][path].value)
        for source in {source for recast in recasts.values() for source in recast.sources} - set(
            groups[group]
        ):
            del restored[group][source]
    return restored


def _recasts(variables: dict, stored: dict, stacks: dict) -> dict:
    """How each variable of one group that the checkpoint lacks, or holds in another shape, is made
    from what it has (meshrun.training.restack)."""
    missing = restack.recasts([path for path in variables if path not in stored], set(stored), stacks)
    shapes = {path: tuple(stored[path].shape) for path in stored}
    return {
        **missing,
        **restack.reshaped({path: tuple(v.shape) for path, v in variables.items()}, shapes, stacks),
    }


def _read_as(variables: dict, recasts: dict, saved: dict) -> dict:
    """What to read of one group: each variable as itself, straight into its sharding, or the
    arrays its recast is made from."""
    target = {}
    for path, v in variables.items():
        if path not in recasts:
            target[path] = jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=v.value.sharding)
            continue
        sharding = restack.source_sharding(v.value, recasts[path], len(saved[recasts[path].sources[0]].shape))
        for source in recasts[path].sources:
            target[source] = jax.ShapeDtypeStruct(tuple(saved[source].shape), v.dtype, sharding=sharding)
    return target


def variable_groups(model) -> dict:
    """The variables a checkpoint holds, by group and path."""
    return {
        "model": {v.path: v for v in model.variables},
        "optimizer": {v.path: v for v in model.optimizer.variables},
        "metrics": {f"{i}:{v.path}": v for i, v in enumerate(model.metrics_variables)},
    }


def _check_fits(saved: dict, groups: dict, point: ResumePoint, plans: dict) -> None:
    """ConfigError naming the first variable whose shape (or presence) differs; a recast one is
    checked against the arrays it is made from."""
    for group, variables in groups.items():
        stored = saved.get(group) or {}
        recasts = plans.get(group, {})
        for path, variable in variables.items():
            if path in recasts:
                shape = restack.made_shape(
                    recasts[path], tuple(stored[recasts[path].sources[0]].shape), tuple(variable.shape)
                )
            elif path not in stored:
                raise ConfigError(
                    "resume",
                    f"checkpoint {point} does not fit this model: it has no {group} variable {path!r}",
                )
            else:
                shape = tuple(stored[path].shape)
            if shape != tuple(variable.shape):
                raise ConfigError(
                    "resume",
                    f"checkpoint {point} does not fit this model: {path} is "
                    f"{format_shape(shape, scalar='a scalar')} there but "
                    f"{format_shape(variable.shape, scalar='a scalar')} here",
                )


def _with_models(err: ConfigError, point: ResumePoint, current: ModelIdentity | None) -> ConfigError:
    """`err`, a checkpoint that does not fit, saying which model wrote it and which this run
    builds, with the options that differ."""
    saved = read_model(point)
    if saved is None or current is None:
        return err
    changes = "; ".join(saved.changes_to(current))
    if str(saved) != str(current):
        models = f"it was written by {saved} and this run builds {current}" + (
            f" ({changes})" if changes else ""
        )
    elif changes:
        models = f"it was written by {saved} with other options ({changes})"
    else:
        return err
    return ConfigError(err.key, f"{str(err).removeprefix(err.key + ': ')}; {models}")
