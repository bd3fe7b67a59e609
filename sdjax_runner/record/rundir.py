"""Images and timings -> the run directory: the on-disk contract later tools rely on.

    images/NNNN_seedS.png   one PNG per image, generation settings in PNG text chunks
                            (plus an A1111-style ``parameters`` chunk image tools read)
    grid.png                every image of the run in one grid
    images.json             per image: file, prompt, negative prompt, batch, device, seed
    timings.json            compile and steady-state timings, layout and device facts
    status.json             FINISHED / FAILED / KILLED, the error, and the tracker run
    tracking.json           what the tracker is to receive (run name, params, tags), written first
    quality.json            CLIP score, PSNR/SSIM to a reference, and what could not be measured
    .hydra/                 the resolved config and the overrides (Hydra writes it)

A sweep directory holds one run directory per job (``0/``, ``1/``, ...) and sweep.json,
summary.csv, summary.json, contact_sheet.png and (with quality metrics) report.png.
"""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any, Iterator, Optional, Sequence

from PIL import Image
from PIL.PngImagePlugin import PngInfo

if TYPE_CHECKING:
    from sdjax_runner.config.plan import Plan

IMAGES_DIR = "images"
GRID = "grid.png"
IMAGES = "images.json"
TIMINGS = "timings.json"
STATUS = "status.json"
TRACKING = "tracking.json"
QUALITY = "quality.json"
HYDRA_DIR = ".hydra"
CONFIG = f"{HYDRA_DIR}/config.yaml"
OVERRIDES = f"{HYDRA_DIR}/overrides.yaml"
# In a sweep directory.
SWEEP = "sweep.json"
SUMMARY_CSV = "summary.csv"
SUMMARY_JSON = "summary.json"
CONTACT_SHEET = "contact_sheet.png"
REPORT = "report.png"


def image_file(index: int, seed: int) -> str:
    """An image's path relative to its run directory."""
    return f"{IMAGES_DIR}/{index:04d}_seed{seed}.png"


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


def image_meta(plan: "Plan", height: int, width: int) -> dict[str, Any]:
    """What every image of the run shares, for its PNG text chunks and images.json."""
    return {
        "negative_prompt": plan.negative,
        "seed": plan.seed,
        "steps": plan.num_inference_steps,
        "guidance_scale": plan.guidance_scale,
        "scheduler": plan.scheduler.name,
        "model": plan.model.name,
        "model_path": str(plan.model.pretrained_model_name_or_path),
        "dtype": plan.dtype.weights_dtype.name,
        "height": height,
        "width": width,
    }


def write_images(run_dir: Path, plan: "Plan", batches: Iterator, meta: dict[str, Any],
                 records: list[dict]) -> tuple[list, float]:
    """Each batch's kept images to images/ as it arrives, their records appended to ``records``
    (so an interruption keeps what was made, and says what it was); (images, seconds spent)."""
    images, write_s = [], 0.0
    if plan.output.save_images:
        (run_dir / IMAGES_DIR).mkdir(exist_ok=True)
    for batch, pixels in enumerate(batches):
        started = time.perf_counter()
        slots = plan.images[batch * plan.images_per_batch:(batch + 1) * plan.images_per_batch]
        for slot, array in zip(slots, pixels):
            if not slot.kept:
                continue
            image = Image.fromarray(array)
            record = dict(meta, index=slot.index, batch=slot.batch, device=slot.device, prompt=slot.prompt,
                          file=image_file(slot.index, plan.seed))
            if plan.output.save_images:
                save_png(image, run_dir / record["file"], record)
            records.append(record)
            images.append(image)
        write_s += time.perf_counter() - started
    return images, write_s


def write_run_files(run_dir: Path, plan: "Plan", records: list[dict], images: list) -> float:
    """images.json and grid.png; returns the seconds it took."""
    started = time.perf_counter()
    write_json(run_dir / IMAGES, records)
    if plan.output.grid:
        rows, cols = grid_shape(len(images), plan.output.grid_rows, plan.output.grid_cols)
        make_grid(images, rows, cols).save(run_dir / GRID)
    return time.perf_counter() - started
