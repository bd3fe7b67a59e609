"""Reading a run's images back from disk."""

from __future__ import annotations

from pathlib import Path

import numpy as np
from PIL import Image


def images_of(run_dir: Path) -> list[np.ndarray]:
    """The run's images, in order, as arrays."""
    return [np.asarray(Image.open(f)) for f in sorted((run_dir / "images").glob("*.png"))]
