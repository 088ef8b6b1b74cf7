"""metrics.json through its one definition (meshrun.specs.metrics.RunMetrics): a run's file reads back
into the same types and writes the same JSON, a new figure is one field that shows in the report, a
failed run holds only its head; and the log sinks behind their registry, where a new sink gets its
`logging.<name>` switch without a config file."""

import csv
import dataclasses
import io
import json
from dataclasses import dataclass
from pathlib import Path

import pytest
from rich.console import Console

from conftest import fast_run_in_process
from meshrun import cli
from meshrun.report.render import render, summary_table
from meshrun.specs.figures import figure
from meshrun.specs.metrics import RunMetrics, TimingFigures


@pytest.fixture(scope="module")
def written() -> dict:
    """The metrics.json content of a small run of the seeds' model on 2x4."""
    return fast_run_in_process("2x4", "dense_model")


@pytest.mark.integration
def test_a_runs_metrics_read_back_into_their_types_and_write_the_same_json(written):
    metrics = RunMetrics.from_json(written)
    assert metrics.ok and metrics.mesh.shape == [2, 4] and metrics.timing.step_time_s > 0
    assert (
        metrics.sharding["d1/kernel"].spec == [None, "model"]
        and metrics.sharding["d1/kernel"].rule == "d1/kernel"
    )
    assert (
        metrics.data.source == "synthetic" and metrics.data.details["family"] == "regression"
    )  # beside data's own keys
    assert json.dumps(metrics.to_json()) == json.dumps(written)  # the same keys, in the same order


@pytest.mark.integration
def test_a_new_figure_is_one_field_and_shows_in_the_report(written):
    @dataclass(frozen=True)
    class Timing(TimingFigures):
        data_wait_s: float = figure("data wait", "{:.2f} s waiting for input")

    base = RunMetrics.from_json(written)
    timing = Timing(**dataclasses.asdict(base.timing), data_wait_s=0.25)
    metrics = dataclasses.replace(base, timing=timing)
    assert metrics.to_json()["timing"]["data_wait_s"] == 0.25
    rows = dict(metrics.summary())
    assert rows["data wait"] == "0.25 s waiting for input"
    assert list(rows)[-1] == "data wait"  # a row SUMMARY_ROWS does not list comes after those
    console = Console(file=io.StringIO(), width=200)
    console.print(summary_table(metrics))
    assert "0.25 s waiting for input" in console.file.getvalue()


@pytest.mark.integration
def test_the_summary_rows_read_as_before(written):
    rows = dict(RunMetrics.from_json(written).summary())
    assert list(rows)[:6] == ["status", "mesh", "devices", "model", "batch", "optimizer"]
    assert rows["mesh"] == "2x4 ('data', 'model'), batch axis 'data'"
    assert rows["devices"] == "8 x cpu (emulated)"
    assert rows["batch"] == "16 global, 8 per replica, 8 steps/epoch x 2 epochs"
    assert rows["optimizer"] == "adam, learning rate 0.001; float32"
    assert rows["flops"].endswith("/s; MFU n/a (no peak known)") and "per step (XLA)" in rows["flops"]
    assert rows["loss"] == " -> ".join(f"{v:.5f}" for v in written["history"]["loss"])


def test_a_blank_or_long_sample_is_cut_short_in_the_report_and_kept_whole_in_metrics_json():
    samples = [
        {"prompt": "Once upon a time", "completion": " " * 300},
        {"prompt": "Say it", "completion": "a\n\nb"},
        {"prompt": "p" * 80, "completion": "word " * 60},
    ]
    metrics = RunMetrics.from_json(
        {
            "status": "ok",
            "mesh": {"shape": [2, 4], "axis_names": ["data", "model"], "batch_axis": "data"},
            "model": {"name": "m"},
            "sharding": {},
            "samples": samples,
        }
    )
    console = Console(
        file=io.StringIO(), width=80
    )  # off a terminal: printed at its natural width, at least 120 columns
    render(metrics, console)
    lines = console.file.getvalue().splitlines()
    assert max(map(len, lines)) <= 120
    shown = [line for line in lines if " -> " in line]
    assert "'Once upon a time' -> '     " in shown[0] and shown[0].rstrip(" │").endswith(
        "... (300 characters)"
    )
    assert "'Say it' -> 'a\\n\\nb'" in shown[1]  # line breaks show as Python writes them
    assert "... (80 characters) -> 'word word" in shown[2] and shown[2].rstrip(" │").endswith(
        "... (300 characters)"
    )
    assert metrics.to_json()["samples"] == samples


def test_a_failed_runs_metrics_hold_only_the_head():
    failed = RunMetrics.failed("mesh.shape: no", "runs/3", {"mesh": "3x1"}, ["mesh=3x1"], exit_status=2)
    assert failed.to_json() == {
        "status": "error",
        "error": "mesh.shape: no",
        "run_dir": "runs/3",
        "choices": {"mesh": "3x1"},
        "overrides": ["mesh=3x1"],
        "exit_status": 2,
    }
    assert RunMetrics.from_json(failed.to_json()) == failed
    with pytest.raises(ValueError, match="not a metrics.json of meshrun train"):
        RunMetrics.from_json({"accuracy": 0.9})
    with pytest.raises(TypeError, match="MeshFigures is given as str"):
        RunMetrics.from_json({"status": "ok", "mesh": "2x4"})


class Lines:
    """A sink for the test: the steps' losses, one per line, in lines.txt."""

    kind = "lines"

    def __init__(self, run_dir: Path, first_step: int):  # a fresh run in the test: nothing to drop
        self.path = run_dir / "lines.txt"
        self._file = open(self.path, "a")

    def step(self, record: dict) -> None:
        self._file.write(f"{record['step']} {record['loss']:.6f}\n")

    def epoch(self, record: dict) -> None:
        self._file.flush()

    def close(self) -> None:
        self._file.close()


@pytest.mark.integration
def test_a_registered_sink_gets_its_switch_and_a_run_writes_it(in_tmp, monkeypatch):
    from meshrun.logs import sinks

    # A new sink is its module's register_sink call and its line in the table of sinks.
    monkeypatch.setitem(sinks.SINKS.modules, "lines", __name__)
    monkeypatch.setattr(
        sinks.SINKS, "_specs", dict(sinks.SINKS._specs)
    )  # the registered specs, put back after
    sinks.register_sink(sinks.SinkSpec("lines", Lines, "the losses, a line per step"))
    assert sinks.switch_names() == ["csv", "lines", "tensorboard"]
    cli.main(
        [
            "train",
            "mesh=2x4",
            "train.verbose=0",
            "train.epochs=1",
            "data.num_samples=64",
            "data.eval_samples=32",
            "logging.lines=true",
            "hydra.run.dir=run",
        ]
    )
    written = (in_tmp / "run" / "lines.txt").read_text().splitlines()
    assert [int(line.split()[0]) for line in written] == list(range(1, 5))
    metrics = json.loads((in_tmp / "run" / "metrics.json").read_text())
    assert metrics["logs"] == {
        "jsonl": str(in_tmp / "run" / "log.jsonl"),
        "lines": str(in_tmp / "run" / "lines.txt"),
    }


# --- what the run's summary says about timing, partial epochs, logs and exports ------------------


def summary_rows(metrics: dict) -> dict:
    """The rows of the summary table of a run's metrics.json content, by name."""
    return dict(RunMetrics.from_json(metrics).summary())


@pytest.fixture(scope="module")
def exported_run(tmp_path_factory):
    """The seeds' model on 2x4 for 4 epochs of 64 steps, with the CSV log and an export: its
    metrics.json content and run dir."""
    from conftest import layout_rules, train_in_process

    run_dir = tmp_path_factory.mktemp("exported")
    raw = {
        "mesh": {"shape": "2x4"},
        "layout": {"rules": layout_rules("dense_model")},
        "model": {"name": "dense_model"},
        "data": {"name": "synthetic", "num_samples": 1024, "eval_samples": 32},
        "train": {"epochs": 4, "verbose": 0},
        "logging": {"csv": True},
        "checkpoint": {"export": True},
    }
    return train_in_process(raw, run_dir).metrics, run_dir


@pytest.mark.integration
def test_throughput_agrees_with_the_wall_clock_of_the_epochs_after_the_first_not_with_the_median_step(
    exported_run,
):
    metrics, run_dir = exported_run
    timing, batch = metrics["timing"], metrics["train"]["global_batch_size"]
    with open(run_dir / "epochs.csv", newline="") as file:
        epochs = list(csv.DictReader(file))
    assert [int(e["epoch_steps"]) for e in epochs] == timing["epoch_steps"] == [64] * 4
    steady_steps = sum(int(e["epoch_steps"]) for e in epochs[1:])
    wall = batch * steady_steps / sum(float(e["epoch_s"]) for e in epochs[1:])  # the step log's own clock
    assert timing["throughput_steps"] == steady_steps == 192
    assert timing["samples_per_s"] == pytest.approx(wall, rel=0.002)
    assert timing["samples_per_s"] == pytest.approx(batch * 192 / timing["throughput_s"])
    assert timing["samples_per_s"] != pytest.approx(
        batch / timing["step_time_s"], rel=1e-6
    )  # not the median step's
    assert metrics["flops"]["per_s"] == pytest.approx(
        metrics["flops"]["per_step"] * timing["samples_per_s"] / batch
    )
    mean_ms = timing["throughput_s"] / 192 * 1e3
    assert summary_rows(metrics)["throughput"] == (
        f"{timing['samples_per_s']:,.0f} samples/s ({mean_ms:.2f} ms a step on "
        "average over the 192 steps after the first epoch)"
    )


@pytest.mark.integration
def test_the_summary_lists_every_log_file_and_names_the_exported_files(exported_run):
    metrics, run_dir = exported_run
    assert metrics["logs"] == {
        "jsonl": str(run_dir / "log.jsonl"),
        "csv": str(run_dir / "steps.csv"),
        "epochs_csv": str(run_dir / "epochs.csv"),
    }
    rows = summary_rows(metrics)
    assert rows["logs"] == "log.jsonl, steps.csv, epochs.csv"
    assert rows["export"] == "model.keras" and (run_dir / "model.keras").is_file()
    assert list(rows).index("export") == list(rows).index("logs") + 1


@pytest.mark.integration
def test_a_run_stopped_after_its_compiling_step_times_no_step_and_marks_the_cut_epoch(tmp_path, capsys):
    """train.max_time passed before the first step: training stops after it, the step that compiled,
    which must not pass for a training step (before: a 270 ms median 'step', 59 samples/s)."""
    from conftest import layout_rules, train_in_process

    raw = {
        "mesh": {"shape": "2x4"},
        "layout": {"rules": layout_rules("dense_model")},
        "model": {"name": "dense_model"},
        "data": {"name": "synthetic", "num_samples": 128, "eval_samples": 32},
        "train": {"epochs": 2, "verbose": 2, "max_time": 0.001},
    }
    metrics = train_in_process(raw, tmp_path).metrics
    timing = metrics["timing"]
    assert metrics["train"]["stopped"]["step"] == 1 and timing["compile_s"] > 0
    assert timing["step_time_s"] is None and timing["steady_steps"] == 0 and timing["samples_per_s"] is None
    assert (
        timing["epoch_steps"] == [1]
        and metrics["flops"]["per_s"] is None
        and metrics["flops"]["per_step"] > 0
    )
    rows = summary_rows(metrics)
    assert rows["step time"] == "none timed: only the first step, which compiled, ran"
    assert rows["throughput"] == "n/a: no step ran after the compiling one"
    assert rows["epochs"] == f"{timing['epoch_s'][0]:.2f} s; epoch 1: 1 of 8 steps"
    assert rows["flops"].endswith(" per step (XLA); MFU n/a (no peak known)")
    line = next(line for line in capsys.readouterr().out.splitlines() if line.startswith("epoch 1/2: "))
    assert line.endswith("; stopped after 1 of 8 steps)")
