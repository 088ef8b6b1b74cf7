"""Measures how meshrun's code is laid out and what that costs at start-up (issue 32's figures):

- knots: groups of meshrun's packages that import each other in a circle (imports inside functions
  counted), from grimp's import graph;
- how many meshrun modules `import meshrun.config.schema` loads, and `parse_run_config` of a
  dense_model run;
- the largest module and the longest function (lines);
- the wall time of `meshrun --help`, `meshrun train --help` and `meshrun plan mesh=2x4
  layout=dense_model`, each run in a fresh process, median of --repeats.

With --baseline-python (an interpreter whose `meshrun` is another checkout, e.g. a venv with
`pip install --no-deps -e` of the older commit), the same figures for that tree too, and the
command timings interleaved run by run (this one, then the baseline), since timings on a shared
machine drift between processes.

    python scripts/measure_layers.py --repeats 10 --baseline-python /tmp/venv_old/bin/python
"""

from __future__ import annotations

import argparse
import ast
import collections
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

COMMANDS = {
    "meshrun --help": ["--help"],
    "meshrun train --help": ["train", "--help"],
    "meshrun plan mesh=2x4 layout=dense_model": ["plan", "mesh=2x4", "layout=dense_model"],
}
_LOADED = """
import json, sys
{code}
print(json.dumps(len([m for m in sys.modules if m.startswith("meshrun")])))
"""


def static_figures() -> dict:
    """Knots, modules loaded, and sizes of the meshrun this interpreter imports."""
    import meshrun

    root = Path(meshrun.__file__).parent
    return {
        "tree": str(root),
        "knots": knots(),
        "modules_loaded_by_config_schema": _modules_loaded("import meshrun.config.schema"),
        "modules_loaded_by_parsing_a_config": _modules_loaded(
            "from meshrun.config import parse_run_config\n"
            "parse_run_config({'mesh': {'shape': '2x4'}, 'model': {'name': 'dense_model'}})"
            if _has_reexport()
            else "from meshrun.config.parse import parse_run_config\n"
            "parse_run_config({'mesh': {'shape': '2x4'}, 'model': {'name': 'dense_model'}})"
        ),
        **sizes(root),
    }


def _has_reexport() -> bool:
    import meshrun.config

    return hasattr(meshrun.config, "parse_run_config")


def _modules_loaded(code: str) -> int:
    done = subprocess.run(
        [sys.executable, "-c", _LOADED.format(code=code)], capture_output=True, text=True, check=True
    )
    return int(done.stdout.split()[-1])


def knots() -> list[list[str]]:
    """The strongly connected groups (more than one) of meshrun's subpackages and top modules."""
    import grimp

    graph = grimp.build_graph("meshrun", include_external_packages=False)
    edges = collections.defaultdict(set)
    for module in graph.modules:
        for imported in graph.find_modules_directly_imported_by(module):
            a, b = _package(module), _package(imported)
            if a != b:
                edges[a].add(b)
    nodes = sorted({_package(m) for m in graph.modules})
    return [sorted(group) for group in _strongly_connected(nodes, edges) if len(group) > 1]


def _package(module: str) -> str:
    return ".".join(module.split(".")[:2])


def _strongly_connected(nodes, edges) -> list[list[str]]:
    """Tarjan's algorithm, iterative enough for a graph of a few dozen nodes."""
    index, low, stack, on_stack, groups = {}, {}, [], set(), []

    def visit(node):
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in on_stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            groups.append(group)

    for node in nodes:
        if node not in index:
            visit(node)
    return groups


def sizes(root: Path) -> dict:
    """The largest module and the longest function under `root`, in lines."""
    largest, longest = ("", 0), ("", 0)
    for path in sorted(root.rglob("*.py")):
        text = path.read_text()
        name = str(path.relative_to(root.parent))
        largest = max(largest, (name, len(text.splitlines())), key=lambda pair: pair[1])
        for node in ast.walk(ast.parse(text)):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                length = node.end_lineno - node.lineno + 1
                longest = max(longest, (f"{name}:{node.name}", length), key=lambda pair: pair[1])
    return {
        "largest_module": {"path": largest[0], "lines": largest[1]},
        "longest_function": {"name": longest[0], "lines": longest[1]},
    }


def time_commands(pythons: dict[str, str], repeats: int) -> dict:
    """Median wall seconds of each command per interpreter, the interpreters taking turns."""
    walls = {label: collections.defaultdict(list) for label in pythons}
    with tempfile.TemporaryDirectory() as cwd:
        for _ in range(repeats):
            for command, args in COMMANDS.items():
                for label, python in pythons.items():
                    started = time.perf_counter()
                    done = subprocess.run(
                        [python, "-m", "meshrun", *args], cwd=cwd, capture_output=True, text=True
                    )
                    walls[label][command].append(time.perf_counter() - started)
                    if done.returncode != 0:
                        raise SystemExit(
                            f"{label}: meshrun {' '.join(args)} exited "
                            f"{done.returncode}: {done.stderr[-500:]}"
                        )
    return {
        label: {command: round(statistics.median(times), 3) for command, times in by.items()}
        for label, by in walls.items()
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--baseline-python", help="an interpreter whose meshrun is the tree to compare with")
    parser.add_argument(
        "--static", action="store_true", help="print this tree's static figures as JSON and stop"
    )
    parser.add_argument("--out", help="also write the figures to this JSON file")
    args = parser.parse_args()
    if args.static:
        print(json.dumps(static_figures()))
        return
    figures = {"this": static_figures()}
    pythons = {"this": sys.executable}
    if args.baseline_python:
        done = subprocess.run(
            [args.baseline_python, __file__, "--static"], capture_output=True, text=True, check=True
        )
        figures["baseline"] = json.loads(done.stdout.splitlines()[-1])
        pythons["baseline"] = args.baseline_python
    for label, walls in time_commands(pythons, args.repeats).items():
        figures[label]["wall_s"] = walls
    text = json.dumps(figures, indent=2)
    print(text)
    if args.out:
        Path(args.out).write_text(text + "\n")


if __name__ == "__main__":
    main()
