"""Fidelity against a reference: each image compared with the reference run's image of the same slot
(same index, seed and prompt) by PSNR and SSIM, with dm-pix (DeepMind's JAX image library).

Identical images give PSNR ``inf`` and SSIM 1. Images are compared as they were written (the
PNGs on disk, lossless), as floats in [0, 1]. An image whose slot the reference does not have, or
has with another prompt, seed or size, is not compared (and counted as such).
"""

from __future__ import annotations

import functools
import math
from pathlib import Path
from typing import Any

import numpy as np


def _slot(record: dict) -> tuple:
    return record["index"], str(record["seed"]), record["prompt"], record.get("negative_prompt")


def _pixels(run_dir: Path, record: dict) -> np.ndarray:
    from PIL import Image

    with Image.open(run_dir / record["file"]) as image:
        return np.asarray(image.convert("RGB"), dtype=np.float32) / 255.0


@functools.lru_cache(maxsize=1)
def _compiled():
    import dm_pix
    import jax

    return jax.jit(lambda a, b: (dm_pix.psnr(a, b), dm_pix.ssim(a, b)))


# Images compared per call of the jitted program: bounds host memory (a chunk of 1024x1024 images is
# ~100 MB of floats per side) whatever the run's size, and keeps one compiled shape per image size.
CHUNK = 8


def psnr_ssim(images: np.ndarray, references: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per-image PSNR (dB) and SSIM of (N, H, W, 3) float arrays in [0, 1], in one jitted program."""
    import jax

    cpu = jax.devices("cpu")[0]  # small arrays: no need to occupy an accelerator
    psnr, ssim = _compiled()(jax.device_put(images, cpu), jax.device_put(references, cpu))
    return np.asarray(psnr), np.asarray(ssim)


def _pairs_psnr_ssim(pairs: list[tuple[Path, dict, Path, dict]]) -> tuple[np.ndarray, np.ndarray]:
    """PSNR and SSIM of each (run, record, reference run, reference record) pair's images, read from
    disk CHUNK pairs at a time (the last chunk padded with its own first pair, then dropped)."""
    psnr, ssim = [], []
    for start in range(0, len(pairs), CHUNK):
        chunk = pairs[start:start + CHUNK]
        padded = chunk + [chunk[0]] * (CHUNK - len(chunk))
        p, s = psnr_ssim(np.stack([_pixels(d, r) for d, r, _, _ in padded]),
                         np.stack([_pixels(d, r) for _, _, d, r in padded]))
        psnr.append(p[:len(chunk)])
        ssim.append(s[:len(chunk)])
    return np.concatenate(psnr), np.concatenate(ssim)


def compare(run_dir: Path, records: list[dict], reference_dir: Path,
            reference_records: list[dict]) -> tuple[list[dict], dict[str, Any]]:
    """(per-image {psnr, ssim} aligned with ``records`` -- empty dicts where not compared, run-level
    fields). ``reference_records``: the image records of the run in ``reference_dir``."""
    by_slot = {_slot(r): r for r in reference_records}
    found = [(i, by_slot.get(_slot(r))) for i, r in enumerate(records)]
    pairs = [(i, ref) for i, ref in found if ref is not None and (ref.get("height"), ref.get("width"))
             == (records[i].get("height"), records[i].get("width"))]
    per_image: list[dict] = [{} for _ in records]
    fields: dict[str, Any] = {"reference": str(reference_dir), "compared_images": len(pairs)}
    if not pairs:
        return per_image, fields
    psnr, ssim = _pairs_psnr_ssim([(run_dir, records[i], reference_dir, ref) for i, ref in pairs])
    for (i, _), p, s in zip(pairs, psnr, ssim, strict=True):
        per_image[i] = {"psnr": float(p), "ssim": float(s)}
    # The run's PSNR is that of its mean squared error over all compared images (inf only if every
    # image is identical; a mean of per-image PSNRs would be inf as soon as one image is).
    mse = float(np.mean(10.0 ** (-psnr / 10.0)))
    fields.update(psnr=math.inf if mse == 0 else -10.0 * math.log10(mse), psnr_min=float(np.min(psnr)),
                  ssim_mean=float(np.mean(ssim)), ssim_min=float(np.min(ssim)),
                  identical_images=int(np.sum(np.isinf(psnr))))
    return per_image, fields
