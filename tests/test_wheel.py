"""The wheel a user or a container image installs (`pip install .`): it holds every module and config
file of the source tree, and the README's main job runs from it, outside the source checkout."""

import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from conftest import read_metrics

pytestmark = pytest.mark.e2e

REPO = Path(__file__).resolve().parents[1]
PACKAGE = REPO / "meshrun"


def tree_files() -> set[str]:
    """The files of the source tree a wheel must hold, by their name inside the wheel: every module
    of meshrun/ and every YAML file of its config tree (meshrun/configs/, whose recipe/ is the
    repo's recipes/)."""
    modules = {p for p in PACKAGE.rglob("*.py") if "__pycache__" not in p.parts}
    configs = set((PACKAGE / "configs").rglob("*.yaml")) | {
        PACKAGE / "configs" / "recipe" / p.name for p in (REPO / "recipes").glob("*.yaml")
    }
    return {p.relative_to(REPO).as_posix() for p in modules | configs}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """meshrun's wheel, built as `pip install .` builds it from a fresh clone: from a copy of what the
    build reads, so that no build output of this checkout (meshrun.egg-info, build/) takes part."""
    source, out = tmp_path_factory.mktemp("source"), tmp_path_factory.mktemp("wheel")
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, source / name)
    for name in ("meshrun", "recipes"):
        shutil.copytree(
            REPO / name, source / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__")
        )
    command = [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "-q",
        "-w",
        str(out),
    ]
    subprocess.run([*command, str(source)], check=True, capture_output=True, timeout=300)
    (built,) = out.glob("meshrun-*.whl")
    return built


def test_the_wheel_holds_every_module_and_config_file_of_the_tree(wheel):
    names = {n for n in zipfile.ZipFile(wheel).namelist() if not n.startswith("meshrun-")}
    tree = tree_files()
    assert "meshrun/hf/load.py" in tree and "meshrun/configs/recipe/seeds_model_parallel.yaml" in tree
    assert sorted(tree - names) == []  # what the wheel would leave out
    assert sorted(n for n in names - tree if n.endswith((".py", ".yaml"))) == []  # nothing stray


def test_the_main_job_runs_from_the_installed_wheel(wheel, tmp_path):
    """`meshrun train mesh=2x4 layout=dense_model` (the README's main job) from the wheel installed
    into a bare dir, run with the working dir outside the checkout: meshrun, its config tree and a
    transformers-checkpoint module (meshrun.hf) all come from there."""
    target = tmp_path / "site"
    install = [sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(target), str(wheel)]
    subprocess.run(install, check=True, capture_output=True, timeout=300)
    run_dir = tmp_path / "run"
    job = ["train", "mesh=2x4", "layout=dense_model", f"hydra.run.dir={run_dir}"]
    where = (
        "import meshrun.cli, meshrun.configs, meshrun.hf.load as h; print(meshrun.cli.__file__, h.__file__)"
    )
    env = {**os.environ, "PYTHONPATH": str(target)}  # ahead of the editable install of the checkout
    found = subprocess.run(
        [sys.executable, "-c", where], cwd=tmp_path, env=env, capture_output=True, text=True
    )
    assert found.returncode == 0, found.stderr
    assert all(path.startswith(str(target)) for path in found.stdout.split()), found.stdout
    done = subprocess.run(
        [sys.executable, "-m", "meshrun", *job],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    metrics = read_metrics(run_dir)
    assert metrics["status"] == "ok"
    assert metrics["mesh"]["shape"] == [2, 4]
    assert metrics["sharding"]["d1/kernel"]["spec"] == [None, "model"]
