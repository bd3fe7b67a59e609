"""Where a run came from: library versions, devices, the command line and the code's commit."""

from __future__ import annotations

import os
import platform
import shlex
import socket
import subprocess
from importlib import metadata
from pathlib import Path
from typing import Optional

from sdjax_runner.versions import package_versions


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


def command(overrides: list[str]) -> str:
    """The command line that makes this run again (as a shell would need it quoted)."""
    return " ".join(["python -m sdjax_runner", *(shlex.quote(str(o)) for o in overrides)])


def run_note(overrides: list[str], run_dir: Path) -> str:
    """The MLflow run's description (markdown): how it was started, where its files are, how to re-run it."""
    where = Path(run_dir).resolve()
    return (f"`{command(overrides)}`\n\nRun directory: `{where}`\n\n"
            f"Re-run it and check the images are bit-identical: `python -m sdjax_runner rerun {where}`")


def run_tags(overrides: list[str], experiment: Optional[str], with_devices: bool = True) -> dict[str, str]:
    """Tags for a tracker run; ``with_devices=False`` where JAX must not grab the devices
    (the process that launches a sweep's jobs elsewhere)."""
    tags = {f"version.{k}": v for k, v in package_versions().items()}
    if with_devices:
        tags.update({k: str(v) for k, v in device_facts().items()})
    tags["hydra.overrides"] = " ".join(overrides)
    tags["command"] = command(overrides)
    tags["mlflow.source.name"] = "sdjax_runner"  # the UI's Source column, linked to the commit below
    tags["mlflow.source.type"] = "LOCAL"
    if experiment:
        tags["experiment"] = experiment
    commit = git_commit()
    if commit:
        tags["mlflow.source.git.commit"] = commit
    return tags


def environment() -> dict[str, object]:
    """What a run ran on (environment.json): the facts a re-run compares, since a different jaxlib,
    device kind or device count can change pixels."""
    return {
        "versions": dict(package_versions(), python=platform.python_version(), sdjax_runner=_own_version()),
        **device_facts(),
        "host": socket.gethostname(),
        "platform": platform.platform(),
        "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "git_commit": git_commit(),
    }


def _own_version() -> str:
    try:
        return metadata.version("sdjax-runner")
    except metadata.PackageNotFoundError:
        return "not installed"
