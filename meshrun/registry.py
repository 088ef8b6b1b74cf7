"""A name -> spec registry, the pattern models and data sources share: each module registers its
spec at import, and a second spec under one name is a programming error."""

from __future__ import annotations

from typing import Generic, TypeVar

Spec = TypeVar("Spec")


class Registry(Generic[Spec]):
    """Specs (anything with a `name`) of one kind, by name."""

    def __init__(self, kind: str):
        self.kind = kind
        self._specs: dict[str, Spec] = {}

    def register(self, spec: Spec) -> Spec:
        """Adds `spec`; raises ValueError when its name is taken."""
        if spec.name in self._specs:
            raise ValueError(f"{self.kind} {spec.name!r} is registered twice")
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> Spec:
        """The spec registered under `name` (KeyError if none)."""
        return self._specs[name]

    def names(self) -> list[str]:
        """Every registered name, sorted."""
        return sorted(self._specs)
