"""How meshrun words things for people: shapes, partition specs, byte counts, lists of valid values,
suggestions, and the first line of an error. Messages, tables and logs all use these, so one thing
always reads the same way."""

from __future__ import annotations

import difflib
import sys
from collections.abc import Iterable

ERROR_PREFIX = "meshrun: error: "
WARNING_PREFIX = "meshrun: warning: "


def format_shape(shape, scalar: str = "") -> str:
    """A shape the way users type a mesh: 2x4 (`scalar` for a shape with no dimensions)."""
    return "x".join(str(d) for d in shape) if len(shape) else scalar


def shape_text(shape) -> str:
    """A shape as error messages write it: (?, 32), ? for a size left open."""
    return "(" + ", ".join("?" if d is None else str(d) for d in shape) + ")"


def spec_text(spec) -> str:
    """A PartitionSpec as tables show it: (None, model)."""
    return "(" + ", ".join("None" if a is None else str(a) for a in spec) + ")"


def format_bytes(count: int) -> str:
    """Bytes in binary units: 512 B, 1.5 KiB, 2.00 GiB."""
    value = float(count)
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if value < 1024 or unit == "TiB":
            return f"{count} B" if unit == "B" else f"{value:.2f} {unit}"
        value /= 1024
    return f"{count} B"


def one_of(candidates: Iterable) -> str:
    """A list of valid values as messages word it: `a, b or c`."""
    items = [str(c) for c in candidates]
    if not items:
        return "(none)"
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " or " + items[-1]


def counted(count: int, noun: str, plural: str | None = None) -> str:
    """A count and its noun as messages word them: `1 example`, `0 examples`, `1,234 examples`
    (`plural`: where it is not the noun and an s)."""
    return f"{count:,} {noun if count == 1 else plural or noun + 's'}"


def closest(word: str, candidates: Iterable[str], n: int = 3) -> list[str]:
    """The candidates most like `word`, ignoring case, best first (empty when none is close)."""
    by_lower = {str(c).lower(): c for c in candidates}
    return [by_lower[c] for c in difflib.get_close_matches(word.lower(), list(by_lower), n=n, cutoff=0.6)]


def did_you_mean(word: str, candidates: Iterable[str]) -> str:
    """`did you mean X? ` for the candidate most like `word`, or '' when none is close.

    Dotted names are compared at the depth of `word`: `modle` with the sections (model), not with
    the keys in them, where the shortest one that starts like it (model.ff) would win and read
    like a key cut short."""
    depth = word.count(".") + 1
    heads = dict.fromkeys(".".join(str(c).split(".")[:depth]) for c in candidates)
    hint = closest(word, heads, n=1)
    return f"did you mean {hint[0]}? " if hint else ""


def not_a_flag(flag: str, command: str, flags: Iterable[str], taken_by: Iterable[str] = ()) -> str:
    """What is said of `flag`, which `meshrun COMMAND` does not take: the commands that do take it
    (`taken_by`), the closest of the command's flags, and its flags (`flags`, as its help writes
    them: `--out FILE`, `-m/--multirun`)."""
    flags = list(flags)
    names = [name for f in flags for name in f.split()[0].split("/")]
    hint = closest(flag, names, n=1)
    others = list(taken_by)
    where = f" (it is one of meshrun {one_of(others)})" if others else ""
    suggestion = f"did you mean {hint[0]}? " if hint and not others else ""
    return (
        f"not a flag of meshrun {command}{where}; {suggestion}valid: "
        f"{one_of(flags)} (see meshrun {command} --help)"
    )


def first_line(err: BaseException, limit: int | None = None) -> str:
    """The first line of an exception's message (empty when it has none), cut at `limit` characters."""
    text = str(err).strip()
    line = text.splitlines()[0].strip() if text else ""
    return line[:limit] if limit else line


def error_text(err: BaseException) -> str:
    """An exception as one line: its type and the first line of its message."""
    return f"{type(err).__name__}: {first_line(err)}"


def say_error(message: str) -> None:
    """Prints `meshrun: error: <message>` on stderr, the one line a user sees for a problem."""
    print(ERROR_PREFIX + message, file=sys.stderr)


def say_warning(message: str) -> None:
    """Prints `meshrun: warning: <message>` on stderr (outside a run, whose warnings are logged)."""
    print(WARNING_PREFIX + message, file=sys.stderr)
