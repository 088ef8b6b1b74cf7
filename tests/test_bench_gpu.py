"""scripts/bench_gpu.py: its small (CPU) set end to end, so that the GPU benchmark does not rot
between the tasks that have a GPU; and the verdicts and retries only a GPU run reaches."""

import importlib.util
import json
import math
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "bench_gpu.py"
EXPECTED = {
    "transformer-tiny": {"meshrun", "keras", "jax"},
    "mlp": {"meshrun", "keras"},
    "llama-tiny": {"meshrun", "keras"},
}


def load_script():
    if str(SCRIPT.parent) not in sys.path:  # the script imports scripts/benchlib.py
        sys.path.insert(0, str(SCRIPT.parent))
    spec = importlib.util.spec_from_file_location("bench_gpu", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up there
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    """One run of the small set on CPU (about 90 s on 2 cores): its exit status, stdout and JSON."""
    workdir = tmp_path_factory.mktemp("bench_gpu")
    out = workdir / "bench.json"
    done = subprocess.run(
        [sys.executable, str(SCRIPT), "--scale", "small", "--json-out", str(out), "--workdir", str(workdir)],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout, json.loads(out.read_text())


@pytest.mark.e2e
def test_every_model_and_variant_is_measured(bench):
    _, report = bench
    assert report["environment"]["platform"] == "cpu" and report["scale"] == "small"
    assert report["complete"] is True and report["failed"] == {} and report["skipped"] == {}
    assert {name: set(model["variants"]) for name, model in report["models"].items()} == EXPECTED
    for name, model in report["models"].items():
        steps = model["steps"]
        for variant, figures in model["variants"].items():
            assert len(figures["runs"]) == report["settings"]["repeats"]
            for run in figures["runs"]:
                assert run["steady_steps"] == steps - 1 - report["settings"]["warmup"], (name, variant)
            assert 0 < figures["step_s"] <= figures["step_p90_s"], (name, variant)
            assert figures["samples_per_s"] == pytest.approx(model["batch_size"] / figures["step_s"])
            assert figures["compile_s"] > 0, (name, variant)
            if model["tokens_per_step"]:
                assert figures["tokens_per_s"] == pytest.approx(
                    figures["samples_per_s"] * model["tokens_per_step"] / model["batch_size"]
                )


@pytest.mark.e2e
def test_ratios_are_finite_and_pair_the_variants(bench):
    _, report = bench
    for name, model in report["models"].items():
        expected = {"meshrun/keras"} | ({"meshrun/jax", "keras/jax"} if "jax" in model["variants"] else set())
        assert set(model["ratios"]) == expected, name
        for ratio in model["ratios"].values():
            assert math.isfinite(ratio) and 0.2 < ratio < 5, (name, model["ratios"])


@pytest.mark.e2e
def test_flops_agree_between_variants_and_with_the_formula(bench):
    _, report = bench
    for name, model in report["models"].items():
        xla = {variant: figures["xla_flops_per_step"] for variant, figures in model["variants"].items()}
        assert all(flops > 0 for flops in xla.values()), (name, xla)
        # The hand-written model is meshrun's model doing the same step: XLA counts the same FLOPs.
        assert xla["keras"] == pytest.approx(xla["meshrun"], rel=0.01), name
        if "jax" in xla:  # no metrics in the bare step
            assert xla["jax"] == pytest.approx(xla["keras"], rel=0.05), name
        analytic = model["analytic_flops"]
        assert 0.5 < analytic["per_step"] / xla["meshrun"] < 2, (name, analytic, xla)
        if name != "mlp":
            assert analytic["attention"] > 0
            # The script's 6·N·tokens is meshrun's own (metrics.json's flops.analytic_per_step).
            assert analytic["six_n"] == pytest.approx(analytic["meshrun_six_n"]), name


@pytest.mark.e2e
def test_cpu_has_no_mfu_live_memory_or_verdicts(bench):
    _, report = bench
    for name, model in report["models"].items():
        assert model["peak_flops_per_device"] is None
        for figures in model["variants"].values():
            assert (
                figures["mfu_xla"] is None
                and figures["mfu_analytic"] is None
                and figures["live_peak_bytes"] is None
            )
        memory = model["memory"]
        # XLA's estimate holds the parameters and optimizer state the plan counts, and more.
        assert 0 < memory["planned_bytes"] <= memory["compiled_peak_bytes"], name
        assert memory["live_over_planned"] is None
    assert report["targets"] and all(row["verdict"] == "n/a" for row in report["targets"])


@pytest.mark.e2e
def test_meshrun_runs_are_the_real_cli_and_agree_with_their_own_report(bench):
    _, report = bench
    for name, model in report["models"].items():
        for run in model["variants"]["meshrun"]["runs"]:
            assert run["platform"] == "cpu" and run["device_count"] == 1 and run["async_log_fetch"] is False
            assert Path(run["run_dir"], "metrics.json").is_file()
            # The same run's steps from log.jsonl (2 warm-up steps fewer) and its own median.
            assert run["step_s"] == pytest.approx(run["reported_step_s"], rel=0.25), name


@pytest.mark.e2e
def test_stdout_has_the_tables_and_the_versions(bench):
    stdout, report = bench
    for title in ("step time per variant", "memory per device", "the GPU targets"):
        assert title in stdout
    for name in EXPECTED:
        assert name in stdout
    environment = report["environment"]
    assert all(environment[key] for key in ("jax", "jaxlib", "keras", "keras_hub", "meshrun", "python"))
    assert f"jax {environment['jax']}" in stdout


@pytest.mark.e2e
def test_a_failed_run_is_recorded_and_the_benchmark_exits_1(tmp_path):
    out = tmp_path / "bench.json"
    done = subprocess.run(
        [
            sys.executable,
            str(SCRIPT),
            "--scale",
            "small",
            "--models",
            "mlp",
            "--meshrun-override",
            "no_such.key=1",
            "--json-out",
            str(out),
            "--workdir",
            str(tmp_path),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 1, done.stderr[-2000:]
    assert "no_such.key" in done.stderr
    report = json.loads(out.read_text())
    assert report["models"] == {} and report["failed"]["mlp"].startswith("meshrun mlp failed (exit 2)")


def test_targets_say_by_how_much_a_gpu_run_misses_them():
    bench_gpu = load_script()
    results = {
        "transformer-1b": {
            "ratios": {"meshrun/keras": 1.10},
            "memory": {"live_over_planned": 1.05, "live_over_compiled": 0.7},
            "variants": {"meshrun": {"mfu_xla": 0.31}},
        },
        "mlp": {
            "ratios": {"meshrun/keras": 1.01},
            "memory": {"live_over_planned": 3.0, "live_over_compiled": None},
            "variants": {"meshrun": {"mfu_xla": 0.01}},
        },
    }
    rows = {row["target"]: row for row in bench_gpu.targets(results, {"platform": "gpu"})}
    assert rows["transformer-1b: meshrun/keras step"]["verdict"] == "missed"
    assert rows["transformer-1b: meshrun/keras step"]["off_by"] == pytest.approx(0.10)
    assert rows["transformer-1b: live peak / plan"]["verdict"] == "met"
    assert rows["transformer-1b: live peak / compiled estimate"]["off_by"] == pytest.approx(-0.3)
    assert rows["transformer-1b: MFU (XLA FLOPs)"]["verdict"] == "missed"
    assert rows["transformer-1b: MFU (XLA FLOPs)"]["off_by"] == pytest.approx(-0.09)
    assert (
        rows["mlp: meshrun/keras step"]["verdict"] == "met"
        and rows["mlp: meshrun/keras step"]["off_by"] is None
    )
    assert rows["mlp: live peak / plan"]["verdict"] == "missed"
    assert rows["mlp: live peak / compiled estimate"]["verdict"] == "n/a"  # no figure: never a verdict


def test_a_model_out_of_device_memory_is_measured_again_with_half_the_batch(monkeypatch):
    bench_gpu = load_script()
    tried = []

    def measure(model, *rest):
        tried.append(model.batch_per_device)
        if model.batch_per_device > 2:
            raise bench_gpu.OutOfMemory("RESOURCE_EXHAUSTED: Out of memory while trying to allocate")
        return {"batch_per_device": model.batch_per_device}

    monkeypatch.setattr(bench_gpu, "measure_model", measure)
    model = bench_gpu.CATALOG["full"][1]
    assert bench_gpu.bench_model(model, {}, "mixed_bfloat16", None, Path(".")) == {"batch_per_device": 2}
    assert tried == [8, 4, 2]


def test_the_analytic_flops_of_the_1b_preset_follow_palm():
    bench_gpu = load_script()
    model = next(m for m in bench_gpu.CATALOG["full"] if m.name == "transformer-1b")
    flops = bench_gpu.analytic_flops(model, batch=8, meshrun_six_n=None)
    layers, width, ff, vocab, seq = 24, 2048, 8192, 32000, 2048
    matmul_params = (
        layers * (4 * width * width + 2 * width * ff + 4 * width + ff + width + 4 * width)
        + 2 * width
        + width * vocab
    )
    tokens = 8 * seq
    assert flops["six_n"] == 6 * matmul_params * tokens
    assert flops["attention"] == 12 * layers * width * seq * tokens
    assert flops["per_step"] == flops["six_n"] + flops["attention"]
