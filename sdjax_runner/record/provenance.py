"""Where a run came from: library versions, devices, the command line and the code's commit."""

from __future__ import annotations

import subprocess
from importlib import metadata
from pathlib import Path
from typing import Optional

PACKAGES = ("jax", "jaxlib", "flax", "diffusers", "transformers")


def package_versions() -> dict[str, str]:
    versions = {}
    for name in PACKAGES:
        try:
            versions[name] = metadata.version(name)
        except metadata.PackageNotFoundError:
            versions[name] = "not installed"
    return versions


def device_facts() -> dict[str, object]:
    import jax

    devices = jax.local_devices()
    return {
        "backend": jax.default_backend(),
        "device_kind": devices[0].device_kind,
        "local_device_count": len(devices),
        "device_count": jax.device_count(),
        "process_count": jax.process_count(),
    }


def git_commit() -> Optional[str]:
    """The commit of the checkout this package runs from, if it is one."""
    try:
        result = subprocess.run(["git", "rev-parse", "HEAD"], cwd=Path(__file__).parent, capture_output=True,
                                text=True, timeout=5, check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() if result.returncode == 0 else None


def run_tags(overrides: list[str], experiment: Optional[str], with_devices: bool = True) -> dict[str, str]:
    """Tags for a tracker run; ``with_devices=False`` where JAX must not grab the devices
    (the process that launches a sweep's jobs elsewhere)."""
    tags = {f"version.{k}": v for k, v in package_versions().items()}
    if with_devices:
        tags.update({k: str(v) for k, v in device_facts().items()})
    tags["hydra.overrides"] = " ".join(overrides)
    if experiment:
        tags["experiment"] = experiment
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags
