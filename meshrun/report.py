"""Reports: `metrics.json` and `plan.json` in the run dir for scripts, rich tables for people (the
run summary, the placed variables, and `meshrun plan`'s placement and lint)."""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from meshrun.plan import format_bytes

METRICS_FILE = "metrics.json"
PLAN_FILE = "plan.json"


def write_json(data: dict, run_dir: str | os.PathLike, name: str) -> Path:
    """Writes `data` as JSON file `name` into `run_dir` atomically."""
    path = Path(run_dir) / name
    write_atomic(path, (json.dumps(data, indent=2, sort_keys=False) + "\n").encode())
    return path


def write_atomic(path: Path, data: bytes) -> None:
    """Writes `data` to `path` through a temporary file, so a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def error_metrics(message: str, run_dir: str, choices: dict, overrides: list) -> dict:
    """The metrics.json of a run that failed after it started."""
    return {"status": "error", "error": message, "run_dir": run_dir, "choices": choices, "overrides": overrides}


def _console() -> Console:
    """The console reports print to: at least 120 columns wide when not on a terminal, so CI logs
    keep a variable's path and its rule on one line."""
    console = Console()
    return console if console.is_terminal else Console(width=max(console.width, 120))


def _print_whole(console: Console, table: Table) -> None:
    """Prints `table`; off a terminal (a log, a pipe) at its natural width, so no cell is cut or
    folded to fit a width nobody reads it at."""
    if not console.is_terminal:
        console.width = max(console.width, _natural_width(console, table))
    console.print(table)


def _natural_width(console: Console, table: Table) -> int:
    """How wide `table` is with no width to keep to."""
    return console.measure(table, options=console.options.update(max_width=1 << 16)).maximum


def render(metrics: dict, console: Console | None = None) -> None:
    """Prints the run summary and the placed sharding of every variable."""
    console = console or _console()
    _print_whole(console, summary_table(metrics))
    _print_whole(console, sharding_table(metrics["sharding"]))


def summary_table(m: dict) -> Table:
    """One row per headline figure of a finished run."""
    t = timing = m["timing"]
    model = m["model"].get("label") or m["model"]["name"]
    table = Table(title=escape(f"meshrun: {model} on mesh {_shape(m['mesh']['shape'])}"), show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    rows = [
        ("status", m["status"]),
        ("mesh", f"{_shape(m['mesh']['shape'])} {tuple(m['mesh']['axis_names'])}, batch axis {m['mesh']['batch_axis']!r}"),
        ("devices", f"{m['devices']['count']} x {m['devices']['kind']}" + (" (emulated)" if m["devices"]["emulated"] else "")
         + (f", {m['devices']['processes']} processes x {m['devices']['per_process']}" if m["devices"].get("processes", 1) > 1 else "")),
        ("model", f"{model}, {m['model']['params']:,} parameters"),
        ("batch", _batch_text(m["train"])),
        ("optimizer", _optimizer_text(m["train"])),
        ("start-up", f"{t['startup_s']:.2f} s to model built, {t['time_to_first_step_s']:.2f} s to first step"),
        ("compile", f"{timing['compile_s']:.3f} s (first step)"),
        ("step time", f"{timing['step_time_s'] * 1e3:.2f} ms median, {timing['step_time_p90_s'] * 1e3:.2f} ms p90 "
                      f"({timing['steady_steps']} steps)"),
        ("throughput", f"{timing['samples_per_s']:,.0f} samples/s"
                       + (f", {timing['tokens_per_s']:,.0f} tokens/s" if timing.get("tokens_per_s") else "")),
        ("flops", _flops_text(m["flops"])),
        ("memory", _memory_text(m["memory"])),
        ("epochs", ", ".join(f"{s:.2f}" for s in timing["epoch_s"]) + " s"),
        ("loss", " -> ".join(f"{v:.5f}" for v in m["history"].get("loss", []))),
        *([("validation", _validation_text(m["history"]))] if any(k.startswith("val_") for k in m["history"]) else []),
        ("eval", ", ".join(f"{k} {v:.5f}" for k, v in m["eval"].items()) + f" ({timing['eval_s']:.2f} s)"),
        *([("stopped", _stopped_text(m["train"]["stopped"]))] if m["train"].get("stopped") else []),
        ("wall", f"{timing['wall_s']:.2f} s"),
        ("run dir", m.get("run_dir", "")),
        *([("logs", ", ".join(Path(p).name for p in m["logs"].values()))] if m.get("logs") else []),
        *([("profile", _profile_text(m["profile"]))] if m.get("profile") else []),
    ]
    for name, value in rows:
        table.add_row(name, escape(str(value)))
    return table


def _batch_text(train: dict) -> str:
    text = (f"{train['global_batch_size']} global, {train['per_replica_batch_size']} per replica, "
            f"{train['steps_per_epoch']} steps/epoch x {train['epochs']} epochs")
    accumulate = train.get("grad_accum_steps", 1)
    if accumulate > 1:
        text += (f"; gradients of {accumulate} steps averaged into each update: {train['samples_per_update']} samples "
                 f"per update, {train['updates']} updates")
    return text


def _validation_text(history: dict) -> str:
    return "; ".join(f"{name} " + " -> ".join(f"{v:.5f}" for v in values) for name, values in history.items() if name.startswith("val_"))


def _stopped_text(stopped: dict) -> str:
    if stopped["reason"] == "max_time":
        text = f"train.max_time reached: stopped after step {stopped['step']}"
    else:
        text = f"early stopping: no improvement, stopped after epoch {stopped['epoch']}"
    return text + (f"; checkpoint {stopped['checkpoint']}" if stopped.get("checkpoint") else "")


def _profile_text(profile: dict) -> str:
    if not profile["traced"]:
        return f"steps {profile['steps'][0]}-{profile['steps'][1]} were not reached; no trace"
    first, last = profile["traced"]
    return f"steps {first}-{last} traced into {profile['dir']} (tensorboard --logdir {profile['dir']}, or perfetto_trace.json.gz in ui.perfetto.dev)"


SHARDING_ROWS = 12  # more variables than this: the largest, and the rest in metrics.json, so the report fits a screen


def sharding_table(sharding: dict) -> Table:
    """Where each variable lives: shape, PartitionSpec as placed, and the rule behind it (the
    largest SHARDING_ROWS variables when there are more; metrics.json holds them all)."""
    shown = sharding
    if len(sharding) > SHARDING_ROWS:
        largest = sorted(sharding, key=lambda path: sharding[path]["bytes_per_device"], reverse=True)[:SHARDING_ROWS]
        shown = {path: sharding[path] for path in sharding if path in largest}
    title = "placed variables" if shown is sharding else f"placed variables: the {len(shown)} largest of {len(sharding)} (all in metrics.json)"
    table = Table(title=title)
    table.add_column("path", overflow="fold")
    table.add_column("shape", no_wrap=True)
    table.add_column("spec", no_wrap=True)
    table.add_column("rule", overflow="fold")
    table.add_column("bytes/device", justify="right", no_wrap=True)
    for path, info in shown.items():
        table.add_row(escape(path), _shape(info["shape"]), _spec(info["spec"]), escape(_rule_text(info)),
                      format_bytes(info["bytes_per_device"]))
    return table


def _flops_text(flops: dict) -> str:
    if flops["per_step"] is None:
        return "not reported by XLA on this platform"
    text = f"{flops['per_step']:.3g} per step (XLA), {flops['per_s']:.3g}/s"
    if flops["analytic_per_step"]:
        text += f"; 6·N·tokens {flops['analytic_per_step']:.3g}"
    return text + (f"; MFU {flops['mfu']:.1%}" if flops["mfu"] is not None else "; MFU n/a (no peak known)")


def _memory_text(memory: dict) -> str:
    text = (f"{format_bytes(memory['params_bytes_per_device'])} params + "
            f"{format_bytes(memory['optimizer_bytes_per_device'])} optimizer per device")
    if memory["peak_bytes_per_device"] is not None:
        text += f"; step peak {format_bytes(memory['peak_bytes_per_device'])} (compiled estimate)"
    if memory["live_peak_bytes_per_device"] is not None:
        text += f", {format_bytes(memory['live_peak_bytes_per_device'])} live"
    return text


def _optimizer_text(train: dict) -> str:
    text = f"{train['optimizer']}, learning rate {train['learning_rate']:g}"
    if train.get("lr_schedule", "constant") != "constant":
        warmup = f" after {train['warmup_steps']} warm-up steps" if train.get("warmup_steps") else ""
        text += f" {train['lr_schedule']}{warmup} to {train['min_learning_rate']:g}"
    if train.get("clip_norm"):
        text += f", gradients clipped to norm {train['clip_norm']:g}"
    return text + f"; {train.get('precision', 'float32')}"


def render_plan(plan: dict, console: Console | None = None, full: bool = False) -> None:
    """Prints a plan: the variables (repeated blocks as one row each unless `full`), the totals
    per device, and the lint."""
    console = console or _console()
    table = plan_table(plan, full)
    excess = _natural_width(console, table) - console.width
    if console.is_terminal and excess > 0:  # cut the rule column short rather than wrap or squeeze paths
        longest_rule = max((len(_rule_text(v)) for v in plan["variables"]), default=0)
        table = plan_table(plan, full, rule_width=max(12, longest_rule - excess))
    _print_whole(console, table)
    _print_whole(console, totals_table(plan))
    if plan["errors"] or plan["warnings"]:
        _print_whole(console, lint_table(plan))


def plan_table(plan: dict, full: bool = False, rule_width: int | None = None) -> Table:
    """Every variable: path, shape, dtype (in the title when there is one), the rule that matched,
    PartitionSpec, bytes per device. Unless `full`, variables that differ only by a block index and are placed alike share one row
    (block_{0..31}/mlp_up/kernel) with the bytes of one, their count and the bytes of all. Paths never
    wrap; rules longer than `rule_width` end in an ellipsis."""
    mesh = plan["mesh"]
    rows = [PlanRow([v], v["path"]) for v in plan["variables"]] if full else collapse_blocks(plan["variables"])
    grouped = any(len(r.members) > 1 for r in rows)
    dtypes = sorted({v["dtype"] for v in plan["variables"]})
    title = f"plan: {plan['model']['name']} on mesh {_shape(mesh['shape'])} {tuple(mesh['axis_names'])}"
    table = Table(title=escape(title + (f", all {dtypes[0]}" if len(dtypes) == 1 else "")))
    columns = ["path", "shape", *(["dtype"] if len(dtypes) > 1 else []), "rule", "spec", "bytes/device",
               *(["x count = all"] if grouped else [])]
    cells = []
    for row in rows:
        v, count = row.members[0], len(row.members)
        text = {"path": escape(row.path), "shape": _shape(v["shape"]), "dtype": v["dtype"], "rule": escape(_rule_text(v)),
                "spec": _spec(v["spec"]), "bytes/device": format_bytes(v["bytes_per_device"]),
                "x count = all": f"x {count} = {format_bytes(count * v['bytes_per_device'])}" if count > 1 else ""}
        cells.append([text[c] for c in columns])
    for index, column in enumerate(columns):
        # Paths keep their whole text; the rule gives way first (rule_width), then the others.
        widest = max([len(column), *(len(row[index]) for row in cells)])
        limits = {"path": {"min_width": widest}, "rule": {"max_width": rule_width, "min_width": min(widest, 6)}}
        table.add_column(column, justify="right" if column in ("bytes/device", "x count = all") else "left", no_wrap=True,
                         overflow="ellipsis", **limits.get(column, {"min_width": min(widest, 8)}))
    for row in cells:
        table.add_row(*row)
    return table


@dataclass(frozen=True)
class PlanRow:
    """One row of the plan table: the variables it stands for (placed alike) and the path shown."""

    members: list
    path: str


_BLOCK_INDEX = re.compile(r"(?<=_)\d+(?=/|$)")


def collapse_blocks(variables: list[dict]) -> list[PlanRow]:
    """Groups variables whose paths differ only in the numbers after an underscore (block_0/...,
    block_1/...) and whose shape, dtype, rule and spec agree; each group's path shows the numbers
    it spans (block_{0..31}/attention/query/kernel). Rows keep the order of first appearance."""
    groups: dict[tuple, list] = {}
    for v in variables:
        key = (_BLOCK_INDEX.sub("#", v["path"]), tuple(v["shape"]), v["dtype"], v.get("rule"), v.get("origin"), tuple(v["spec"]))
        groups.setdefault(key, []).append(v)
    rows = []
    for (pattern, *_), members in groups.items():
        if len(members) == 1:
            rows.append(PlanRow(members, members[0]["path"]))
            continue
        positions = zip(*(map(int, _BLOCK_INDEX.findall(m["path"])) for m in members))
        spans = iter([_span(sorted(set(numbers))) for numbers in positions])
        rows.append(PlanRow(members, re.sub("#", lambda _: next(spans), pattern)))
    return rows


def _span(numbers: list[int]) -> str:
    """0..31 as {0..31}, a lone number as itself, anything else as {0,2,5}."""
    if len(numbers) == 1:
        return str(numbers[0])
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{{{numbers[0]}..{numbers[-1]}}}"
    return "{" + ",".join(map(str, numbers)) + "}"


def _rule_text(placed: dict) -> str:
    """The rule that placed a variable, with its origin unless it was written in the layout."""
    if not placed.get("rule"):
        return "replicated"
    origin = placed.get("origin")
    return placed["rule"] + (f" ({origin})" if origin and origin != "rules" else "")


def totals_table(plan: dict) -> Table:
    """Per-device totals: parameters, optimizer state, and the largest replicated variables."""
    per_device = plan["per_device"]
    table = Table(title=f"per device ({plan['mesh']['devices']} devices)", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("bytes", justify="right")
    table.add_row("parameters", format_bytes(per_device["params_bytes"]))
    table.add_row(f"optimizer state ({plan['optimizer']})", format_bytes(per_device["optimizer_bytes"]))
    table.add_row("total", format_bytes(per_device["total_bytes"]))
    processes = plan.get("processes") or {"count": 1}
    if processes["count"] > 1:
        crossing = ", ".join(processes["axes_across_processes"]) or "none"
        table.add_row(
            "processes",
            f"{processes['count']} x {processes['devices_per_process']} devices; axes across processes: {crossing}; "
            f"batch in {processes['batch_shares']} shares",
        )
    for item in plan["largest_replicated"]:
        table.add_row(escape(f"replicated: {item['path']}"), format_bytes(item["bytes"]))
    return table


def lint_table(plan: dict) -> Table:
    """Layout errors (the run would be rejected) and warnings."""
    table = Table(title="lint", show_header=False)
    table.add_column("level", style="bold")
    table.add_column("finding")
    for error in plan["errors"]:
        table.add_row("[red]error[/red]", escape(error))
    for warning in plan["warnings"]:
        table.add_row("[yellow]warning[/yellow]", escape(warning))
    return table


def render_sweep(rows: list[dict], console: Console | None = None) -> None:
    """Prints the comparison of a sweep's jobs (one line per job in CI logs too)."""
    _print_whole(console or _console(), sweep_table(rows))


def rate_column(rows: list[dict]) -> str:
    """The throughput column the rows are ranked by: tokens_per_s when every successful run has it
    (all language models), else samples_per_s, which every run has."""
    ok = [r for r in rows if r["status"] == "ok"]
    return "tokens_per_s" if ok and all(r["tokens_per_s"] for r in ok) else "samples_per_s"


def sweep_title(rows: list[dict]) -> str:
    """What a comparison is of: the job count, the model(s), the layout when it is one, and what
    varies between the jobs (mesh, layout, model)."""
    models, layouts = _known(rows, "model"), _known(rows, "layout")
    title = f"meshrun sweep: {len(rows)} jobs of {', '.join(models)}"
    if len(layouts) == 1:
        title += f", layout {layouts[0]}"
    varies = varying_keys(rows)
    return title + (f"; varying {', '.join(varies)}" if varies else "")


def varying_keys(rows: list[dict]) -> list[str]:
    """Which of mesh, model and layout differ between the jobs."""
    return [key for key in ("mesh", "model", "layout") if len(_known(rows, key)) > 1]


def _known(rows: list[dict], key: str) -> list[str]:
    """The distinct values of `key` in the rows that have one (a job that failed early may not)."""
    return sorted({str(r[key]) for r in rows if r[key] is not None})


def sweep_table(rows: list[dict]) -> Table:
    """One row per job, fastest first, the best marked in its status; failed jobs last with their
    reason; a model or layout column where they vary. A figure a run does not have shows as -."""
    unit = rate_column(rows)
    lm = unit == "tokens_per_s"
    varying = [key for key in varying_keys(rows) if key != "mesh"]
    table = Table(title=escape(sweep_title(rows) + f"; fastest first ({'tokens' if lm else 'samples'}/s)"))
    columns = ["job", "mesh", *varying, "status", "compile s",
               "step ms", "p90 ms", "tokens/s" if lm else "samples/s", "eval loss", "peak/device"]
    errors = any(r["status"] != "ok" for r in rows)
    for column in columns + (["error"] if errors else []):
        left = column in ("job", "mesh", "model", "layout", "status", "error")
        table.add_column(column, justify="left" if left else "right", no_wrap=column != "error")
    for r in rows:
        head = [r["job"], r["mesh"], *(escape(str(r[key])) for key in varying)]
        if r["status"] != "ok":
            table.add_row(*head, "[red]error[/red]", *[""] * 6, escape(r["error"] or ""))
            continue
        peak = f"{format_bytes(r['peak_bytes_per_device'])} {r['peak_source']}" if r["peak_bytes_per_device"] else "n/a"
        table.add_row(
            *head, "[bold green]best[/bold green]" if r["best"] else "ok", _figure(r["compile_s"], ".2f"),
            _figure(r["step_time_ms"], ".2f"), _figure(r["step_time_p90_ms"], ".2f"), _figure(r[unit], ",.0f"),
            _figure(r["eval_loss"], ".5f"), peak, *([""] if errors else []),
        )
    return table


def _figure(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _spec(spec) -> str:
    return "(" + ", ".join("None" if a is None else str(a) for a in spec) + ")"


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"
