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
from typing import NamedTuple, Optional

import numpy as np

from sdjax_runner.records import ImageRecord, Quality, required


class Fidelity(NamedTuple):
    """One image against the reference's image of its slot."""

    psnr: float  # dB; inf: identical
    ssim: float  # at most 1


def slot(record: ImageRecord) -> tuple:
    """What makes two runs' images the same image's: index, seed, prompt, negative prompt and size (KeyError
    naming a field the record lacks). PSNR/SSIM against a reference run and ``evaluate``'s pairs both match by it."""
    return (required(record.index, "index"), str(required(record.seed, "seed")), required(record.prompt, "prompt"),
            record.negative_prompt, record.height, record.width)


def _pixels(run_dir: Path, record: ImageRecord) -> np.ndarray:
    from PIL import Image

    with Image.open(run_dir / required(record.file, "file")) as image:
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


def _pairs_psnr_ssim(pairs: list[tuple[Path, ImageRecord, Path, ImageRecord]]) -> tuple[np.ndarray, np.ndarray]:
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


def compare(run_dir: Path, records: list[ImageRecord], reference_dir: Path,
            reference_records: list[ImageRecord]) -> tuple[list[Optional[Fidelity]], Quality]:
    """(per-image PSNR and SSIM aligned with ``records`` -- None where not compared, the run-level quality
    fields). ``reference_records``: the image records of the run in ``reference_dir``."""
    by_slot = {slot(r): r for r in reference_records}
    pairs = [(i, ref) for i, r in enumerate(records) if (ref := by_slot.get(slot(r))) is not None]
    per_image: list[Optional[Fidelity]] = [None for _ in records]
    fields = Quality(reference=str(reference_dir), compared_images=len(pairs))
    if not pairs:
        return per_image, fields
    psnr, ssim = _pairs_psnr_ssim([(run_dir, records[i], reference_dir, ref) for i, ref in pairs])
    for (i, _), p, s in zip(pairs, psnr, ssim, strict=True):
        per_image[i] = Fidelity(float(p), float(s))
    # The run's PSNR is that of its mean squared error over all compared images (inf only if every
    # image is identical; a mean of per-image PSNRs would be inf as soon as one image is).
    mse = float(np.mean(10.0 ** (-psnr / 10.0)))
    fields.psnr = math.inf if mse == 0 else -10.0 * math.log10(mse)
    fields.psnr_min, fields.ssim_mean, fields.ssim_min = float(np.min(psnr)), float(np.mean(ssim)), float(np.min(ssim))
    fields.identical_images = int(np.sum(np.isinf(psnr)))
    return per_image, fields
