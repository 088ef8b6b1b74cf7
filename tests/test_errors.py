"""Every bad input named by the foundation issue: one line on stderr, exit 2, nothing left behind.

These run the real CLI in-process (Hydra included); cases caught after device set-up use the 8
emulated CPU devices of this test process.
"""

import pytest

from meshrun import cli

CASES = {
    # mesh
    "mesh product != devices": (
        ["mesh=4x4"],
        ["mesh.shape", "needs 16 devices", "has 8 CPU devices"],
    ),
    "malformed shape": (["mesh=2xa"], ["mesh.shape", "'2xa'", "AxB[xC]"]),
    "zero dimension": (["mesh=2x0"], ["mesh.shape", "2x0", "positive integer"]),
    "negative dimension": (["mesh.shape=[2,-3]"], ["mesh.shape", "2x-3", "positive integer"]),
    "duplicate axis names": (
        ["mesh=2x4", "mesh.axis_names=[a,a]"],
        ["mesh.axis_names", "['a', 'a']", "unique"],
    ),
    "3-D mesh without names": (["mesh=2x2x2"], ["mesh.axis_names", "2x2x2", "give 3 names"]),
    "batch axis not in mesh": (
        ["mesh=2x4", "mesh.batch_axis=x"],
        ["mesh.batch_axis", "'x'", "data or model"],
    ),
    # layout
    "layout axis not in mesh": (
        ["mesh=2x4", "layout.rules={d1/kernel:[null,tensor]}"],
        ["layout.rules.d1/kernel", "'tensor'", "data, model or null"],
    ),
    "rank mismatch": (
        ["mesh=2x4", "layout.rules={d1/kernel:[model]}"],
        ["layout.rules.d1/kernel", "1 axes", "rank 2", "(784, 200)"],
    ),
    "indivisible dimension": (
        ["mesh=2x4", "layout=dense_model", "model.hidden=202"],
        ["layout.rules.d1/kernel", "size 202", "'model' of size 4", "valid for this dimension: null or data"],
    ),
    "rule matches nothing": (
        ["mesh=2x4", "layout.rules={d3/kernel:[null,model]}"],
        [
            "layout.rules.d3/kernel",
            "matches no variable or output",
            "closest real paths: d2/kernel, d1/kernel",
        ],
    ),
    "variable matched twice": (
        ["mesh=2x4", "layout.rules={d1/ker.*:[null,model],d1/.*:[model,null]}"],
        ["layout.rules", "'d1/kernel' is matched by 2 rules", "'d1/ker.*' and 'd1/.*'"],
    ),
    "invalid regex": (
        ["mesh=2x4", "layout.rules={*kernel:[null,model]}"],
        ["layout.rules.*kernel", "regular expression"],
    ),
    # unknown names
    "unknown model": (
        ["model=resnet"],
        [
            "model: unknown option 'resnet'",
            "available: cnn, dense_model, keras_hub, python, transformer or two_tower",
        ],
    ),
    "unknown layout": (["layout=tp"], ["layout: unknown option 'tp'", "replicated, transformer_2d"]),
    "unknown named mesh": (
        ["mesh=data_paralel"],
        ["mesh: unknown option 'data_paralel'", "did you mean data_parallel?"],
    ),
    "unknown data": (
        ["data=imagenet"],
        [
            "data: unknown option 'imagenet'",
            "available: arrays, classes, python, synthetic, text or tfrecord",
        ],
    ),
    "unknown recipe": (["recipe=nope"], ["recipe: unknown option 'nope'", "seeds_model_parallel"]),
    "unknown model name key": (
        ["model.name=resnet"],
        [
            "model.name",
            "'resnet'",
            "available models: cnn, dense_model, keras_hub, python, transformer or two_tower",
        ],
    ),
    # the model zoo: bad sizes and bad layouts for each model
    "transformer heads do not divide d_model": (
        ["model=transformer", "model.heads=5"],
        ["model.heads", "got 5", "does not divide model.d_model=64"],
    ),
    "unknown preset": (
        ["model=transformer", "model.preset=7B"],
        ["model.preset", "'7B'", "did you mean 7b?", "tiny, small, 125m, 1b or 7b"],
    ),
    "transformer_tp mlp width indivisible": (  # (heads it cannot divide stay whole: transformer_tp lets them)
        ["model=transformer", "mesh=1x8", "model.ff=250"],
        [
            "layout.rules.block_\\d+/mlp_up/kernel",
            "'block_0/mlp_up/kernel'",
            "(size 250",
            "'model' of size 8",
            "valid for this dimension: null or data",
            "(and 1 more path matched the same way); 2 more layout problems",
        ],
    ),
    "transformer_fsdp d_model indivisible": (
        ["model=transformer", "layout=transformer_fsdp", "mesh=8x1", "model.d_model=36", "model.heads=4"],
        ["layout.rules.", "(size 36", "'data' of size 8"],
    ),
    "two_tower rows indivisible": (
        ["model=two_tower", "mesh=1x8", "model.num_users=1001"],
        [
            "layout.rules.(user|item)_embedding/embeddings",
            "'user_embedding/embeddings' (size 1001",
            "'model' of size 8",
        ],
    ),
    "cnn rule of the wrong rank": (
        ["model=cnn", "mesh=2x4", "layout.rules={conv2d.*kernel:[null,model]}"],
        ["layout.rules.conv2d.*kernel", "gives 2 axes", "rank 4", "(3, 3, 1, 32)"],
    ),
    "cnn layout on the transformer": (
        ["model=transformer", "layout=cnn", "mesh=2x4"],
        ["layout.rules.conv2d.*kernel: matches no variable or output", "token_embedding/embeddings"],
    ),
    "model layout on a 1-D mesh": (
        ["model=cnn", "mesh=8"],
        ["layout.rules.conv2d.*kernel", "'model'", "data or null"],
    ),
    # train
    "batch not divisible": (
        ["mesh=2x4", "train.batch_size=15"],
        ["train.batch_size", "got 15", "'data' of size 2", "14 or 16"],
    ),
    "batch not divisible after -1 fill": (["train.batch_size=12"], ["train.batch_size", "got 12", "size 8"]),
    "unknown optimizer": (["train.optimizer=adamm"], ["train.optimizer", "'adamm'", "did you mean adam?"]),
    "unknown loss": (["train.loss=msee"], ["train.loss", "'msee'", "mean_squared_error"]),
    "wrong type": (["train.epochs=three"], ["train.epochs", "'three'", "expected int"]),
    "non-positive": (["train.epochs=0"], ["train.epochs", "got 0", "positive"]),
    "bad platform": (["devices.platform=npu"], ["devices.platform", "'npu'", "auto, cpu, gpu or tpu"]),
    # keys that do not exist
    "override of missing key": (
        ["train.epoch=3"],
        ["train.epoch: no such key", "'train.epoch=3'", "did you mean train.epochs?"],
    ),
    "appended missing key": (
        ["+train.epoch=3"],
        ["train.epoch: unknown key (got 3)", "did you mean train.epochs?"],
    ),
    "unknown top-level key": (["+trian.epochs=3"], ["trian: unknown key", "did you mean train? valid keys"]),
    # a misspelt section is matched with the sections, not cut from a key in one (model.ff)
    "misspelt section": (
        ["modle=cnn"],
        ["modle: no such key (got override 'modle=cnn'); did you mean model?"],
    ),
    "unknown model option": (["+model.hiden=3"], ["model.hiden: unknown key", "did you mean model.hidden?"]),
    "key of another data source": (
        ["data.path=train.npz"],
        [
            "data.path: not a key of the chosen data source (got override 'data.path=train.npz'); "
            "data.path is a key of data=arrays; add data=arrays"
        ],
    ),
    "appended key of another model": (
        ["+model.factory=m:f"],
        [
            "model.factory: unknown key (got 'm:f'); model.factory "
            "is a key of model=python; add model=python; valid keys"
        ],
    ),
    "key of two other models": (
        ["model=transformer", "model.hidden=64"],
        ["model.hidden is a key of model=cnn or model=dense_model; add one of them"],
    ),
    # Hydra's own
    "hydra.mode set": (["hydra.mode=MULTIRUN"], ["hydra.mode", "'MULTIRUN'", "a multirun with -m"]),
    "malformed override": (["mesh=="], ["malformed override 'mesh=='", "key=value"]),
    "regex rule without escapes": (
        ["layout.rules={d[12]/kernel:[null,model]}"],
        [
            "malformed override 'layout.rules={d[12]/kernel:[null,model]}' (",
            "put a backslash before ( ) [ ] { } : = , and spaces",
            r"'layout.rules={d\[12\]/kernel:[null,model],block_\(0|1\)/.*:[model]}'",
        ],
    ),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_bad_input_is_one_line_with_exit_2(name, in_tmp, capsys):
    args, expected = CASES[name]
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", *args, "train.verbose=0"])
    err = capsys.readouterr().err
    lines = [line for line in err.splitlines() if line.strip()]
    assert exit_info.value.code == 2, err
    assert len(lines) == 1, err
    assert lines[0].startswith("meshrun: error: ")
    assert "Traceback" not in err
    for fragment in expected:
        assert fragment in lines[0], f"{fragment!r} not in {lines[0]!r}"
    assert list(in_tmp.iterdir()) == [], "a rejected run left files behind"


def test_rejected_run_keeps_files_that_were_already_in_its_run_dir(in_tmp, capsys):
    run_dir = in_tmp / "mine"
    run_dir.mkdir()
    (run_dir / "notes.txt").write_text("keep me")
    (run_dir / "mine.log").write_text("keep me too")
    with pytest.raises(SystemExit):
        cli.main(["train", "mesh=2x4", "train.batch_size=15", f"hydra.run.dir={run_dir}"])
    assert sorted(p.name for p in run_dir.iterdir()) == ["mine.log", "notes.txt"]


def test_rejected_run_outside_the_working_dir_leaves_no_empty_run_dir(in_tmp, tmp_path_factory, capsys):
    run_dir = tmp_path_factory.mktemp("elsewhere") / "run"
    with pytest.raises(SystemExit):
        cli.main(["train", "mesh=2x4", "train.batch_size=15", f"hydra.run.dir={run_dir}"])
    assert not run_dir.exists() and run_dir.parent.exists()


def test_broken_interpolation_is_a_config_error(in_tmp, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "train.seed=${nope}"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.startswith(
        "meshrun: error: train.seed: Interpolation key 'nope' not found"
    )


def test_unknown_command(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["trian"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip() == "meshrun: error: unknown command 'trian'; valid: train, plan, "
        "sweep, report, generate, preset or k8s (see meshrun --help)"
    )


def test_usage_without_command(capsys):
    cli.main([])
    assert "usage: meshrun train" in capsys.readouterr().out


def test_an_unknown_role_is_one_line(capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli.main(["train", "--role=boss"])
    assert exit_info.value.code == 2
    assert (
        capsys.readouterr().err.strip()
        == "meshrun: error: --role: got 'boss'; valid: user, local-process or sweep-job"
    )


def test_meshrun_processes_are_started_with_their_role():
    import sys

    from meshrun.launch.spawn import Role, command

    assert command(["train", "mesh=2x4"], Role.SWEEP_JOB) == [
        sys.executable,
        "-m",
        "meshrun",
        "train",
        "mesh=2x4",
        "--role=sweep-job",
    ]
