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


def wait_for_images(directory: Path, count: int, proc: subprocess.Popen, timeout: float = 120) -> None:
    """Until ``directory`` holds ``count`` PNGs of the running ``proc`` (which must not end first)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if directory.is_dir() and len(list(directory.glob("*.png"))) >= count:
            return
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    raise AssertionError("no images appeared")
