"""What the plan and metrics.json say about a quantized base (model.quantize, issue 55): a tiny Gemma
preset, LoRA rank 4, on a 2x4 mesh under its family layout. The plan splits the parameters' bytes per
device into trainable, frozen quantized and frozen float, each the sum over its own variables; a run
records the quantized base's loss before training beside the float base's, and the same split read
from its arrays."""

import io
import json
import math

import pytest
from rich.console import Console

from conftest import read_metrics
from meshrun import cli
from meshrun.report.render import totals_table
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


def plan_of(args, capsys) -> dict:
    capsys.readouterr()
    cli.main(["plan", *args, "--json"])
    return json.loads(capsys.readouterr().out)


def bytes_of(plan: dict, which) -> int:
    return sum(v["bytes_per_device"] for v in plan["variables"] if which(v))


@pytest.mark.parametrize("mode", MODES)
def test_the_plan_splits_a_quantized_base_into_trainable_frozen_quantized_and_frozen_float(
    gemma, mode, capsys
):
    plan = plan_of(run_args(gemma, f"model.quantize={mode}"), capsys)
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
    assert (
        rows["frozen, quantized"] == f"{format_bytes(per_device['frozen_quantized_bytes'])} (float32, int8)"
    )
    assert rows["frozen, float"] == format_bytes(per_device["frozen_float_bytes"])


def totals_lines(plan: dict) -> list[str]:
    """The rows of the plan's per-device table, as printed."""
    console = Console(file=io.StringIO(), width=200)
    console.print(totals_table(plan))
    return [line for line in console.file.getvalue().splitlines() if line.count("│") == 3]


def test_a_float_base_plans_as_before(gemma, capsys):
    plan = plan_of(run_args(gemma), capsys)
    assert set(plan["per_device"]) == {"params_bytes", "optimizer_bytes", "total_bytes"}
    assert not any("quantized" in v for v in plan["variables"])
    assert not any("frozen" in line.split("│")[1] for line in totals_lines(plan))


@pytest.fixture(scope="module")
def runs(gemma, tmp_path_factory):
    """One epoch of each mode; metrics.json and plan.json of each."""
    out = tmp_path_factory.mktemp("runs")
    found = {}
    for mode in MODES:
        run_dir = out / mode
        cli.main(
            [
                "train",
                *run_args(gemma, f"model.quantize={mode}", "train.epochs=1", "train.verbose=0"),
                f"hydra.run.dir={run_dir}",
            ]
        )
        metrics = read_metrics(run_dir)
        assert metrics["status"] == "ok", metrics["error"]
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
