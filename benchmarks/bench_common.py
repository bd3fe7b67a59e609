"""What every benchmark records about where it ran: versions, CPU count and the JAX devices."""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata


def machine_facts(with_devices: bool = False) -> dict:
    facts = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
             "machine": platform.machine(), "cpus": os.cpu_count(),
             **{p: metadata.version(p) for p in ("jax", "jaxlib", "flax", "diffusers", "hydra-core")}}
    if with_devices:
        import jax

        facts.update(backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
                     device_count=jax.device_count())
    return facts


def run_sweep(overrides: list[str], sweep_dir, env: dict, cwd) -> list[dict]:
    """``python -m sdjax_runner -m OVERRIDES`` into ``sweep_dir``; each job's overrides and timings.json."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    result = subprocess.run([sys.executable, "-m", "sdjax_runner", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"],
                            cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"failed: {' '.join(overrides)}\n{result.stderr[-3000:]}")
    jobs = []
    for job in sorted((p for p in Path(sweep_dir).iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        overrides_done = (job / ".hydra" / "overrides.yaml").read_text()
        jobs.append({"overrides": overrides_done, **json.loads((job / "timings.json").read_text())})
    return jobs
