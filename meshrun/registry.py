"""A name -> spec registry that loads its plugins itself, the pattern models, data sources and log
sinks share. The registry knows each name's module (a table in meshrun.specs); asking for a name
imports that module alone, which registers its spec. So composing a config imports the chosen
components and no others, and a second spec under one name, or a spec the table does not name, is
a programming error."""

from __future__ import annotations

import importlib
from collections.abc import Mapping
from typing import Generic, TypeVar

Spec = TypeVar("Spec")


class Registry(Generic[Spec]):
    """Specs (anything with a `name`) of one kind, by name, each loaded on first use from the
    module `modules[name]`."""

    def __init__(self, kind: str, modules: Mapping[str, str]):
        self.kind = kind
        self.modules = dict(modules)
        self._specs: dict[str, Spec] = {}

    def register(self, spec: Spec) -> Spec:
        """Adds `spec`; raises ValueError when its name is taken or not in the table of modules."""
        if spec.name not in self.modules:
            raise ValueError(
                f"{self.kind} {spec.name!r} is not in the table of {self.kind}s; add it beside the others"
            )
        if spec.name in self._specs:
            raise ValueError(f"{self.kind} {spec.name!r} is registered twice")
        self._specs[spec.name] = spec
        return spec

    def get(self, name: str) -> Spec:
        """The spec registered under `name`, importing its module the first time (KeyError if none)."""
        if name not in self._specs:
            importlib.import_module(self.modules[name])
        return self._specs[name]

    def names(self) -> list[str]:
        """Every name in the table, sorted (nothing is imported)."""
        return sorted(self.modules)

    def all(self) -> list[Spec]:
        """Every spec, sorted by name (imports every module of the table)."""
        return [self.get(name) for name in self.names()]
