"""What a quantized base (model.quantize) is made of, as records the plan and layouts read: the
modes meshrun quantizes with, what a model's options ask for (Quantization, the answer of a
ModelSpec's `quantization` hook), and for each variable of a quantized layer the float kernel it
stands for (meshrun.quantize fills them; meshrun.placement.quantized lays them out)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from meshrun.errors import ConfigError
from meshrun.wording import one_of

ROWS, COLUMNS = "rows", "columns"


@dataclass(frozen=True)
class QuantizedOf:
    """A variable of a quantized layer: the path and shape of the float kernel it stands for
    (the one rules are written for), its `role` (kernel, scale, zero, index), and what each of its
    dimensions holds: a float kernel axis (its index), ROWS or COLUMNS of int4's row-major reshape
    of the float kernel to `rows` x (the rest), or None (a dimension of size 1, blocks of rows).
    `packed`: its COLUMNS dimension holds two columns a byte (int4's kernel)."""

    kernel: str
    float_shape: tuple[int, ...]
    role: str
    holds: tuple[int | str | None, ...]
    rows: int | None = None
    packed: bool = False

    @property
    def packs(self) -> str | None:
        """What a packed kernel's bytes hold, two values a byte: "int4" (the one mode that packs);
        None for any other variable."""
        return "int4" if self.packed else None


QUANTIZE_MODES = ("int8", "int4")  # model.quantize (meshrun.quantize)


@dataclass(frozen=True)
class Quantization:
    """The quantized base a model's options ask for (model.quantize): its `mode`, one of
    QUANTIZE_MODES, and `float_options`, the options of the float model it is made from (the same
    model with a float base), which the run evaluates beside it (train.eval_float_base)."""

    mode: str
    float_options: Any


def check_quantize_mode(mode) -> None:
    """ConfigError on model.quantize unless it is null or one of QUANTIZE_MODES."""
    if mode is not None and mode not in QUANTIZE_MODES:
        hint = (
            " (Keras' GPTQ, AWQ and float8 modes need calibration or train differently)"
            if mode in ("gptq", "awq", "float8")
            else ""
        )
        raise ConfigError(
            "model.quantize", f"got {mode!r}{hint}; valid: {one_of(QUANTIZE_MODES)}, or null for a float base"
        )
