"""Layout files written by `meshrun plan --save-layout FILE.yaml`: the rules a plan placed by (written
by hand, the model's own or derived by layout=auto), as a layout config that `layout=FILE.yaml`
loads back, so a derived layout can be kept, reviewed and edited like a hand-written one."""

from __future__ import annotations

import datetime
from collections.abc import Sequence

import yaml

from meshrun.config.layout_schema import LayoutRule
from meshrun.errors import ConfigError
from meshrun.files import write_output
from meshrun.placement.plan import Plan
from meshrun.wording import first_line, format_bytes, format_shape


def layout_text(rules: Sequence[LayoutRule], plan: Plan, overrides: Sequence[str]) -> str:
    """The layout file's text: a header saying what it was planned for, then `rules` (every rule,
    extra_rules and the model's own included, as plain rules), and `optional` and
    `replicate_if_indivisible` where any rule is so."""
    origins = sorted({rule.origin for rule in rules})
    header = [
        f"# Saved by `meshrun plan {' '.join(overrides)} "
        f"--save-layout` on {datetime.date.today().isoformat()}.",
        f"# Planned for {plan.model} on mesh {format_shape(plan.mesh.shape)} {tuple(plan.mesh.axis_names)}, "
        f"batch axis {plan.mesh.batch_axis!r}: {format_bytes(plan.params_bytes_per_device)} parameters + "
        f"{format_bytes(plan.optimizer_bytes_per_device)} {plan.optimizer} state per device.",
        f"# Rules from: {', '.join(origins) or 'none (everything replicated)'}. "
        "Load it with layout=PATH; edit it like any layout.",
    ]
    body = {"rules": {rule.pattern: list(rule.axes) for rule in rules}}
    for key in ("optional", "replicate_if_indivisible"):
        patterns = [rule.pattern for rule in rules if getattr(rule, key)]
        if patterns:
            body[key] = patterns
    return (
        "\n".join(header) + "\n" + yaml.safe_dump(body, sort_keys=False, default_flow_style=None, width=1000)
    )


def save_layout(path: str, rules: Sequence[LayoutRule], plan: Plan, overrides: Sequence[str]) -> None:
    """Writes the layout file at `path` (whole or not at all); an OS error is a ConfigError."""
    try:
        write_output(path, layout_text(rules, plan, overrides).encode())
    except OSError as err:
        raise ConfigError(
            "--save-layout",
            f"got {path!r}, which cannot be written ({first_line(err)}); give a path in a writable directory",
        ) from None
