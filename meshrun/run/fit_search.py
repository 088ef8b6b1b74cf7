"""The largest global batch, or sequence length, whose train step fits one device's memory
(`meshrun plan --fit batch|seq_len`): the step compiled on abstract inputs for each size tried
(meshrun.run.step_memory), doubling from the configured size while it fits, then halving the gap
to the first size that does not. A step's peak grows with both, so the search is exact on the sizes
it may pick: multiples of the batch axis (the batch splits evenly over it), and for the sequence
length multiples of 8 (fewer compiles; a model's own limit still applies).

Importing this module imports jax and keras: call `meshrun.placement.devices.prepare` first.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from dataclasses import dataclass

from meshrun.config.schema import RunConfig
from meshrun.errors import ConfigError
from meshrun.run import step_memory
from meshrun.wording import format_bytes

SEQ_LEN_STEP = 8
MAX_DOUBLINGS = 16  # at most 2**16 times the configured size


@dataclass(frozen=True)
class FitFound:
    """The largest size of `key` (train.batch_size or model.seq_len) whose step peak fits `memory`
    bytes, that peak, the next size up and its peak (None: it was not tried, the search stopped at
    its bound), every size compiled and its peak, and the seconds the search took."""

    key: str
    value: int
    peak_bytes: int
    memory_bytes: int
    larger: int | None
    larger_peak_bytes: int | None
    tried: tuple[tuple[int, int], ...]
    seconds: float

    def to_dict(self) -> dict:
        return {
            "key": self.key,
            "value": self.value,
            "step_peak_bytes_per_device": self.peak_bytes,
            "device_memory_bytes": self.memory_bytes,
            "larger": self.larger,
            "larger_step_peak_bytes_per_device": self.larger_peak_bytes,
            "tried": [list(pair) for pair in self.tried],
            "seconds": round(self.seconds, 3),
        }

    def line(self) -> str:
        """What the search found, in one line."""
        found = (
            f"largest {self.key} that fits: {self.value} (step peak {format_bytes(self.peak_bytes)} "
            f"of {format_bytes(self.memory_bytes)} per device)"
        )
        if self.larger is not None:
            found += f"; {self.larger} needs {format_bytes(self.larger_peak_bytes)}"
        return f"{found}; {len(self.tried)} compiles, {self.seconds:.1f} s"


def largest_fitting(config: RunConfig, planned, loss_function: str, devices, target: str, place) -> FitFound:
    """The largest train.batch_size (target "batch") or model.seq_len ("seq_len") whose train step
    fits the plan's device memory on `devices`; `place(config)` plans a config whose model changed
    shape (meshrun.run.prepare.place on the plan's mesh). ConfigError when even the smallest size
    does not fit."""
    start = time.perf_counter()
    memory = planned.plan.memory.bytes
    key, unit, current, sized = _target(config, planned, target)
    peaks: dict[int, int] = {}
    invalid: set[int] = set()  # sizes the model does not take (beyond its longest sequence)

    def fits(units: int) -> bool:
        if units in invalid:
            return False
        if units not in peaks:
            resized = sized(units * unit)
            try:
                replanned = planned if target == "batch" or resized is config else place(resized)
            except ConfigError:
                invalid.add(units)
                return False
            peaks[units] = step_memory.step_memory(
                resized, replanned, loss_function, devices
            ).step_peak_bytes_per_device
        return peaks[units] <= memory

    best = _largest(fits, max(current // unit, 1))
    if best == 0:
        if 1 not in peaks:
            raise ConfigError(
                "--fit",
                f"got {target!r} but {planned.spec.name_of(config.model.options)} takes no {key}={unit}",
            )
        recompute = " or recompute activations (train.remat=blocks)" if config.train.remat == "none" else ""
        raise ConfigError(
            "devices.memory_gib",
            f"not even {key}={unit} fits: its train step needs {format_bytes(peaks[1])} per device, "
            f"more than the {format_bytes(memory)} of one device ({planned.plan.memory.source}); "
            f"shard more{recompute}",
        )
    larger = min((units for units in peaks if units > best), default=None)
    return FitFound(
        key=key,
        value=best * unit,
        peak_bytes=peaks[best],
        memory_bytes=memory,
        larger=None if larger is None else larger * unit,
        larger_peak_bytes=None if larger is None else peaks[larger],
        tried=tuple(sorted((units * unit, peak) for units, peak in peaks.items())),
        seconds=time.perf_counter() - start,
    )


def _largest(fits: Callable[[int], bool], start: int) -> int:
    """The largest n >= 1 with fits(n), fits being monotonic (true up to some n, false after);
    0 when fits(1) is false. Doubles from `start` while it fits, then bisects."""
    if fits(start):
        low, high = start, None
        for _ in range(MAX_DOUBLINGS):
            if not fits(low * 2):
                high = low * 2
                break
            low *= 2
        if high is None:
            return low
    else:
        low, high = 0, start
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if fits(middle) else (low, middle)
    return low


def _target(config: RunConfig, planned, target: str):
    """For `target`: the key it sets, the unit its sizes are multiples of, the configured size, and
    a function giving the config with another size (the same config for the configured one)."""
    if target == "batch":
        unit = planned.plan.mesh.axis_size(planned.plan.mesh.batch_axis)

        def with_batch(size: int) -> RunConfig:
            if size == config.train.batch_size:
                return config
            return dataclasses.replace(config, train=dataclasses.replace(config.train, batch_size=size))

        return "train.batch_size", unit, config.train.batch_size, with_batch
    options = config.model.options
    if not dataclasses.is_dataclass(options) or not hasattr(options, "seq_len") or options.seq_len is None:
        raise ConfigError(
            "--fit",
            f"got 'seq_len' for {planned.spec.name_of(options)}, which has no model.seq_len to vary; "
            "valid for it: batch",
        )

    def with_seq_len(size: int) -> RunConfig:
        if size == options.seq_len:
            return config
        model = dataclasses.replace(config.model, options=dataclasses.replace(options, seq_len=size))
        return dataclasses.replace(config, model=model)

    return "model.seq_len", SEQ_LEN_STEP, options.seq_len, with_seq_len
