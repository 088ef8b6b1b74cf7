"""Benchmarks how soon meshrun answers: seconds to the first training step, to a plan, to a config
error, against its start-up targets, and optionally against another checkout ("before").

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

With --hub, three tiny KerasHub fine-tunes on mesh 2x4 (one epoch), each judged by its time to first
step, on inputs the script builds first with tests/presets.py (a 35 KB corpus, a Gemma preset of
vocabulary 512 and 2 layers with its SentencePiece tokenizer, a Hugging Face tokenizer.json):

- hub_synthetic:  a Llama made from model.backbone on data=synthetic (the KerasHub example of docs/models.md);
- hub_text:       the Gemma preset, LoRA rank 4, data=text with the tokenizer.json (the direct
  `tokenizers` encoder: nothing of TensorFlow's is needed);
- hub_preset_tok: the same with the preset's own tokenizer, whose check against KerasHub's
  TensorFlow graph the warm-up run made and kept in the token cache (TensorFlow needed for that
  check only, so not run without TensorFlow);
- plan_hub_7b:    `meshrun plan` of a KerasHub Llama of Llama-7B's sizes on 2x4 (layout=from_model),
  wall (scripts/bench_plan.py has it among others).

--without-tensorflow adds a column: this checkout in a venv the script makes, which links every
package of this interpreter's site-packages but TensorFlow's (meshrun.measure.venv_without_tensorflow,
which tests/test_without_tensorflow.py uses too): an install without TensorFlow, as `pip install
--no-deps keras-hub` makes it. Target: each hub fine-tune's time to first step within 1.5 s of
that column's. Every job also reports its process's peak RSS.

Each job is run once untimed first (a warm compile cache, warm disk, the token cache filled), then
--repeats times; each timed repeat runs the columns one after the other (no TensorFlow, before,
after), so that drift of the shared machine reaches all alike. Medians are reported, with the
range of the figure (max - min over the repeats: how noisy the machine was), and for train_mlp
whether the checkouts trained to exactly the same losses.

Targets: train_mlp time to first step <= 2.5 s; plan_mlp <= 1.5 s; plan_7b <= 3 s;
error_rule and error_data <= 2 s; step time and the sweep within noise of before.

    python scripts/bench_startup.py                            # this checkout, 5 repeats
    git worktree add /tmp/meshrun-before <commit> && ln -s ../configs /tmp/meshrun-before/meshrun/configs
    python scripts/bench_startup.py --before /tmp/meshrun-before --sweep --out bench_startup.json
    python scripts/bench_startup.py --hub --without-tensorflow --before /tmp/meshrun-before \
        --jobs hub_synthetic hub_text hub_preset_tok

(`--before` runs that checkout's code with this interpreter through PYTHONPATH; the link makes its
own configs the ones found.) It is a measurement: it exits 0 whatever the numbers, 1 only when a job
does not end as it should (a run that fails, an error that is not one line with exit status 2).
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

import benchlib
from meshrun.measure import run_measured, venv_without_tensorflow

START_JOBS = {
    "train_mlp": ["train", "mesh=2x4", "layout=dense_model"],
    "plan_mlp": ["plan", "mesh=2x4", "layout=dense_model"],
    "plan_7b": ["plan", "recipe=transformer_7b_tp"],
    "error_rule": ["train", "mesh=2x4", "layout.rules={d3/kernel:[null,model]}"],
    "error_data": ["train", "mesh=2x4", "data=arrays", "data.path=missing.npz"],
    "sweep": ["sweep", "layout=dense_model"],
}
TARGETS_S = {"train_mlp": 2.5, "plan_mlp": 1.5, "plan_7b": 3.0, "error_rule": 2.0, "error_data": 2.0}
ERROR_TEXT = {"error_rule": "matches no variable", "error_data": "data.path"}

# --hub: tiny KerasHub fine-tunes; {inputs} is the folder of the inputs build_hub_inputs makes.
HUB_COMMON = ["train", "mesh=2x4", "train.epochs=1", "train.verbose=0"]
GEMMA_TEXT = [
    *HUB_COMMON,
    "model=keras_hub",
    "model.preset={inputs}/gemma",
    "layout=gemma_tp",
    "model.seq_len=32",
    "model.lora.rank=4",
    "data=text",
    "data.files={inputs}/corpus.txt",
]
HUB_JOBS = {
    "hub_synthetic": [
        *HUB_COMMON,
        "model=keras_hub",
        "model.task=LlamaCausalLM",
        "model.seq_len=32",
        "layout=from_model",
        "model.backbone={{vocabulary_size:512,num_layers:2,num_query_heads:8,num_key_value_heads:4,hidden_dim:64,intermediate_dim:128}}",
        "data.num_samples=256",
        "data.eval_samples=32",
    ],
    "hub_text": [*GEMMA_TEXT, "data.tokenizer={inputs}/hf/tokenizer.json"],
    "hub_preset_tok": GEMMA_TEXT,
    # and a plan: a KerasHub Llama of Llama-7B's sizes (scripts/bench_plan.py's), built from shapes alone
    "plan_hub_7b": [
        "plan",
        "model=keras_hub",
        "model.task=LlamaCausalLM",
        "model.seq_len=2048",
        "mesh=2x4",
        "layout=from_model",
        "model.backbone={{vocabulary_size:32000,num_layers:32,num_query_heads:32,num_key_value_heads:32,hidden_dim:4096,"
        "intermediate_dim:11008}}",
    ],
}
JOBS = {**START_JOBS, **HUB_JOBS}
NEEDS_TENSORFLOW = {"hub_preset_tok"}  # its tokenizer check, made by the warm-up run, needs TensorFlow
# A hub job's time to first step, with TensorFlow installed, within this of the install without it
HUB_GAP_S = 1.5
TRAINING_JOBS = {"train_mlp", *HUB_JOBS} - {"plan_hub_7b"}
NO_TENSORFLOW = "no TF"

BUILD_HUB_INPUTS = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from presets import corpus_text, gemma_preset, hf_tokenizer_json
inputs = Path(sys.argv[1])
text = corpus_text()
(inputs / "corpus.txt").write_text(text)
gemma_preset(inputs / "gemma", text, num_key_value_heads=4)
hf_tokenizer_json(inputs / "hf", text)
"""


def build_hub_inputs(folder: Path) -> Path:
    """The hub jobs' inputs in `folder` (tests/presets.py, in a process of its own)."""
    folder.mkdir(parents=True, exist_ok=True)
    tests = Path(__file__).resolve().parent.parent / "tests"
    subprocess.run(
        [sys.executable, "-c", BUILD_HUB_INPUTS, str(folder), str(tests)],
        check=True,
        capture_output=True,
        env={**os.environ, "KERAS_BACKEND": "jax"},
        timeout=600,
    )
    return folder


def job_args(name: str, folder: Path, inputs: Path | None) -> list[str]:
    """Job `name`'s command line with its run dir (or sweep dir) in `folder`; a hub job's with its
    inputs and, on data=text, the token cache every run of the benchmark shares (in `folder`'s
    parent: warm after the warm-up run, the tokenizer's check kept there)."""
    if name == "sweep":
        return [*JOBS[name], f"hydra.sweep.dir={folder / 'sweep'}"]
    args = list(JOBS[name])
    if name in HUB_JOBS:
        args = [arg.format(inputs=inputs) for arg in args]
        args += [f"data.cache_dir={folder.parent / 'token-cache'}"] if "data=text" in args else []
    return [*args, f"hydra.run.dir={folder / 'run'}"]


def run_job(
    name: str, checkout: str | None, work: Path, python: str | None = None, inputs: Path | None = None
) -> dict:
    """One fresh process of job `name` with this checkout's code or `checkout`'s (with interpreter
    `python`, default this one), in a folder of `work`; its figures."""
    folder = Path(tempfile.mkdtemp(dir=work))
    env = benchlib.checkout_env(checkout)
    done = run_measured(job_args(name, folder, inputs), cwd=folder, timeout=600, env=env, python=python)
    figures = {"wall_s": done.wall_s, "exit": done.returncode, "rss_mib": done.peak_rss_bytes / 2**20}
    if name.startswith("error_"):
        lines = done.stderr.strip().splitlines()
        figures["ok"] = done.returncode == 2 and len(lines) == 1 and ERROR_TEXT[name] in lines[0]
        figures["said"] = lines[-1] if lines else ""
    elif name in TRAINING_JOBS:
        figures.update(training_figures(name, done.returncode, folder / "run"))
    else:
        figures["ok"] = done.returncode == 0
    if not figures["ok"]:
        figures["stderr_tail"] = done.stderr[-1500:]
    return figures


def training_figures(name: str, returncode: int, run_dir: Path) -> dict:
    """A training job's figures from its metrics.json: time to first step and to the model built,
    steady step time, and (train_mlp) its losses."""
    metrics = benchlib.read_metrics(run_dir) if (run_dir / "metrics.json").exists() else {}
    if returncode != 0 or metrics.get("status") != "ok":
        return {"ok": False}
    timing = metrics["timing"]
    figures = {
        "ok": True,
        "first_step_s": timing["time_to_first_step_s"],
        "startup_s": timing["startup_s"],
        "step_ms": timing["step_time_s"] * 1e3,
    }
    if name == "train_mlp":
        figures.update(losses=metrics["history"]["loss"], eval_loss=metrics["eval"]["loss"])
    return figures


def headline_key(name: str) -> str:
    """The figure a job is judged by: time to first step for a training job, else the wall."""
    return "first_step_s" if name in TRAINING_JOBS else "wall_s"


def headline(name: str, runs: list[dict]) -> float | None:
    """The median of a job's headline figure over its repeats that ended as they should."""
    return median_of(runs, headline_key(name))


def spread(name: str, runs: list[dict]) -> float | None:
    """The range (max - min) of a job's headline figure over its repeats."""
    key = headline_key(name)
    values = [r[key] for r in runs if r.get("ok") and r.get(key) is not None]
    return max(values) - min(values) if len(values) > 1 else None


def median_of(runs: list[dict], key: str) -> float | None:
    """The median of `key` over the repeats that ended as they should."""
    return benchlib.median_of([r for r in runs if r.get("ok")], key)


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--before", help="another checkout to compare with (run through PYTHONPATH)")
    parser.add_argument(
        "--sweep", action="store_true", help="also time `meshrun sweep layout=dense_model` (about 15 s a run)"
    )
    parser.add_argument(
        "--hub",
        action="store_true",
        help=f"also time the KerasHub fine-tunes ({', '.join(HUB_JOBS)}; 10-30 s a run)",
    )
    parser.add_argument(
        "--without-tensorflow",
        action="store_true",
        help="also run this checkout in a venv without TensorFlow",
    )
    parser.add_argument("--jobs", nargs="*", default=None, help=f"only these jobs (of {', '.join(JOBS)})")
    parser.add_argument("--out", default="bench_startup.json")
    return parser.parse_args()


def columns_of(args: argparse.Namespace, work: Path) -> dict[str, tuple[str | None, str | None]]:
    """label -> (checkout, python) of each column, in the order each repeat runs them."""
    columns = {}
    if args.without_tensorflow:
        columns[NO_TENSORFLOW] = (None, str(venv_without_tensorflow(work / "no-tensorflow")))
    if args.before:
        columns["before"] = (str(Path(args.before).resolve()), None)
    columns["after"] = (None, None)
    return columns


def measure(names: list[str], columns: dict, repeats: int, work: Path, console: Console) -> tuple[dict, bool]:
    """Every job's figures in every column it runs in (warm-up first, then the columns in turns)."""
    inputs = build_hub_inputs(work / "hub-inputs") if any(name in HUB_JOBS for name in names) else None
    results: dict = {name: {label: [] for label in runs_in(name, columns)} for name in names}
    failed = False
    for name in names:
        for label in results[name]:
            run_job(
                name, columns[label][0], work, python=columns[label][1], inputs=inputs
            )  # warm-up: compile cache, disk, token cache
        for repeat in range(repeats):
            for label in results[name]:
                figures = run_job(name, columns[label][0], work, python=columns[label][1], inputs=inputs)
                results[name][label].append(figures)
                failed |= not figures["ok"]
                console.print(
                    f"{name} {label} #{repeat + 1}: "
                    + ", ".join(
                        f"{k} {v:.3f}" if isinstance(v, float) else f"{k} {v}"
                        for k, v in figures.items()
                        if k not in ("losses", "stderr_tail")
                    )
                )
    return results, failed


def runs_in(name: str, columns: dict) -> list[str]:
    """The columns job `name` runs in: all but the one without TensorFlow for a job that needs it."""
    return [label for label in columns if not (label == NO_TENSORFLOW and name in NEEDS_TENSORFLOW)]


def summarize(names: list[str], labels: list[str], results: dict, repeats: int) -> tuple[Table, dict]:
    """The table of medians (ranges beside them) and the summary written to --out."""
    table = benchlib.table(
        f"start-up, median of {repeats} fresh processes (range max - min)",
        ("job", "figure", *labels, "target"),
        left=("job", "figure"),
    )
    summary = {}
    for name in names:
        runs = results[name]
        medians = {label: headline(name, runs[label]) if label in runs else None for label in labels}
        ranges = {label: spread(name, runs[label]) if label in runs else None for label in labels}
        target = TARGETS_S.get(name)
        summary[name] = {
            "median_s": medians,
            "range_s": ranges,
            "target_s": target,
            "met": None if target is None or medians["after"] is None else medians["after"] <= target,
        }
        cells = [cell(medians[label], ranges[label], " s", label in runs) for label in labels]
        table.add_row(
            name,
            "time to first step" if name in TRAINING_JOBS else "wall",
            *cells,
            f"<= {target} s" if target else "within noise",
        )
        if name in HUB_JOBS and medians.get(NO_TENSORFLOW) is not None and medians["after"] is not None:
            gap = medians["after"] - medians[NO_TENSORFLOW]
            judged = name in TRAINING_JOBS  # the fine-tunes; the plan's gap is for information
            summary[name].update(gap_to_no_tensorflow_s=gap, met=gap <= HUB_GAP_S if judged else None)
            table.add_row(
                "",
                f"after - {NO_TENSORFLOW}",
                *["" for _ in labels[:-1]],
                f"{gap:+.2f} s",
                f"<= {HUB_GAP_S} s" if judged else "",
            )
        rss = {label: median_of(runs[label], "rss_mib") if label in runs else None for label in labels}
        summary[name]["rss_mib"] = rss
        table.add_row(
            "", "peak RSS", *(cell(rss[label], None, " MiB", label in runs, digits=0) for label in labels), ""
        )
        if name == "train_mlp":
            train_mlp_rows(table, summary[name], runs, labels)
    return table, summary


def cell(value: float | None, width: float | None, unit: str, ran: bool, digits: int = 2) -> str:
    if not ran:
        return "-"
    if value is None:
        return "failed"
    return f"{value:.{digits}f}{unit}" + (f" ({width:.{digits}f})" if width is not None else "")


def train_mlp_rows(table: Table, summary: dict, runs: dict, labels: list[str]) -> None:
    steps = {label: median_of(runs[label], "step_ms") for label in labels}
    table.add_row(
        "",
        "steady step",
        *(f"{steps[label]:.2f} ms" if steps[label] else "-" for label in labels),
        "within noise",
    )
    losses = {
        label: {tuple(r["losses"]) + (r["eval_loss"],) for r in runs[label] if r.get("ok")}
        for label in labels
    }
    same = len(set().union(*losses.values())) == 1
    summary.update(step_ms=steps, same_losses=same, losses=sorted(set().union(*losses.values())))
    table.add_row("", "losses", *("identical" if same else "DIFFER" for _ in labels), "the same")


def main() -> int:
    args = parse_args()
    default = [n for n in JOBS if (n != "sweep" or args.sweep) and (n not in HUB_JOBS or args.hub)]
    names = args.jobs or default
    console = Console()
    load_at_start = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="bench-startup-") as scratch:
        work = Path(scratch)
        columns = columns_of(args, work)
        results, failed = measure(names, columns, args.repeats, work, console)
    table, summary = summarize(names, list(columns), results, args.repeats)
    console.print(table)
    payload = {
        "machine": {
            "python": sys.version.split()[0],
            "platform": platform.platform(),
            "cpus": os.cpu_count(),
            "load_average_at_start": load_at_start,
            "load_average_at_end": os.getloadavg(),
        },
        "repeats": args.repeats,
        "columns": list(columns),
        "summary": summary,
        "runs": results,
    }
    benchlib.write_json(args.out, payload, default=list)
    console.print(f"wrote {args.out}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
