"""log.jsonl: the step log every run writes."""

from __future__ import annotations

import json
from pathlib import Path

from meshrun.logs.sinks import SinkSpec, keep_records_up_to, register_sink
from meshrun.specs.rundir import LOG_FILE


class JsonLines:
    """log.jsonl: one JSON object per step and per epoch, in order, each step once: a run resumed
    from the checkpoint of step `first_step` continues the log after that step's records."""

    kind = "jsonl"

    def __init__(self, run_dir: Path, first_step: int = 0):
        self.path = run_dir / LOG_FILE
        run_dir.mkdir(parents=True, exist_ok=True)
        keep_records_up_to(self.path, first_step, _step_of)
        self._file = open(self.path, "a", buffering=1 << 16)

    def step(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")

    def epoch(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


def _step_of(line: str) -> int | None:
    try:
        record = json.loads(line)
    except ValueError:
        return None
    return record.get("step") if isinstance(record, dict) else None


register_sink(
    SinkSpec(
        "jsonl", JsonLines, "log.jsonl in the run dir: one JSON object per step and per epoch", always=True
    )
)
