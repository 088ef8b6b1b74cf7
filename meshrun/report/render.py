"""The rich tables people read: a run's summary and its placed variables (from RunMetrics), the plan
of `meshrun plan` with its lint, and the comparison of a sweep's runs. Files are written elsewhere
(meshrun.files); what a run's summary shows is declared with its figures (meshrun.specs.metrics,
meshrun.specs.figures), which hand this module the rows."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from rich.console import Console
from rich.markup import escape
from rich.table import Table

from meshrun.specs.metrics import DOES_NOT_FIT, PlacedVariable, RunMetrics
from meshrun.wording import format_bytes, format_shape, spec_text


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


def render(metrics: RunMetrics, console: Console | None = None) -> None:
    """Prints the run summary and the placed sharding of every variable."""
    console = console or _console()
    _print_whole(console, summary_table(metrics))
    _print_whole(console, sharding_table(metrics.sharding))


def summary_table(metrics: RunMetrics) -> Table:
    """One row per headline figure of a finished run (the rows RunMetrics declares)."""
    table = Table(
        title=escape(f"meshrun: {metrics.model.called} on mesh {format_shape(metrics.mesh.shape)}"),
        show_header=False,
    )
    table.add_column("what", style="bold")
    table.add_column("value")
    for name, value in metrics.summary():
        table.add_row(name, escape(str(value)))
    return table


SHARDING_ROWS = (
    12  # more variables than this: the largest, and the rest in metrics.json, so the report fits a screen
)


def sharding_table(sharding: dict[str, PlacedVariable]) -> Table:
    """Where each variable lives: shape, PartitionSpec as placed, and the rule behind it (the
    largest SHARDING_ROWS variables when there are more; metrics.json holds them all)."""
    shown = sharding
    if len(sharding) > SHARDING_ROWS:
        largest = sorted(sharding, key=lambda path: sharding[path].bytes_per_device, reverse=True)[
            :SHARDING_ROWS
        ]
        shown = {path: sharding[path] for path in sharding if path in largest}
    title = (
        "placed variables"
        if shown is sharding
        else f"placed variables: the {len(shown)} largest of {len(sharding)} (all in metrics.json)"
    )
    table = Table(title=title)
    table.add_column("path", overflow="fold")
    table.add_column("shape", no_wrap=True)
    table.add_column("spec", no_wrap=True)
    table.add_column("rule", overflow="fold")
    table.add_column("bytes/device", justify="right", no_wrap=True)
    for path, placed in shown.items():
        table.add_row(
            escape(path),
            format_shape(placed.shape, "scalar"),
            spec_text(placed.spec),
            escape(_rule_text(placed.rule, placed.origin)),
            format_bytes(placed.bytes_per_device),
        )
    return table


def render_plan(plan: dict, console: Console | None = None, full: bool = False) -> None:
    """Prints a plan: the variables (repeated blocks as one row each unless `full`), the totals
    per device, and the lint."""
    console = console or _console()
    table = plan_table(plan, full)
    excess = _natural_width(console, table) - console.width
    if (
        console.is_terminal and excess > 0
    ):  # fold the rule column onto more lines rather than wrap or squeeze paths
        longest_rule = max(
            (len(_rule_text(v.get("rule"), v.get("origin"))) for v in plan["variables"]), default=0
        )
        table = plan_table(plan, full, rule_width=max(12, longest_rule - excess))
    _print_whole(console, table)
    _print_whole(console, totals_table(plan))
    for note in plan.get("data", {}).get("notes", []):
        console.print(escape(note))
    if plan["errors"] or plan["warnings"]:
        _print_whole(console, lint_table(plan))


def slow_network_rows(plan: dict) -> list[tuple[str, str]]:
    """The plan's rows about a job of several processes: each axis's size within a process and the
    processes it spans (mesh.dcn), and what a step sends between processes, by kind."""
    axes = "; ".join(
        f"{a['name']} {a['in_process']} in a process x {a['across_processes']} across"
        for a in plan["mesh"].get("axes", [])
    )
    rows = [("mesh.dcn", f"{plan['mesh'].get('dcn')}: {axes}")]
    traffic = plan.get("slow_network")
    if traffic:
        kinds = [
            (k.replace("_", " "), traffic[k])
            for k in ("gradients", "fsdp_all_gathers", "tensor_activations", "stage_activations")
        ]
        parts = ", ".join(
            f"{name} {format_bytes(size) if size is not None else 'unknown'}"
            for name, size in kinds
            if size != 0
        )
        rows.append(
            (
                "between processes",
                f"about {format_bytes(traffic['bytes_per_step'])} a step from each process"
                + (f" ({parts})" if parts else ""),
            )
        )
    return rows


def plan_table(plan: dict, full: bool = False, rule_width: int | None = None) -> Table:
    """Every variable: path, shape, dtype (in the title when there is one), the rule that matched,
    PartitionSpec, bytes per device, and whether it trains (a column only when some are frozen,
    as under LoRA). Unless `full`, variables that differ only by a block index and are placed alike share one
    row (block_{0..31}/mlp_up/kernel) with the bytes of one, their count and the bytes of all. Paths never
    wrap; rules longer than `rule_width` fold onto more lines, whole (a regex cut short is no use)."""
    mesh = plan["mesh"]
    rows = (
        [PlanRow([v], v["path"]) for v in plan["variables"]] if full else collapse_blocks(plan["variables"])
    )
    grouped = any(len(r.members) > 1 for r in rows)
    dtypes = sorted({dtype_text(v) for v in plan["variables"]})
    title = f"plan: {plan['model']['name']} on mesh {format_shape(mesh['shape'])} {tuple(mesh['axis_names'])}"
    table = Table(title=escape(title + (f", all {dtypes[0]}" if len(dtypes) == 1 else "")))
    frozen = any(not v.get("trainable", True) for v in plan["variables"])
    columns = [
        "path",
        "shape",
        *(["dtype"] if len(dtypes) > 1 else []),
        "rule",
        "spec",
        "bytes/device",
        *(["x count = all"] if grouped else []),
        *(["trains"] if frozen else []),
    ]
    cells = []
    for row in rows:
        v, count = row.members[0], len(row.members)
        text = {
            "path": escape(row.path),
            "shape": format_shape(v["shape"], "scalar"),
            "dtype": dtype_text(v),
            "rule": escape(_rule_text(v.get("rule"), v.get("origin"))),
            "spec": spec_text(v["spec"]),
            "bytes/device": format_bytes(v["bytes_per_device"]),
            "x count = all": f"x {count} = {format_bytes(count * v['bytes_per_device'])}"
            if count > 1
            else "",
            "trains": "yes" if v.get("trainable", True) else "frozen",
        }
        cells.append([text[c] for c in columns])
    for index, column in enumerate(columns):
        # Paths keep their whole text; the rule gives way first (rule_width, folded whole), then the others.
        widest = max([len(column), *(len(row[index]) for row in cells)])
        # A set width keeps Rich from collapsing the folding rule column to nothing to fit the others.
        rule_limits = {"width": rule_width} if rule_width else {"min_width": min(widest, 6)}
        limits = {"path": {"min_width": widest}, "rule": rule_limits}
        folded = column == "rule"
        table.add_column(
            column,
            justify="right" if column in ("bytes/device", "x count = all") else "left",
            no_wrap=not folded,
            overflow="fold" if folded else "ellipsis",
            **limits.get(column, {"min_width": min(widest, 8)}),
        )
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
        key = (
            _BLOCK_INDEX.sub("#", v["path"]),
            tuple(v["shape"]),
            dtype_text(v),
            v.get("rule"),
            v.get("origin"),
            tuple(v["spec"]),
            v.get("trainable", True),
        )
        groups.setdefault(key, []).append(v)
    rows = []
    for (pattern, *_), members in groups.items():
        if len(members) == 1:
            rows.append(PlanRow(members, members[0]["path"]))
            continue
        positions = zip(*(map(int, _BLOCK_INDEX.findall(m["path"])) for m in members), strict=False)
        spans = iter([_span(sorted(set(numbers))) for numbers in positions])
        rows.append(PlanRow(members, re.sub("#", lambda _, spans=spans: next(spans), pattern)))
    return rows


LISTED_NUMBERS = 5  # more scattered numbers than this are folded into a count (a model's seed generators)


def _span(numbers: list[int]) -> str:
    """0..31 as {0..31}, a lone number as itself, a few others as {0,2,5}, and more scattered ones
    as their count and range: {72 in 2..108} (--full lists them)."""
    if len(numbers) == 1:
        return str(numbers[0])
    if numbers == list(range(numbers[0], numbers[-1] + 1)):
        return f"{{{numbers[0]}..{numbers[-1]}}}"
    if len(numbers) > LISTED_NUMBERS:
        return f"{{{len(numbers)} in {numbers[0]}..{numbers[-1]}}}"
    return "{" + ",".join(map(str, numbers)) + "}"


def _rule_text(rule: str | None, origin: str | None) -> str:
    """The rule that placed a variable, with its origin unless it was written in the layout."""
    if not rule:
        return "replicated"
    if origin == "pipeline":
        return "the stages alone (pipeline)"  # a stacked block weight that no rule places
    return rule + (f" ({origin})" if origin and origin != "rules" else "")


def totals_table(plan: dict) -> Table:
    """Per-device totals: parameters (for a quantized base, split into trainable, frozen quantized
    and frozen float), optimizer state (of the trainable ones), and the largest replicated
    variables; the model's parameter count, how many train when some are frozen, and the LoRA
    adapters."""
    per_device, model = plan["per_device"], plan["model"]
    table = Table(title=f"per device ({plan['mesh']['devices']} devices)", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("bytes", justify="right")
    table.add_row(
        "model parameters", f"{model['params']:,} ({format_bytes(model['params_bytes'])} unsharded)"
    )
    table.add_row("parameters", format_bytes(per_device["params_bytes"]))
    if "frozen_quantized_bytes" in per_device:  # a quantized base (model.quantize): what they are made of
        table.add_row("  trains", format_bytes(per_device["trainable_bytes"]))
        table.add_row("  frozen, quantized", _quantized_text(plan))
        table.add_row("  frozen, float", format_bytes(per_device["frozen_float_bytes"]))
    frozen = model.get("frozen_params")
    if frozen:
        table.add_row(
            "trainable",
            f"{model['trainable_params']:,} of {model['params']:,} parameters ({frozen:,} frozen); "
            "optimizer state only for those",
        )
    if plan.get("lora_adapters"):
        table.add_row("LoRA adapters", _adapters_text(plan["lora_adapters"]))
    table.add_row(f"optimizer state ({plan['optimizer']})", format_bytes(per_device["optimizer_bytes"]))
    table.add_row("total", format_bytes(per_device["total_bytes"]))
    step = plan.get("step")
    if step:
        table.add_row("train step's own", format_bytes(step["step_bytes_per_device"]))
        table.add_row(
            "train step's peak",
            f"{format_bytes(step['step_peak_bytes_per_device'])} ({escape(step['method'])})",
        )
    memory = plan.get("device_memory")
    if memory:
        verdict = "fits" if memory["fits"] else "[red]does not fit[/red]"
        counts = "" if step else "; counts parameters and optimizer state only"
        source = escape(memory["source"])
        table.add_row("device memory", f"{format_bytes(memory['bytes'])} ({source}): {verdict}{counts}")
    processes = plan.get("processes") or {"count": 1}
    if processes["count"] > 1:
        crossing = ", ".join(processes["axes_across_processes"]) or "none"
        table.add_row(
            "processes",
            f"{processes['count']} x {processes['devices_per_process']} devices; axes across processes: "
            f"{crossing}; batch in {processes['batch_shares']} shares",
        )
        for what, text in slow_network_rows(plan):
            table.add_row(what, escape(text))
    if plan.get("pipeline"):
        for what, text in pipeline_rows(plan["pipeline"]):
            table.add_row(what, escape(text))
    for item in plan["largest_replicated"]:
        table.add_row(escape(f"replicated: {item['path']}"), format_bytes(item["bytes"]))
    return table


def pipeline_rows(pipeline: dict) -> list[tuple[str, str]]:
    """The pipeline stages of a plan in a few rows: which blocks each stage holds, the microbatches
    and the schedule's idle share, and the block inputs kept for the backward pass."""
    stages, repeats = pipeline["stage_blocks"], pipeline.get("repeats", 1)

    def held(blocks: list) -> str:
        return (
            ", ".join(blocks) if repeats > 1 else blocks[0] + (f"..{blocks[-1]}" if len(blocks) > 1 else "")
        )

    each = f"{len(stages[0])} block{'s' if len(stages[0]) > 1 else ''} each"
    circular = f", circular: {repeats} rounds" if repeats > 1 else ""
    formula = "(S-1)/(RM+S-1)" if repeats > 1 else "(S-1)/(M+S-1)"
    rows = [
        (
            "pipeline stages",
            f"{pipeline['stages']} over {pipeline['axis']!r}, {each}{circular} "
            f"({'; '.join(f'{i}: {held(blocks)}' for i, blocks in enumerate(stages))})",
        ),
        (
            "microbatches",
            f"{pipeline['microbatches']} of {pipeline['microbatch_rows']} rows "
            f"({pipeline['microbatch_rows_per_replica']} per data replica); idle share {formula} = "
            f"{pipeline['bubble_fraction']:.1%}",
        ),
    ]
    kept = pipeline.get("kept_activation_bytes_per_device")
    if kept is not None:
        rows.append(
            (
                "kept activations",
                f"{format_bytes(kept)} of block inputs"
                + (
                    ""
                    if pipeline["remat"]
                    else ", plus each block's own (pipeline.remat=true keeps only these)"
                ),
            )
        )
    return rows


def _quantized_text(plan: dict) -> str:
    """The frozen quantized variables of a plan per device, with what they hold (int4 kernels: two
    values a byte)."""
    dtypes = sorted({dtype_text(v) for v in plan["variables"] if v.get("quantized")})
    return f"{format_bytes(plan['per_device']['frozen_quantized_bytes'])} ({', '.join(dtypes)})"


def dtype_text(variable: dict) -> str:
    """What a variable of the plan holds: its dtype, or for a packed kernel the values packed in
    its bytes, "int4 packed two a byte" (its shape is the packed one: half the float kernel's
    columns, in int8)."""
    if variable.get("packed"):
        return f"{variable['packed']} packed two a byte"
    return variable["dtype"]


def _adapters_text(adapters: dict) -> str:
    """The LoRA adapters of a plan in a line: size, and how they are placed."""
    count, placed = adapters["variables"], adapters["placed_by_rules"]
    where = (
        "all replicated (they are small)"
        if not placed
        else f"{placed} placed by rules, {count - placed} replicated"
    )
    return (
        f"{count} variables, {adapters['params']:,} parameters, "
        f"{format_bytes(adapters['bytes_per_device'])}: {where}"
    )


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
    title = f"meshrun sweep: {len(rows)} jobs of {', '.join(map(label_text, models))}"
    if len(layouts) == 1:
        title += f", layout {label_text(layouts[0])}"
    varies = varying_keys(rows)
    return title + (f"; varying {', '.join(varies)}" if varies else "")


def label_text(label: str) -> str:
    """A model's or layout's label as a list of them shows it: in double quotes where it holds
    what separates the list's items (a comma: `GemmaCausalLM, LoRA rank 8`), a quote, or space at
    an end; as it is otherwise."""
    plain = label and label == label.strip() and not any(c in label for c in ',;"')
    return label if plain else json.dumps(label, ensure_ascii=False)


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
    fitting = " among those that fit" if any(r["status"] == DOES_NOT_FIT for r in rows) else ""
    table = Table(
        title=escape(sweep_title(rows) + f"; fastest first{fitting} ({'tokens' if lm else 'samples'}/s)")
    )
    staged = any(r.get("stages") for r in rows)  # pipelined runs: their stages, microbatches and idle share
    errors = any(r["status"] != "ok" for r in rows)
    for column in _sweep_columns(varying, staged, lm) + (["error"] if errors else []):
        left = column in ("job", "mesh", "model", "layout", "status", "error")
        table.add_column(column, justify="left" if left else "right", no_wrap=column != "error")
    for r in rows:
        head = [
            r["job"],
            r["mesh"],
            *(escape(str(r[key])) for key in varying),
            *(_stages_cells(r) if staged else []),
        ]
        idle = [_idle_text(r)] if staged else []
        table.add_row(*head, *_sweep_cells(r, unit, idle, errors))
    return table


def _sweep_columns(varying: list[str], staged: bool, lm: bool) -> list[str]:
    """The sweep table's columns (but the error column): the job, its mesh, the settings that vary
    between jobs, a pipeline's stages, then the status and the figures measured."""
    return [
        "job",
        "mesh",
        *varying,
        *(["stages", "micro"] if staged else []),
        "status",
        "compile s",
        "step ms",
        "p90 ms",
        "tokens/s" if lm else "samples/s",
        "eval loss",
        "peak/device",
        *(["idle (formula, fit)"] if staged else []),
    ]


def _sweep_cells(r: dict, unit: str, idle: list[str], errors: bool) -> list[str]:
    """A job's cells after its head (job, mesh, varying settings, stages): its status and figures,
    or for a job that failed or does not fit, its status, the planned bytes where known, and why."""
    if r["status"] == DOES_NOT_FIT:
        needed = format_bytes(r["peak_bytes_per_device"]) + " planned" if r["peak_bytes_per_device"] else "-"
        return ["[yellow]does not fit[/yellow]", *[""] * 5, needed, *idle, escape(r["error"] or "")]
    if r["status"] != "ok":
        return ["[red]error[/red]", *[""] * 6, *idle, escape(r["error"] or "")]
    peak = (
        f"{format_bytes(r['peak_bytes_per_device'])} {r['peak_source']}"
        if r["peak_bytes_per_device"]
        else "n/a"
    )
    return [
        "[bold green]best[/bold green]" if r["best"] else "ok",
        _figure(r["compile_s"], ".2f"),
        _figure(r["step_time_ms"], ".2f"),
        _figure(r["step_time_p90_ms"], ".2f"),
        _figure(r[unit], ",.0f"),
        _figure(r["eval_loss"], ".5f"),
        peak,
        *idle,
        *([""] if errors else []),
    ]


def _stages_cells(row: dict) -> list[str]:
    """A pipelined run's stages (x rounds of the circular schedule) and microbatches; - without."""
    if not row.get("stages"):
        return ["-", "-"]
    rounds = f" x{row['repeats']}" if (row.get("repeats") or 1) > 1 else ""
    return [f"{row['stages']}{rounds}", str(row["microbatches"])]


def _idle_text(row: dict) -> str:
    """The share of a step the stages wait: the formula's, and the one fitted to the step times of
    runs that differ only in their microbatch count (see meshrun.pipeline.bubble.fit_bubble)."""
    if row.get("bubble_formula") is None:
        return "-"
    fit = f", {row['bubble_fit']:.1%}" if row.get("bubble_fit") is not None else ""
    return f"{row['bubble_formula']:.1%}{fit}"


def _figure(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)
