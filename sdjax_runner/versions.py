"""The versions of the libraries that decide a program's pixels: recorded with each run (environment.json)
and part of every cache key (stored executables, parameter shapes)."""

from __future__ import annotations

from importlib import metadata

PACKAGES = ("jax", "jaxlib", "flax", "diffusers", "transformers", "numpy")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions
