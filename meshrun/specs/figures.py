"""How a run's summary table is drawn from metrics.json's fields: `figure(row, text)` declares a
field of meshrun.specs.metrics together with the row it shows in and how it reads there, and
`summary_rows` gathers a run's rows in the order SUMMARY_ROWS gives (a row not listed there comes
after those). The texts that need code are in meshrun.specs.figure_text; meshrun.report.render puts
the rows into a table.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from meshrun.specs.jsondata import FLATTEN, OMIT_IF_NONE

SUMMARY_ROWS = (
    "status",
    "mesh",
    "devices",
    "model",
    "batch",
    "optimizer",
    "start-up",
    "compile",
    "step time",
    "throughput",
    "flops",
    "memory",
    "epochs",
    "loss",
    "validation",
    "eval",
    "samples",
    "stopped",
    "wall",
    "run dir",
    "logs",
    "export",
    "profile",
)


@dataclass(frozen=True)
class Shown:
    """Where the summary table shows a figure: its row, how it reads (a format string for the value,
    which leaves out a value of None, or a function (value, section) -> text or None), and what joins
    it to the figure before it in that row."""

    row: str
    text: str | Callable[[Any, Any], str | None] = "{}"
    join: str = ", "

    def render(self, value, section) -> str | None:
        """The text of this figure, or None when it says nothing."""
        if callable(self.text):
            return self.text(value, section)
        return None if value is None else self.text.format(value)


def figure(
    row: str | None = None,
    text: str | Callable = "{}",
    join: str = ", ",
    *,
    also: tuple[Shown, ...] = (),
    flatten: bool = False,
    omit_if_none: bool = False,
):
    """A field of metrics.json (None until set), shown in summary row `row` when one is given (and
    in the rows of `also`); `flatten` and `omit_if_none` mark how it is written (meshrun.specs.jsondata)."""
    shown = ((Shown(row, text, join),) if row else ()) + also
    return field(default=None, metadata={"shown": shown, FLATTEN: flatten, OMIT_IF_NONE: omit_if_none})


def summary_rows(metrics) -> list[tuple[str, str]]:
    """The rows of a run's summary table, (row, text), ordered as SUMMARY_ROWS. A field of the run
    itself reads with the run as its section; a field of a section, with that section."""
    parts: dict[str, list[tuple[str, str]]] = {}
    _collect_shown(metrics, metrics, parts)
    order = {row: index for index, row in enumerate(SUMMARY_ROWS)}
    rows = sorted(parts, key=lambda row: order.get(row, len(order)))
    return [(row, _joined(parts[row])) for row in rows]


def _collect_shown(section, metrics, parts: dict) -> None:
    """Adds the text of every figure of `section` and of the sections inside it to `parts`, by row."""
    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        for shown in f.metadata.get("shown", ()):
            text = shown.render(value, metrics if section is metrics else section)
            if text is not None:
                parts.setdefault(shown.row, []).append((shown.join, text))
        if dataclasses.is_dataclass(value):
            _collect_shown(value, metrics, parts)


def _joined(parts: list[tuple[str, str]]) -> str:
    """The texts of one row, each joined to the one before it by its own separator."""
    text = parts[0][1]
    for join, more in parts[1:]:
        text += join + more
    return text
