"""logging.csv: the step log as CSV files in the run dir."""

from __future__ import annotations

import csv
import io
from pathlib import Path

from meshrun.files import write_atomic
from meshrun.logs.sinks import SinkSpec, keep_records_up_to, register_sink
from meshrun.specs.rundir import EPOCHS_CSV, STEPS_CSV


class Csv:
    """steps.csv (a row per step; columns fixed by the first step) and epochs.csv (a row per epoch;
    rewritten whole at each epoch end, so columns that appear later, such as val_loss with
    train.eval_every=2, are never lost). A run resumed from the checkpoint of step `first_step`
    continues both after that step's rows."""

    kind = "csv"

    def __init__(self, run_dir: Path, first_step: int = 0):
        self.path = run_dir / STEPS_CSV
        self.epochs_path = run_dir / EPOCHS_CSV
        run_dir.mkdir(parents=True, exist_ok=True)
        keep_records_up_to(self.path, first_step, _step_of, header=True)
        self._file = open(self.path, "a", newline="", buffering=1 << 16)
        self._writer = None
        self._epochs: list[dict] = [
            row for row in _read_rows(self.epochs_path) if int(float(row["step"])) <= first_step
        ]
        if self.epochs_path.is_file():
            self._write_epochs()

    def step(self, record: dict) -> None:
        if self._writer is None:
            self._writer = csv.DictWriter(self._file, fieldnames=list(record), extrasaction="ignore")
            if self._file.tell() == 0:
                self._writer.writeheader()
        self._writer.writerow(record)

    def epoch(self, record: dict) -> None:
        self._epochs.append(record)
        self._write_epochs()
        self._file.flush()

    def _write_epochs(self) -> None:
        columns = list(dict.fromkeys(key for row in self._epochs for key in row))
        text = io.StringIO()
        writer = csv.DictWriter(text, fieldnames=columns)
        writer.writeheader()
        writer.writerows(self._epochs)
        write_atomic(self.epochs_path, text.getvalue().encode())

    def more_files(self) -> dict[str, Path]:
        """epochs.csv once an epoch has ended (metrics.json's logs.epochs_csv)."""
        return {"epochs_csv": self.epochs_path} if self.epochs_path.is_file() else {}

    def close(self) -> None:
        self._file.close()


def _step_of(line: str) -> int | None:
    """The step of a row of steps.csv (its first column), None for a row cut short."""
    try:
        return int(line.partition(",")[0])
    except ValueError:
        return None


def _read_rows(path: Path) -> list[dict]:
    if not path.is_file():
        return []
    with open(path, newline="") as file:
        return [{k: v for k, v in row.items() if v != ""} for row in csv.DictReader(file)]


register_sink(
    SinkSpec("csv", Csv, "steps.csv (a row per step) and epochs.csv (a row per epoch) in the run dir")
)
