"""Where the step log goes. A sink takes step records and epoch records (plain dicts of numbers, see
`meshrun.logs.steplog.StepLog`) and must be cheap per step: the step log writes between training
steps. Each sink is a module of this package that registers a SinkSpec: its name, which is also its
switch (`logging.<name>=true`; a sink marked `always` is written by every run), and how to open it
in a run dir. A new sink is one more module here: importing this package imports every module in
it, and meshrun.app makes a `logging.<name>` switch for every registered sink."""

from __future__ import annotations

import importlib
import pkgutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from meshrun.registry import Registry


class Sink(Protocol):
    """An open sink of one run: what `kind` it is, where it writes (a file or a dir) and how it
    takes records."""

    kind: str
    path: Path

    def step(self, record: dict) -> None:
        """Takes the record of one training step."""

    def epoch(self, record: dict) -> None:
        """Takes the record of one epoch (and makes what it wrote so far readable)."""

    def close(self) -> None:
        """Writes what is left and releases the file."""

    # Optional: more_files() -> {name: Path}, the files it wrote besides `path` (see files_written).


@dataclass(frozen=True)
class SinkSpec:
    """A registered sink: its name (its `logging.<name>` switch), how to open it in a run dir, what
    it writes, and whether every run writes it (no switch then)."""

    name: str
    open: Callable[[Path], Sink]
    description: str
    always: bool = False


_REGISTRY: Registry[SinkSpec] = Registry("log sink")
register_sink = _REGISTRY.register


def switch_names() -> list[str]:
    """The sinks a run writes only when switched on, by name (the keys of the logging section)."""
    return [name for name in _REGISTRY.names() if not _REGISTRY.get(name).always]


def open_sinks(run_dir: Path, switched_on: Iterable[str] = ()) -> list[Sink]:
    """Opens the sinks a run writes in `run_dir`: those always written, then those switched on."""
    wanted = set(switched_on)
    specs = [_REGISTRY.get(name) for name in _REGISTRY.names()]
    return [spec.open(run_dir) for spec in sorted(specs, key=lambda s: not s.always) if spec.always or spec.name in wanted]


def files_written(sink: Sink) -> dict[str, Path]:
    """Where `sink` wrote, as metrics.json's `logs` names it: `path` under the sink's kind, and the
    other files of a sink that writes several (`more_files()`)."""
    more = sink.more_files() if hasattr(sink, "more_files") else {}
    return {sink.kind: sink.path, **more}


def _register_all() -> None:
    """Imports every sink module of this package; each registers its sink."""
    for module in pkgutil.iter_modules(__path__):
        importlib.import_module(f"{__name__}.{module.name}")


_register_all()
