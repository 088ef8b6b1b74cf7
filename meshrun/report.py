"""The end-of-run report: `metrics.json` in the run dir for scripts, a rich table for people."""

from __future__ import annotations

import json
import os
from pathlib import Path

from rich.console import Console
from rich.table import Table

METRICS_FILE = "metrics.json"


def write_metrics(metrics: dict, run_dir: str | os.PathLike) -> Path:
    """Writes metrics.json into `run_dir` atomically (a reader never sees half a file)."""
    path = Path(run_dir) / METRICS_FILE
    tmp = path.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(metrics, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)
    return path


def error_metrics(message: str, run_dir: str, choices: dict, overrides: list) -> dict:
    """The metrics.json of a run that failed after it started."""
    return {"status": "error", "error": message, "run_dir": run_dir, "choices": choices, "overrides": overrides}


def render(metrics: dict, console: Console | None = None) -> None:
    """Prints the run summary and the placed sharding of every variable."""
    console = console or Console()
    console.print(summary_table(metrics))
    console.print(sharding_table(metrics["sharding"]))


def summary_table(m: dict) -> Table:
    """One row per headline figure of a finished run."""
    t = timing = m["timing"]
    table = Table(title=f"meshrun: {m['model']['name']} on mesh {_shape(m['mesh']['shape'])}", show_header=False)
    table.add_column("what", style="bold")
    table.add_column("value")
    rows = [
        ("status", m["status"]),
        ("mesh", f"{_shape(m['mesh']['shape'])} {tuple(m['mesh']['axis_names'])}, batch axis {m['mesh']['batch_axis']!r}"),
        ("devices", f"{m['devices']['count']} x {m['devices']['kind']}" + (" (emulated)" if m["devices"]["emulated"] else "")),
        ("model", f"{m['model']['name']}, {m['model']['params']:,} parameters"),
        ("batch", f"{m['train']['global_batch_size']} global, {m['train']['per_replica_batch_size']} per replica, "
                  f"{m['train']['steps_per_epoch']} steps/epoch x {m['train']['epochs']} epochs"),
        ("start-up", f"{t['startup_s']:.2f} s to model built, {t['time_to_first_step_s']:.2f} s to first step"),
        ("compile", f"{timing['compile_s']:.3f} s (first step)"),
        ("step time", f"{timing['step_time_s'] * 1e3:.2f} ms median, {timing['step_time_p90_s'] * 1e3:.2f} ms p90 "
                      f"({timing['steady_steps']} steps)"),
        ("throughput", f"{timing['samples_per_s']:,.0f} samples/s"),
        ("epochs", ", ".join(f"{s:.2f}" for s in timing["epoch_s"]) + " s"),
        ("loss", " -> ".join(f"{v:.5f}" for v in m["history"].get("loss", []))),
        ("eval", ", ".join(f"{k} {v:.5f}" for k, v in m["eval"].items()) + f" ({timing['eval_s']:.2f} s)"),
        ("wall", f"{timing['wall_s']:.2f} s"),
        ("run dir", m.get("run_dir", "")),
    ]
    for name, value in rows:
        table.add_row(name, str(value))
    return table


def sharding_table(sharding: dict) -> Table:
    """Where each variable lives: shape, PartitionSpec as placed, and the rule behind it."""
    table = Table(title="placed variables")
    for column in ("path", "shape", "spec", "rule"):
        table.add_column(column)
    for path, info in sharding.items():
        spec = "(" + ", ".join("None" if a is None else str(a) for a in info["spec"]) + ")"
        table.add_row(path, _shape(info["shape"]), spec, info["rule"] or "replicated")
    return table


def _shape(shape) -> str:
    return "x".join(str(d) for d in shape) if shape else "scalar"
