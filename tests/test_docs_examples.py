"""The commands the README and the docs show: every `meshrun train`, `plan` and `k8s` command in them
composes into a valid config as written (each job of a multirun), and every error a page shows is
the error line meshrun prints for that command today, word for word."""

import re
import shlex
from pathlib import Path

import pytest
from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.errors import MissingConfigException

from conftest import composed_config, error_line_here
from meshrun import app
from meshrun.config.parse import parse_run_config
from meshrun.errors import ConfigError

REPO = Path(__file__).parents[1]
PAGES = [REPO / "README.md", *sorted(p for p in (REPO / "docs").rglob("*.md") if "_build" not in p.parts)]
COMMAND = re.compile(r"meshrun (train|plan|k8s)\s+(.*)")
# Keys whose value is a path of the user's own (a preset dir, a layout file): a page's example can
# name one that only exists on the reader's machine.
USERS_PATHS = ("model.preset",)


def shown_commands():
    """(page, command, error) for every meshrun command in the pages' code blocks (continuation
    lines joined; in a block of output, only the lines typed at a `$ ` prompt), each with the error
    line shown right after it, if any."""
    for page in PAGES:
        for kind, block in re.findall(r"```([^\n]*)\n(.*?)```", page.read_text(), re.S):
            lines = re.sub(r"\\\n\s*", " ", block).splitlines()
            typed = "$ " if kind in ("text", "console") else ""
            for i, line in enumerate(lines):
                line = line.strip()
                found = line.startswith(typed) and COMMAND.match(line.removeprefix("$ "))
                if found:
                    after = lines[i + 1] if i + 1 < len(lines) else ""
                    shown_error = after if after.startswith("meshrun: error: ") else None
                    yield page.relative_to(REPO), found.group(0), shown_error


EXAMPLES = list(shown_commands())
ERRORS = [(page, command, error) for page, command, error in EXAMPLES if error]
RUNS = [(page, command) for page, command, error in EXAMPLES if not error and "..." not in command]


def overrides_of(command: str) -> list[str]:
    """The KEY=VALUE overrides of a shown command (its flags and their values left out)."""
    return [arg for arg in shlex.split(command, comments=True)[2:] if "=" in arg and not arg.startswith("-")]


def jobs_of(overrides: list[str]) -> list[list[str]]:
    """The jobs a multirun's overrides make, enough to try every value of every swept key once: the
    i-th job takes each sweep's i-th value (its last once a sweep runs out)."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    sweeps = {o.input_line: list(o.sweep_string_iterator()) for o in parsed if o.is_sweep_override()}
    count = max((len(values) for values in sweeps.values()), default=1)
    return [
        [
            f"{o.get_key_element()}={sweeps[o.input_line][min(i, len(sweeps[o.input_line]) - 1)]}"
            if o.input_line in sweeps
            else o.input_line
            for o in parsed
        ]
        for i in range(count)
    ]


def test_the_pages_show_commands_and_errors():
    assert len(RUNS) >= 40 and len(ERRORS) >= 3


@pytest.mark.parametrize(("page", "command"), RUNS, ids=[f"{p}: {c[:60]}" for p, c in RUNS])
def test_a_shown_command_composes_into_a_valid_config(page, command, in_tmp):
    for job in jobs_of(overrides_of(command)):
        try:
            parse_run_config(composed_config(*app.prepare_overrides(job), resolve=True))
        except ConfigError as error:
            if error.key not in USERS_PATHS:
                raise
        except MissingConfigException:
            assert any(re.fullmatch(r"\w+=\S+\.ya?ml", override) for override in job), "no such option"


@pytest.mark.parametrize(("page", "command", "error"), ERRORS, ids=[f"{p}: {c}" for p, c, _ in ERRORS])
def test_a_shown_error_is_the_line_meshrun_prints(page, command, error, capsys, in_tmp):
    assert error_line_here(shlex.split(command)[1:], capsys) == error
