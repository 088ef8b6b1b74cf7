"""`meshrun --help`, each command's own `--help` and `meshrun --version` (in-process, no jax)."""

from importlib import metadata

import pytest

from meshrun import cli


def printed(args, capsys) -> str:
    """What `meshrun ARGS` prints on stdout, having asserted it exits 0 and says nothing on stderr."""
    cli.main(args)  # a failure would be SystemExit
    out, err = capsys.readouterr()
    assert err == "", err
    return out


@pytest.mark.parametrize(
    "command, flags",
    [
        ("train", ["--cfg job", "-m, --multirun"]),
        ("plan", ["--json", "--full", "--save-layout FILE.yaml"]),
        ("sweep", ["mesh.axis_names=[a,b,c]"]),
        ("report", ["--out DIR"]),
    ],
)
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_each_command_has_its_own_help(command, flags, flag, capsys):
    text = printed([command, "layout=dense_model", flag], capsys)
    assert text.startswith(f"usage: meshrun {command} ")
    assert all(f in text for f in flags), text
    groups = "config groups (group=option):" in text
    assert groups == (command != "report")
    if groups:
        assert (
            "  layout: auto, cnn, dense_model," in text
            and "  mesh: data_parallel, model_parallel, or any shape" in text
        )


def test_version_names_meshrun_and_the_libraries_it_runs_on(capsys):
    line = printed(["--version"], capsys).strip()
    expected = ", ".join(
        f"{name} {metadata.version(name)}" for name in ("jax", "jaxlib", "keras", "keras-hub")
    )
    assert line == f"meshrun {metadata.version('meshrun')} ({expected})"


TRAIN_FLAGS = (
    "-m/--multirun, --cfg/-c job|hydra|all, --resolve, --package/-p "
    "PACKAGE, --info/-i [WHAT] or --help (see meshrun train --help)"
)
PLAN_FLAGS = (
    "--json, --full, --save-layout FILE.yaml, --fit batch|seq_len, -m/--multirun or --help "
    "(see meshrun plan --help)"
)
UNKNOWN_FLAGS = {
    "train, misspelt": (
        ["train", "mesh=2x4", "--jsn"],
        f"--jsn: not a flag of meshrun train; valid: {TRAIN_FLAGS}",
    ),
    "train, plan's": (
        ["train", "--json"],
        f"--json: not a flag of meshrun train (it is one of meshrun plan); valid: {TRAIN_FLAGS}",
    ),
    "train, Hydra's left out": (
        ["train", "--config-dir", "conf"],
        f"--config-dir: not a flag of meshrun train; valid: {TRAIN_FLAGS}",
    ),
    "train, a short one": (["train", "-x"], f"-x: not a flag of meshrun train; valid: {TRAIN_FLAGS}"),
    "train, a bad value": (["train", "--cfg", "jobs"], "--cfg: got 'jobs'; valid: job, hydra or all"),
    "train, no value": (["train", "--package"], "--package: got nothing; give PACKAGE after it"),
    "train, a value to a switch": (["train", "--resolve=yes"], "--resolve: got 'yes'; it takes no value"),
    "plan, misspelt": (
        ["plan", "mesh=2x4", "--jsn"],
        f"--jsn: not a flag of meshrun plan; did you mean --json? valid: {PLAN_FLAGS}",
    ),
    "plan, train's": (
        ["plan", "--cfg", "job"],
        f"--cfg: not a flag of meshrun plan (it is one of meshrun train); valid: {PLAN_FLAGS}",
    ),
    "sweep": (
        ["sweep", "--foo"],
        "--foo: not a flag of meshrun sweep; valid: -m/--multirun or --help (see meshrun sweep --help)",
    ),
    "report": (
        ["report", "runs", "--outt", "cmp"],
        "--outt: not a flag of meshrun report; did you mean --out? "
        "valid: --out DIR or --help (see meshrun report --help)",
    ),
    "generate": (
        ["generate", "run", "--prompt", "x", "--promt", "y"],
        "--promt: not a flag of meshrun generate; did you mean --prompt? valid: --prompt TEXT, --chat JSON, "
        "--system TEXT, --user TEXT, --assistant TEXT, --max-length N, --temperature T, --top-k K, "
        "--top-p P, --seed S, --json or --help (see meshrun generate --help)",
    ),
    "k8s": (
        ["k8s", "--imag", "x", "--nodes", "2"],
        "--imag: not a flag of meshrun k8s; did you mean --image? valid: --image IMAGE, --nodes N, --kind "
        "KIND, --out FILE, --volume CLAIM:PATH, --name NAME, --namespace NS, "
        "--port PORT, --user UID:GID, --pull-secret SECRET, --no-network-policy, --apply, --simulate or "
        "--help (see meshrun k8s --help)",
    ),
}


@pytest.mark.parametrize("name", sorted(UNKNOWN_FLAGS))
def test_an_unknown_flag_is_one_line_naming_the_commands_flags(name, in_tmp, capsys):
    args, message = UNKNOWN_FLAGS[name]
    with pytest.raises(SystemExit) as ended:
        cli.main(args)
    out, err = capsys.readouterr()
    assert ended.value.code == 2 and out == ""
    assert err.splitlines() == [f"meshrun: error: {message}"]
    assert list(in_tmp.iterdir()) == []


def test_hydras_flags_that_train_takes_work_anywhere_among_the_overrides(capsys):
    text = printed(["train", "mesh=2x4", "--cfg", "job", "-p", "train", "train.epochs=2"], capsys)
    assert text.startswith("# @package train\n") and "\nepochs: 2\n" in text


def test_an_output_path_that_cannot_be_made_is_refused_alike_by_every_command(in_tmp, capsys):
    # Missing dirs of an output path are made (tests/test_k8s.py, test_sweep.py, test_auto_layout.py); a file
    # in the way is not.
    (in_tmp / "taken").write_text("a file")
    cases = {
        ("plan", "--save-layout", "taken/layout.yaml"): "--save-layout",
        ("k8s", "--image", "x", "--nodes", "1", "--out", "taken/job.yaml"): "--out",
        ("report", ".", "--out", "taken/cmp"): "--out",
    }
    for args, flag in cases.items():
        with pytest.raises(SystemExit) as ended:
            cli.main(list(args))
        err = capsys.readouterr().err
        assert ended.value.code == 2 and err.count("\n") == 1, err
        assert err.startswith(
            f"meshrun: error: {flag}: got '{args[-1]}', which cannot be written ({in_tmp / 'taken'} is a "
            "file, not a directory); give "
        ), err
    assert [p.name for p in in_tmp.iterdir()] == ["taken"]
