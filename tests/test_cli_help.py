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


@pytest.mark.parametrize("command, flags", [
    ("train", ["--cfg job", "-m, --multirun"]),
    ("plan", ["--json", "--full", "--save-layout FILE.yaml"]),
    ("sweep", ["mesh.axis_names=[a,b,c]"]),
    ("report", ["--out DIR"]),
])
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_each_command_has_its_own_help(command, flags, flag, capsys):
    text = printed([command, "layout=dense_model", flag], capsys)
    assert text.startswith(f"usage: meshrun {command} ")
    assert all(f in text for f in flags), text
    groups = "config groups (group=option):" in text
    assert groups == (command != "report")
    if groups:
        assert "  layout: auto, cnn, dense_model," in text and "  mesh: data_parallel, model_parallel, or any shape" in text


def test_version_names_meshrun_and_the_libraries_it_runs_on(capsys):
    line = printed(["--version"], capsys).strip()
    expected = ", ".join(f"{name} {metadata.version(name)}" for name in ("jax", "jaxlib", "keras", "keras-hub"))
    assert line == f"meshrun {metadata.version('meshrun')} ({expected})"
