"""What a log sink declares to meshrun (SinkSpec), what an open sink does (Sink), and which module
registers each sink name (SINKS). A sink takes step records and epoch records (plain dicts of
numbers, see `meshrun.training.steplog.StepLog`) and must be cheap per step: the step log writes
between training steps. A new sink is a module of meshrun.logs.sinks that calls
`register_sink(SinkSpec(...))`, and a line in SINKS; its name is its `logging.<name>=true` switch."""

from __future__ import annotations

from collections.abc import Callable
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
    """A registered sink: its name (its `logging.<name>` switch), how to open it in a run dir for a
    run that starts after a given global step (0: a fresh start; a resumed run's checkpoint step:
    what the sink holds of later steps is dropped, so that every step is logged once), what it
    writes, and whether every run writes it (no switch then)."""

    name: str
    open: Callable[[Path, int], Sink]
    description: str
    always: bool = False


SINKS: Registry[SinkSpec] = Registry(
    "log sink",
    {
        "csv": "meshrun.logs.sinks.csv_files",
        "jsonl": "meshrun.logs.sinks.jsonl",
        "tensorboard": "meshrun.logs.sinks.tensorboard_events",
    },
)


def switch_names() -> list[str]:
    """The sinks a run writes only when switched on, by name (the keys of the logging section)."""
    return [spec.name for spec in SINKS.all() if not spec.always]
