"""The config reference page (docs/reference/config.md), generated from the typed schema: every
section, key, type, default and doc line, and for the model and data groups each option's own keys.
Regenerate it with `python -m meshrun.config.reference`; tests/test_config_defaults.py fails when
the committed page is stale.
"""

from __future__ import annotations

import dataclasses
import importlib.resources
import sys
from pathlib import Path
from typing import Any, get_type_hints

import yaml

from meshrun.config.fields import WRITTEN, default_of, doc_of, has_default
from meshrun.config.layout_schema import LAYOUT_OPTION_KEYS
from meshrun.config.schema import DataConfig, RunConfig
from meshrun.specs import sinks
from meshrun.specs.data import SOURCES
from meshrun.specs.model import MODELS

PAGE = Path("docs/reference/config.md")
COMMAND = "python -m meshrun.config.reference"
CONFIG_MODULE = "meshrun.configs"

# The sections, in RunConfig's order, each with its dataclass (model, data and logging have keys of
# their own besides: each model's and source's options, each sink's switch).
SECTIONS = tuple(
    (name, hint) for name, hint in get_type_hints(RunConfig).items() if dataclasses.is_dataclass(hint)
)
# What the default column says for a key its group's option writes (no default in the schema).
CHOSEN = {"mesh": "the mesh option's", "model": "the model option's", "data": "the data option's"}
CHOSEN_MARK = "\0"  # marks a default column that is prose (CHOSEN), not a value


def render() -> str:
    """The whole page, as Markdown."""
    lines = [
        "# Config reference",
        "",
        f"<!-- Generated from the schema by `{COMMAND}`: edit meshrun/config/schema.py or "
        "layout_schema.py (or a model's or data source's options dataclass), not this page. -->",
        "",
        "Every key a run's config has, with its type, its default and what it does. The defaults are "
        "written once, in the typed schema (`meshrun/config/schema.py` and `layout_schema.py`, and each "
        "model's and data source's options dataclass); the YAML options of each config group "
        "(`configs/`) write only what differs from them. Set any key on the command line as "
        "`section.key=value` "
        "(`meshrun train train.epochs=5 'train.sample_prompts=[Hello]'`), and pick a group's option "
        "as `group=option` (`model=transformer data=text`); `meshrun train --cfg job` prints the "
        "composed config.",
        "",
        "## Top-level keys",
        "",
        *table("", [f for f in dataclasses.fields(RunConfig) if f.name == "resume"]),
    ]
    for name, cls in SECTIONS:
        lines += ["", f"## {name}", "", intro(cls), ""]
        if name == "logging":
            lines += logging_table()
            continue
        lines += table(name, dataclasses.fields(cls), chosen=CHOSEN.get(name))
        if name == "layout":
            lines += [
                "",
                "A layout option (`configs/layout/`, or a file: `layout=./my_layout.yaml`) may also write:",
                "",
                *key_rows(
                    [(f"layout.{key}", "list[str]", "[]", doc) for key, doc in LAYOUT_OPTION_KEYS.items()]
                ),
            ]
        if name == "model":
            lines += options_sections("model", {n: MODELS.get(n).options for n in MODELS.names()})
        if name == "data":
            lines += data_options_line()
            lines += options_sections("data", {n: SOURCES.get(n).options for n in SOURCES.names()})
    return "\n".join(lines) + "\n"


def intro(cls) -> str:
    """The dataclass's docstring as one paragraph."""
    return cell(" ".join((cls.__doc__ or "").split()), prose=True)


def table(prefix: str, fields, chosen: str | None = None) -> list[str]:
    """A table of `fields` (nested dataclasses as their keys, `early_stopping.monitor`)."""
    return key_rows(list(rows(prefix, fields, chosen)))


def rows(prefix: str, fields, chosen: str | None):
    for f in fields:
        key = f"{prefix}.{f.name}" if prefix else f.name
        nested = nested_class(f)
        if nested is not None:
            yield from rows(key, dataclasses.fields(nested), chosen)
            continue
        if has_default(f) or WRITTEN in f.metadata:
            default = format_value(default_of(f))
        else:
            default = CHOSEN_MARK + (chosen or "required")
        yield key, type_text(f), default, doc_of(f)


def nested_class(f):
    """The dataclass a field holds (train.early_stopping, model.lora), or None."""
    if f.default_factory is not dataclasses.MISSING:
        made = f.default_factory()
        if dataclasses.is_dataclass(made):
            return type(made)
    return None


def key_rows(rows_: list[tuple[str, str, str, str]]) -> list[str]:
    lines = ["| Key | Type | Default | Doc |", "| --- | --- | --- | --- |"]
    for key, kind, default, doc in rows_:
        shown = default[1:] if default.startswith(CHOSEN_MARK) else f"`{cell(default)}`"
        lines.append(f"| `{key}` | {cell(kind)} | {shown} | {cell(doc, prose=True)} |")
    return lines


def logging_table() -> list[str]:
    """One true/false switch per optional log sink (meshrun.specs.sinks)."""
    return key_rows(
        [
            (f"logging.{name}", "bool", "false", sinks.SINKS.get(name).description)
            for name in sinks.switch_names()
        ]
    )


def options_sections(group: str, options: dict[str, Any]) -> list[str]:
    """A subsection per model or data source: its options dataclass's keys."""
    lines = []
    for name, cls in sorted(options.items()):
        lines += ["", f"### {group}: {name}", "", intro(cls), ""]
        lines += table(group, dataclasses.fields(cls))
    return lines


def data_options_line() -> list[str]:
    """The options of the data group that pick a source under another name, with what they set."""
    folder = importlib.resources.files(CONFIG_MODULE) / "data"
    lines = []
    for path in sorted(folder.iterdir(), key=lambda p: p.name):
        option = path.name.removesuffix(".yaml")
        written = yaml.safe_load(path.read_text()) or {}
        source = written.pop("name", DataConfig.name)
        if option != source:
            values = ", ".join(f"`data.{k}={format_value(v)}`" for k, v in written.items())
            lines.append(f"`data={option}` is the `{source}` source with {values}.")
    return ["", *lines] if lines else []


def type_text(f) -> str:
    """A field's type as the config writes it (lists for tuples, mappings for dicts)."""
    text = str(f.type)
    if "LayoutRule" in text:
        return "mapping: regex -> list of axes"
    replace = (
        ("tuple[", "list["),
        (", ...]", "]"),
        ("frozenset[", "set["),
        ("Any", "any"),
        (" | None", " or null"),
    )
    for old, new in replace:
        text = text.replace(old, new)
    return "mapping" if text == "dict" else text


def format_value(value: Any) -> str:
    """A default as YAML writes it: null, true, [a, b], {}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(format_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{k}: {format_value(v)}" for k, v in value.items()) + "}"
    if isinstance(value, str) and not value:
        return '""'
    return str(value)


def cell(text: str, prose: bool = False) -> str:
    """`text` safe in a Markdown table cell (and, as prose, outside a code span)."""
    text = text.replace("|", "\\|")
    if not prose:
        return text
    parts = text.split("`")
    for i in range(0, len(parts), 2):  # outside code spans
        for char in ("<", ">", "*", "$"):
            parts[i] = parts[i].replace(char, "\\" + char)
    return "`".join(parts)


def main(argv: list[str]) -> int:
    """Writes the page (under the current dir, the repository's root), or with --check says whether
    the committed page is current."""
    page = Path(PAGE)
    if "--check" in argv:
        if not page.is_file() or page.read_text() != render():
            print(f"{PAGE} is stale: regenerate it with `{COMMAND}`")
            return 1
        return 0
    page.write_text(render())
    print(f"wrote {PAGE}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
