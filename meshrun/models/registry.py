"""The model registry: each model module registers its ModelSpec (meshrun.specs.model) under a name
at import time, and `get_model(name)` imports the module of that name alone (the table is
meshrun.specs.model.MODELS). Helpers the model modules share are here too.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from meshrun.specs.model import MODELS, SYNTHETIC_FAMILIES, InputSpec, ModelSpec
from meshrun.specs.quantized import Quantization
from meshrun.wording import one_of

get_model = MODELS.get
model_names = MODELS.names

__all__ = [
    "InputSpec",
    "ModelSpec",
    "class_accuracy",
    "fill_from_preset",
    "get_model",
    "model_names",
    "register_model",
    "require_positive",
    "zoo_model_names",
]


def register_model(spec: ModelSpec) -> ModelSpec:
    """Adds `spec` to the registry and returns it; raises ValueError, as the registry does for a
    name it has no module for, when its `data` names no synthetic data family."""
    if spec.data not in SYNTHETIC_FAMILIES:
        raise ValueError(
            f"model {spec.name!r}: data={spec.data!r} is not a synthetic data family "
            f"(meshrun.data.synthetic.FAMILIES); valid: {one_of(sorted(SYNTHETIC_FAMILIES))}"
        )
    return MODELS.register(spec)


def zoo_model_names() -> list[str]:
    """The names of meshrun's own models (not the specs that build the user's)."""
    return [name for name in model_names() if get_model(name).zoo]


def fill_from_preset(options, presets: dict[str, dict[str, Any]]) -> None:
    """For an options dataclass with a `preset` field: sets every field left at None to the
    preset's value (options are frozen, so this runs in __post_init__). Unknown preset names are
    a ConfigError on `model.preset`."""
    from meshrun.errors import ConfigError
    from meshrun.wording import did_you_mean, one_of

    if options.preset not in presets:
        raise ConfigError(
            "model.preset",
            f"got {options.preset!r}; {did_you_mean(options.preset, presets)}valid: {one_of(presets)}",
        )
    for key, value in presets[options.preset].items():
        if getattr(options, key) is None:
            object.__setattr__(options, key, value)


def class_accuracy(options) -> list:
    """ModelSpec.metrics of a model predicting class logits for integer labels: their accuracy."""
    import keras

    return [keras.metrics.SparseCategoricalAccuracy(name="accuracy")]


def require_positive(options, *names: str) -> None:
    """ConfigError on `model.<name>` for the first of `names` that is not a positive number."""
    from meshrun.errors import ConfigError

    for name in names:
        value = getattr(options, name)
        if value <= 0:
            raise ConfigError(f"model.{name}", f"got {value}; expected a positive integer")


def quantize_option(options) -> Quantization | None:
    """ModelSpec.quantization for options with a `quantize` field (model.quantize): its mode, and the
    same options with quantize=None for the float model it is made from; None for a float base."""
    if options.quantize is None:
        return None
    return Quantization(options.quantize, dataclasses.replace(options, quantize=None))
