"""Images and timings -> the run directory (the on-disk contract later tools rely on).

    images/NNNN_seedS.png   one PNG per image, generation settings in PNG text chunks
                            (plus an A1111-style ``parameters`` chunk image tools read)
    grid.png                every image of the run in one grid
    images.json             per image: file, prompt, negative prompt, batch, device, seed
    timings.json            compile and steady-state timings, layout and device facts
    status.json             FINISHED / FAILED / KILLED, the error, and the tracker run
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, Optional, Sequence

from PIL import Image
from PIL.PngImagePlugin import PngInfo


def image_name(index: int, seed: int) -> str:
    return f"{index:04d}_seed{seed}.png"


def a1111_parameters(meta: dict[str, Any]) -> str:
    """The ``parameters`` text AUTOMATIC1111's web UI writes, which many image tools parse."""
    lines = [meta["prompt"]]
    if meta.get("negative_prompt"):
        lines.append(f"Negative prompt: {meta['negative_prompt']}")
    lines.append(
        f"Steps: {meta['steps']}, Sampler: {meta['scheduler']}, CFG scale: {meta['guidance_scale']}, "
        f"Seed: {meta['seed']}, Size: {meta['width']}x{meta['height']}, Model: {meta['model']}, "
        f"Dtype: {meta['dtype']}, Batch: {meta['batch']}, Device: {meta['device']}"
    )
    return "\n".join(lines)


def save_png(image: Image.Image, path: Path, meta: dict[str, Any]) -> None:
    info = PngInfo()
    for key, value in meta.items():
        info.add_itxt(key, "" if value is None else str(value))
    info.add_itxt("parameters", a1111_parameters(meta))
    image.save(path, pnginfo=info)


def grid_shape(count: int, rows: Optional[int] = None, cols: Optional[int] = None) -> tuple[int, int]:
    """Rows x cols for ``count`` images: as given, else the most square exact factorisation
    (8 -> 2 x 4), else a near-square grid with empty cells at the end."""
    if rows and cols:
        return rows, cols
    if rows:
        return rows, math.ceil(count / rows)
    if cols:
        return math.ceil(count / cols), cols
    side = math.ceil(math.sqrt(count))
    best = max(d for d in range(1, math.isqrt(count) + 1) if count % d == 0)
    if count // best <= 2 * side:
        return best, count // best
    return math.ceil(count / side), side


def make_grid(images: Sequence[Image.Image], rows: int, cols: int) -> Image.Image:
    from diffusers.utils import make_image_grid

    blank = Image.new(images[0].mode, images[0].size)
    cells = list(images) + [blank] * (rows * cols - len(images))
    return make_image_grid(cells, rows=rows, cols=cols)


def write_json(path: Path, data: Any) -> None:
    """Write atomically: a reader never sees half a file."""
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", encoding="utf-8")
    os.replace(tmp, path)


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))
