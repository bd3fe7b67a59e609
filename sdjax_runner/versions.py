"""The versions of the libraries that decide a program's pixels: recorded with each run (environment.json)
and part of every cache key (stored executables, parameter shapes)."""

from __future__ import annotations

import functools
from importlib import metadata

# The model code is the runner's own (issue #60): diffusers and transformers decide no pixel any more.
PACKAGES = ("jax", "jaxlib", "flax", "numpy")


@functools.cache
def _installed() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def package_versions() -> dict[str, str]:
    """``{package: version}`` of :data:`PACKAGES` (read once per process: what is imported does not change)."""
    return dict(_installed())
