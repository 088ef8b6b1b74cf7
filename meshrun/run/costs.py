"""XLA's cost and memory analysis of a model's real, compiled train step: FLOPs per step (global and
per device) and the compiled per-device memory estimate, plus the live peak where devices report it.

It rebuilds the jit of `JAXTrainer.make_train_function` (keras/src/backend/jax/trainer.py):
`jax.jit(model.train_step, donate_argnums=0, out_shardings=(None, state shardings))`, with the
training state, its shardings and the batch placement fit uses, which only private Keras names give
(reached through meshrun.compat). With the same function, arguments and shardings, jax's in-process
caches return the step fit already compiled, so reading the costs after fit costs about a
millisecond instead of a compile.

Nothing is executed: the step is lowered and compiled only, so the donated state (the model's own
variable arrays) is never consumed and the model stays usable.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

import jax
import keras
import numpy as np

from meshrun.compat.keras.jax_trainer import distribute_data, state_shardings, training_state
from meshrun.pipeline.counting import blocks_in_turn
from meshrun.pipeline.stack import holds_pipelined_blocks


@dataclass(frozen=True)
class StepCosts:
    """What XLA reports about one train step; None wherever XLA reports nothing.

    `peak_bytes_per_device` is the compiled estimate argument + output + temp - alias: inputs and
    outputs live at once except where an output reuses a donated input's buffer (alias), plus the
    step's scratch (temp). It leaves out generated code and anything held outside the step.
    """

    flops_per_step: (
        float | None
    )  # global, from the lowered (unpartitioned) HLO; pipelined blocks counted in turn
    flops_per_step_per_device: (
        float | None
    )  # from the compiled (partitioned) executable; None for pipelined blocks
    bubble_flops_per_step: (
        float | None
    )  # what pipeline stages compute on their bubble ticks besides (None: no stages)
    argument_bytes: int | None  # compiled.memory_analysis(), per device
    output_bytes: int | None
    temp_bytes: int | None
    alias_bytes: int | None
    generated_code_bytes: int | None
    peak_bytes_per_device: int | None
    seconds: float  # lowering + compile + analysis

    @classmethod
    def unknown(cls) -> StepCosts:
        """The costs of a step not analysed (a run stopped by a signal has no time to spare)."""
        return cls(None, None, None, None, None, None, None, None, None, 0.0)


def train_step_costs(model, batch) -> StepCosts:
    """XLA's FLOPs and memory figures for one step of `model.fit` on `batch`, one batch as this
    process feeds it ((x, y) numpy arrays; x may be a dict; with several processes, this
    process's share of the global batch), read after fit under the distribution still in force.
    The model's variables are left as they are.

    XLA counts a loop's body once, however many times it runs: a model with pipelined blocks (whose
    schedule is loops) is counted from a second lowering with its blocks run in turn, unrolled
    (meshrun.pipeline.counting): the same model's FLOPs with separate blocks, plus apart what its
    schedule computes on the bubble ticks. Its compiled per-device count is left out (None)."""
    if getattr(keras.config, "is_nnx_enabled", lambda: False)():
        raise RuntimeError("meshrun.run.costs does not support Keras' Flax NNX mode")
    if getattr(model, "train_function", None) is None:
        raise ValueError("train_step_costs needs a model that has been trained with fit()")
    if model.run_eagerly or not model.jit_compile:
        raise ValueError("the model runs its train step eagerly: no compiled step to analyse")

    start = time.perf_counter()
    out_shardings = None
    if keras.distribution.distribution() is not None:
        out_shardings = (None, state_shardings(model))
    step = jax.jit(model.train_step, donate_argnums=0, out_shardings=out_shardings)
    state = training_state(model)
    data = distribute_data(keras.tree.map_structure(_as_fit_feeds_it, tuple(batch)))
    lowered = step.lower(state, data)
    compiled = lowered.compile()

    if holds_pipelined_blocks(model):
        (flops, bubble), per_device = _pipelined_flops(model, state, data), None
    else:
        flops, per_device, bubble = (
            _flops(_analysis(lowered.cost_analysis)),
            _flops(_analysis(compiled.cost_analysis)),
            None,
        )
    memory = _analysis(compiled.memory_analysis)
    sizes = {
        field: _bytes(memory, f"{field}_size_in_bytes")
        for field in ("argument", "output", "temp", "alias", "generated_code")
    }
    parts = (sizes["argument"], sizes["output"], sizes["temp"], sizes["alias"])
    peak = None if None in parts else parts[0] + parts[1] + parts[2] - parts[3]
    return StepCosts(
        flops_per_step=flops,
        flops_per_step_per_device=per_device,
        bubble_flops_per_step=bubble,
        argument_bytes=sizes["argument"],
        output_bytes=sizes["output"],
        temp_bytes=sizes["temp"],
        alias_bytes=sizes["alias"],
        generated_code_bytes=sizes["generated_code"],
        peak_bytes_per_device=peak,
        seconds=time.perf_counter() - start,
    )


def _pipelined_flops(model, state, data) -> tuple[float | None, float | None]:
    """The FLOPs of one step of `model`, whose blocks run as pipeline stages, with its blocks
    counted in turn (as separate blocks run), and what the schedules compute on their bubble ticks
    besides (None without stages of more than one device)."""
    with blocks_in_turn() as bubbles:
        # A function of its own: jit's trace cache would give back the trace of the schedule fit made.
        lowered = jax.jit(lambda state, data: model.train_step(state, data)).lower(state, data)
    flops = _flops(_analysis(lowered.cost_analysis))
    if not bubbles:
        return flops, None
    extra = [
        _flops(_analysis(jax.jit(work.forward_and_backward).lower(*work.args).cost_analysis))
        for work in bubbles
    ]
    return flops, None if None in extra else sum(
        work.share * count for work, count in zip(bubbles, extra, strict=True)
    )


def live_peak_bytes(devices) -> int | None:
    """The most memory any of `devices` has held at once so far ("peak_bytes_in_use"), where the
    platform reports it (GPU, TPU); None where none does (CPU)."""
    peaks = []
    for device in devices:
        stats = device.memory_stats()
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None


def _as_fit_feeds_it(array):
    """`array` as fit would feed it: floats in Keras' floatx (fit casts float64 input), so the
    traced step matches fit's and its compiled executable is reused."""
    if array is None:
        return None
    array = np.asarray(array)
    if np.issubdtype(array.dtype, np.floating) and array.dtype != np.dtype(keras.config.floatx()):
        return array.astype(keras.config.floatx())
    return array


def _analysis(read):
    """The result of one of XLA's analyses, or None where the platform does not implement it."""
    try:
        result = read()
    except NotImplementedError:
        return None
    # Older jax returned a list with one entry per executable.
    if isinstance(result, (list, tuple)):
        result = result[0] if result else None
    return result


def _flops(analysis) -> float | None:
    """The "flops" entry of a cost analysis; None if absent or negative (XLA's "unknown")."""
    if not analysis or analysis.get("flops") is None:
        return None
    flops = float(analysis["flops"])
    return flops if flops >= 0 else None


def _bytes(memory, name: str) -> int | None:
    """One size field of a memory analysis as an int; None if absent or negative."""
    value = getattr(memory, name, None) if memory is not None else None
    return int(value) if value is not None and value >= 0 else None
