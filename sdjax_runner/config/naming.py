"""Run names: a single run is named after what its command line changes (``smoke dtype=bf16
scheduler=euler``), so runs of one experiment can be told apart in the run directories, in MLflow
and in ``python -m sdjax_runner runs list``; ``run_name=`` on the command line wins. Names become
directory names only through :func:`slug`, which keeps them inside ``paths.output_root``.

Both are OmegaConf resolvers (registered with the schema) so that ``hydra.run.dir`` can use them.
"""

from __future__ import annotations

import re
from typing import Iterable

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


def _key(override: str) -> str:
    return override.split("=", 1)[0].lstrip("+~")


def _is_housekeeping(key: str) -> bool:
    return any(key == group or key.startswith(group + ".") or key.startswith(group + "/") for group in HOUSEKEEPING)


def _short_value(value: str) -> str:
    """A path-like value by its last part (``metrics.reference=.../17-08-10_smoke`` -> ``17-08-10_smoke``)."""
    value = value.rstrip("/")
    return value.rsplit("/", 1)[-1] if "/" in value else value


def override_label(overrides: Iterable[str]) -> str:
    """``dtype=bf16 scheduler=euler``: the overrides that change what a run computes, as given."""
    parts = []
    for override in overrides:
        key = _key(str(override))
        if "=" not in str(override) or _is_housekeeping(key) or str(override) == "prompts.texts=[]":
            continue
        parts.append(f"{key}={_short_value(str(override).split('=', 1)[1])}")
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
