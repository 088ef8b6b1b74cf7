"""Benchmarks `meshrun plan`: how long it takes and how much memory it needs to plan large models,
which it builds from shapes alone (nothing allocated).

Jobs: the transformer's 7b preset (6.7e9 parameters) on meshes 1x8, 2x4 and 8x1 with each of the
layouts transformer_tp, transformer_fsdp and transformer_2d, two_tower's large preset (1.4e10
parameters, mostly embedding tables) with layout two_tower on 1x8, and a KerasHub Llama of Llama-7B's
sizes (model=keras_hub, 6.7e9 parameters) on 2x4 with KerasHub's own map (layout=from_model) and with
meshrun's llama_tp, llama_fsdp and llama_2d. Each repeat of each job is a
fresh `python -m meshrun plan ... --json` subprocess, so start-up (imports, Hydra, jax) is
included. Measured per job: wall time around the subprocess (median and max over repeats), the
child's own peak RSS (ru_maxrss from os.wait4, so other processes do not count), and from its JSON
the status, the lint counts and the per-device bytes (parameters, optimizer state, total).

The targets from the issues: the 7b plan on 1x8, and the KerasHub Llama-7B plan, in under 60 s and
2 GiB peak RSS.

    python scripts/bench_plan.py                     # every job, 3 repeats, writes bench_plan.json
    python scripts/bench_plan.py --repeats 1 --out /tmp/bench_plan.json

It is a measurement: it exits 0 whatever the numbers and 1 only when a subprocess crashes (no
JSON plan on stdout). Lint errors (exit 2) are recorded as status "error", not as failures.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
from pathlib import Path

from rich.console import Console

import benchlib

WALL_TARGET_S = 60.0
RSS_TARGET_BYTES = 2 << 30

TRANSFORMER_MESHES = ("1x8", "2x4", "8x1")
TRANSFORMER_LAYOUTS = ("transformer_tp", "transformer_fsdp", "transformer_2d")
LLAMA_7B = [
    "model=keras_hub",
    "model.task=LlamaCausalLM",
    "model.seq_len=2048",
    "model.backbone={vocabulary_size:32000,num_layers:32,num_query_heads:32,num_key_value_heads:32,hidden_dim:4096,intermediate_dim:11008}",
]
LLAMA_LAYOUTS = ("from_model", "llama_tp", "llama_fsdp", "llama_2d")


def jobs() -> list[dict]:
    """Every job: a name and its `meshrun plan` overrides."""
    found = []
    for layout in TRANSFORMER_LAYOUTS:
        for mesh in TRANSFORMER_MESHES:
            found.append(
                {
                    "model": "transformer/7b",
                    "mesh": mesh,
                    "layout": layout,
                    "overrides": ["model=transformer", "model.preset=7b", f"mesh={mesh}", f"layout={layout}"],
                }
            )
    found.append(
        {
            "model": "two_tower/large",
            "mesh": "1x8",
            "layout": "two_tower",
            "overrides": ["model=two_tower", "model.preset=large", "mesh=1x8", "layout=two_tower"],
        }
    )
    for layout in LLAMA_LAYOUTS:
        found.append(
            {
                "model": "keras_hub/llama-7b",
                "mesh": "2x4",
                "layout": layout,
                "overrides": [*LLAMA_7B, "mesh=2x4", f"layout={layout}"],
            }
        )
    return found


def run_once(overrides: list[str], timeout: float) -> dict:
    """One `meshrun plan OVERRIDES --json` in a fresh process and an empty working dir: its exit
    status, wall seconds, peak RSS bytes (its own rusage) and the plan it printed (None if none)."""
    done, plan = benchlib.plan(overrides, timeout)
    return {
        "rc": done.returncode,
        "wall_s": done.wall_s,
        "peak_rss_bytes": done.peak_rss_bytes,
        "plan": plan,
        "stderr_tail": done.stderr.strip().splitlines()[-3:],
    }


def summarise(job: dict, runs: list[dict]) -> dict:
    """A job's result: timings over its repeats and the numbers of its (last) plan."""
    walls = [r["wall_s"] for r in runs]
    rss = [r["peak_rss_bytes"] for r in runs]
    plan = runs[-1]["plan"]
    result = {
        "model": job["model"],
        "mesh": job["mesh"],
        "layout": job["layout"],
        "command": "meshrun plan " + " ".join(job["overrides"]) + " --json",
        "repeats": len(runs),
        "rc": [r["rc"] for r in runs],
        "wall_s": walls,
        "wall_median_s": statistics.median(walls),
        "wall_max_s": max(walls),
        "peak_rss_bytes": rss,
        "peak_rss_max_bytes": max(rss),
        "crashed": any(r["plan"] is None for r in runs),
    }
    if plan is None:
        result["stderr_tail"] = runs[-1]["stderr_tail"]
        return result
    result.update(
        status=plan["status"],
        params=plan["model"]["params"],
        devices=plan["mesh"]["devices"],
        errors=len(plan["errors"]),
        warnings=len(plan["warnings"]),
        per_device=plan["per_device"],
        largest_replicated=plan["largest_replicated"][:1],
    )
    return result


def gib(count: int) -> str:
    return f"{count / (1 << 30):.2f}"


def render(results: list[dict], console: Console) -> None:
    """The table of every job's timings, memory and plan."""
    table = benchlib.table(
        "meshrun plan: wall time and peak RSS of a fresh process (per-device bytes in GiB)",
        (
            "model",
            "mesh",
            "layout",
            "status",
            "wall median s",
            "wall max s",
            "peak RSS MiB",
            "params/dev",
            "optimizer/dev",
            "total/dev",
            "lint E/W",
        ),
        left=("model", "mesh", "layout", "status"),
    )
    for r in results:
        if r["crashed"]:
            status, params, optimizer, total, lint = "crashed", "-", "-", "-", "-"
        else:
            per_device = r["per_device"]
            status = r["status"]
            params, optimizer, total = (
                gib(per_device[k]) for k in ("params_bytes", "optimizer_bytes", "total_bytes")
            )
            lint = f"{r['errors']}/{r['warnings']}"
        table.add_row(
            r["model"],
            r["mesh"],
            r["layout"],
            status,
            f"{r['wall_median_s']:.2f}",
            f"{r['wall_max_s']:.2f}",
            f"{r['peak_rss_max_bytes'] / (1 << 20):.0f}",
            params,
            optimizer,
            total,
            lint,
        )
    console.print(table)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3, help="fresh subprocesses per job (default 3)")
    parser.add_argument(
        "--out", type=Path, default=Path("bench_plan.json"), help="results file (default ./bench_plan.json)"
    )
    parser.add_argument(
        "--timeout", type=float, default=300.0, help="seconds before a plan is killed (default 300)"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1:
        parser.error("--repeats must be at least 1")
    console = benchlib.console(150)

    results = []
    for job in jobs():
        runs = []
        for repeat in range(args.repeats):
            run = run_once(job["overrides"], args.timeout)
            runs.append(run)
            console.print(
                f"{job['model']} {job['mesh']} {job['layout']} #{repeat + 1}: rc {run['rc']}, "
                f"{run['wall_s']:.2f} s, {run['peak_rss_bytes'] / (1 << 20):.0f} MiB",
                highlight=False,
            )
        results.append(summarise(job, runs))

    render(results, console)
    within = True
    for model, mesh, layout in (
        ("transformer/7b", "1x8", "transformer_tp"),
        ("keras_hub/llama-7b", "2x4", "from_model"),
    ):
        target = next(r for r in results if (r["model"], r["mesh"], r["layout"]) == (model, mesh, layout))
        met = target["wall_max_s"] < WALL_TARGET_S and target["peak_rss_max_bytes"] < RSS_TARGET_BYTES
        within = within and met
        console.print(
            f"{model} on {mesh} ({layout}): max wall {target['wall_max_s']:.2f} s (target < "
            f"{WALL_TARGET_S:.0f} s), max peak RSS {target['peak_rss_max_bytes'] / (1 << 20):.0f} MiB "
            f"(target < 2048 MiB): {'within' if met else 'OUTSIDE'} the bound",
            highlight=False,
        )
    report = {
        "benchmark": "meshrun plan",
        "python": sys.version.split()[0],
        "machine": {"platform": platform.platform(), "cpus": os.cpu_count()},
        "repeats": args.repeats,
        "targets": {"wall_s": WALL_TARGET_S, "peak_rss_bytes": RSS_TARGET_BYTES},
        "target_met": within,
        "results": results,
    }
    benchlib.write_json(args.out, report)
    console.print(f"wrote {args.out}", highlight=False)
    return 1 if any(r["crashed"] for r in results) else 0


if __name__ == "__main__":
    sys.exit(main())
