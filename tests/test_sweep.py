"""Sweeps: the mesh shapes `meshrun sweep` tries, the comparison of finished runs (table rows,
summary.csv/json/png), `meshrun report`, failed jobs that do not stop a sweep, jobs needing
different device counts, and the persistent compilation cache."""

import json
import re
import shutil

import pytest

from conftest import FAST, cli_here, read_metrics, run_meshrun
from meshrun import cli
from meshrun.report import sweep

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def test_mesh_shapes_are_every_ordered_factorisation():
    assert sweep.mesh_shapes(8, 2) == [(8, 1), (4, 2), (2, 4), (1, 8)]
    assert sweep.mesh_shapes(6, 2) == [(6, 1), (3, 2), (2, 3), (1, 6)]
    assert sweep.mesh_shapes(8, 1) == [(8,)]
    three = sweep.mesh_shapes(8, 3)
    assert len(three) == 10 and len(set(three)) == 10
    assert all(a * b * c == 8 for a, b, c in three)


@pytest.mark.parametrize(
    "given, expected_meshes",
    [
        ([], "mesh=8x1,4x2,2x4,1x8"),
        (["mesh=2x4"], "mesh=2x4"),  # a shape given is the shape run, not its rank
        (["mesh=[2,4],[4,2]"], "mesh=[2,4],[4,2]"),
        (["mesh=model_parallel"], "mesh=model_parallel"),
        (
            ["mesh.axis_names=[data,model,seq]"],
            "mesh=8x1x1,4x2x1,4x1x2,2x4x1,2x2x2,2x1x4,1x8x1,1x4x2,1x2x4,1x1x8",
        ),
    ],
)
def test_sweep_runs_the_meshes_given_else_every_shape_of_the_devices(given, expected_meshes, capsys):
    from meshrun import app, hydra_sources

    hydra_sources.register_config_sources()
    overrides = app.sweep_overrides(["layout=dense_model", *given])
    assert [o for o in overrides if o.startswith("mesh=")] == [expected_meshes]
    assert capsys.readouterr().out.startswith("meshrun sweep: ")


def fake_run(folder, name, mesh, samples_per_s, tokens_per_s=None, status="ok", model="m", layout="l"):
    """A run dir with the metrics.json fields the sweep summary reads."""
    run_dir = folder / name
    run_dir.mkdir(parents=True)
    metrics = {
        "status": status,
        "error": None if status == "ok" else "mesh.shape: no",
        "choices": {"mesh": mesh, "layout": layout},
    }
    if status == "ok":
        metrics |= {
            "mesh": {"shape": [int(d) for d in mesh.split("x")]},
            "model": {"name": model},
            "timing": {
                "compile_s": 1.0,
                "step_time_s": 16 / samples_per_s,
                "step_time_p90_s": 20 / samples_per_s,
                "samples_per_s": samples_per_s,
                "tokens_per_s": tokens_per_s,
            },
            "eval": {"loss": 0.5},
            "memory": {"peak_bytes_per_device": 1000, "live_peak_bytes_per_device": None},
        }
    (run_dir / "metrics.json").write_text(json.dumps(metrics))
    return run_dir


def test_rows_are_sorted_by_throughput_with_the_best_marked_and_failures_last(tmp_path):
    runs = [
        fake_run(tmp_path, "0", "8x1", 100.0),
        fake_run(tmp_path, "1", "4x2", 300.0),
        fake_run(tmp_path, "2", "3x1", 0, status="error"),
        fake_run(tmp_path, "10", "1x8", 200.0),
    ]
    assert sweep.find_runs([tmp_path]) == [runs[0], runs[1], runs[2], runs[3]]  # 10 after 2
    rows = sweep.summary_rows(runs, relative_to=tmp_path)
    assert [r["mesh"] for r in rows] == ["4x2", "1x8", "8x1", "3x1"]
    assert [r["best"] for r in rows] == [True, False, False, False]
    assert (
        rows[-1]["status"] == "error"
        and rows[-1]["error"] == "mesh.shape: no"
        and rows[-1]["step_time_ms"] is None
    )
    assert rows[0]["step_time_ms"] == pytest.approx(16 / 300 * 1e3, rel=1e-5)
    assert rows[0]["peak_bytes_per_device"] == 1000 and rows[0]["peak_source"] == "compiled"
    assert rows[0]["run_dir"] == "1"


@pytest.mark.integration
def test_the_layout_column_names_rules_given_on_the_command_line(tmp_path):
    # A real run records its overrides as Hydra got them (layout.rules={...} as ~layout.rules
    # +layout.rules={...}).
    given = tmp_path / "given"
    cli.main(
        [
            "train",
            "mesh=2x4",
            "layout.rules={d1/kernel:[null,model]}",
            "layout.extra_rules={d2/kernel:[null,null]}",
            *FAST,
            "train.epochs=1",
            f"hydra.run.dir={given}",
        ]
    )
    chosen = fake_run(tmp_path, "chosen", "2x4", 100.0, layout="dense_model")
    failed = fake_run(
        tmp_path, "failed", "2x4", 0, status="error", layout="replicated"
    )  # no layout section: no counts
    metrics = read_metrics(failed)
    (failed / "metrics.json").write_text(
        json.dumps({**metrics, "overrides": ["~layout.rules", "+layout.rules={d1/kernel:[null,model]}"]})
    )
    rows = {r["job"]: r["layout"] for r in sweep.summary_rows([given, chosen, failed], relative_to=tmp_path)}
    assert rows == {
        "given": "1 rule from command line + 1 extra rule",
        "chosen": "dense_model",
        "failed": "rules from command line",
    }


def test_language_models_are_ranked_by_tokens(tmp_path):
    runs = [
        fake_run(tmp_path, "0", "8x1", 100.0, tokens_per_s=9000.0),
        fake_run(tmp_path, "1", "1x8", 200.0, tokens_per_s=3000.0),
    ]
    assert [r["mesh"] for r in sweep.summary_rows(runs, relative_to=tmp_path)] == ["8x1", "1x8"]


def test_report_compares_any_mix_of_runs_and_skips_files_it_cannot_read(tmp_path):
    fake_run(
        tmp_path / "runs",
        "lm",
        "2x4",
        100.0,
        tokens_per_s=3200.0,
        model="transformer",
        layout="transformer_tp",
    )
    fake_run(tmp_path / "runs", "mlp", "2x4", 400.0, model="dense_model", layout="replicated")
    sparse = fake_run(tmp_path / "runs", "sparse", "8x1", 200.0, model="dense_model", layout="replicated")
    metrics = json.loads((sparse / "metrics.json").read_text())
    del metrics["timing"]["compile_s"], metrics["eval"]["loss"]
    (sparse / "metrics.json").write_text(json.dumps(metrics))
    one_step = fake_run(tmp_path / "runs", "one_step", "4x2", 1.0, model="dense_model", layout="replicated")
    metrics = json.loads(
        (one_step / "metrics.json").read_text()
    )  # stopped after its compiling step: nothing timed
    metrics["timing"] |= {"step_time_s": None, "step_time_p90_s": None, "samples_per_s": None}
    (one_step / "metrics.json").write_text(json.dumps(metrics))
    for name, text in {
        "broken": "{not json",
        "foreign": '{"accuracy": 0.9}',
        "half": '{"status": "ok"}',
    }.items():
        (tmp_path / "runs" / name).mkdir()
        (tmp_path / "runs" / name / "metrics.json").write_text(text)

    done = run_meshrun(["report", str(tmp_path / "runs"), "--out", str(tmp_path / "cmp")], tmp_path)
    assert done.returncode == 0, done.stderr
    skipped = done.stderr.strip().splitlines()
    assert len(skipped) == 3 and all(line.startswith("skipped ") for line in skipped), done.stderr
    assert "runs/half/metrics.json: no 'timing' in it" in done.stderr
    assert "runs/broken/metrics.json: Expecting property name" in done.stderr
    assert "runs/foreign/metrics.json: not a metrics.json of meshrun train" in done.stderr
    rows = json.loads((tmp_path / "cmp" / "summary.json").read_text())["rows"]
    assert [(r["job"], r["best"]) for r in rows] == [
        ("mlp", True),
        ("sparse", False),
        ("lm", False),
        ("one_step", False),
    ]  # by samples/s
    assert rows[-1]["step_time_ms"] is None and rows[-1]["samples_per_s"] is None
    assert "fastest first (samples/s)" in done.stdout and "varying mesh, model, layout" in done.stdout
    sparse_line = next(line for line in done.stdout.splitlines() if "sparse" in line)
    assert sparse_line.count(" - ") == 2  # no compile time, no eval loss

    only_broken = tmp_path / "runs" / "broken"
    failed = run_meshrun(["report", str(only_broken)], tmp_path)
    assert failed.returncode == 2 and failed.stderr.strip().splitlines()[-1].startswith(
        "meshrun: error: report: none of the 1"
    )


def test_the_figure_orders_jobs_like_the_table_and_names_what_varies(tmp_path):
    runs = [
        fake_run(tmp_path, "0", "8x1", 100.0),
        fake_run(tmp_path, "1", "4x2", 300.0),
        fake_run(tmp_path, "2", "1x8", 0, status="error"),
    ]
    rows = sweep.summary_rows(runs, relative_to=tmp_path)
    figure = sweep.sweep_figure(rows)
    assert figure._suptitle.get_text() == "meshrun sweep: 3 jobs of m, layout l; varying mesh"
    top, bottom = figure.axes
    assert [t.get_text() for t in bottom.get_xticklabels()] == ["1: 4x2", "0: 8x1", "2: 1x8"]
    assert [a.get_text() for a in bottom.texts] == ["best"] and bottom.texts[0].xy[0] == 0
    assert [a.get_text() for a in top.texts] == ["error"]


def test_report_out_makes_the_dirs_it_needs(in_tmp, capsys):
    fake_run(in_tmp / "runs", "0", "2x4", 100.0)
    cli.main(["report", "runs", "--out=cmp/2026/exp1"])
    assert sorted(p.name for p in (in_tmp / "cmp" / "2026" / "exp1").iterdir()) == [
        "summary.csv",
        "summary.json",
        "summary.png",
    ]


def test_the_title_quotes_the_labels_that_hold_commas(tmp_path):
    from meshrun.report.render import sweep_title

    runs = [
        fake_run(tmp_path, "0", "2x4", 100.0, model="GemmaCausalLM, LoRA rank 4", layout="gemma_tp"),
        fake_run(tmp_path, "1", "2x4", 90.0, model="GemmaCausalLM, LoRA rank 8", layout="gemma_tp"),
        fake_run(tmp_path, "2", "2x4", 80.0, model='say "hi"', layout="gemma_tp"),
    ]
    rows = sweep.summary_rows(runs, relative_to=tmp_path)
    assert sweep_title(rows) == (
        'meshrun sweep: 3 jobs of "GemmaCausalLM, LoRA rank 4", '
        '"GemmaCausalLM, LoRA rank 8", "say \\"hi\\"", '
        "layout gemma_tp; varying model"
    )


def test_summary_files(tmp_path):
    rows = sweep.summary_rows(
        [fake_run(tmp_path, "0", "8x1", 100.0), fake_run(tmp_path, "1", "3x1", 0, status="error")], tmp_path
    )
    csv_path, json_path, png_path = sweep.write_summary(rows, tmp_path / "out")
    lines = csv_path.read_text().splitlines()
    assert lines[0].split(",") == list(sweep.COLUMNS)
    assert lines[1].startswith("0,8x1,m,l,ok,True,1.0,160.0,200.0,100.0,,0.5,1000,compiled,")
    assert json.loads(json_path.read_text())["rows"] == rows
    png = png_path.read_bytes()
    assert png.startswith(PNG_MAGIC)
    import matplotlib.image

    height, width, _ = matplotlib.image.imread(str(png_path)).shape
    assert width >= 600 and height >= 600


@pytest.mark.parametrize(
    "args,expected",
    [
        ([], "give one or more sweep or run dirs"),
        (["nowhere"], "'nowhere' is not a directory"),
        (["."], "no metrics.json under ."),
        (["--out"], "--out: got nothing; give DIR after it"),
        (
            [".", "--out", "taken"],
            "--out: got 'taken', which cannot be written (it is a file); give a dir where you can write",
        ),
        ([".", "--out", "taken/cmp"], "taken is a file, not a directory"),
    ],
)
def test_report_errors_are_one_line_exit_2(args, expected, in_tmp, capsys):
    (in_tmp / "taken").write_text("a file")
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["report", *args])
    err = capsys.readouterr().err.strip()
    assert exit_info.value.code == 2
    assert err.startswith("meshrun: error: ") and expected in err and "\n" not in err


@pytest.mark.integration
def test_sweep_runs_every_shape_compares_them_and_report_reproduces_the_files(tmp_path, in_tmp, capsys):
    """The sweep and the reports by the CLI in this process (its jobs share it, as they share a
    `meshrun sweep` process)."""
    sweep_dir = tmp_path / "sweep"
    done = cli_here(["sweep", "layout=dense_model", *FAST, f"hydra.sweep.dir={sweep_dir}"], capsys)
    assert done.returncode == 0, done.stderr
    assert "meshrun sweep: 4 mesh shapes of 8 devices: 8x1, 4x2, 2x4, 1x8" in done.stdout
    rows = json.loads((sweep_dir / "summary.json").read_text())["rows"]
    assert sorted(r["mesh"] for r in rows) == ["1x8", "2x4", "4x2", "8x1"]
    assert all(r["status"] == "ok" for r in rows) and sum(r["best"] for r in rows) == 1
    throughputs = [r["samples_per_s"] for r in rows]
    assert throughputs == sorted(throughputs, reverse=True)
    losses = [read_metrics(sweep_dir / str(job))["history"]["loss"] for job in range(4)]
    assert all(loss == pytest.approx(losses[0], abs=1e-5) for loss in losses)
    assert (sweep_dir / "summary.png").read_bytes().startswith(PNG_MAGIC)
    assert "best" in done.stdout and "fastest first" in done.stdout

    original = (sweep_dir / "summary.csv").read_text()
    again = cli_here(["report", str(sweep_dir), "--out", str(tmp_path / "again")], capsys)
    assert again.returncode == 0, again.stderr
    assert (tmp_path / "again" / "summary.csv").read_text().replace("../sweep/", "") == original
    shutil.rmtree(tmp_path / "again")
    in_place = cli_here(["report", str(sweep_dir)], capsys)
    assert in_place.returncode == 0 and (sweep_dir / "summary.csv").read_text() == original


@pytest.mark.integration
def test_a_job_that_cannot_run_is_recorded_and_the_sweep_goes_on(tmp_path, in_tmp, capsys):
    # hidden=202 divides by a model axis of 1 (8x1) but not of 4 (2x4); two batch sizes each. The
    # multiruns by the CLI in this process, their jobs sharing it as they share a meshrun process.
    sweep_dir = tmp_path / "sweep"
    done = cli_here(
        [
            "train",
            "-m",
            "mesh=8x1,2x4",
            "train.batch_size=16,32",
            "layout=dense_model",
            "model.hidden=202",
            *FAST,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        capsys,
    )
    assert done.returncode == 0, done.stderr  # at least one job succeeded
    statuses = {job: read_metrics(sweep_dir / str(job)) for job in range(4)}
    assert [statuses[j]["status"] for j in range(4)] == ["ok", "ok", "error", "error"]
    failed = statuses[2]
    assert (
        failed["error"].startswith("layout.rules.d1/kernel: shards dimension 1")
        and failed["exit_status"] == 2
    )
    assert statuses[1]["train"]["global_batch_size"] == 32
    assert "meshrun: error: job 2: layout.rules.d1/kernel" in done.stderr
    rows = json.loads((sweep_dir / "summary.json").read_text())["rows"]
    assert [r["status"] for r in rows][-2:] == ["error", "error"]

    none_ok = cli_here(
        [
            "train",
            "-m",
            "mesh=2x4,1x8",
            "layout=dense_model",
            "model.hidden=202",
            *FAST,
            f"hydra.sweep.dir={tmp_path / 'all-failed'}",
        ],
        capsys,
    )
    assert none_ok.returncode == 2
    assert (tmp_path / "all-failed" / "summary.csv").exists()


@pytest.mark.e2e
def test_jobs_needing_different_device_counts_run_in_their_own_processes(tmp_path, in_tmp, capsys):
    """The multirun by the CLI in this process; each job in a meshrun process of its own."""
    sweep_dir = tmp_path / "sweep"
    done = cli_here(
        ["train", "-m", "mesh=2x2,2x4", "layout=dense_model", *FAST, f"hydra.sweep.dir={sweep_dir}"], capsys
    )
    assert done.returncode == 0, done.stderr
    assert "jobs need different device counts (4 or 8): running each job in its own process" in done.stdout
    small, large = read_metrics(sweep_dir / "0"), read_metrics(sweep_dir / "1")
    assert (small["devices"]["available"], large["devices"]["available"]) == (4, 8)
    assert small["status"] == large["status"] == "ok"
    assert large["history"]["loss"] == pytest.approx(small["history"]["loss"], abs=1e-5)


@pytest.mark.e2e
def test_a_job_in_a_process_of_its_own_that_cannot_run_is_recorded_too(tmp_path, in_tmp, capsys):
    # Different device counts: each job runs as `meshrun train --role=sweep-job`, which keeps a
    # rejected job's run dir with its reason instead of removing it. hidden=202 divides by 2, not 4.
    sweep_dir = tmp_path / "sweep"
    done = cli_here(
        [
            "train",
            "-m",
            "mesh=2x2,2x4",
            "layout=dense_model",
            "model.hidden=202",
            *FAST,
            f"hydra.sweep.dir={sweep_dir}",
        ],
        capsys,
    )
    assert done.returncode == 0, done.stderr
    assert "running each job in its own process" in done.stdout
    ok, failed = read_metrics(sweep_dir / "0"), read_metrics(sweep_dir / "1")
    assert ok["status"] == "ok" and failed["status"] == "error" and failed["exit_status"] == 2
    assert failed["error"].startswith(
        "layout.rules.d1/kernel: shards dimension 1 of variable 'd1/kernel' (size 202"
    )
    rows = json.loads((sweep_dir / "summary.json").read_text())["rows"]
    assert [(r["mesh"], r["status"]) for r in rows] == [("2x2", "ok"), ("2x4", "error")]


@pytest.mark.e2e
def test_compilation_cache_is_on_by_default_and_can_be_moved_or_switched_off(tmp_path):
    cache = tmp_path / "xla-cache"
    done = run_meshrun(
        ["train", "mesh=2x4", *FAST, f"cache.dir={cache}", f"hydra.run.dir={tmp_path / 'a'}"], tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert read_metrics(tmp_path / "a")["cache"] == {"enabled": True, "dir": str(cache)}
    entries = sorted(p.name for p in cache.iterdir())
    assert entries, "nothing was cached"
    off = run_meshrun(
        [
            "train",
            "mesh=2x4",
            *FAST,
            f"cache.dir={tmp_path / 'unused'}",
            "cache.enabled=false",
            f"hydra.run.dir={tmp_path / 'b'}",
        ],
        tmp_path,
    )
    assert off.returncode == 0, off.stderr
    assert read_metrics(tmp_path / "b")["cache"] == {"enabled": False, "dir": None}
    assert not (tmp_path / "unused").exists()


@pytest.mark.e2e
def test_a_multirun_over_two_models_ends_with_their_comparison(tmp_path, monkeypatch):
    # A fresh matplotlib config dir: drawing summary.png builds its font cache and logs that
    # (INFO), after the jobs, under Hydra's own logging config.
    monkeypatch.setenv("MPLCONFIGDIR", str(tmp_path / "matplotlib"))
    sweep_dir = tmp_path / "sweep"
    done = run_meshrun(
        ["train", "-m", "model=dense_model,transformer", "mesh=2x4", *FAST, f"hydra.sweep.dir={sweep_dir}"],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    lines = (done.stdout + done.stderr).splitlines()
    assert [
        line for line in lines if "[HYDRA]" in line and not re.search(r"\[HYDRA\] (Launching|\t#\d)", line)
    ] == []
    assert (tmp_path / "matplotlib").is_dir() and not [line for line in lines if "fontManager" in line]
    rows = json.loads((sweep_dir / "summary.json").read_text())["rows"]
    assert sorted(r["model"] for r in rows) == ["dense_model", "transformer"] and all(
        r["status"] == "ok" for r in rows
    )
    assert rows[0]["samples_per_s"] >= rows[1]["samples_per_s"] and rows[0]["best"]
    assert "varying model, layout; fastest first (samples/s)" in done.stdout


@pytest.mark.parametrize(
    "args, expected",
    [
        (
            ["model=resnet"],
            "meshrun: error: model: unknown option 'resnet'; available: "
            "cnn, dense_model, keras_hub, python, transformer or two_tower",
        ),
        (
            ["train.epoch=3"],
            "meshrun: error: train.epoch: no such key (got "
            "override 'train.epoch=3'); did you mean train.epochs?",
        ),
    ],
)
def test_a_sweep_over_a_config_that_does_not_compose_is_one_line(args, expected, in_tmp, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["sweep", *args])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.strip().splitlines() == [expected]
    assert list(in_tmp.iterdir()) == []
