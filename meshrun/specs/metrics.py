"""What metrics.json holds: `RunMetrics` and its sections, one typed definition that a run writes
(`to_json`) and that `meshrun report` and sweeps read back (`from_json`), converted by
meshrun.specs.jsondata; and the statuses a run ends in.

Each field is declared with `figure(row, text)` (meshrun.specs.figures): the row of the summary
table it shows in and how it reads there, a format string or a function of meshrun.specs.figure_text.
Where the summary's text is declared, and why: here, beside the fields, rather than in
meshrun.report, so that adding a figure to metrics.json and to the report stays one field here (and
the code that measures it), and `RunMetrics.summary()` hands the rows to whoever prints them
(meshrun.report.render). The functions behind the texts that need code are in figure_text, so that
this module says only what the file holds.

Every field defaults to None, so that a metrics.json written by an older meshrun, or a failed run's
(which holds only the head: status, error, run dir, choices, overrides), reads back with what it
has. Nothing here imports jax or keras.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from meshrun.specs import figure_text as text
from meshrun.specs.figures import Shown, figure, summary_rows
from meshrun.specs.jsondata import from_json, to_json
from meshrun.wording import one_of


@dataclass(frozen=True)
class MeshFigures:
    """The mesh as built, -1 filled in."""

    shape: list = figure("mesh", text.shape_text)
    axis_names: list = figure("mesh", text.axis_names_text, " ")
    batch_axis: str = figure("mesh", "batch axis {!r}")
    dcn: list = figure("mesh", text.dcn_text)  # slices of each axis across processes (mesh.dcn)


@dataclass(frozen=True)
class DeviceFigures:
    """The devices the run used and how many processes held them."""

    platform: str = figure("devices", text.devices_text)
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


@dataclass(frozen=True)
class ModelFigures:
    """The model: its registered name, how reports name it, its size and options, and what it takes
    and gives per sample."""

    name: str = figure()
    label: str = figure("model", text.label_text)
    params: int = figure("model", "{:,} parameters")
    trainable_params: int = figure("model", text.trainable_text)
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


@dataclass(frozen=True)
class TrainFigures:
    """The training set-up, and why training ended early (`stopped`, None: it ran to the end)."""

    global_batch_size: int = figure("batch", "{} global")
    per_replica_batch_size: int = figure("batch", "{} per replica")
    steps_per_epoch: int = figure("batch", "{} steps/epoch")
    epochs: int = figure("batch", "x {} epochs", " ")
    optimizer: str = figure("optimizer")
    learning_rate: float = figure("optimizer", "learning rate {:g}")
    lr_schedule: str = figure("optimizer", text.schedule_text, " ")
    warmup_steps: int = figure()
    min_learning_rate: float = figure()
    clip_norm: float = figure("optimizer", text.clip_norm_text)
    precision: str = figure("optimizer", "{}", "; ")
    remat: str = figure("optimizer", text.remat_text, "; ")
    grad_accum_steps: int = figure("batch", text.accumulation_text, "; ")
    samples_per_update: int = figure()
    updates: int = figure()
    eval_every: int = figure()
    max_time_s: float = figure()
    early_stopping: dict = figure()
    stopped: dict = figure("stopped", text.stopped_text)
    loss: str = figure()
    seed: int = figure()


@dataclass(frozen=True)
class TimingFigures:
    """Where the job's time went (see docs/reference/metrics.md for each figure)."""

    startup_s: float = figure("start-up", "{:.2f} s to model built")
    time_to_first_step_s: float = figure("start-up", "{:.2f} s to first step")
    compile_s: float = figure("compile", "{:.3f} s (first step)")
    step_time_s: float = figure("step time", text.ms("{:.2f} ms median"))
    step_time_p90_s: float = figure("step time", text.ms("{:.2f} ms p90"))
    steady_steps: int = figure("step time", text.steady_text, " ")
    minor_faults_per_step: float = figure("step time", "{:,.0f} minor page faults/step")
    async_log_fetch: bool = figure()
    samples_per_s: float = figure("throughput", text.throughput_text)
    tokens_per_s: float = figure("throughput", "{:,.0f} tokens/s")
    throughput_s: float = (
        figure()
    )  # the window samples_per_s is taken over (meshrun.logs.timing.throughput_window)
    throughput_steps: int = figure()
    epoch_s: list = figure()  # shown with the steps each epoch ran (text.epochs_text)
    epoch_steps: list = figure()
    eval_s: float = figure()  # shown with the evaluation
    cost_analysis_s: float = figure()
    checkpoint_s: float = figure()
    teardown_s: float = figure()
    wall_s: float = figure("wall", "{:.2f} s")


@dataclass(frozen=True)
class CacheFigures:
    """The compilation cache the run used."""

    enabled: bool = figure()
    dir: str = figure()


@dataclass(frozen=True)
class FlopsFigures:
    """XLA's FLOPs of one step, the rate achieved, the device peak and utilisation, and the
    analytic 6·N·tokens estimate of the language models ((4·N+2·T)·tokens when only T of the N
    parameters train, as under LoRA: frozen weights get no weight gradients). With pipeline stages,
    the step is counted with its blocks in turn (the same model's FLOPs with separate blocks), and
    what the stages compute on the schedule's bubble ticks, thrown away, is apart (bubble_per_step).
    Where XLA gives no global count (under CUDA), the rate and MFU come from the analytic one."""

    per_step: float = figure()  # shown with the run (text.flops_text)
    per_step_per_device: float = (
        figure()
    )  # None with pipeline stages (XLA counts the schedule's loops once) or without per_step (GPU)
    bubble_per_step: float = (
        figure()
    )  # pipeline stages: FLOPs of the bubble ticks, in neither per_step, per_s nor mfu
    bubble_fraction: float = (
        figure()
    )  # pipeline stages: the bubble ticks' share of a stage's ticks, (S-1)/(RM+S-1)
    source: str = figure()  # the count per_s and mfu come from: "xla" (per_step), "analytic" or None
    per_s: float = figure()
    peak_per_device: float = figure()
    peak_source: str = figure()
    mfu: float = figure()
    analytic_per_step: float = figure()
    analytic_over_xla: float = figure()
    analytic_formula: str = (
        figure()
    )  # 6·N·tokens, or (4·N+2·T)·tokens when only T of the N parameters train (LoRA)


@dataclass(frozen=True)
class CompiledMemory:
    """XLA's compiled memory analysis of the train step, per device."""

    argument_bytes: int = figure()
    output_bytes: int = figure()
    temp_bytes: int = figure()
    alias_bytes: int = figure()
    generated_code_bytes: int = figure()


@dataclass(frozen=True)
class MemoryFigures:
    """Bytes per device: placed variables and optimizer state (read from the arrays, and as
    planned; for a quantized base, the variables split into trainable, frozen quantized and frozen
    float), XLA's estimate of the step and the live peak where the platform reports one; the
    peaks of building the model and loading its weights, per device and on the host
    (meshrun.system.load_memory)."""

    params_bytes_per_device: int = figure("memory", text.bytes_text("{} params +"))
    optimizer_bytes_per_device: int = figure("memory", text.bytes_text("{} optimizer per device"), " ")
    # A quantized base (model.quantize): the params' bytes per device split by what they are.
    trainable_bytes_per_device: int = figure(
        "memory", text.bytes_text("params: {} trainable"), "; ", omit_if_none=True
    )
    frozen_quantized_bytes_per_device: int = figure(
        "memory", text.bytes_text("{} frozen quantized"), omit_if_none=True
    )
    frozen_float_bytes_per_device: int = figure(
        "memory", text.bytes_text("{} frozen float"), omit_if_none=True
    )
    planned_params_bytes_per_device: int = figure()
    planned_optimizer_bytes_per_device: int = figure()
    # The plan's figures for the step, where it counted them (devices.memory_gib or an accelerator's).
    planned_step_bytes_per_device: int = figure(omit_if_none=True)
    planned_step_peak_bytes_per_device: int = figure(omit_if_none=True)
    peak_bytes_per_device: int = figure("memory", text.bytes_text("step peak {} (compiled estimate)"), "; ")
    compiled: CompiledMemory = figure()
    live_peak_bytes_per_device: int = figure("memory", text.bytes_text("{} live"))
    load_peak_bytes_per_device: int = figure(
        "memory", text.bytes_text("loading peaked at {} per device"), "; "
    )  # sampled
    load_peak_host_bytes: int = figure("memory", text.bytes_text("{} host"))
    needed_bytes_per_device: int = figure(omit_if_none=True)  # a job that does not fit: what its plan needs
    device_memory_bytes: int = figure(omit_if_none=True)  # and what one device has


@dataclass(frozen=True)
class QuantizeFigures:
    """What quantizing the base cost (model.quantize): the mode, and the evaluation loss of the
    quantized base before training beside the float base's on the same data (None:
    train.eval_float_base=false), and the difference (quantized - float): the quantization error
    training starts from; `seconds` the two cost (the float base built, evaluated and freed before
    the run's model is built, so within timing.startup_s; the quantized base evaluated after)."""

    mode: str = figure()
    base_loss: float = figure()
    float_base_loss: float = figure()
    difference: float = figure()
    seconds: float = figure()


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
    exported_hf: str = figure(omit_if_none=True)  # a transformers source: the model as a transformers dir
    exported_peft: str = figure(omit_if_none=True)  # and a LoRA run's PEFT adapter dir


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


SKIPPABLE = (
    "eval",
    "flops",
    "export",
    "samples",
)  # what a run stopped by a signal leaves out (RunMetrics.skipped)


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
    timing: TimingFigures = figure("epochs", text.epochs_text)
    cache: CacheFigures = figure()
    flops: FlopsFigures = figure("flops", text.flops_text)
    memory: MemoryFigures = figure()
    checkpoint: CheckpointFigures = figure("export", text.export_text)
    logs: dict = figure("logs", text.logs_text)
    profile: ProfileFigures = figure("profile", text.profile_text)
    history: dict = figure("loss", text.loss_text, also=(Shown("validation", text.validation_text),))
    eval: dict = figure("eval", text.eval_text)
    quantize: QuantizeFigures = figure("eval", text.quantize_text, "; ", omit_if_none=True)
    samples: list = figure("samples", text.samples_text)
    skipped: list = (
        figure()
    )  # of SKIPPABLE: what a run stopped by a signal left out (None: nothing); shown in those rows
    sharding: dict[str, PlacedVariable] = figure()
    versions: dict = figure()

    @classmethod
    def failed(
        cls, message: str, run_dir: str, choices: dict, overrides: list, exit_status: int | None = None
    ) -> RunMetrics:
        """The metrics of a run that failed: what it was, and why."""
        return cls(
            status="error",
            error=message,
            run_dir=run_dir,
            choices=choices,
            overrides=overrides,
            exit_status=exit_status,
        )

    @classmethod
    def not_fitting(
        cls, message: str, run_dir: str, choices: dict, overrides: list, needed: int, available: int
    ) -> RunMetrics:
        """The metrics of a job that was not run because its plan exceeds a device's memory: the
        bytes per device it needs and the bytes one device has."""
        memory = MemoryFigures(needed_bytes_per_device=needed, device_memory_bytes=available)
        return cls(
            status=DOES_NOT_FIT,
            error=message,
            run_dir=run_dir,
            choices=choices,
            overrides=overrides,
            exit_status=2,
            memory=memory,
        )

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
        """The rows of the run's summary table, (row, text), ordered as SUMMARY_ROWS
        (meshrun.specs.figures)."""
        return summary_rows(self)
