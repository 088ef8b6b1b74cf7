"""Dataclasses as plain JSON data and back: the one converter for everything meshrun writes as JSON
from its records (metrics.json and the config values it repeats, plan.json) and for reading
metrics.json back into its types.

Two marks in a field's metadata change how it is written: FLATTEN puts the keys of the field's
mapping beside its siblings' (and reads back every key no other field names), OMIT_IF_NONE leaves
the field out while it is None.
"""

from __future__ import annotations

import dataclasses
import typing
from collections.abc import Mapping

FLATTEN = "flatten"
OMIT_IF_NONE = "omit_if_none"


def to_json(value):
    """`value` as plain JSON data: a dataclass as a dict of its fields in their order, tuples as
    lists, mappings and lists item by item; anything else as it is."""
    if dataclasses.is_dataclass(value):
        return _fields_to_json(value)
    if isinstance(value, Mapping):
        return {key: to_json(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [to_json(item) for item in value]
    return value


def _fields_to_json(record) -> dict:
    data = {}
    for f in dataclasses.fields(record):
        item = getattr(record, f.name)
        if f.metadata.get(OMIT_IF_NONE) and item is None:
            continue
        if f.metadata.get(FLATTEN):
            data.update(to_json(item) or {})
        else:
            data[f.name] = to_json(item)
    return data


def from_json(cls, data: Mapping):
    """An instance of dataclass `cls` from its JSON data: a missing key keeps the field's default,
    a field typed as a dataclass (or a dict of them) is read as that type, a FLATTEN field takes the
    keys no other field has. TypeError when `data` is not a mapping."""
    if not isinstance(data, Mapping):
        raise TypeError(f"{cls.__name__} is given as {type(data).__name__}, not a mapping")
    hints = typing.get_type_hints(cls)
    fields = dataclasses.fields(cls)
    named = {f.name for f in fields if not f.metadata.get(FLATTEN)}
    values = {}
    for f in fields:
        if f.metadata.get(FLATTEN):
            values[f.name] = {key: item for key, item in data.items() if key not in named}
        elif f.name in data:
            values[f.name] = _read(hints[f.name], data[f.name])
    return cls(**values)


def _read(hint, value):
    """`value` read as type `hint`: a dataclass, a dict of dataclasses, or plain data kept as it is."""
    if value is None:
        return None
    if dataclasses.is_dataclass(hint):
        return from_json(hint, value)
    if typing.get_origin(hint) is dict and dataclasses.is_dataclass(typing.get_args(hint)[1]):
        item = typing.get_args(hint)[1]
        return {key: from_json(item, entry) for key, entry in value.items()}
    return value
