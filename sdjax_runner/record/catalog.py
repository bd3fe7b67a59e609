"""Runs on disk, found and read back without MLflow: every run directory under an output root (single
runs and sweep jobs), a one-line summary of each, and the differences between two runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any, Iterator, Optional

from omegaconf import OmegaConf

from sdjax_runner.record import rundir

# What a summary shows of a run's config and of its numbers.
KEY_PARAMS = ("model.name", "dtype.name", "scheduler.name", "sampling.num_inference_steps",
              "sampling.guidance_scale", "seed", "parallelism.mode")
HEADLINE = ("images_per_s", "generate_s", "compile_s", "wall_s", "clip_score_mean", "psnr", "ssim_mean")


def find_runs(root: Path) -> Iterator[Path]:
    """Every run directory under ``root`` (a directory with status.json), or ``root`` itself."""
    if (root / rundir.STATUS).is_file():
        yield root
        return
    for status in root.rglob(rundir.STATUS):
        yield status.parent


def _read(path: Path) -> dict:
    try:
        return rundir.read_json(path)
    except (OSError, ValueError):
        return {}


def flat_config(run_dir: Path) -> dict[str, str]:
    """The run's recorded config, flattened (``sampling.num_inference_steps: "4"``, lists as JSON),
    resolved where this environment can (else shown as written)."""
    path = run_dir / rundir.CONFIG
    if not path.is_file():
        return {}
    config = OmegaConf.load(path)
    try:
        container = OmegaConf.to_container(config, resolve=True, enum_to_str=True)
    except Exception:  # an interpolation this environment cannot resolve
        container = OmegaConf.to_container(config, resolve=False, enum_to_str=True)
    return {key: value for key, value in _walk(container)}


def _walk(node: Any, prefix: str = "") -> Iterator[tuple[str, str]]:
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _walk(value, f"{prefix}.{key}" if prefix else str(key))
    elif isinstance(node, list):
        yield prefix, json.dumps(node, ensure_ascii=False)
    else:
        yield prefix, "null" if node is None else str(node)


def summary(run_dir: Path) -> dict[str, Any]:
    """Name, status, start, key params and headline numbers of one run."""
    status = _read(run_dir / rundir.STATUS)
    numbers = dict(_read(run_dir / rundir.TIMINGS), **_read(run_dir / rundir.QUALITY))
    config = flat_config(run_dir)
    return {
        "dir": str(run_dir),
        "name": status.get("run_name") or config.get("run_name", run_dir.name),
        "status": status.get("status", "UNKNOWN"),
        "started": status.get("started_at") or "",
        "run_id": status.get("run_id") or "",
        **{key: config.get(key, "") for key in KEY_PARAMS},
        **{key: numbers.get(key, "") for key in HEADLINE},
    }


def numbers(run_dir: Path) -> dict[str, float]:
    """The run's numeric timings and quality metrics."""
    data = dict(_read(run_dir / rundir.TIMINGS), **_read(run_dir / rundir.QUALITY))
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


def config_diff(a: Path, b: Path) -> list[tuple[str, str, str]]:
    """(key, value in a, value in b) for every config key whose values differ."""
    left, right = flat_config(a), flat_config(b)
    return [(k, left.get(k, "-"), right.get(k, "-")) for k in sorted(set(left) | set(right))
            if left.get(k, "-") != right.get(k, "-")]


def metric_diff(a: Path, b: Path, keys: Optional[tuple[str, ...]] = None) -> list[tuple[str, float, float, str]]:
    """(metric, a, b, b/a) for the metrics both runs have (``keys``: only these)."""
    left, right = numbers(a), numbers(b)
    rows = []
    for key in sorted(set(left) & set(right)):
        if keys and key not in keys:
            continue
        x, y = left[key], right[key]
        ratio = f"{y / x:.3g}x" if x and math.isfinite(x) and math.isfinite(y) else ""
        rows.append((key, x, y, ratio))
    return rows
