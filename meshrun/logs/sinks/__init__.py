"""Where the step log goes: the sinks (log.jsonl always; CSV and TensorBoard when switched on with
`logging.<name>=true`). Each sink is a module of this package that registers a SinkSpec
(meshrun.specs.sinks: its name, which is also its switch, and how to open it in a run dir);
meshrun.app makes a `logging.<name>` switch for every sink in the table, meshrun.specs.sinks.SINKS."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from meshrun.specs.sinks import SINKS, Sink, SinkSpec, switch_names

__all__ = ["Sink", "SinkSpec", "files_written", "open_sinks", "register_sink", "switch_names"]

register_sink = SINKS.register


def open_sinks(run_dir: Path, switched_on: Iterable[str] = ()) -> list[Sink]:
    """Opens the sinks a run writes in `run_dir`: those always written, then those switched on."""
    wanted = set(switched_on)
    return [spec.open(run_dir) for spec in sorted(SINKS.all(), key=lambda s: not s.always) if spec.always or spec.name in wanted]


def files_written(sink: Sink) -> dict[str, Path]:
    """Where `sink` wrote, as metrics.json's `logs` names it: `path` under the sink's kind, and the
    other files of a sink that writes several (`more_files()`)."""
    more = sink.more_files() if hasattr(sink, "more_files") else {}
    return {sink.kind: sink.path, **more}

