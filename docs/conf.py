"""Sphinx configuration of meshrun's docs: Markdown pages (MyST) under the Furo theme.

Build them as CI does (a warning, a broken cross-reference or a page outside the table of contents
fails it): `python -m sphinx -W --keep-going -n -b html docs docs/_build/html`.
"""

project = "meshrun"
author = "the meshrun developers"
copyright = "2026, the meshrun developers"

extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
root_doc = "index"
exclude_patterns = ["_build"]

# Headings up to ### get anchors, so pages link to each other's sections: [text](plan.md#the-table).
myst_heading_anchors = 3
myst_enable_extensions = ["colon_fence", "deflist"]

html_theme = "furo"
html_title = "meshrun"
html_static_path: list[str] = []
nitpicky = True
