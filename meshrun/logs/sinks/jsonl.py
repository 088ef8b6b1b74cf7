"""log.jsonl: the step log every run writes."""

from __future__ import annotations

import json
from pathlib import Path

from meshrun.logs.sinks import SinkSpec, register_sink
from meshrun.specs.rundir import LOG_FILE


class JsonLines:
    """log.jsonl: one JSON object per step and per epoch, appended (a resumed run continues it)."""

    kind = "jsonl"

    def __init__(self, run_dir: Path):
        self.path = run_dir / LOG_FILE
        run_dir.mkdir(parents=True, exist_ok=True)
        self._file = open(self.path, "a", buffering=1 << 16)

    def step(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")

    def epoch(self, record: dict) -> None:
        self._file.write(json.dumps(record) + "\n")
        self._file.flush()

    def close(self) -> None:
        self._file.close()


register_sink(SinkSpec("jsonl", JsonLines, "log.jsonl in the run dir: one JSON object per step and per epoch", always=True))
