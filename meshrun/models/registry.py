"""The model registry: each model module registers a ModelSpec under a name at import time.

A spec carries the model's options dataclass (its configurable sizes, checked by meshrun.schema),
a `build(options)` function that imports keras only when called, and the names of the layout
configs (under configs/layout/) written for it, the first being its default.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_MODELS: dict[str, "ModelSpec"] = {}


@dataclass(frozen=True)
class ModelSpec:
    """A registered model: how to configure it, build it, and which layouts fit it."""

    name: str
    options: type
    build: Callable[[Any], Any]
    layouts: tuple[str, ...] = ()
    description: str = ""


def register_model(spec: ModelSpec) -> ModelSpec:
    """Adds a model to the registry; a second model of the same name is a programming error."""
    if spec.name in _MODELS:
        raise ValueError(f"model {spec.name!r} is registered twice")
    _MODELS[spec.name] = spec
    return spec


def get_model(name: str) -> ModelSpec:
    """The spec registered under `name` (KeyError if none)."""
    return _MODELS[name]


def model_names() -> list[str]:
    """Names of every registered model, sorted."""
    return sorted(_MODELS)
