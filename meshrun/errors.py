"""The errors meshrun reports to users as one line, and the helpers that word them."""

from __future__ import annotations

import difflib
from collections.abc import Iterable


class ConfigError(Exception):
    """A bad config value, found before training: the CLI prints it as one line and exits 2.

    `key` is the dotted config key at fault; the message says what was received and what is valid.
    """

    def __init__(self, key: str, message: str):
        super().__init__(f"{key}: {message}")
        self.key = key


class RunFailed(Exception):
    """Training started but failed; the run dir holds metrics.json (status: error) and the log."""


def closest(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates most like `word`, ignoring case, best first (empty when none is close)."""
    by_lower = {str(c).lower(): c for c in candidates}
    return [by_lower[c] for c in difflib.get_close_matches(word.lower(), list(by_lower), n=n, cutoff=0.6)]


def one_of(candidates: Iterable[str]) -> str:
    """Words a list of valid values for an error message: `a, b or c`."""
    items = [str(c) for c in candidates]
    if not items:
        return "(none)"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]


def first_line(err: BaseException) -> str:
    """The first line of an exception's message (empty when it has none)."""
    text = str(err).strip()
    return text.splitlines()[0].strip() if text else ""


def shape_text(shape) -> str:
    """A shape as error messages write it: (?, 32), ? for a size left open."""
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"
