"""The docs: the site under docs/ builds strictly (a warning, a broken cross-reference or a page left
out of the table of contents fails), and the README stays a short front page whose links land on
pages that exist."""

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).parents[1]
README = REPO / "README.md"


def test_the_docs_site_builds_without_a_warning(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "sphinx", "-W", "--keep-going", "-n", "-q", "-b", "html", "docs", tmp_path],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "index.html").is_file()


def test_the_readme_is_at_most_250_lines():
    assert len(README.read_text().splitlines()) <= 250


def heading_anchors(page: Path) -> set[str]:
    """The anchors MyST gives a page's headings up to ### (myst_heading_anchors = 3), slugged as
    GitHub and MyST slug them: lower case, spaces to hyphens, other punctuation dropped."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.M | re.S)
    titles = re.findall(r"^#{1,3} (.+)$", text, flags=re.M)
    return {re.sub(r"[^\w\- ]", "", title.lower().replace(" ", "-")) for title in titles}


def test_every_readme_link_into_the_docs_lands_on_a_page_and_heading_that_exist():
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", README.read_text())
    assert len(links) >= 10, "the README's feature list links into docs/"
    missing = [path for path, _ in links if not (REPO / path).is_file()]
    assert missing == []
    unknown = [
        f"{path}#{anchor}" for path, anchor in links if anchor and anchor not in heading_anchors(REPO / path)
    ]
    assert unknown == []
