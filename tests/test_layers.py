"""The package's layers (docs/architecture.md), read from its source: no module imports a layer to its right and
there is no import circle, counting the imports made inside functions and those only a type checker reads (an
``if TYPE_CHECKING:`` import never runs, but it is a dependency a reader follows)."""

from __future__ import annotations

import ast
from pathlib import Path

import sdjax_runner

PACKAGE = Path(sdjax_runner.__file__).resolve().parent
# Left to right. The bottom modules may be imported by anything; runner.py and commands/ sit on top.
LAYERS = {"errors": 0, "files": 0, "versions": 0, "console": 0, "interpreter": 0, "process": 0, "tensor_files": 0, "internals": 0,
          "records": 0, "config": 1, "models": 2,
          "engine": 3, "metrics": 4, "record": 5, "runner": 6, "commands": 7, "launchers": 7, "__main__": 8}


def _modules() -> dict[str, Path]:
    found = {}
    for path in PACKAGE.rglob("*.py"):
        if "conf" in path.relative_to(PACKAGE).parts[:1]:
            continue
        name = ".".join(("sdjax_runner",) + path.relative_to(PACKAGE).with_suffix("").parts)
        found[name.removesuffix(".__init__")] = path
    return found


def _imports(path: Path, modules: dict[str, Path], type_only: bool = False) -> set[str]:
    """The package's modules ``path`` imports; with ``type_only``, those in ``if TYPE_CHECKING:`` blocks too."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    skipped = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.If) and getattr(node.test, "id", "") == "TYPE_CHECKING" and not type_only:
            skipped.update(id(child) for child in ast.walk(node))
    found = set()
    for node in ast.walk(tree):
        if id(node) in skipped:
            continue
        if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("sdjax_runner"):
            for alias in node.names:
                child = f"{node.module}.{alias.name}"
                found.add(child if child in modules else node.module)
        elif isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names if alias.name.startswith("sdjax_runner."))
    return {name for name in found if name in modules}


def _layer(module: str) -> int:
    parts = module.split(".")
    return LAYERS[parts[1]] if len(parts) > 1 else -1  # the package itself: its __init__ imports nothing


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules, type_only) - {name} for name, path in modules.items()}


def test_every_module_has_a_layer():
    assert {name.split(".")[1] for name in _graph() if "." in name} <= set(LAYERS)


def test_no_module_imports_a_layer_to_its_right():
    upward = sorted(f"{module} -> {target}" for module, targets in _graph(type_only=True).items() for target in targets
                    if _layer(target) > _layer(module))
    assert upward == []


def test_no_import_circle():
    graph = _graph(type_only=True)
    circles, state = [], {}

    def visit(module: str, path: list[str]) -> None:
        state[module] = "open"
        for target in sorted(graph[module]):
            if state.get(target) == "open":
                circles.append(path[path.index(target):] + [target])
            elif target not in state:
                visit(target, path + [target])
        state[module] = "done"

    for module in sorted(graph):
        if module not in state:
            visit(module, [module])
    assert circles == []


EMPTY_CONTAINERS = ("dict", "list", "set", "Counter", "OrderedDict", "defaultdict", "deque")
STATE_HOMES = {"sdjax_runner.process", "sdjax_runner.interpreter"}  # interpreter.py mirrors gc's own state


def _process_state_outside_its_home() -> list[str]:
    """Module-level state outside process.py: a ``global`` statement, or a module-level name bound to an empty
    container (a cache or a registry of what happened, filled at run time)."""
    found = []
    for name, path in _modules().items():
        if name in STATE_HOMES:
            continue
        tree = ast.parse(path.read_text(encoding="utf-8"))
        found += [f"{name}:{node.lineno} global {', '.join(node.names)}" for node in ast.walk(tree)
                  if isinstance(node, ast.Global)]
        for node in tree.body:
            value = node.value if isinstance(node, (ast.Assign, ast.AnnAssign)) else None
            empty_literal = isinstance(value, (ast.Dict, ast.List, ast.Set)) and not (
                getattr(value, "keys", None) or getattr(value, "elts", None))
            empty_call = (isinstance(value, ast.Call) and not value.args and not value.keywords
                          and getattr(value.func, "attr", getattr(value.func, "id", "")) in EMPTY_CONTAINERS)
            if empty_literal or empty_call:
                found.append(f"{name}:{node.lineno} {ast.unparse(node).splitlines()[0]}")
    return found


def test_what_a_process_keeps_between_jobs_lives_in_process_py():
    """The reuse cache, scorers, cache settings, claimed folders, a sweep's result ... are fields of
    ``process.ProcessState``; no other module keeps state of its own."""
    assert _process_state_outside_its_home() == []


def test_no_module_imports_torch_diffusers_or_transformers():
    """The runtime is the runner's own (issue #60): those libraries are references in the test extra only; a module
    that imports one, at its top or inside a function, is named here."""
    importing = []
    for name, path in _modules().items():
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            roots = [alias.name.split(".")[0] for alias in node.names] if isinstance(node, ast.Import) else \
                [node.module.split(".")[0]] if isinstance(node, ast.ImportFrom) and node.module and not node.level \
                else []
            importing += [f"{name}: {root}" for root in roots if root in ("torch", "diffusers", "transformers")]
    assert importing == []
