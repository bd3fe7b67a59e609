"""The package's layers (docs/architecture.md), read from its source: no module imports a layer to its right and
there is no import circle, counting the imports made inside functions and those only a type checker reads (an
``if TYPE_CHECKING:`` import never runs, but it is a dependency a reader follows). A model family's package
(``families/<name>/``) is a slice through the layers: each of its parts is in the layer it is named after
(``families/flux/engine/stages.py`` is the engine's), and nothing outside it branches on the family's name."""

from __future__ import annotations

import ast
from importlib import import_module
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


FAMILY_PARTS = ("config", "models", "engine")  # the layers a family's package has a part in


def _layer(module: str) -> int:
    parts = module.split(".")
    if parts[1:2] == ["families"]:  # the families' names and package docstrings: imported by anything
        return LAYERS[parts[3]] if len(parts) > 3 else 0
    return LAYERS[parts[1]] if len(parts) > 1 else -1  # the package itself: its __init__ imports nothing


def _graph(type_only: bool = False) -> dict[str, set[str]]:
    modules = _modules()
    return {name: _imports(path, modules, type_only) - {name} for name, path in modules.items()}


def test_every_module_has_a_layer():
    assert {name.split(".")[1] for name in _graph() if "." in name} <= set(LAYERS) | {"families"}
    family_modules = [name.split(".") for name in _graph() if name.startswith("sdjax_runner.families.")]
    assert {parts[3] for parts in family_modules if len(parts) > 3} <= set(FAMILY_PARTS)


def test_each_family_is_one_package_with_an_entry_in_each_layer():
    """``families.NAMES`` is the one list: each registry reads its layer's part of every family named there
    (config/families.py, models/loaders.py and engine/families.py import them by name, which the import graph
    above cannot see; here each part is checked to be there, in its layer, and to be the entry its registry has)."""
    from sdjax_runner.config.families import FAMILIES as CONFIG
    from sdjax_runner.engine.families import FAMILIES as ENGINE
    from sdjax_runner.families import NAMES
    from sdjax_runner.models.loaders import LOADERS

    modules = _modules()
    packages = sorted(path.name for path in (PACKAGE / "families").iterdir() if (path / "__init__.py").is_file())
    assert packages == sorted(NAMES)
    for name in NAMES:
        entries = {f"sdjax_runner.families.{name}.config": "config", f"sdjax_runner.families.{name}.models.entry":
                   "models", f"sdjax_runner.families.{name}.models.builtin": "models",
                   f"sdjax_runner.families.{name}.engine.entry": "engine"}
        assert {module: _layer(module) for module in entries} == {module: LAYERS[layer] for module, layer in
                                                                 entries.items()} and set(entries) <= set(modules)
    assert tuple(CONFIG) == tuple(LOADERS) == tuple(ENGINE) == NAMES
    assert all(CONFIG[name].name == ENGINE[name].name == name for name in NAMES)
    # the built-in models its entry names are the ones its package builds (ControlNets are components, not models)
    for name in NAMES:
        builds = import_module(f"sdjax_runner.families.{name}.models.builtin").BUILDS
        assert set(CONFIG[name].builtins) == {model for model, built in builds.items() if built.kind == "pipeline"}


def _family_name_branches(names: tuple[str, ...], modules: dict[str, Path]) -> list[str]:
    """Outside ``families/``: a family's name as a literal compared with (``==``, ``!=``, ``in``), looked up
    (``X["flux"]``), passed to a call, used as a dict key or as a parameter's default."""
    found = []
    for module, path in modules.items():
        if module.startswith("sdjax_runner.families"):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            literals: list = []
            if isinstance(node, ast.Compare):
                literals = [node.left, *node.comparators]
            elif isinstance(node, ast.Subscript):
                literals = [node.slice]
            elif isinstance(node, ast.Call):
                literals = [*node.args, *(keyword.value for keyword in node.keywords)]
            elif isinstance(node, ast.Dict):
                literals = [key for key in node.keys if key is not None]
            elif isinstance(node, ast.arguments):
                literals = [*node.defaults, *(default for default in node.kw_defaults if default is not None)]
            found += [f"{module}:{literal.lineno} {ast.unparse(node).splitlines()[0][:80]}" for literal in literals
                      if isinstance(literal, ast.Constant) and literal.value in names]
    return found


def test_no_branch_on_a_familys_name_outside_its_package():
    """What a family is and does is its package's (its entries' fields); the layers iterate the registries. A
    module elsewhere that asks whether a model is "flux" is named here."""
    from sdjax_runner.families import NAMES

    assert _family_name_branches(NAMES, _modules()) == []


def test_the_family_branch_check_finds_each_kind_of_branch(tmp_path):
    """The check above can fail: each kind of branch in a planted module is found, the same text in a family's
    package is not."""
    source = ('def run(family="sd", **settings):\n'
              '    if family == "sd3" or REGISTRY["flux"] or pick("flux"):\n'
              '        return {"sd": 1}\n')
    planted = tmp_path / "planted.py"
    planted.write_text(source)
    found = _family_name_branches(("sd", "flux", "sd3"), {"sdjax_runner.config.planted": planted,
                                                          "sdjax_runner.families.flux.config": planted})
    assert [line.split(" ")[0] for line in found] == ["sdjax_runner.config.planted:1"] * 1 + \
        ["sdjax_runner.config.planted:2"] * 3 + ["sdjax_runner.config.planted:3"]


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
