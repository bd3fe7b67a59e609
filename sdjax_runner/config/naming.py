"""Run names: a single run is named after what its command line changes (``smoke dtype=bf16
scheduler=euler``, ``smoke sampler=DPM++ 2M Karras``, ``smoke lora=style.safetensors@0.8``: values as meant,
without Hydra's escapes, quotes or brackets), so runs of one experiment can be told apart in the run
directories, in MLflow and in ``python -m sdjax_runner runs list``; ``run_name=`` on the command line wins. Names become
directory names only through :func:`slug`, which keeps them inside ``paths.output_root``.

Both are OmegaConf resolvers (registered with the schema) so that ``hydra.run.dir`` can use them.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Any

from omegaconf import OmegaConf

# Overrides that say where and how a run is recorded, not what it computes: left out of its name.
HOUSEKEEPING = ("hydra", "experiment", "run_name", "tracking", "paths", "compilation_cache", "reuse",
                "output", "timing")
MAX_NAME_CHARS = 120
# Short names for config keys, usable where a person names a key: filters of ``runs list``
# (``model=sd-v1-4``) and the axes of a sweep's report (``report.x=steps``).
SHORT_KEYS = {"model": "model.name", "dtype": "dtype.name", "scheduler": "scheduler.name",
              "steps": "sampling.num_inference_steps", "guidance": "sampling.guidance_scale",
              "parallelism": "parallelism.mode"}
_UNSAFE = re.compile(r"[^A-Za-z0-9._=,+@-]+")
_PLAIN = re.compile(r"[\w.+\-/:@%^]*")  # an override value in which Hydra's grammar has nothing to read


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _is_housekeeping(key: str) -> bool:
    return any(key == group or key.startswith(group + ".") or key.startswith(group + "/") for group in HOUSEKEEPING)


def _short_value(value: str) -> str:
    """A path-like value by its last part (``metrics.reference=.../17-08-10_smoke`` -> ``17-08-10_smoke``)."""
    value = value.rstrip("/")
    return value.rsplit("/", 1)[-1] if "/" in value else value


def _shown(value: Any, short: bool) -> str:
    """A parsed override value as a person reads it: text as it is, a list's items joined by commas, a
    LoRA (a mapping with a path) as ``style.safetensors@0.8``, another mapping as ``key:value`` pairs;
    ``short``: paths by their last part."""
    if isinstance(value, dict):
        if "path" in value:
            scale = value.get("scale")
            return _shown(value["path"], short) + ("" if scale is None else f"@{_shown(scale, short)}")
        return ",".join(f"{key}:{_shown(item, short)}" for key, item in value.items())
    if isinstance(value, (list, tuple)):
        return ",".join(_shown(item, short) for item in value)
    text = "null" if value is None else str(value).lower() if isinstance(value, bool) else str(value)
    return _short_value(text) if short else text


def override_value(override: str, short: bool = False) -> str:
    """An override's value as the person meant it, without the grammar around it: Hydra's escapes
    (``Euler\\ a`` -> ``Euler a``), quotes, and the brackets and braces of a list or mapping (a LoRA:
    ``style.safetensors@0.8``). A number keeps its spelling; a value Hydra cannot parse is its text with
    backslash escapes dropped. ``short``: paths by their last part."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    text = str(override).split("=", 1)[1] if "=" in str(override) else ""
    if _PLAIN.fullmatch(text):  # no grammar to take off (most values): as it is, without parsing
        return _shown(text, short)
    try:
        value = OverridesParser.create().parse_override(str(override)).value()
    except Exception:  # not one override Hydra reads (it refuses such a command itself)
        value = re.sub(r"\\(.)", r"\1", text)
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        value = text.strip()  # 7.50 stays 7.50, 1e-3 stays 1e-3
    return _shown(value, short)


def override_label(overrides: Iterable[str]) -> str:
    """``dtype=bf16 sampler=DPM++ 2M Karras``: the overrides that change what a run computes, their values
    as :func:`override_value` shows them."""
    parts = []
    for override in overrides:
        key = _key(str(override))
        if "=" not in str(override) or _is_housekeeping(key) or str(override) == "prompts.texts=[]":
            continue
        parts.append(f"{key}={override_value(str(override), short=True)}")
    return " ".join(parts)


def run_name(base: str, overrides: Iterable[str]) -> str:
    """The run's name: ``base`` (the config's ``run_name``) with the override label, unless
    ``run_name`` itself was given on the command line."""
    overrides = [str(o) for o in overrides]
    if any(_key(o) == "run_name" for o in overrides):
        return str(base)
    name = f"{base} {override_label(overrides)}".strip()
    return name if len(name) <= MAX_NAME_CHARS else name[: MAX_NAME_CHARS - 3] + "..."


def slug(name: str) -> str:
    """``name`` as one directory name: safe characters only, never ``..`` or a path separator."""
    text = _UNSAFE.sub("_", str(name).replace(" ", "_")).strip("._") or "run"
    return re.sub(r"\.{2,}", ".", text)[:MAX_NAME_CHARS]


def register_resolvers() -> None:
    """``${sdjax.run_name:${run_name},${hydra:overrides.task}}`` and ``${sdjax.slug:...}``."""
    if not OmegaConf.has_resolver("sdjax.run_name"):
        OmegaConf.register_new_resolver("sdjax.run_name", lambda base, overrides: run_name(base, overrides or []))
    if not OmegaConf.has_resolver("sdjax.slug"):
        OmegaConf.register_new_resolver("sdjax.slug", slug)
