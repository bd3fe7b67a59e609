"""What the registries of things a run picks by name share (config/guiders.py's guiders, config/caches.py's step
caches): the name looked up in its registry and in what the model's family runs, and the settings of the group that
the chosen entry does not read -- said in one line each and left out, so a sweep over the names with one entry's
setting runs its other points without it."""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable, Mapping
from typing import Any

from sdjax_runner.errors import UserError

log = logging.getLogger("sdjax_runner")


def number(value: float) -> str:
    """A setting as written back for a re-run: the shortest text that reads as the same float, ``.0`` left out (``3``,
    ``0.5``, ``9999999``, ``0.123456789``) -- not ``:g``'s six digits (9999999 was ``1e+07``)."""
    text = repr(float(value))
    return text[:-2] if text.endswith(".0") else text


def label(name: str, settings: tuple[tuple[str, float], ...]) -> str:
    """``apg (eta 0.5, norm_threshold 15)``: an entry and its settings for the plan line."""
    values = ", ".join(f"{key} {number(value)}" for key, value in settings)
    return f"{name} ({values})" if values else name


def chosen(group: str, name: str, registry: Mapping[str, Any], runs_here: tuple[str, ...], config: Any,
           family: Any) -> Any:
    """``registry``'s entry ``name`` (``group=NAME``), one the family runs (``runs_here``); else UserError on
    ``group`` naming what is allowed."""
    if name not in registry:
        raise UserError(group, name, ", ".join(registry))
    if name not in runs_here:
        raise UserError(group, f"{name}: {config.model.name} is a {family.name} model, which runs "
                        f"{', '.join(runs_here)}", ", ".join(runs_here))
    return registry[name]


def settings_read(group: str, given: Any, name: str, registry: Mapping[str, Any], check: Callable[[str, Any], None],
                  apart: tuple[str, ...] = ()) -> tuple[tuple[str, float], ...]:
    """The settings (``group.KEY``, the fields of ``given``, a schema dataclass, but ``name`` and ``apart``) that
    entry ``name`` reads (its ``reads``), as numbers, each first checked (``check(key, value)``); one it does not
    read, set away from its default, is said in one line."""
    entry, defaults = registry[name], type(given)()
    for key in (f.name for f in dataclasses.fields(given) if f.name not in ("name", *apart)):
        value = getattr(given, key)
        check(key, value)
        if key not in entry.reads and value != getattr(defaults, key):
            readers = [other.name for other in registry.values() if key in other.reads]
            log.warning("%s.%s: %g is read by %s; %s=%s runs without it", group, key, value, " and ".join(readers),
                        group, name)
    return tuple((key, float(getattr(given, key))) for key in entry.reads)
