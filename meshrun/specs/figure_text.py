"""How the figures of metrics.json read in a run's summary table, where a format string is not enough:
each function takes the figure's value and its section (the run itself for a field of RunMetrics)
and returns the text, or None to say nothing.

Where this lives: the fields of meshrun.specs.metrics name these functions in their `figure(row,
text)` declarations, and RunMetrics.summary() reads with them, so they stay in the specs layer
beside the schema (meshrun.report, above it, only prints the rows); the schema module keeps to what
metrics.json holds. A new figure is one field there, with a format string or a function here.
"""

from __future__ import annotations

from pathlib import Path

from meshrun.wording import format_bytes, format_shape


def shape_text(shape, _) -> str:
    return format_shape(shape)


def axis_names_text(names, _) -> str:
    return str(tuple(names))


def dcn_text(dcn, mesh) -> str | None:
    """The axes that span processes, and how many each (nothing when none does)."""
    crossing = [
        f"{name} across {slices}"
        for name, slices in zip(mesh.axis_names, dcn or (), strict=False)
        if slices > 1
    ]
    return f"mesh.dcn {list(dcn)} ({', '.join(crossing)} processes)" if crossing else None


def devices_text(_, devices) -> str:
    text = f"{devices.count} x {devices.kind}" + (" (emulated)" if devices.emulated else "")
    if devices.processes and devices.processes > 1:
        text += f", {devices.processes} processes x {devices.per_process}"
    return text


def label_text(_, model) -> str | None:
    return model.called


def trainable_text(count: int | None, model) -> str | None:
    """`N trainable (M frozen)` when some parameters do not train (LoRA, frozen layers), else nothing."""
    params = model.params
    if count is None or params is None or count == params:
        return None
    return f"{count:,} trainable ({params - count:,} frozen)"


def accumulation_text(steps, train) -> str | None:
    if not steps or steps <= 1:
        return None
    return (
        f"gradients of {steps} steps averaged into each update: {train.samples_per_update} samples per "
        f"update, {train.updates} updates"
    )


def schedule_text(schedule, train) -> str | None:
    if schedule in (None, "constant"):
        return None
    warmup = f" after {train.warmup_steps} warm-up steps" if train.warmup_steps else ""
    return f"{schedule}{warmup} to {train.min_learning_rate:g}"


def remat_text(policy, _) -> str | None:
    return None if policy in (None, "none") else f"train.remat={policy}: recomputed in the backward pass"


def clip_norm_text(norm, _) -> str | None:
    return f"gradients clipped to norm {norm:g}" if norm else None


def stopped_text(stopped, _) -> str | None:
    if not stopped:
        return None
    if stopped["reason"] == "max_time":
        text = f"train.max_time reached: stopped after step {stopped['step']}"
    elif stopped["reason"] == "signal":
        text = f"{stopped['signal']} received: stopped after step {stopped['step']}"
    else:
        text = f"early stopping: no improvement, stopped after epoch {stopped['epoch']}"
    return text + (f"; checkpoint {stopped['checkpoint']}" if stopped.get("checkpoint") else "")


def ms(template: str):
    """A text function showing seconds as milliseconds in `template`; nothing for None."""
    return lambda seconds, _: None if seconds is None else template.format(seconds * 1e3)


def steady_text(steps, _) -> str | None:
    if steps == 0:  # a run stopped after its first step: that step was the compilation
        return "none timed: only the first step, which compiled, ran"
    return None if steps is None else f"({steps} steps)"


def throughput_text(samples_per_s, timing) -> str | None:
    """Samples/s, and the mean step of the window they are taken over, which a reader would
    otherwise take for the median."""
    if samples_per_s is None:
        return "n/a: no step ran after the compiling one" if timing.steady_steps == 0 else None
    text = f"{samples_per_s:,.0f} samples/s"
    steps = timing.throughput_steps
    if timing.throughput_s and steps:
        where = "after the first epoch" if len(timing.epoch_s or ()) > 1 else "after the compiling one"
        text += (
            f" ({timing.throughput_s / steps * 1e3:.2f} ms a step on average over the {steps} steps {where})"
        )
    return text


def epochs_text(timing, metrics) -> str | None:
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
    short = [
        f"epoch {first + index}: {count} of {per_epoch} steps"
        for index, count in enumerate(counts)
        if count < per_epoch
    ]
    return "; ".join([text, *short])


def flops_text(flops, metrics) -> str | None:
    """XLA's count of a step, the rate and MFU; where XLA gives none (under CUDA, or the analysis
    skipped), the analytic count's, said to be analytic."""
    if _skipped(metrics, "flops"):
        text = _skipped_text(metrics, " (XLA's cost analysis, and the compiled memory estimate with it)")
        return text + (f"; {_analytic_text(flops)}" if flops and flops.source == "analytic" else "")
    if flops is None:
        return None
    if flops.per_step is None:
        if not flops.analytic_per_step:
            return "not reported by XLA on this platform"
        return _analytic_text(flops, "; XLA reports none on this platform")
    text = f"{flops.per_step:.3g} per step (XLA)" + (
        f", {flops.per_s:.3g}/s" if flops.per_s is not None else ""
    )
    if flops.analytic_per_step:
        text += f"; {flops.analytic_formula or '6·N·tokens'} {flops.analytic_per_step:.3g}"
    text += _mfu_text(flops)
    if (
        flops.bubble_per_step is not None and flops.bubble_fraction is not None
    ):  # a line of its own: the table stays narrow
        text += (
            f"\npipeline bubble: {flops.bubble_fraction:.1%} of each stage's ticks, "
            f"{flops.bubble_per_step:.3g} FLOPs more (discarded, not counted above)"
        )
    return text


def _analytic_text(flops, why: str = "") -> str:
    """The analytic count of a step, its rate and MFU, where XLA gave no count, `why` said after
    `analytic`: `6·N·tokens 1.23e+12 per step (analytic), 4.5e+14/s; MFU 38.8%`."""
    rate = f", {flops.per_s:.3g}/s" if flops.per_s is not None else ""
    formula = flops.analytic_formula or "6·N·tokens"
    return f"{formula} {flops.analytic_per_step:.3g} per step (analytic{why}){rate}" + _mfu_text(flops)


def _mfu_text(flops) -> str:
    if flops.mfu is not None:
        return f"; MFU {flops.mfu:.1%}"
    return "; MFU n/a (no peak known)" if flops.peak_per_device is None else ""


def bytes_text(template: str):
    """A text function showing a byte count in `template`; nothing for None."""
    return lambda count, _: None if count is None else template.format(format_bytes(count))


def profile_text(profile, _) -> str | None:
    if profile is None:
        return None
    if not profile.traced:
        return f"steps {profile.steps[0]}-{profile.steps[1]} were not reached; no trace"
    first, last = profile.traced
    return (
        f"steps {first}-{last} traced into {profile.dir} (tensorboard "
        f"--logdir {profile.dir}, or perfetto_trace.json.gz in ui.perfetto.dev)"
    )


def logs_text(logs, _) -> str | None:
    """The log files by name: `log.jsonl, steps.csv`."""
    return ", ".join(Path(p).name for p in logs.values()) if logs else None


def loss_text(history, _) -> str:
    return " -> ".join(f"{v:.5f}" for v in (history or {}).get("loss", []))


def validation_text(history, _) -> str | None:
    parts = [
        f"{name} " + " -> ".join(f"{v:.5f}" for v in values)
        for name, values in (history or {}).items()
        if name.startswith("val_")
    ]
    return "; ".join(parts) or None


def eval_text(evaluation, metrics) -> str | None:
    if _skipped(metrics, "eval"):
        why = (
            "a run stopped by a signal only saves its checkpoint, to exit within the scheduler's grace period"
        )
        return f"{_skipped_text(metrics)}; {why}"
    if evaluation is None:
        return None
    seconds = metrics.timing.eval_s if metrics.timing and metrics.timing.eval_s is not None else 0.0
    return ", ".join(f"{name} {value:.5f}" for name, value in evaluation.items()) + f" ({seconds:.2f} s)"


def quantize_text(quantize, _) -> str | None:
    """A quantized base's evaluation loss before training beside the float base's."""
    if quantize is None:
        return None
    text = f"before training: {quantize.mode} base loss {quantize.base_loss:.5f}"
    if quantize.float_base_loss is not None:
        text += f", float base {quantize.float_base_loss:.5f} ({quantize.difference:+.5f})"
    return text + f" ({quantize.seconds:.2f} s)"


# The most characters of a sample's line in the summary (metrics.json holds it whole): with the
# row's name, the table stays within 120 columns, the width a report is printed at off a terminal.
SAMPLE_LINE = 96
PROMPT_SHOWN = (
    56  # an instruction template's prompt whole (`'Instruction: What does math.sqrt do? Response: '`)
)


def samples_text(samples, metrics) -> str | None:
    """How the tokens were picked (sampling_text), then each prompt of train.sample_prompts and its
    completion, a line each: 'prompt' -> 'completion', quoted as Python writes strings (so that
    spaces and line breaks show), a long one cut short."""
    if _skipped(metrics, "samples"):
        return _skipped_text(metrics)
    if not samples:
        return None
    lines = [sampling_text(samples[0].get("sampling"))]
    for sample in samples:
        prompt = _cut(sample["prompt"], PROMPT_SHOWN)
        lines.append(f"{prompt} -> {_cut(sample['completion'], SAMPLE_LINE - len(prompt) - 4)}")
    return "\n".join(lines)


def sampling_text(record: dict | None) -> str:
    """A sample's sampling settings (meshrun.text.complete.Sampling.record) in words: `greedy` (also
    for samples recorded without them, as every run's were before they could draw), else `drawn:
    temperature 0.8, top_k 40, top_p 0.9, seed 0` (the settings given)."""
    if not record or record.get("sampler") == "greedy":
        return "greedy"
    names = ("temperature", "top_k", "top_p")
    parts = [f"{name} {record[name]}" for name in names if record.get(name) is not None]
    return "drawn: " + ", ".join([*parts, f"seed {record.get('seed')}"])


def _cut(text: str, width: int) -> str:
    """`text` quoted (repr), within `width` characters: cut short with its length said where longer."""
    quoted = repr(text)
    if len(quoted) <= width:
        return quoted
    note = f"... ({len(text)} characters)"
    return quoted[: max(width - len(note), 8)] + note


def export_text(checkpoint, metrics) -> str | None:
    """The files a run exported, named inside its run dir: `model.keras, preset/, adapter.lora.h5`."""
    if _skipped(metrics, "export"):
        return _skipped_text(metrics)
    if checkpoint is None:
        return None
    exported = [
        (checkpoint.exported, ""),
        (checkpoint.exported_preset, "/"),
        (checkpoint.exported_adapter, ""),
        (checkpoint.exported_peft, "/"),
    ]
    return ", ".join(_in_run_dir(path, metrics.run_dir) + end for path, end in exported if path) or None


def _in_run_dir(path: str, run_dir: str | None) -> str:
    """`path` relative to the run dir when it is inside it, else whole."""
    if run_dir and Path(path).is_relative_to(run_dir):
        return str(Path(path).relative_to(run_dir))
    return path


def _skipped(metrics, part: str) -> bool:
    """Whether a run stopped by a signal left `part` out (RunMetrics.skipped)."""
    return part in (metrics.skipped or ())


def _skipped_text(metrics, what: str = "") -> str:
    """`skipped: SIGTERM received after step 1884`, `what` said after `skipped`."""
    stopped = (metrics.train.stopped if metrics.train else None) or {}
    why = (
        f"{stopped['signal']} received after step {stopped['step']}"
        if stopped.get("signal")
        else "training was stopped"
    )
    return f"skipped{what}: {why}"
