"""The axes of a sweep's report grid (``report.x``, ``report.y``; record/report_page.py), from its swept keys.

A name is a swept key as the command line gives it (``sampling.num_inference_steps``, ``dtype``), a
short name (config/naming.py: ``steps``, ``guidance``, ...) or the last part of a dotted key
(``num_inference_steps``). Unset axes are chosen: x the last swept key not taken, y the one before it;
every other swept key pages the grid (Z: one grid per combination of their values).
"""

from __future__ import annotations

from typing import NamedTuple, Optional

from sdjax_runner.config.naming import SHORT_KEYS
from sdjax_runner.config.samplers import a1111_name
from sdjax_runner.errors import UserError


class Axes(NamedTuple):
    x: Optional[str]  # a swept key, or None (no swept key: one cell)
    y: Optional[str]
    z: tuple[str, ...]  # the keys whose values page the grid


def resolve(name: str, keys: list[str], config_key: str) -> str:
    """The swept key ``name`` names (module docstring); one line naming ``config_key`` if none."""
    long = SHORT_KEYS.get(name, name)
    for key in keys:
        if name == key or long == key or SHORT_KEYS.get(key) == long:
            return key
    by_last = [key for key in keys if key.rsplit(".", 1)[-1] == name]
    if len(by_last) == 1:
        return by_last[0]
    raise UserError(config_key, f"{name} is not a swept key of this sweep",
                    ", ".join(keys) if keys else "nothing: the sweep sweeps no key")


def axis_value(key: str, value: str) -> str:
    """A swept value as the report, summary.csv and the reference point read it: a sampler as A1111 spells
    what it runs (``dpmpp_2m karras`` -> ``DPM++ 2M Karras``), any other value as it is."""
    return a1111_name(value) if key.lstrip("+~") == "sampler" else value


def image_index(value) -> int:
    """``report.image``: which image of each point the grid shows, an index of 0 or more."""
    text = str(value if value is not None else 0)
    if not (text.isascii() and text.isdigit()):
        raise UserError("report.image", text, "an image index of the run, 0 or more")
    return int(text)


def choose(keys: list[str], x: Optional[str] = None, y: Optional[str] = None) -> Axes:
    """The grid's axes for a sweep over ``keys`` (module docstring); ``x``/``y``: report.x / report.y."""
    chosen_x = resolve(x, keys, "report.x") if x else None
    chosen_y = resolve(y, keys, "report.y") if y else None
    if chosen_x and chosen_x == chosen_y:
        raise UserError("report.y", f"{y} is report.x's key too", "another swept key, or null")
    free = [k for k in keys if k not in (chosen_x, chosen_y)]
    if chosen_x is None and free:
        chosen_x = free.pop()
    if chosen_y is None and free:
        chosen_y = free.pop()
    return Axes(chosen_x, chosen_y, tuple(free))
