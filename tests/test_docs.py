"""The docs: the site under docs/ builds strictly (a warning, a broken cross-reference or a page left
out of the table of contents fails), and the README stays a short front page whose links land on
pages that exist."""

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]


def test_the_docs_site_builds_without_a_warning(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", "docs", tmp_path],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "index.html").is_file()
