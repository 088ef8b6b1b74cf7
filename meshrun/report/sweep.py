"""Mesh-shape sweeps: which shapes to try, and the comparison of finished runs (the rows of the
sweep table and the files summary.csv, summary.json and summary.png in the sweep dir).

Each run's metrics.json is read as RunMetrics (meshrun.specs.metrics); the rows are plain dicts, the
content of summary.json. No jax.
"""

from __future__ import annotations

import csv
import io
import json
import logging
import os
import re
from pathlib import Path

from meshrun.errors import ConfigError
from meshrun.files import unwritable, write_atomic, write_json
from meshrun.flags import read_command_line
from meshrun.logs import console
from meshrun.pipeline.bubble import fit_bubble
from meshrun.report.render import label_text, rate_column, render_sweep, sweep_title, varying_keys
from meshrun.specs.metrics import (
    DOES_NOT_FIT,
    MemoryFigures,
    ModelFigures,
    RunMetrics,
    TimingFigures,
)
from meshrun.specs.rundir import METRICS_FILE, PLAN_FILE, SUMMARY_FILES
from meshrun.wording import counted, first_line, format_bytes, format_shape, one_of

log = logging.getLogger("meshrun")

COLUMNS = (
    "job",
    "mesh",
    "model",
    "layout",
    "status",
    "best",
    "compile_s",
    "step_time_ms",
    "step_time_p90_ms",
    "samples_per_s",
    "tokens_per_s",
    "eval_loss",
    "peak_bytes_per_device",
    "peak_source",
    "run_dir",
    "error",
    "stages",
    "repeats",
    "microbatches",
    "bubble_formula",
    "bubble_fit",
)


def mesh_shapes(device_count: int, rank: int) -> list[tuple[int, ...]]:
    """Every ordered factorisation of `device_count` into `rank` dimensions, the first dimension
    largest first: 8 devices, 2-D -> 8x1, 4x2, 2x4, 1x8."""
    if rank == 1:
        return [(device_count,)]
    shapes = []
    for first in sorted((d for d in range(1, device_count + 1) if device_count % d == 0), reverse=True):
        shapes += [(first, *rest) for rest in mesh_shapes(device_count // first, rank - 1)]
    return shapes


def compare(run_dirs, out_dir) -> list[dict]:
    """Prints the comparison of `run_dirs` and writes the summary files into `out_dir`."""
    rows = summary_rows(run_dirs, relative_to=out_dir)
    if not rows:
        raise ConfigError(
            "report",
            f"none of the {len(run_dirs)} metrics.json files found could be read (see the warnings above)",
        )
    render_sweep(rows)
    for path in write_summary(rows, out_dir):
        print(f"wrote {path}")
    return rows


OUT = "--out"


def report(args: list[str]) -> list[dict]:
    """`meshrun report DIR [DIR ...] [--out DIR]`: compares the runs found under the dirs, writing
    the summary files into the one dir given, or --out (the working dir for several)."""
    out, dirs = report_args(args)
    missing = [d for d in dirs if not Path(d).is_dir()]
    if missing:
        raise ConfigError("report", f"{missing[0]!r} is not a directory")
    runs = find_runs(dirs)
    if not runs:
        raise ConfigError(
            "report", f"no metrics.json under {one_of(dirs)}; run dirs of meshrun train hold one"
        )
    return compare(runs, out or (dirs[0] if len(dirs) == 1 else "."))


def report_args(args: list[str]) -> tuple[str | None, list[str]]:
    """The --out dir (`--out DIR` or `--out=DIR`; None: not given, the last where given twice) and
    the dirs to compare; a ConfigError for another flag, no dir, or an --out dir that cannot be made
    or written."""
    line = read_command_line(args, "report", {OUT: "DIR"}, ())
    given = line.values.get(OUT, [None]) if line else [None]
    out = given[-1]
    reason = unwritable(out, directory=True) if out else None
    if reason:
        raise ConfigError(
            OUT,
            f"got {out!r}, which cannot be written ({reason}); give a dir where you can write "
            "(made if missing), e.g. --out comparison/",
        )
    if not line or not line.positional:
        raise ConfigError(
            "report", "got no dir; give one or more sweep or run dirs, e.g. meshrun report multirun/DATE/TIME"
        )
    return out, list(line.positional)


def find_runs(paths) -> list[Path]:
    """The run dirs (dirs holding a metrics.json) at or under each of `paths`, in natural order
    (job 2 before job 10)."""
    found = set()
    for path in map(Path, paths):
        if (path / METRICS_FILE).is_file():
            found.add(path)
        found.update(p.parent for p in path.rglob(METRICS_FILE))
    return sorted(found, key=_natural_key)


def summary_rows(run_dirs, relative_to) -> list[dict]:
    """One row per readable run, sorted by throughput (tokens/s when every run is a language model,
    else samples/s), then the jobs that did not fit a device's memory, failed runs last; the fastest
    successful run has best=True."""
    rows = [row for row in (_read_row(Path(d), Path(relative_to)) for d in run_dirs) if row is not None]
    add_bubble_fits(rows)
    unit = rate_column(rows)
    rank = {"ok": 0, DOES_NOT_FIT: 1}
    rows.sort(key=lambda r: (rank.get(r["status"], 2), -(r[unit] or 0.0)))
    if rows and rows[0]["status"] == "ok":
        rows[0]["best"] = True
    return rows


def add_bubble_fits(rows: list[dict]) -> None:
    """Sets `bubble_fit` on the successful pipelined runs that differ from others only in their
    microbatch count (same mesh, model, layout, stages and repeats; two counts at least): the idle
    share measured by fitting their step times to the schedule (meshrun.pipeline.bubble)."""
    groups: dict[tuple, dict[int, dict]] = {}
    for row in rows:
        if row["status"] == "ok" and (row["stages"] or 0) > 1 and row["step_time_ms"]:
            key = (row["mesh"], row["model"], row["layout"], row["stages"], row["repeats"])
            groups.setdefault(key, {})[row["microbatches"]] = row
    for (*_, stages, repeats), by_microbatches in groups.items():
        fit = fit_bubble(stages, repeats, {m: row["step_time_ms"] for m, row in by_microbatches.items()})
        for m, row in by_microbatches.items():
            row["bubble_fit"] = _round(fit.shares[m]) if fit else None


def write_summary(rows: list[dict], out_dir) -> list[Path]:
    """Writes summary.csv, summary.json and summary.png into `out_dir`; returns their paths."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / name for name in SUMMARY_FILES]
    write_atomic(paths[0], to_csv(rows).encode())
    write_json({"rows": rows}, out, paths[1].name)
    write_atomic(paths[2], plot_png(rows))
    return paths


def to_csv(rows: list[dict]) -> str:
    """The rows as CSV text, one column per COLUMNS entry."""
    buffer = io.StringIO()
    writer = csv.DictWriter(buffer, fieldnames=COLUMNS, lineterminator="\n")
    writer.writeheader()
    for row in rows:
        writer.writerow({k: "" if row[k] is None else row[k] for k in COLUMNS})
    return buffer.getvalue()


def plot_png(rows: list[dict]) -> bytes:
    """The sweep figure as PNG bytes."""
    buffer = io.BytesIO()
    sweep_figure(rows).savefig(buffer, format="png", dpi=100, metadata={"Software": None})
    return buffer.getvalue()


def sweep_figure(rows: list[dict]):
    """Two bar charts of the jobs in the table's order (fastest first, the best marked): median step
    time (p90 as a whisker) and throughput, titled like the table."""
    console.library_lines("matplotlib")  # before its import, which may build its font cache and say so
    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    varying = [key for key in varying_keys(rows) if key != "mesh"]
    labels = [
        " ".join([f"{r['job']}: {r['mesh']}", *(label_text(str(r[key])) for key in varying)]) for r in rows
    ]
    ok = [r["status"] == "ok" for r in rows]
    unit = rate_column(rows)
    step = [r["step_time_ms"] or 0.0 if o else 0.0 for r, o in zip(rows, ok, strict=True)]
    whisker = [
        max((r["step_time_p90_ms"] or 0.0) - (r["step_time_ms"] or 0.0), 0.0) if o else 0.0
        for r, o in zip(rows, ok, strict=True)
    ]
    rate = [r[unit] or 0.0 if o else 0.0 for r, o in zip(rows, ok, strict=True)]
    colours = ["tab:orange" if r["best"] else "tab:blue" for r in rows]

    figure = Figure(figsize=(max(6.0, 1.2 * len(rows) + 2), 6.5), layout="constrained")
    top, bottom = figure.subplots(2, 1, sharex=True)
    positions = range(len(rows))
    top.bar(positions, step, yerr=[[0] * len(rows), whisker], color=colours, capsize=4)
    top.set_ylabel("step time, ms (median; whisker: p90)")
    bottom.bar(positions, rate, color=["tab:orange" if r["best"] else "tab:green" for r in rows])
    bottom.set_ylabel(unit.replace("_per_s", "/s"))
    bottom.set_xticks(list(positions), labels, rotation=30, ha="right")
    for index, row in enumerate(rows):
        if row["best"]:
            bottom.annotate("best", (index, rate[index]), ha="center", va="bottom", color="tab:orange")
        elif row["status"] != "ok":
            text = "does not fit" if row["status"] == DOES_NOT_FIT else "error"
            top.annotate(text, (index, 0), ha="center", va="bottom", color="tab:red")
    figure.suptitle(sweep_title(rows))
    return figure


def _read_row(run_dir: Path, relative_to: Path) -> dict | None:
    """The summary row of one run, or None (with one warning line) when its metrics.json cannot be
    read or was not written by meshrun train."""
    path = run_dir / METRICS_FILE
    try:
        return _row(run_dir, RunMetrics.from_json(json.loads(path.read_text())), relative_to)
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as err:
        reason = f"no {err} in it" if isinstance(err, KeyError) else first_line(err)
        log.warning(f"skipped {path}: {reason}")
        return None


def _row(run_dir: Path, m: RunMetrics, relative_to: Path) -> dict:
    # A section the file lacks reads as one whose figures are all None.
    timing, memory, model = (
        m.timing or TimingFigures(),
        m.memory or MemoryFigures(),
        m.model or ModelFigures(),
    )
    if m.ok and m.timing is None:
        raise KeyError(
            "timing"
        )  # a successful run has its timing section (null step times: only the compiling step ran)
    live, compiled, planned = (
        memory.live_peak_bytes_per_device,
        memory.peak_bytes_per_device,
        memory.needed_bytes_per_device,
    )
    choices = m.choices or {}
    return {
        "job": run_dir.name,
        "mesh": format_shape(m.mesh.shape) if m.mesh else str(choices.get("mesh", "?")),
        "model": model.called or choices.get("model"),
        "layout": layout_label(m),
        "status": m.status,
        "best": False,
        "compile_s": _round(timing.compile_s) if m.ok else None,
        "step_time_ms": _round(_ms(timing.step_time_s)) if m.ok else None,
        "step_time_p90_ms": _round(_ms(timing.step_time_p90_s)) if m.ok else None,
        "samples_per_s": _round(timing.samples_per_s) if m.ok else None,
        "tokens_per_s": _round(timing.tokens_per_s) if m.ok else None,
        "eval_loss": _round((m.eval or {}).get("loss")) if m.ok else None,
        "peak_bytes_per_device": next((b for b in (live, compiled, planned) if b is not None), None),
        "peak_source": next(
            (name for name, b in (("live", live), ("compiled", compiled), ("planned", planned)) if b), None
        ),
        "run_dir": os.path.relpath(run_dir.resolve(), relative_to.resolve()),
        "error": _fit_text(memory) if m.status == DOES_NOT_FIT else m.error,
        **_pipeline_figures(run_dir),
    }


def _pipeline_figures(run_dir: Path) -> dict:
    """The run's pipeline stages as its plan.json records them (all None without stages, or
    without a plan): stages, repeats, microbatches and the formula's idle share; bubble_fit is set
    over the rows (add_bubble_fits)."""
    try:
        pipeline = json.loads((run_dir / PLAN_FILE).read_text()).get("pipeline") or {}
    except (OSError, ValueError, AttributeError):
        pipeline = {}
    return {
        "stages": pipeline.get("stages"),
        "repeats": pipeline.get("repeats"),
        "microbatches": pipeline.get("microbatches"),
        "bubble_formula": _round(pipeline.get("bubble_fraction")),
        "bubble_fit": None,
    }


def layout_label(m: RunMetrics) -> str | None:
    """The layout a run placed by, as the comparison names it: the layout option chosen, or what
    the command line made of it: `2 rules from command line` when layout.rules=... replaced the
    option's rules, `transformer_tp + 1 extra rule` when layout.extra_rules=... added some (counts
    from metrics.json's layout section; a run that failed before placing anything has none)."""
    given = {o.lstrip("+~").partition("=")[0] for o in m.overrides or [] if "=" in o}
    origins = list(m.layout.origins.values()) if m.layout and m.layout.origins is not None else None
    label = (m.choices or {}).get("layout")
    if "layout.rules" in given:
        label = f"{_counted(origins, 'rules', 'rule')} from command line"
    if "layout.extra_rules" in given:
        label = f"{label} + {_counted(origins, 'extra_rules', 'extra rule')}"
    return label


def _counted(origins: list | None, origin: str, noun: str) -> str:
    """`2 rules`: how many of `origins` are `origin`, or the bare plural when they are unknown."""
    if origins is None:
        return f"{noun}s"
    return counted(origins.count(origin), noun)


def _fit_text(memory: MemoryFigures) -> str:
    """A job that did not fit, in a few words (its metrics.json has the whole reason)."""
    needed, available = memory.needed_bytes_per_device, memory.device_memory_bytes
    if needed is None or available is None:
        return "does not fit a device's memory"
    return (
        f"needs {format_bytes(needed)} per device for parameters "
        f"and optimizer state; a device has {format_bytes(available)}"
    )


def _ms(seconds):
    return None if seconds is None else seconds * 1e3


def _round(value, digits: int = 6):
    return None if value is None else round(float(value), digits)


def _natural_key(value) -> list:
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", str(value))]
