"""Where the step log goes: the sinks (log.jsonl always; CSV and TensorBoard when switched on with
`logging.<name>=true`). Each sink is a module of this package that registers a SinkSpec
(meshrun.specs.sinks: its name, which is also its switch, and how to open it in a run dir);
meshrun.hydra_sources makes a `logging.<name>` switch for every sink in the table,
meshrun.specs.sinks.SINKS."""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from meshrun.files import write_atomic
from meshrun.specs.sinks import SINKS, Sink, SinkSpec, switch_names

__all__ = [
    "Sink",
    "SinkSpec",
    "files_written",
    "keep_records_up_to",
    "open_sinks",
    "register_sink",
    "switch_names",
]

register_sink = SINKS.register


def open_sinks(run_dir: Path, switched_on: Iterable[str] = (), first_step: int = 0) -> list[Sink]:
    """Opens the sinks a run writes in `run_dir`: those always written, then those switched on; the
    run starts after global step `first_step` (a resumed run: its checkpoint's step)."""
    wanted = set(switched_on)
    return [
        spec.open(run_dir, first_step)
        for spec in sorted(SINKS.all(), key=lambda s: not s.always)
        if spec.always or spec.name in wanted
    ]


def keep_records_up_to(path: Path, first_step: int, step_of, header: bool = False) -> None:
    """Rewrites the log file at `path` (if any) with its records (a line each) of steps up to
    `first_step`, after its header line where it has one (kept with any record); `step_of(line)` is
    a record's global step, None for a line that is not a whole record. A resumed run logs the
    steps after its checkpoint again, and a kill may have cut the last line short."""
    if not path.is_file():
        return
    lines = path.read_text().splitlines(keepends=True)
    head, records = (lines[:1], lines[1:]) if header else ([], lines)

    def kept(line: str) -> bool:
        step = step_of(line) if line.endswith("\n") else None
        return step is not None and step <= first_step

    records = [line for line in records if kept(line)]
    write_atomic(path, "".join((head if records else []) + records).encode())


def files_written(sink: Sink) -> dict[str, Path]:
    """Where `sink` wrote, as metrics.json's `logs` names it: `path` under the sink's kind, and the
    other files of a sink that writes several (`more_files()`)."""
    more = sink.more_files() if hasattr(sink, "more_files") else {}
    return {sink.kind: sink.path, **more}
