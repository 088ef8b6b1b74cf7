"""What the plan and metrics.json say about a quantized base (model.quantize, issue 55): a tiny Gemma
preset, LoRA rank 4, on a 2x4 mesh under its family layout. The plan splits the parameters' bytes per
device into trainable, frozen quantized and frozen float, each the sum over its own variables; a run
records the quantized base's loss before training beside the float base's, and the same split read
from its arrays."""

import contextlib
import io
import json
import math

import pytest
from rich.console import Console

from conftest import train_here
from meshrun import cli
from meshrun.report.render import plan_table, totals_table
from meshrun.wording import format_bytes
from presets import corpus_text, gemma_preset

pytestmark = pytest.mark.integration

MODES = ("int8", "int4")


@pytest.fixture(scope="module")
def gemma(tmp_path_factory):
    root = tmp_path_factory.mktemp("qlora")
    corpus = root / "corpus.txt"
    corpus.write_text(corpus_text())
    return gemma_preset(root / "gemma", corpus_text()), corpus


def run_args(gemma, *extra) -> list[str]:
    preset, corpus = gemma
    return [
        "model=keras_hub",
        f"model.preset={preset}",
        "model.lora.rank=4",
        "mesh=2x4",
        "layout=gemma_tp",
        "data=text",
        f"data.files={corpus}",
        "train.batch_size=8",
        *extra,
    ]


def plan_of(args) -> dict:
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        cli.main(["plan", *args, "--json"])
    return json.loads(printed.getvalue())


@pytest.fixture(scope="module")
def plans(gemma) -> dict:
    """`meshrun plan --json` of the float base (None) and of each mode, made once."""
    return {
        mode: plan_of(run_args(gemma, *([f"model.quantize={mode}"] if mode else [])))
        for mode in (None, *MODES)
    }


def bytes_of(plan: dict, which) -> int:
    return sum(v["bytes_per_device"] for v in plan["variables"] if which(v))


@pytest.mark.parametrize("mode", MODES)
def test_the_plan_splits_a_quantized_base_into_trainable_frozen_quantized_and_frozen_float(plans, mode):
    plan = plans[mode]
    per_device = plan["per_device"]
    quantized = [v for v in plan["variables"] if v.get("quantized")]
    assert {v["quantized"] for v in quantized} >= {"kernel", "scale"}
    assert all(not v["trainable"] for v in quantized)
    assert {v["dtype"] for v in quantized if v["quantized"] == "kernel"} == {"int8"}  # int4: two a byte
    assert per_device["trainable_bytes"] == bytes_of(plan, lambda v: v["trainable"]) > 0
    assert per_device["frozen_quantized_bytes"] == bytes_of(plan, lambda v: v.get("quantized")) > 0
    assert (
        per_device["frozen_float_bytes"]
        == bytes_of(plan, lambda v: not v["trainable"] and not v.get("quantized"))
        > 0
    )
    split = ("trainable_bytes", "frozen_quantized_bytes", "frozen_float_bytes")
    assert sum(per_device[key] for key in split) == per_device["params_bytes"]
    assert per_device["trainable_bytes"] == plan["lora_adapters"]["bytes_per_device"]
    rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in totals_lines(plan)}
    assert rows["trains"] == format_bytes(per_device["trainable_bytes"])
    held = {"int8": "float32, int8", "int4": "float32, int4 packed two a byte, int8"}[mode]
    assert rows["frozen, quantized"] == f"{format_bytes(per_device['frozen_quantized_bytes'])} ({held})"
    assert rows["frozen, float"] == format_bytes(per_device["frozen_float_bytes"])


def totals_lines(plan: dict) -> list[str]:
    """The rows of the plan's per-device table, as printed."""
    console = Console(file=io.StringIO(), width=200)
    console.print(totals_table(plan))
    return [line for line in console.file.getvalue().splitlines() if line.count("│") == 3]


def test_a_float_base_plans_as_before(plans):
    plan = plans[None]
    assert set(plan["per_device"]) == {"params_bytes", "optimizer_bytes", "total_bytes"}
    assert not any("quantized" in v for v in plan["variables"])
    assert not any("frozen" in line.split("│")[1] for line in totals_lines(plan))


def test_an_int4_plan_names_its_packed_kernels_int4_in_its_records_and_its_table(plans):
    for mode in MODES:
        kernels = [v for v in plans[mode]["variables"] if v.get("quantized") == "kernel"]
        assert kernels and {v.get("packed") for v in kernels} == ({"int4"} if mode == "int4" else {None})
        for v in kernels:  # the float kernel it stands for; int4's packed shape has half its columns
            float_elements = math.prod(v["float_shape"])
            assert math.prod(v["shape"]) == (float_elements // 2 if mode == "int4" else float_elements)
    plan = plans["int4"]
    kernels = {v["path"] for v in plan["variables"] if v.get("quantized") == "kernel"}
    printed = table_lines(plan_table(plan, full=True))
    rows = {line.split("│")[1].strip(): line.split("│")[3].strip() for line in printed}
    assert kernels and {rows[path] for path in kernels} == {"int4 packed two a byte"}
    assert not any("int4" in dtype for path, dtype in rows.items() if path not in kernels)
    assert "int4 packed two a byte" not in "".join(table_lines(plan_table(plans["int8"], full=True)))


def test_a_quantized_plan_counts_the_float_models_parameters(plans):
    """A quantized kernel counts as its float kernel's elements, its scales and zero points not
    at all: every plan of the same model counts as many parameters, and as many frozen ones."""
    counted = {mode: plans[mode]["model"] for mode in plans}
    for mode in MODES:
        for key in ("params", "trainable_params", "frozen_params"):
            assert counted[mode][key] == counted[None][key], (mode, key)
        assert counted[mode]["params_bytes"] < counted[None]["params_bytes"]  # what it holds: less
        rows = {line.split("│")[1].strip(): line.split("│")[2].strip() for line in totals_lines(plans[mode])}
        assert rows["model parameters"].startswith(f"{counted[None]['params']:,} (")


def table_lines(table) -> list[str]:
    """The rows of a rich table, as printed wide enough to hold them."""
    console = Console(file=io.StringIO(), width=400)
    console.print(table)
    return [line for line in console.file.getvalue().splitlines() if line.startswith("│")]


@pytest.fixture(scope="module")
def runs(gemma, tmp_path_factory):
    """One epoch of each mode; metrics.json and plan.json of each."""
    out = tmp_path_factory.mktemp("runs")
    found = {}
    for mode in MODES:
        run_dir = out / mode
        metrics = train_here(
            run_args(gemma, f"model.quantize={mode}", "train.epochs=1", "train.verbose=0"), run_dir
        )
        found[mode] = metrics, json.loads((run_dir / "plan.json").read_text())
    return found


def test_a_run_records_the_quantized_and_the_float_base_loss_before_training(runs):
    differences = {}
    for mode, (metrics, _) in runs.items():
        record = metrics["quantize"]
        assert record["mode"] == mode
        base, floated = record["base_loss"], record["float_base_loss"]
        assert math.isfinite(base) and math.isfinite(floated)
        assert record["difference"] == pytest.approx(base - floated)
        assert 0 < abs(record["difference"]) < 0.05
        differences[mode] = abs(record["difference"])
    assert differences["int4"] > differences["int8"]  # 16 levels lose more than 256
    float_losses = {metrics["quantize"]["float_base_loss"] for metrics, _ in runs.values()}
    assert len(float_losses) == 1  # the same float base on the same data


def test_a_run_reads_the_plans_split_off_its_arrays(runs):
    for metrics, plan in runs.values():
        memory, per_device = metrics["memory"], plan["per_device"]
        for key in ("trainable_bytes", "frozen_quantized_bytes", "frozen_float_bytes"):
            assert memory[f"{key}_per_device"] == per_device[key]
        # the float base is freed before the quantized model loads: the load peak is the latter's
        assert memory["load_peak_bytes_per_device"] < 1.05 * per_device["params_bytes"]


def test_a_runs_plan_json_counts_the_float_models_parameters_and_names_int4(runs, plans):
    for mode, (metrics, plan) in runs.items():
        assert plan["model"]["params"] == plans[None]["model"]["params"]
        assert metrics["model"]["params"] == plan["model"]["params"]  # the run counts as its plan
        packed = {v.get("packed") for v in plan["variables"] if v.get("quantized") == "kernel"}
        assert packed == ({"int4"} if mode == "int4" else {None})
