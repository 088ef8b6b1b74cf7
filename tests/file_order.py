"""The order the test files run in, slowest first, from a record of their durations that the suite
writes itself (tests/durations.json), so that the two workers of the README's command end together.

`-n 2 --dist loadfile` runs each file on one worker from start to end and hands the files out in the
order they were collected: a slow file handed out last keeps one worker busy for minutes while the
other idles. So the files are collected slowest first, by the seconds each took in the last whole run
of the suite on the same kind of start: with the tests' XLA cache empty (`cold`) or filled by an
earlier run (`warm`), which takes compile-heavy files half the time. A file the record does not
know yet (a new one) is taken to be as slow as the slowest, so it starts early.

Every whole run of the suite that passes (no -k, -m, --lf or paths: what the README's command runs)
updates the record where it has moved: a file whose time changed by more than a quarter and more
than 5 s, a file added or gone. In between, the file stays as it is, so a run leaves the checkout
clean unless the suite's shape changed.
"""

import json
from collections import Counter
from pathlib import Path

import pytest

DURATIONS = Path(__file__).with_name("durations.json")
KINDS = ("cold", "warm")
# How far a file's time must move before the record is rewritten (both): run-to-run noise on a
# shared 2-core machine is 10-40%, and a few seconds either way change no order that matters.
MOVED_SHARE = 0.25
MOVED_SECONDS = 5.0


def read_record(path: Path) -> dict[str, dict[str, float]]:
    """The record at `path`: for each kind of run, the seconds each file took ({}: none yet)."""
    try:
        return json.loads(path.read_text())
    except (FileNotFoundError, ValueError):
        return {}


def recorded(kind: str, path: Path = DURATIONS) -> dict[str, float]:
    """The seconds each file took in the last whole run of this kind, by file name ({}: none)."""
    return read_record(path).get(kind, {})


def slowest_first(items: list, kind: str, path: Path = DURATIONS) -> None:
    """Sorts the collected `items` so that their files run slowest first (a stable sort: each file's
    tests keep their order); files the record does not know count as the slowest."""
    seconds = recorded(kind, path)
    unknown = max(seconds.values(), default=0.0) + 1.0
    items.sort(key=lambda item: -seconds.get(item.path.name, unknown))


def whole_suite(config: pytest.Config) -> bool:
    """Whether this run is the README's: every test of the suite, nothing chosen or left out."""
    option = config.option
    chosen = (
        option.keyword,
        option.markexpr,
        getattr(option, "deselect", None),
        getattr(option, "lf", False),
        getattr(option, "failedfirst", False),
        getattr(option, "exitfirst", False),
    )
    return config.args_source == pytest.Config.ArgsSource.TESTPATHS and not any(chosen)


def moved(old: dict[str, float], new: dict[str, float]) -> bool:
    """Whether the record `old` no longer describes the run `new`: another set of files, or a file
    whose time moved by more than MOVED_SHARE and MOVED_SECONDS."""
    if set(old) != set(new):
        return True
    return any(abs(new[name] - old[name]) > max(MOVED_SECONDS, MOVED_SHARE * old[name]) for name in new)


class DurationRecorder:
    """A pytest plugin that sums each test file's seconds (set-up, call and tear-down of its tests,
    as the workers report them) and, after a whole passing run of the suite, updates the record of
    its `kind` where the run moved from it (in the record at `path`)."""

    def __init__(self, config: pytest.Config, kind: str, path: Path = DURATIONS):
        self.config = config
        self.kind = kind
        self.path = path
        self.seconds = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[Path(report.fspath).name] += report.duration

    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        if exitstatus != pytest.ExitCode.OK or not whole_suite(self.config) or not self.seconds:
            return
        new = {name: round(seconds, 1) for name, seconds in sorted(self.seconds.items())}
        record = read_record(self.path)
        if not moved(record.get(self.kind, {}), new):
            return
        record[self.kind] = new
        ordered = {kind: record[kind] for kind in KINDS if kind in record}
        self.path.write_text(json.dumps(ordered, indent=1) + "\n")
