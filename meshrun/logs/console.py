"""How a run's log records look on the console: meshrun's own lines at INFO and up, other
libraries' only from WARNING up (their INFO lines still go to the run's train.log), each line
labelled with the logger it came from and warnings marked as such. Hydra's job logging config
(configs/meshrun.yaml) installs these."""

from __future__ import annotations

import logging
import sys

OWN_LOGGER = "meshrun"


class ConsoleFilter(logging.Filter):
    """Passes meshrun's records, and other loggers' records of WARNING and above."""

    def filter(self, record: logging.LogRecord) -> bool:
        own = record.name == OWN_LOGGER or record.name.startswith(OWN_LOGGER + ".")
        return own or record.levelno >= logging.WARNING


class LineFormatter(logging.Formatter):
    """`[HH:MM:SS][logger] message`, with `warning: ` or `error: ` before the message of records
    of those levels."""

    def __init__(
        self, fmt=None, datefmt=None, **_
    ) -> None:  # Hydra's default passes its own format; ours is fixed
        super().__init__("%(message)s")

    def format(self, record: logging.LogRecord) -> str:
        level = f"{record.levelname.lower()}: " if record.levelno >= logging.WARNING else ""
        return f"[{self.formatTime(record, '%H:%M:%S')}][{record.name}] {level}{super().format(record)}"


class _StderrHandler(logging.StreamHandler):
    """Writes records in meshrun's line format to sys.stderr as it is at each record (tests swap
    it), so that it keeps working after Hydra's logging set-up closes every handler."""

    def __init__(self) -> None:
        super().__init__()
        self.setFormatter(LineFormatter())

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _) -> None:
        pass


def library_lines(name: str) -> None:
    """Sets library `name`'s logger apart from whatever logging config is in force: its warnings
    on stderr as `[HH:MM:SS][name] warning: ...`, its INFO lines dropped. A multirun compares its
    jobs under Hydra's own logging config, which would print them tagged `[HYDRA]`, INFO included
    (matplotlib's `generated new fontManager` on its first use)."""
    logger = logging.getLogger(name)
    logger.setLevel(logging.WARNING)
    logger.propagate = False
    if not any(isinstance(h, _StderrHandler) for h in logger.handlers):
        logger.addHandler(_StderrHandler())
