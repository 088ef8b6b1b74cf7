"""The order the suite runs its files in (tests/file_order.py): slowest first by the record the
suite writes itself, and the record rewritten only by a whole passing run that moved from it."""

import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

import file_order

TESTS = Path(__file__).parent


def collected(*names: str) -> list:
    """Collected items as slowest_first sees them: each of `names` ("file::test") by its path."""
    return [SimpleNamespace(path=TESTS / name.split("::")[0], name=name) for name in names]


def test_files_run_slowest_first_new_ones_before_all_each_files_tests_in_their_order(tmp_path):
    record = tmp_path / "durations.json"
    record.write_text(
        json.dumps({"cold": {"test_a.py": 5.0, "test_b.py": 50.0}, "warm": {"test_a.py": 60.0}})
    )
    items = collected("test_a.py::1", "test_b.py::1", "test_new.py::1", "test_a.py::2", "test_b.py::2")
    file_order.slowest_first(items, "cold", record)
    assert [item.name for item in items] == [
        "test_new.py::1",
        "test_b.py::1",
        "test_b.py::2",
        "test_a.py::1",
        "test_a.py::2",
    ]
    file_order.slowest_first(items, "warm", record)
    assert [item.name for item in items][:2] == ["test_new.py::1", "test_b.py::1"]  # both unknown when warm
    assert [item.name for item in items][2:] == ["test_b.py::2", "test_a.py::1", "test_a.py::2"]


def test_the_record_moves_only_past_a_quarter_and_5_seconds_or_with_another_set_of_files():
    old = {"test_a.py": 100.0, "test_b.py": 10.0}
    assert not file_order.moved(old, {"test_a.py": 124.0, "test_b.py": 14.9})
    assert file_order.moved(old, {"test_a.py": 126.0, "test_b.py": 10.0})
    assert file_order.moved(old, {"test_a.py": 100.0, "test_b.py": 15.1})
    assert file_order.moved(old, {"test_a.py": 100.0})
    assert file_order.moved({}, {"test_a.py": 1.0})


def run_project(project: Path, *args: str) -> int:
    """Runs pytest on `project` in a fresh process (the recorder writes when the session ends)."""
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *args],
        cwd=project,
        env={"PYTHONPATH": str(TESTS), "PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        timeout=120,
    )
    return done.returncode


@pytest.mark.e2e
def test_a_whole_passing_run_writes_its_seconds_a_chosen_or_failing_one_leaves_the_record(tmp_path):
    project = tmp_path / "project"
    (project / "tests").mkdir(parents=True)
    (project / "pytest.ini").write_text("[pytest]\ntestpaths = tests\n")
    record = project / "durations.json"
    (project / "tests" / "conftest.py").write_text(
        "import file_order\n\n\ndef pytest_configure(config):\n"
        f"    record = file_order.Path({str(record)!r})\n"
        "    config.pluginmanager.register(file_order.DurationRecorder(config, 'warm', record))\n"
    )
    (project / "tests" / "test_slow.py").write_text(
        "import time\n\n\ndef test_slow():\n    time.sleep(0.3)\n"
    )
    (project / "tests" / "test_fast.py").write_text("def test_fast():\n    pass\n")
    assert run_project(project) == 0
    written = json.loads(record.read_text())
    assert list(written) == ["warm"] and set(written["warm"]) == {"test_slow.py", "test_fast.py"}
    assert written["warm"]["test_slow.py"] >= 0.3 and written["warm"]["test_fast.py"] < 0.3
    record.write_text(json.dumps({"cold": {"test_x.py": 1.0}, "warm": {"test_slow.py": 99.0}}))
    assert run_project(project, "-k", "slow") == 0  # a chosen run: no rewrite
    assert json.loads(record.read_text())["warm"] == {"test_slow.py": 99.0}
    (project / "tests" / "test_fails.py").write_text("def test_fails():\n    assert False\n")
    assert run_project(project) == 1
    assert json.loads(record.read_text())["warm"] == {"test_slow.py": 99.0}
    (project / "tests" / "test_fails.py").unlink()
    assert run_project(project) == 0  # the cold record is kept beside the rewritten warm one
    assert set(json.loads(record.read_text())) == {"cold", "warm"}
    assert set(json.loads(record.read_text())["warm"]) == {"test_slow.py", "test_fast.py"}
