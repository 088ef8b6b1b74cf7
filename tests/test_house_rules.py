"""The house rules docs/contributing.md states, kept by reading the code: functions under 60 lines,
no module-level mutable state but the process-wide state contributing.md names with its reason, no
import circles, the layers it draws equal to pyproject.toml's contract, and a line in its module map
for every module."""

import ast
import re
import tomllib
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
CONTRIBUTING = (REPO / "docs" / "contributing.md").read_text()
MAX_FUNCTION_LINES = 59  # "under 60 lines", from the first decorator to the last line, after ruff format

# What a module-level name may be bound to and then changed in place, and how it is changed.
MUTABLE_DISPLAYS = (ast.Dict, ast.List, ast.Set, ast.DictComp, ast.ListComp, ast.SetComp)
MUTABLE_CALLS = {"dict", "list", "set", "defaultdict", "OrderedDict", "deque", "Counter", "bytearray"}
MUTABLE_CALLS |= {"WeakKeyDictionary", "WeakValueDictionary", "WeakSet"}
MUTATING_METHODS = {"append", "add", "update", "setdefault", "pop", "popitem", "clear", "extend"}
MUTATING_METHODS |= {"insert", "remove", "discard"}
# Objects that change as the process runs: registries (specs register themselves) and context
# variables (a value in force inside a `with` block, for code that cannot be handed it).
STATEFUL_CALLS = {"Registry", "ContextVar"}
CACHES = {"cache", "lru_cache"}  # a function's results kept for the rest of the process


def python_files(*roots: str) -> list[Path]:
    return sorted(p for root in roots for p in (REPO / root).rglob("*.py") if "__pycache__" not in p.parts)


def relative(path: Path) -> str:
    return path.relative_to(REPO).as_posix()


def fenced_block_after(heading: str) -> str:
    """The first fenced block of contributing.md after `heading` (a line of it)."""
    after = CONTRIBUTING[CONTRIBUTING.index(heading) :]
    return re.search(r"```text\n(.*?)```", after, re.S).group(1)


def function_lines(node) -> int:
    first = min([node.lineno, *(d.lineno for d in node.decorator_list)])
    return node.end_lineno - first + 1


def test_every_function_of_meshrun_and_the_scripts_is_under_60_lines():
    long = [
        f"{relative(path)}:{node.lineno} {node.name} ({function_lines(node)} lines)"
        for path in python_files("meshrun", "scripts")
        for node in ast.walk(ast.parse(path.read_text()))
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and function_lines(node) > MAX_FUNCTION_LINES
    ]
    assert long == []


def _called(node) -> str | None:
    function = node.func
    return function.attr if isinstance(function, ast.Attribute) else getattr(function, "id", None)


def _bound_at_top(tree) -> dict[str, ast.expr]:
    """The names a module's top level binds by assignment, with the values bound."""
    bound = {}
    for node in tree.body:
        if isinstance(node, ast.Assign):
            bound.update({t.id: node.value for t in node.targets if isinstance(t, ast.Name)})
        elif isinstance(node, ast.AnnAssign) and node.value is not None and isinstance(node.target, ast.Name):
            bound[node.target.id] = node.value
    return bound


def _changed_in_place(tree) -> set[str]:
    """The names a module assigns items of, deletes items of, adds to or calls a mutating method of."""
    changed = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign | ast.AugAssign | ast.AnnAssign | ast.Delete):
            targets = node.targets if isinstance(node, ast.Assign | ast.Delete) else [node.target]
            for target in targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    changed.add(target.value.id)
                elif isinstance(node, ast.AugAssign) and isinstance(target, ast.Name):
                    changed.add(target.id)
        elif isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in MUTATING_METHODS and isinstance(node.func.value, ast.Name):
                changed.add(node.func.value.id)
    return changed


def module_state(tree) -> set[str]:
    """The module-level state a module holds: names rebound through `global`, containers bound at
    the top level and changed in place, registries, context variables and cached functions."""
    state = {name for node in ast.walk(tree) if isinstance(node, ast.Global) for name in node.names}
    changed = _changed_in_place(tree)
    for name, value in _bound_at_top(tree).items():
        mutable = isinstance(value, MUTABLE_DISPLAYS) or (
            isinstance(value, ast.Call) and _called(value) in MUTABLE_CALLS
        )
        if (mutable and name in changed) or (
            isinstance(value, ast.Call) and _called(value) in STATEFUL_CALLS
        ):
            state.add(name)
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and any(
            _called(d) in CACHES
            if isinstance(d, ast.Call)
            else getattr(d, "attr", getattr(d, "id", None)) in CACHES
            for d in node.decorator_list
        ):
            state.add(node.name)
    return state


def named_process_wide_state() -> set[str]:
    """`module: name` of each row of contributing.md's table of process-wide state."""
    table = CONTRIBUTING[CONTRIBUTING.index("### Process-wide state") :]
    return {
        f"{module}: {name}"
        for module, name in re.findall(r"^\| `(meshrun/[\w/]+\.py)` \| `(\w+)` \|", table, re.M)
    }


def test_module_level_state_is_only_what_contributing_names_with_its_reason():
    held = {
        f"{relative(path)}: {name}"
        for path in python_files("meshrun")
        for name in module_state(ast.parse(path.read_text()))
    }
    named = named_process_wide_state()
    assert sorted(held - named) == []  # state nobody has said must be process-wide
    assert sorted(named - held) == []  # named, but no longer held


def test_the_state_check_finds_each_kind_of_module_state():
    tree = ast.parse(
        "import functools\nSEEN = set()\nTABLE = {'a': 1}\nMODELS = Registry('model', {})\nflag = False\n"
        "_in_force = contextvars.ContextVar('x')\n"
        "def note(x):\n    SEEN.add(x)\n    global flag\n    flag = True\n"
        "@functools.cache\ndef once():\n    return TABLE['a']\n"
    )
    assert module_state(tree) == {"SEEN", "MODELS", "flag", "once", "_in_force"}  # TABLE is only read


def meshrun_import_cycles() -> list[list[str]]:
    """The groups of meshrun modules that import each other in a circle, deferred imports included
    (Tarjan's strongly connected components of the module graph)."""
    import grimp  # import-linter's graph (the dev extra; the oldest stack's smoke set lacks it)

    graph = grimp.build_graph("meshrun", cache_dir=None)
    edges = {
        m: [n for n in graph.find_modules_directly_imported_by(m) if n.startswith("meshrun")]
        for m in graph.modules
    }
    index, low, stack, on_stack, cycles = {}, {}, [], set(), []

    def visit(module):
        index[module] = low[module] = len(index)
        stack.append(module)
        on_stack.add(module)
        for imported in edges.get(module, ()):
            if imported not in index:
                visit(imported)
                low[module] = min(low[module], low[imported])
            elif imported in on_stack:
                low[module] = min(low[module], index[imported])
        if low[module] == index[module]:
            group = []
            while not group or group[-1] != module:
                group.append(stack.pop())
                on_stack.discard(group[-1])
            if len(group) > 1:
                cycles.append(sorted(group))

    for module in sorted(edges):
        if module not in index:
            visit(module)
    return cycles


def test_no_meshrun_modules_import_each_other_in_a_circle():
    assert meshrun_import_cycles() == []


def test_the_layers_contributing_draws_are_pyprojects_contract():
    pyproject = tomllib.loads((REPO / "pyproject.toml").read_text())
    (contract,) = [c for c in pyproject["tool"]["importlinter"]["contracts"] if c["type"] == "layers"]
    drawn = [
        line.strip() for line in fenced_block_after("## Layout of the code").splitlines() if line.strip()
    ]
    assert drawn == contract["layers"], "\n".join(contract["layers"])  # the block as it should read


def module_map() -> dict[str, str]:
    """contributing.md's module map: each entry's path (`meshrun/run/`, `meshrun/cli.py`) and text."""
    entries, path = {}, None
    for line in fenced_block_after("A `meshrun train` passes through these once").splitlines():
        if line and not line[0].isspace():
            path, _, text = line.partition(" ")
            entries[path] = text
        elif path:
            entries[path] += " " + line.strip()
    return entries


def test_every_module_of_meshrun_has_a_line_in_the_module_map():
    entries = module_map()
    unnamed = []
    for path in python_files("meshrun"):
        name, package = relative(path), relative(path.parent) + "/"
        if path.name == "__init__.py" and name != "meshrun/__init__.py":
            name = package  # a package is named by its own entry, or in its parent's
            package = relative(path.parent.parent) + "/"
        stem = name.rsplit("/", 2)[-2] + "/" if name.endswith("/") else path.name
        if name not in entries and not re.search(rf"(?<![\w/.]){re.escape(stem)}", entries.get(package, "")):
            unnamed.append(name)
    assert unnamed == []
