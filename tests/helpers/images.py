"""Reading a run's images back from disk."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import numpy as np
from PIL import Image


def images_of(run_dir: Path) -> list[np.ndarray]:
    """The run's images, in order, as arrays."""
    return [np.asarray(Image.open(f)) for f in sorted((run_dir / "images").glob("*.png"))]


def records_of(run_dir: Path) -> list[dict]:
    """The run's images.json: one record per image."""
    import json

    return json.loads((run_dir / "images.json").read_text())


def recorded_pixels(run_dir: Path) -> list[np.ndarray]:
    """The run's images in the order its records list them (each record's ``file``), as arrays."""
    out = []
    for record in records_of(run_dir):
        with Image.open(run_dir / record["file"]) as image:
            out.append(np.asarray(image))
    return out


def wait_for_images(directory: Path, count: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``directory`` holds ``count`` PNGs of the running ``proc`` (which must not end first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if directory.is_dir() and len(list(directory.glob("*.png"))) >= count:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("no images appeared")
