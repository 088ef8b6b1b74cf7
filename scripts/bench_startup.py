"""Benchmarks how soon meshrun answers: seconds to the first training step, to a plan, to a config
error, against the targets of issue 18, and optionally against another checkout ("before").

Jobs, each repeat a fresh `python -m meshrun ...` process (imports, Hydra and jax start-up count):

- train_mlp:  `meshrun train mesh=2x4 layout=dense_model` (the README's main job): its
  `timing.time_to_first_step_s` (from process start) is the figure; beside it the steady step time
  (`timing.step_time_s`) and the per-epoch losses, which must not change;
- plan_mlp:   `meshrun plan mesh=2x4 layout=dense_model`, wall from spawn to exit;
- plan_7b:    `meshrun plan recipe=transformer_7b_tp`, wall;
- error_rule: a layout rule that matches nothing (`layout.rules={d3/kernel:[null,model]}`), wall to
  the one-line error (exit 2);
- error_data: a data file that does not exist (`data=arrays data.path=missing.npz`), wall to the
  one-line error (exit 2);
- sweep (with --sweep): `meshrun sweep layout=dense_model`, the four mesh shapes of 8 devices in one
  process, wall.

Each job is run once untimed first (a warm compile cache, warm disk), then --repeats times; with
--before, each timed repeat of a job runs the other checkout right before this one, so that drift
of the shared machine reaches both alike. Medians are reported, and for train_mlp whether both
checkouts trained to exactly the same losses.

Targets (issue 18): train_mlp time to first step <= 2.5 s; plan_mlp <= 1.5 s; plan_7b <= 3 s;
error_rule and error_data <= 2 s; step time and the sweep within noise of before.

    python scripts/bench_startup.py                            # this checkout, 5 repeats
    git worktree add /tmp/meshrun-before <commit> && ln -s ../configs /tmp/meshrun-before/meshrun/configs
    python scripts/bench_startup.py --before /tmp/meshrun-before --sweep --out bench_startup.json

(`--before` runs that checkout's code with this interpreter through PYTHONPATH; the link makes its
own configs the ones found.) It is a measurement: it exits 0 whatever the numbers, 1 only when a job
does not end as it should (a run that fails, an error that is not one line with exit status 2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from meshrun.measure import run_measured

JOBS = {
    "train_mlp": ["train", "mesh=2x4", "layout=dense_model"],
    "plan_mlp": ["plan", "mesh=2x4", "layout=dense_model"],
    "plan_7b": ["plan", "recipe=transformer_7b_tp"],
    "error_rule": ["train", "mesh=2x4", "layout.rules={d3/kernel:[null,model]}"],
    "error_data": ["train", "mesh=2x4", "data=arrays", "data.path=missing.npz"],
    "sweep": ["sweep", "layout=dense_model"],
}
TARGETS_S = {"train_mlp": 2.5, "plan_mlp": 1.5, "plan_7b": 3.0, "error_rule": 2.0, "error_data": 2.0}
ERROR_TEXT = {"error_rule": "matches no variable", "error_data": "data.path"}


def run_job(name: str, checkout: str | None, work: Path) -> dict:
    """One fresh process of job `name` with this checkout's code or `checkout`'s; its figures."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    if checkout:
        env["PYTHONPATH"] = checkout
    folder = Path(tempfile.mkdtemp(dir=work))
    args = [*JOBS[name], f"hydra.run.dir={folder / 'run'}"] if name != "sweep" else [*JOBS[name], f"hydra.sweep.dir={folder / 'sweep'}"]
    done = run_measured(args, cwd=folder, timeout=600, env=env)
    figures = {"wall_s": done.wall_s, "exit": done.returncode}
    if name.startswith("error_"):
        lines = done.stderr.strip().splitlines()
        figures["ok"] = done.returncode == 2 and len(lines) == 1 and ERROR_TEXT[name] in lines[0]
        figures["said"] = lines[-1] if lines else ""
    elif name == "train_mlp":
        metrics_file = folder / "run" / "metrics.json"
        metrics = json.loads(metrics_file.read_text()) if metrics_file.exists() else {}
        figures["ok"] = done.returncode == 0 and metrics.get("status") == "ok"
        if figures["ok"]:
            timing = metrics["timing"]
            figures.update(first_step_s=timing["time_to_first_step_s"], startup_s=timing["startup_s"],
                           step_ms=timing["step_time_s"] * 1e3, losses=metrics["history"]["loss"], eval_loss=metrics["eval"]["loss"])
    else:
        figures["ok"] = done.returncode == 0
    if not figures["ok"]:
        figures["stderr_tail"] = done.stderr[-1500:]
    return figures


def headline(name: str, runs: list[dict]) -> float | None:
    """The figure a job is judged by: time to first step for train_mlp, else the wall."""
    key = "first_step_s" if name == "train_mlp" else "wall_s"
    values = [r[key] for r in runs if r.get("ok") and key in r]
    return statistics.median(values) if values else None


def median_of(runs: list[dict], key: str) -> float | None:
    values = [r[key] for r in runs if r.get("ok") and key in r]
    return statistics.median(values) if values else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", help="another checkout to compare with (run through PYTHONPATH)")
    parser.add_argument("--sweep", action="store_true", help="also time `meshrun sweep layout=dense_model` (about 15 s a run)")
    parser.add_argument("--jobs", nargs="*", default=None, help=f"only these jobs (of {', '.join(JOBS)})")
    parser.add_argument("--out", default="bench_startup.json")
    args = parser.parse_args()
    names = args.jobs or [n for n in JOBS if n != "sweep" or args.sweep]
    checkouts = {"after": None, **({"before": str(Path(args.before).resolve())} if args.before else {})}
    console = Console()
    results: dict = {name: {label: [] for label in checkouts} for name in names}
    failed = False
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        work = Path(scratch)
        for name in names:
            for checkout in checkouts.values():
                run_job(name, checkout, work)  # warm-up: compile cache, disk
            for repeat in range(args.repeats):
                for label in reversed(list(checkouts)):  # before, then after
                    figures = run_job(name, checkouts[label], work)
                    results[name][label].append(figures)
                    failed |= not figures["ok"]
                    console.print(f"{name} {label} #{repeat + 1}: " + ", ".join(
                        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}" for k, v in figures.items() if k not in ("losses", "stderr_tail")))
    table = Table(title=f"start-up, median of {args.repeats} fresh processes")
    table.add_column("job")
    table.add_column("figure")
    for label in reversed(list(checkouts)):
        table.add_column(label, justify="right")
    table.add_column("target", justify="right")
    summary = {}
    for name in names:
        figure = "time to first step" if name == "train_mlp" else "wall"
        medians = {label: headline(name, results[name][label]) for label in checkouts}
        target = TARGETS_S.get(name)
        summary[name] = {"median_s": medians, "target_s": target, "met": None if target is None or medians["after"] is None else medians["after"] <= target}
        cells = [f"{medians[label]:.2f} s" if medians[label] is not None else "failed" for label in reversed(list(checkouts))]
        table.add_row(name, figure, *cells, f"<= {target} s" if target else "within noise")
        if name == "train_mlp":
            steps = {label: median_of(results[name][label], "step_ms") for label in checkouts}
            table.add_row("", "steady step", *(f"{steps[label]:.2f} ms" if steps[label] else "-" for label in reversed(list(checkouts))), "within noise")
            losses = {label: {tuple(r["losses"]) + (r["eval_loss"],) for r in results[name][label] if r.get("ok")} for label in checkouts}
            same = len(set().union(*losses.values())) == 1
            summary[name].update(step_ms=steps, same_losses=same, losses=sorted(set().union(*losses.values())))
            table.add_row("", "losses", *("identical" if same else "DIFFER" for _ in checkouts), "the same")
    console.print(table)
    payload = {"machine": {"python": sys.version.split()[0], "platform": platform.platform(), "cpus": os.cpu_count()},
               "repeats": args.repeats, "summary": summary, "runs": results}
    Path(args.out).write_text(json.dumps(payload, indent=2, default=list))
    console.print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
