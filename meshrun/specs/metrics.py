"""What metrics.json holds: `RunMetrics` and its sections, one typed definition that a run writes
(`to_json`) and that `meshrun report` and sweeps read back (`from_json`), and what the run's summary
table shows of it.

A field declared with `figure(row, text)` is shown in row `row` of the summary table
(meshrun.report.render): adding a figure to metrics.json and to the report is one field here (and
the code that measures it). Rows are ordered as SUMMARY_ROWS lists them; a row not listed there comes
after those.

Every field defaults to None, so that a metrics.json written by an older meshrun, or a failed run's
(which holds only the head: status, error, run dir, choices, overrides), reads back with what it
has. Nothing here imports jax or keras.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshrun.wording import format_bytes, format_shape, one_of

SUMMARY_ROWS = (
    "status", "mesh", "devices", "model", "batch", "optimizer", "start-up", "compile", "step time", "throughput", "flops",
    "memory", "epochs", "loss", "validation", "eval", "samples", "stopped", "wall", "run dir", "logs", "export",
    "profile",
)


@dataclass(frozen=True)
class Shown:
    """Where the summary table shows a figure: its row, how it reads (a format string for the value,
    which leaves out a value of None, or a function (value, section) -> text or None), and what joins
    it to the figure before it in that row."""

    row: str
    text: str | Callable[[Any, Any], str | None] = "{}"
    join: str = ", "

    def render(self, value, section) -> str | None:
        """The text of this figure, or None when it says nothing."""
        if callable(self.text):
            return self.text(value, section)
        return None if value is None else self.text.format(value)


def figure(row: str | None = None, text: str | Callable = "{}", join: str = ", ", *, also: tuple[Shown, ...] = (),
           **metadata):
    """A field of metrics.json (None until set), shown in summary row `row` when one is given (and
    in the rows of `also`); `metadata` marks how it is written (`flatten`, `omit_if_none`)."""
    shown = ((Shown(row, text, join),) if row else ()) + also
    return field(default=None, metadata={"shown": shown, **metadata})


@dataclass(frozen=True)
class MeshFigures:
    """The mesh as built, -1 filled in."""

    shape: list = figure("mesh", lambda shape, _: format_shape(shape))
    axis_names: list = figure("mesh", lambda names, _: str(tuple(names)), " ")
    batch_axis: str = figure("mesh", "batch axis {!r}")


def _devices_text(_, devices) -> str:
    text = f"{devices.count} x {devices.kind}" + (" (emulated)" if devices.emulated else "")
    if devices.processes and devices.processes > 1:
        text += f", {devices.processes} processes x {devices.per_process}"
    return text


@dataclass(frozen=True)
class DeviceFigures:
    """The devices the run used and how many processes held them."""

    platform: str = figure("devices", _devices_text)
    kind: str = figure()
    count: int = figure()
    available: int = figure()
    emulated: bool = figure()
    processes: int = figure()
    per_process: int = figure()


@dataclass(frozen=True)
class ProcessFigures:
    """The job's processes as process 0 saw them, and where it learned them."""

    process_id: int = figure()
    processes: int = figure()
    coordinator: str = figure()
    source: str = figure()


@dataclass(frozen=True)
class LayoutFigures:
    """The layout rules in force (the model's own map resolved) and where each came from."""

    rules: dict = figure()
    origins: dict = figure()
    from_model: bool = figure()


def _trainable_text(trainable: int | None, params: int | None) -> str | None:
    """`N trainable (M frozen)` when some parameters do not train (LoRA, frozen layers), else nothing."""
    if trainable is None or params is None or trainable == params:
        return None
    return f"{trainable:,} trainable ({params - trainable:,} frozen)"


@dataclass(frozen=True)
class ModelFigures:
    """The model: its registered name, how reports name it, its size and options, and what it takes
    and gives per sample."""

    name: str = figure()
    label: str = figure("model", lambda _, model: model.called)
    params: int = figure("model", "{:,} parameters")
    trainable_params: int = figure("model", lambda count, model: _trainable_text(count, model.params))
    options: dict = figure()
    inputs: list = figure()
    outputs: list = figure()

    @property
    def called(self) -> str | None:
        """How reports name the model: its label, else its registered name."""
        return self.label or self.name


@dataclass(frozen=True)
class DataFigures:
    """The data source, its settings and what it reported (`details`, which metrics.json holds
    beside the other keys), how each global batch is shared between processes, which loader fed
    Keras (pydataset, grain or tf.data) and whether glibc's large-block policy was put back after a
    tf.data generator changed it."""

    source: str = figure()
    loader: str = figure()
    allocator_restored: bool = figure()
    details: dict = figure(flatten=True)
    global_batch_size: int = figure()
    process_batch_size: int = figure()
    processes: int = figure()
    process_share: dict = figure()


def _accumulation_text(steps, train) -> str | None:
    if not steps or steps <= 1:
        return None
    return (f"gradients of {steps} steps averaged into each update: {train.samples_per_update} samples per update, "
            f"{train.updates} updates")


def _schedule_text(schedule, train) -> str | None:
    if schedule in (None, "constant"):
        return None
    warmup = f" after {train.warmup_steps} warm-up steps" if train.warmup_steps else ""
    return f"{schedule}{warmup} to {train.min_learning_rate:g}"


def _stopped_text(stopped, _) -> str | None:
    if not stopped:
        return None
    if stopped["reason"] == "max_time":
        text = f"train.max_time reached: stopped after step {stopped['step']}"
    elif stopped["reason"] == "signal":
        text = f"{stopped['signal']} received: stopped after step {stopped['step']}"
    else:
        text = f"early stopping: no improvement, stopped after epoch {stopped['epoch']}"
    return text + (f"; checkpoint {stopped['checkpoint']}" if stopped.get("checkpoint") else "")


@dataclass(frozen=True)
class TrainFigures:
    """The training set-up, and why training ended early (`stopped`, None: it ran to the end)."""

    global_batch_size: int = figure("batch", "{} global")
    per_replica_batch_size: int = figure("batch", "{} per replica")
    steps_per_epoch: int = figure("batch", "{} steps/epoch")
    epochs: int = figure("batch", "x {} epochs", " ")
    optimizer: str = figure("optimizer")
    learning_rate: float = figure("optimizer", "learning rate {:g}")
    lr_schedule: str = figure("optimizer", _schedule_text, " ")
    warmup_steps: int = figure()
    min_learning_rate: float = figure()
    clip_norm: float = figure("optimizer", lambda norm, _: f"gradients clipped to norm {norm:g}" if norm else None)
    precision: str = figure("optimizer", "{}", "; ")
    grad_accum_steps: int = figure("batch", _accumulation_text, "; ")
    samples_per_update: int = figure()
    updates: int = figure()
    eval_every: int = figure()
    max_time_s: float = figure()
    early_stopping: dict = figure()
    stopped: dict = figure("stopped", _stopped_text)
    loss: str = figure()
    seed: int = figure()


def _ms(template: str):
    """A text function showing seconds as milliseconds in `template`; nothing for None."""
    return lambda seconds, _: None if seconds is None else template.format(seconds * 1e3)


def _steady_text(steps, _) -> str | None:
    if steps == 0:  # a run stopped after its first step: that step was the compilation
        return "none timed: only the first step, which compiled, ran"
    return None if steps is None else f"({steps} steps)"


def _throughput_text(samples_per_s, timing) -> str | None:
    """Samples/s, and the mean step of the window they are taken over, which a reader would
    otherwise take for the median."""
    if samples_per_s is None:
        return "n/a: no step ran after the compiling one" if timing.steady_steps == 0 else None
    text = f"{samples_per_s:,.0f} samples/s"
    steps = timing.throughput_steps
    if timing.throughput_s and steps:
        where = "after the first epoch" if len(timing.epoch_s or ()) > 1 else "after the compiling one"
        text += f" ({timing.throughput_s / steps * 1e3:.2f} ms a step on average over the {steps} steps {where})"
    return text


@dataclass(frozen=True)
class TimingFigures:
    """Where the job's time went (see the README's table of metrics.json for each figure)."""

    startup_s: float = figure("start-up", "{:.2f} s to model built")
    time_to_first_step_s: float = figure("start-up", "{:.2f} s to first step")
    compile_s: float = figure("compile", "{:.3f} s (first step)")
    step_time_s: float = figure("step time", _ms("{:.2f} ms median"))
    step_time_p90_s: float = figure("step time", _ms("{:.2f} ms p90"))
    steady_steps: int = figure("step time", _steady_text, " ")
    minor_faults_per_step: float = figure("step time", "{:,.0f} minor page faults/step")
    async_log_fetch: bool = figure()
    samples_per_s: float = figure("throughput", _throughput_text)
    tokens_per_s: float = figure("throughput", "{:,.0f} tokens/s")
    throughput_s: float = figure()  # the window samples_per_s is taken over (meshrun.logs.timing.throughput_window)
    throughput_steps: int = figure()
    epoch_s: list = figure()  # shown with the steps each epoch ran (_epochs_text)
    epoch_steps: list = figure()
    eval_s: float = figure()  # shown with the evaluation
    cost_analysis_s: float = figure()
    checkpoint_s: float = figure()
    teardown_s: float = figure()
    wall_s: float = figure("wall", "{:.2f} s")


def _epochs_text(timing, metrics) -> str | None:
    """Each epoch's seconds, and the epochs that ran fewer steps than an epoch has (the one a run
    resumed in, the one it stopped in), by number: `epoch 4: 348 of 512 steps`."""
    if timing is None or timing.epoch_s is None:
        return None
    text = ", ".join(f"{s:.2f}" for s in timing.epoch_s) + " s"
    per_epoch, counts = metrics.train.steps_per_epoch if metrics.train else None, timing.epoch_steps or []
    if not per_epoch or len(counts) != len(timing.epoch_s):
        return text
    # history holds the epochs before a resumed run's too; this run's are its last ones
    first = len((metrics.history or {}).get("loss") or counts) - len(counts) + 1
    short = [f"epoch {first + index}: {count} of {per_epoch} steps" for index, count in enumerate(counts) if count < per_epoch]
    return "; ".join([text, *short])


@dataclass(frozen=True)
class CacheFigures:
    """The compilation cache the run used."""

    enabled: bool = figure()
    dir: str = figure()


def _flops_text(flops, metrics) -> str | None:
    if _skipped(metrics, "flops"):
        return _skipped_text(metrics, " (XLA's cost analysis, and the compiled memory estimate with it)")
    if flops is None:
        return None
    if flops.per_step is None:
        return "not reported by XLA on this platform"
    text = f"{flops.per_step:.3g} per step (XLA)" + (f", {flops.per_s:.3g}/s" if flops.per_s is not None else "")
    if flops.analytic_per_step:
        text += f"; {flops.analytic_formula or '6·N·tokens'} {flops.analytic_per_step:.3g}"
    if flops.mfu is not None:
        return text + f"; MFU {flops.mfu:.1%}"
    return text + ("; MFU n/a (no peak known)" if flops.peak_per_device is None else "")


@dataclass(frozen=True)
class FlopsFigures:
    """XLA's FLOPs of one step, the rate achieved, the device peak and utilisation, and the
    analytic 6·N·tokens estimate of the language models ((4·N+2·T)·tokens when only T of the N
    parameters train, as under LoRA: frozen weights get no weight gradients)."""

    per_step: float = figure()  # shown with the run (_flops_text)
    per_step_per_device: float = figure()
    per_s: float = figure()
    peak_per_device: float = figure()
    peak_source: str = figure()
    mfu: float = figure()
    analytic_per_step: float = figure()
    analytic_over_xla: float = figure()
    analytic_formula: str = figure()  # 6·N·tokens, or (4·N+2·T)·tokens when only T of the N parameters train (LoRA)


@dataclass(frozen=True)
class CompiledMemory:
    """XLA's compiled memory analysis of the train step, per device."""

    argument_bytes: int = figure()
    output_bytes: int = figure()
    temp_bytes: int = figure()
    alias_bytes: int = figure()
    generated_code_bytes: int = figure()


def _bytes_text(template: str):
    return lambda count, _: None if count is None else template.format(format_bytes(count))


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes per device: placed variables and optimizer state (read from the arrays, and as
    planned), XLA's estimate of the step and the live peak where the platform reports one; the
    peaks of building the model and loading its weights, per device and on the host
    (meshrun.system.load_memory)."""

    params_bytes_per_device: int = figure("memory", _bytes_text("{} params +"))
    optimizer_bytes_per_device: int = figure("memory", _bytes_text("{} optimizer per device"), " ")
    planned_params_bytes_per_device: int = figure()
    planned_optimizer_bytes_per_device: int = figure()
    peak_bytes_per_device: int = figure("memory", _bytes_text("step peak {} (compiled estimate)"), "; ")
    compiled: CompiledMemory = figure()
    live_peak_bytes_per_device: int = figure("memory", _bytes_text("{} live"))
    load_peak_bytes_per_device: int = figure("memory", _bytes_text("loading peaked at {} per device"), "; ")  # sampled
    load_peak_host_bytes: int = figure("memory", _bytes_text("{} host"))
    needed_bytes_per_device: int = figure(omit_if_none=True)  # a job that does not fit: what its plan needs
    device_memory_bytes: int = figure(omit_if_none=True)  # and what one device has


@dataclass(frozen=True)
class CheckpointFigures:
    """Where checkpoints went, the steps saved, what the run resumed from, and the exports
    (model.keras; a KerasHub run's preset dir and LoRA adapters)."""

    dir: str = figure()
    saved_steps: list = figure()
    resumed_from: str = figure()
    resumed_at_step: int = figure()
    exported: str = figure()
    exported_preset: str = figure()  # KerasHub: the trained task as a preset dir
    exported_adapter: str = figure()  # and a LoRA run's adapters (.lora.h5)


def _profile_text(profile, _) -> str | None:
    if profile is None:
        return None
    if not profile.traced:
        return f"steps {profile.steps[0]}-{profile.steps[1]} were not reached; no trace"
    first, last = profile.traced
    return f"steps {first}-{last} traced into {profile.dir} (tensorboard --logdir {profile.dir}, or perfetto_trace.json.gz in ui.perfetto.dev)"


@dataclass(frozen=True)
class ProfileFigures:
    """The profiler trace: its dir, the steps asked for and traced, its files."""

    dir: str = figure()
    steps: list = figure()
    traced: list = figure()
    files: list = figure()


@dataclass(frozen=True)
class PlacedVariable:
    """One variable as placed: shape, dtype, PartitionSpec and bytes per device read back from the
    array, and the rule that placed it (None: replicated) with its origin."""

    shape: list = figure()
    dtype: str = figure()
    spec: list = figure()
    bytes_per_device: int = figure()
    rule: str = figure()
    origin: str = figure()


def _validation_text(history, _) -> str | None:
    parts = [f"{name} " + " -> ".join(f"{v:.5f}" for v in values) for name, values in (history or {}).items() if name.startswith("val_")]
    return "; ".join(parts) or None


def _eval_text(evaluation, metrics) -> str | None:
    if _skipped(metrics, "eval"):
        why = "a run stopped by a signal only saves its checkpoint, to exit within the scheduler's grace period"
        return f"{_skipped_text(metrics)}; {why}"
    if evaluation is None:
        return None
    seconds = metrics.timing.eval_s if metrics.timing and metrics.timing.eval_s is not None else 0.0
    return ", ".join(f"{name} {value:.5f}" for name, value in evaluation.items()) + f" ({seconds:.2f} s)"


def _samples_text(samples, metrics) -> str | None:
    """Each prompt of train.sample_prompts and its completion, a line each: 'prompt' -> 'completion'."""
    if _skipped(metrics, "samples"):
        return _skipped_text(metrics)
    return "\n".join(f"{s['prompt']!r} -> {s['completion']!r}" for s in samples) if samples else None


def _export_text(checkpoint, metrics) -> str | None:
    """The files a run exported, named inside its run dir: `model.keras, preset/, adapter.lora.h5`."""
    if _skipped(metrics, "export"):
        return _skipped_text(metrics)
    if checkpoint is None:
        return None
    exported = [(checkpoint.exported, ""), (checkpoint.exported_preset, "/"), (checkpoint.exported_adapter, "")]
    return ", ".join(_in_run_dir(path, metrics.run_dir) + end for path, end in exported if path) or None


def _in_run_dir(path: str, run_dir: str | None) -> str:
    """`path` relative to the run dir when it is inside it, else whole."""
    if run_dir and Path(path).is_relative_to(run_dir):
        return str(Path(path).relative_to(run_dir))
    return path


SKIPPABLE = ("eval", "flops", "export", "samples")  # what a run stopped by a signal leaves out (RunMetrics.skipped)


def _skipped(metrics, part: str) -> bool:
    return part in (metrics.skipped or ())


def _skipped_text(metrics, what: str = "") -> str:
    """`skipped: SIGTERM received after step 1884`, `what` said after `skipped`."""
    stopped = (metrics.train.stopped if metrics.train else None) or {}
    why = f"{stopped['signal']} received after step {stopped['step']}" if stopped.get("signal") else "training was stopped"
    return f"skipped{what}: {why}"


HEAD = ("status", "error", "run_dir", "choices", "overrides")
DOES_NOT_FIT = "does_not_fit"  # a job not run: its plan exceeds a device's memory
PREEMPTED = "preempted"  # stopped by a stop signal after saving a checkpoint; train.stopped says where
STATUSES = ("ok", "error", DOES_NOT_FIT, PREEMPTED)


@dataclass(frozen=True)
class RunMetrics:
    """Everything metrics.json says about one run. A failed run has the head only (HEAD, and the
    exit status of the job where the launcher decided it)."""

    status: str = figure("status")
    error: str = figure()
    run_dir: str = figure("run dir")
    choices: dict = figure()
    overrides: list = figure()
    exit_status: int = figure(omit_if_none=True)
    mesh: MeshFigures = figure()
    devices: DeviceFigures = figure()
    distributed: ProcessFigures = figure()
    layout: LayoutFigures = figure()
    model: ModelFigures = figure()
    data: DataFigures = figure()
    train: TrainFigures = figure()
    timing: TimingFigures = figure("epochs", _epochs_text)
    cache: CacheFigures = figure()
    flops: FlopsFigures = figure("flops", _flops_text)
    memory: MemoryFigures = figure()
    checkpoint: CheckpointFigures = figure("export", _export_text)
    logs: dict = figure("logs", lambda logs, _: ", ".join(Path(p).name for p in logs.values()) if logs else None)
    profile: ProfileFigures = figure("profile", _profile_text)
    history: dict = figure("loss", lambda h, _: " -> ".join(f"{v:.5f}" for v in (h or {}).get("loss", [])),
                           also=(Shown("validation", _validation_text),))
    eval: dict = figure("eval", _eval_text)
    samples: list = figure("samples", _samples_text)
    skipped: list = figure()  # of SKIPPABLE: what a run stopped by a signal left out (None: nothing); shown in those rows
    sharding: dict[str, PlacedVariable] = figure()
    versions: dict = figure()

    @classmethod
    def failed(cls, message: str, run_dir: str, choices: dict, overrides: list, exit_status: int | None = None) -> RunMetrics:
        """The metrics of a run that failed: what it was, and why."""
        return cls(status="error", error=message, run_dir=run_dir, choices=choices, overrides=overrides, exit_status=exit_status)

    @classmethod
    def not_fitting(cls, message: str, run_dir: str, choices: dict, overrides: list, needed: int, available: int) -> RunMetrics:
        """The metrics of a job that was not run because its plan exceeds a device's memory: the
        bytes per device it needs and the bytes one device has."""
        memory = MemoryFigures(needed_bytes_per_device=needed, device_memory_bytes=available)
        return cls(status=DOES_NOT_FIT, error=message, run_dir=run_dir, choices=choices, overrides=overrides, exit_status=2, memory=memory)

    @property
    def ok(self) -> bool:
        return self.status == "ok"

    def to_json(self) -> dict:
        """metrics.json's content: every field, None as null (a failed run: the head and what it has;
        a preempted run ran, so it has every field, as an ok run)."""
        data = to_json(self)
        if not self.ok and self.status != PREEMPTED:
            data = {key: value for key, value in data.items() if value is not None or key in HEAD}
        return data

    @classmethod
    def from_json(cls, data) -> RunMetrics:
        """Reads metrics.json's content; ValueError when it is not a meshrun run's (no status ok or
        error), TypeError when a section is not a mapping."""
        if not isinstance(data, Mapping) or data.get("status") not in STATUSES:
            raise ValueError(f"not a metrics.json of meshrun train (no status {one_of(STATUSES)})")
        return from_json(cls, data)

    def summary(self) -> list[tuple[str, str]]:
        """The rows of the run's summary table, (row, text), ordered as SUMMARY_ROWS."""
        parts: dict[str, list[tuple[str, str]]] = {}
        _collect_shown(self, self, parts)
        order = {row: index for index, row in enumerate(SUMMARY_ROWS)}
        rows = sorted(parts, key=lambda row: order.get(row, len(order)))
        return [(row, _joined(parts[row])) for row in rows]


def _collect_shown(section, metrics: RunMetrics, parts: dict) -> None:
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        for shown in f.metadata.get("shown", ()):
            text = shown.render(value, metrics if section is metrics else section)
            if text is not None:
                parts.setdefault(shown.row, []).append((shown.join, text))
        if dataclasses.is_dataclass(value):
            _collect_shown(value, metrics, parts)


def _joined(parts: list[tuple[str, str]]) -> str:
    text = parts[0][1]
    for join, more in parts[1:]:
        text += join + more
    return text


def to_json(value):
    """A metrics dataclass (or anything holding them) as plain JSON data, fields in their order;
    a field marked `flatten` puts its keys beside its siblings', one marked `omit_if_none` is
    left out while None."""
    if dataclasses.is_dataclass(value):
        data = {}
        for f in dataclasses.fields(value):
            item = getattr(value, f.name)
            if f.metadata.get("omit_if_none") and item is None:
                continue
            if f.metadata.get("flatten"):
                data.update(to_json(item) or {})
            else:
                data[f.name] = to_json(item)
        return data
    if isinstance(value, Mapping):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    return value


def from_json(cls, data: Mapping):
    """An instance of metrics dataclass `cls` from its JSON data: missing keys stay None, sections
    are read as their own types, a `flatten` field takes the keys no other field has."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__} is given as {type(data).__name__}, not a mapping")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    named = {f.name for f in fields if not f.metadata.get("flatten")}
    values = {}
    for f in fields:
        if f.metadata.get("flatten"):
            values[f.name] = {key: item for key, item in data.items() if key not in named}
        elif f.name in data:
            values[f.name] = _read(hints[f.name], data[f.name])
    return cls(**values)


def _read(hint, value):
    if value is None:
        return None
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
        item = typing.get_args(hint)[1]
        return {key: from_json(item, entry) for key, entry in value.items()}
    return value
