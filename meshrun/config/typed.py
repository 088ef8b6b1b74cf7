"""Reading typed values out of a config's plain mappings, for any section: a dataclass's fields from
a mapping (unknown keys and values of the wrong type rejected), a section that must be a mapping,
a true/false switch, and the values written with units (durations, sizes). Each problem is a
`ConfigError` naming the key; an unknown key's error suggests the likely one (meshrun.config.keys).
"""

from __future__ import annotations

import dataclasses
import re
import types
import typing
from collections.abc import Mapping
from typing import Any, Union

from meshrun.config.keys import unknown_key_hint
from meshrun.errors import ConfigError
from meshrun.wording import one_of


def section(raw: Mapping[str, Any], name: str) -> Mapping[str, Any]:
    """Section `name` of `raw` (empty when not given); ConfigError when it is not a mapping."""
    value = raw.get(name)
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError(name, f"got {value!r}; expected a config section (a mapping)")
    return value


def reject_unknown(raw: Mapping[str, Any], allowed, prefix: str) -> None:
    """ConfigError on the first key of `raw` that is not in `allowed`, with the likely key and the
    valid ones."""
    for key in raw:
        if key in allowed:
            continue
        dotted = f"{prefix}.{key}" if prefix else str(key)
        valid = [f"{prefix}.{a}" if prefix else a for a in allowed]
        raise ConfigError(
            dotted, f"unknown key (got {raw[key]!r}); {unknown_key_hint(dotted)}valid keys: {one_of(valid)}"
        )


def parse_dataclass(cls, raw: Mapping[str, Any], prefix: str, as_kwargs: bool = False):
    """Checks keys and value types of `raw` against dataclass `cls`; returns an instance (or the
    checked keyword arguments when `as_kwargs`)."""
    allowed = [f.name for f in dataclasses.fields(cls)]
    reject_unknown(raw, allowed, prefix=prefix)
    hints = typing.get_type_hints(cls)
    values = {name: check_type(f"{prefix}.{name}", raw[name], hints[name]) for name in allowed if name in raw}
    return values if as_kwargs else cls(**values)


def check_type(key: str, value: Any, expected: Any) -> Any:
    """`value` checked against the type annotation `expected` (optional, a nested dataclass, a tuple
    of items, bool, int, float, str) and returned as that type (an int as a float, a list as a
    tuple, a mapping as the dataclass); ConfigError on `key` when it does not fit."""
    origin = typing.get_origin(expected)
    args = typing.get_args(expected)
    if origin in (Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        (inner,) = [a for a in args if a is not type(None)]
        return check_type(key, value, inner)
    if dataclasses.is_dataclass(expected):
        if not isinstance(value, Mapping):
            raise ConfigError(
                key,
                f"got {value!r}; expected a section with keys "
                f"{one_of([f.name for f in dataclasses.fields(expected)])}",
            )
        return parse_dataclass(expected, value, key)
    if origin is tuple:
        if not isinstance(value, (list, tuple)):
            raise ConfigError(key, f"got {value!r}; expected a list")
        return tuple(check_type(key, item, args[0]) for item in value)
    if expected is bool:
        ok = isinstance(value, bool)
    elif expected is int:
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif expected is float:
        ok = isinstance(value, (int, float)) and not isinstance(value, bool)
        value = float(value) if ok else value
    elif expected is str:
        ok = isinstance(value, str)
    else:
        ok = True
    if not ok:
        raise ConfigError(key, f"got {value!r}; expected {getattr(expected, '__name__', expected)}")
    return value


def switch(raw: Mapping[str, Any], key: str) -> bool:
    """The true/false switch `key` (dotted; its last part is looked up in `raw`), false when not given."""
    value = raw.get(key.rpartition(".")[2]) or False
    if not isinstance(value, bool):
        raise ConfigError(key, f"got {value!r}; expected true or false")
    return value


_DURATION_UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400}
_DURATION_TEXT = re.compile(r"^(\d+(?:\.\d+)?[smhd])+$")


def parse_duration(key: str, value: Any) -> float | None:
    """Seconds from a duration written as a number of seconds, `90m`, `1h30m`, `2h` or `H:MM:SS`."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return float(value)
    text = str(value).strip().lower()
    if re.fullmatch(r"\d+(:\d{1,2}){1,2}", text):
        seconds = 0.0
        for part in text.split(":"):
            seconds = seconds * 60 + int(part)
        return seconds
    if _DURATION_TEXT.match(text):
        return sum(
            float(amount) * _DURATION_UNITS[unit]
            for amount, unit in re.findall(r"(\d+(?:\.\d+)?)([smhd])", text)
        )
    raise ConfigError(key, f"got {value!r}; expected seconds or a duration such as 90m, 1h30m, 2h or 1:30:00")


def with_duration(raw: Mapping[str, Any], name: str, prefix: str) -> Mapping[str, Any]:
    """`raw` with its duration `name` turned into seconds."""
    if name not in raw:
        return raw
    return {**raw, name: parse_duration(f"{prefix}.{name}", raw[name])}


_SIZE_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "kib": 1 << 10,
    "mib": 1 << 20,
    "gib": 1 << 30,
}
_SIZE_TEXT = re.compile(r"^(\d+(?:\.\d+)?)\s*([a-z]*)$")


def parse_size(key: str, value: Any) -> int:
    """Bytes from a size written as a number of bytes or with a unit: 1MiB, 512KiB, 1.5GiB (KB, MB and
    GB are powers of 1000)."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    found = (
        _SIZE_TEXT.match(str(value).strip().lower())
        if isinstance(value, (str, float)) and not isinstance(value, bool)
        else None
    )
    if found and found.group(2) in _SIZE_UNITS:
        return int(float(found.group(1)) * _SIZE_UNITS[found.group(2)])
    raise ConfigError(
        key,
        f"got {value!r}; expected a size in bytes: a number, or a number with a unit such as 512KiB, "
        "1MiB or 1.5GiB",
    )
