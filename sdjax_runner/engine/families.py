"""The engine's registry of model families: each family's package makes its own :class:`~.family.Family`
(``sdjax_runner/families/<name>/engine/entry.py``'s ``FAMILY``), gathered here for the names
``sdjax_runner.families.NAMES`` lists -- the same families, in the same order, as config/families.py's and
models/loaders.py's registries. Nothing here or elsewhere in the engine branches on a family's name: the engine
takes everything family-specific from the entry (docs/architecture.md, "Where a new model family goes")."""

from __future__ import annotations

from importlib import import_module

from sdjax_runner.engine.family import Family
from sdjax_runner.families import NAMES

# Each family's engine part is a module of the engine's layer inside its package (tests/test_layers.py)
FAMILIES: dict[str, Family] = {name: import_module(f"sdjax_runner.families.{name}.engine.entry").FAMILY
                               for name in NAMES}
