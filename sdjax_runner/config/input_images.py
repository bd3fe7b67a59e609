"""The images a run starts from or is steered by (``init_image``, ``mask_image``, ``controlnet.image``):
untrusted files, read and checked before any model loads, then fitted to the run's size.

Each key takes a file, a folder (its image files in name order) or a list of files. One file serves every
prompt; a folder or list is paired with the prompts: prompt k gets image k, so it must hold exactly as
many images as there are prompts. Every image is decoded whole here (a truncated or corrupt file is one
line now, not a failure mid-run), at most :data:`MAX_PIXELS` pixels (a decompression bomb -- a small file
that decodes to gigabytes -- is refused from its header, before it is decoded).

Fitting to ``height`` x ``width`` (:func:`fitted`), by ``resize_mode``:

* ``stretch`` (the default): resized to exactly height x width, Lanczos, aspect ratio not kept -- what
  diffusers' ``VaeImageProcessor.resize`` does by default and A1111's "Just resize";
* ``crop``: scaled (Lanczos) so it covers height x width, then the centre cut out -- A1111's "Crop and resize"
  (a picture far longer than the run's shape has its centre cut out first, then resized: the scaled
  picture stays within :data:`MAX_SCALED` run images, not gigapixels from a 1 x 200000 file).

An image already of the run's size is used as it is (no resampling), which is how diffusers' Flax
pipelines take an image of their size. A mask is binarised after resizing: >= 0.5 (128 of 255)
repaints, as diffusers' Flax inpaint pipeline does; it is resized with the same geometry as the init
image (nearest neighbour, so its edge stays sharp before binarising).

A mask is read as A1111 reads one (``create_binary_mask`` in its modules/processing.py), so the files users
already have work: a grayscale mask as it is (white repaints, black keeps); an RGB or palette mask by its
luminance (Pillow's ``convert("L")``); a mask with transparency (RGBA, LA, or a palette with a transparent
colour) whose alpha is not fully opaque by its alpha, thresholded as A1111 does (alpha above 128 repaints:
paint where you want it redrawn, leave the rest transparent); one fully opaque by its luminance. 16-bit and
float grayscale masks are scaled to 0..255 by their type's range. The console says which reading a
non-grayscale mask got.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdjax_runner.config.modes import MODES
from sdjax_runner.console import error_line
from sdjax_runner.errors import UserError
from sdjax_runner.files import not_a_file

MAX_PIXELS = 64 * 2**20  # 64 megapixels: 8192 x 8192; a 512 x 512 image is 0.26
MAX_FILE_BYTES = 256 * 2**20  # read whole: a sparse file of terabytes costs no disk, but all the memory
# The crop fit's scaled picture, in run images: 4 keeps every ordinary picture (up to 4:1 against the run's
# shape) on the two-step path A1111 takes, and at most 64 MP (the largest run, 4096 x 4096, times 4).
MAX_SCALED = 4
EXTENSIONS = (".png", ".jpg", ".jpeg", ".webp", ".bmp", ".tif", ".tiff")
log = logging.getLogger("sdjax_runner")
MAX_REFERENCES = 8  # reference_images: each adds the image's tokens to every transformer call
ALLOWED = "an image file (PNG, JPEG, WebP, ...), a folder of them, or a list of files paired with the prompts"


@dataclass(frozen=True)
class InputImage:
    key: str  # the config key it came from
    path: str
    sha256: str
    pixels: np.ndarray  # (H, W, C) uint8 as decoded: RGB, or L for a mask

    @property
    def size(self) -> tuple[int, int]:
        return self.pixels.shape[1], self.pixels.shape[0]  # (width, height), as PIL says it


def paired(images: Sequence, prompt_index: int):
    """The image prompt ``prompt_index`` gets: the one image, or its own of a list / folder."""
    return images[prompt_index % len(images)]


def _paths(key: str, value: Any) -> list[Path]:
    """The files ``value`` names: one file, a folder's image files in name order, or a list."""
    if isinstance(value, (list, tuple)):
        if not value:
            raise UserError(key, "is an empty list", ALLOWED)
        return [Path(str(item)).expanduser() for item in value]
    path = Path(str(value)).expanduser()
    if path.is_dir():
        files = sorted(p for p in path.iterdir() if p.suffix.lower() in EXTENSIONS and p.is_file())
        if not files:
            raise UserError(key, f"{path} holds no image files ({', '.join(EXTENSIONS)})", ALLOWED)
        return files
    return [path]


class BadImage(ValueError):
    """An image file refused: ``problem`` (what follows its path in a message) and what is ``allowed``."""

    def __init__(self, problem: str, allowed: str):
        super().__init__(f"{problem} (allowed: {allowed})")
        self.problem, self.allowed = problem, allowed


def image_file_bytes(path: Path) -> bytes:
    """A regular file's bytes, at most :data:`MAX_FILE_BYTES` (:class:`BadImage` otherwise)."""
    size = path.stat().st_size
    if size > MAX_FILE_BYTES:
        raise BadImage(f"has {size / 1e9:.1f} GB", f"an image file of at most {MAX_FILE_BYTES // 2**20} MB")
    return path.read_bytes()


def decoded(data: bytes, max_pixels: int = MAX_PIXELS):
    """``data`` decoded whole (a loaded PIL image), or :class:`BadImage`: more than ``max_pixels`` by its
    header (refused before decoding: a decompression bomb), not an image, truncated or corrupt, or text
    chunks past Pillow's limits."""
    import io
    import warnings

    from PIL import Image, UnidentifiedImageError

    limit = f"an image of at most {max_pixels // 2**20} MP"
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("error", Image.DecompressionBombWarning)
            image = Image.open(io.BytesIO(data))
            width, height = image.size
            if width * height > max_pixels:
                raise BadImage(f"is {width} x {height} pixels ({width * height / 1e6:.0f} MP)", limit)
            image.load()
            return image
    except BadImage:
        raise
    except UnidentifiedImageError:
        raise BadImage("is not an image Pillow can read", ALLOWED) from None
    except (Image.DecompressionBombError, Image.DecompressionBombWarning) as exc:
        raise BadImage(f"is a decompression bomb ({error_line(exc, 120)})", limit) from None
    except Exception as exc:  # truncated or corrupt data, text chunks over Pillow's limits: whatever the decoder raises
        raise BadImage(f"cannot be decoded ({error_line(exc, 120)})", ALLOWED) from None


def read_image(key: str, path: Path, mask: bool = False) -> InputImage:
    """One file, decoded whole and checked; a mask read as A1111 reads it (:func:`mask_pixels`)."""
    missing = not_a_file(path)
    if missing:
        raise UserError(key, f"{missing}: {path}", ALLOWED)
    try:
        data = image_file_bytes(path)
        image = decoded(data)
    except BadImage as bad:
        raise UserError(key, f"{path} {bad.problem}", bad.allowed) from None
    pixels = mask_pixels(key, path, image)[..., None] if mask else np.asarray(image.convert("RGB"))
    return InputImage(key, str(path), hashlib.sha256(data).hexdigest(), np.ascontiguousarray(pixels))


def mask_pixels(key: str, path: Path, image) -> np.ndarray:
    """The mask in ``image`` as (H, W) uint8, white repaints, read as A1111 reads it (module docstring)."""
    if image.mode in ("1", "L"):
        return np.asarray(image.convert("L"))
    if image.mode in ("I;16", "I", "F"):
        return np.asarray(_to_8bit(image))
    mode = image.mode
    if mode in ("RGBA", "LA", "PA", "La", "RGBa") or (mode == "P" and "transparency" in image.info):
        image = image.convert("RGBA")  # its luminance too, should the alpha say nothing
        alpha = image.getchannel("A")
        if alpha.getextrema() != (255, 255):
            log.info("%s: %s has transparency: its alpha is the mask (opaque repaints, transparent keeps)",
                     key, path)
            return np.where(np.asarray(alpha) > 128, 255, 0).astype(np.uint8)
    log.info("%s: %s is %s: its luminance is the mask (white repaints, black keeps)", key, path, mode)
    return np.asarray(image.convert("L"))


def _to_8bit(image):
    """A 16-bit or float single-channel image as 0..255 (scaled by its type's range)."""
    array = np.asarray(image, dtype=np.float64)
    top = 1.0 if image.mode == "F" else 65535.0 if array.max(initial=0) > 255 else 255.0
    from PIL import Image

    return Image.fromarray(np.clip(np.round(array / top * 255), 0, 255).astype(np.uint8), "L")


def read_images(key: str, value: Any, prompts: int, mask: bool = False) -> tuple[InputImage, ...]:
    """The images of ``key``: one for all prompts, or exactly one per prompt."""
    paths = _paths(key, value)
    if len(paths) > 1 and len(paths) != prompts:
        raise UserError(key, f"has {len(paths)} images for {prompts} prompt(s); images are paired with prompts",
                        f"one image for every prompt, or {prompts} image(s) (prompt k gets image k)")
    return tuple(read_image(key, path, mask) for path in paths)


def same_sizes(mask_key: str, masks: tuple[InputImage, ...], images: tuple[InputImage, ...]) -> None:
    """Each mask has its init image's size (paired as the prompts pair them)."""
    count = max(len(masks), len(images))
    for k in range(count):
        m, i = paired(masks, k), paired(images, k)
        if m.size != i.size:
            raise UserError(mask_key, f"{m.path} is {m.size[0]} x {m.size[1]}, its init image {i.path} is "
                            f"{i.size[0]} x {i.size[1]}", "a mask of its init image's size")


def fitted(image: InputImage, height: int, width: int, resize_mode: str) -> np.ndarray:
    """``image`` at height x width by ``resize_mode`` (module docstring), (height, width, C) uint8."""
    from PIL import Image

    pixels = image.pixels
    if pixels.shape[:2] == (height, width):
        return pixels
    mask = pixels.shape[-1] == 1
    picture = Image.fromarray(pixels[..., 0] if mask else pixels)
    resample = Image.Resampling.NEAREST if mask else Image.Resampling.LANCZOS
    if resize_mode == "crop":
        picture = covered_and_cropped(picture, height, width, resample)
    else:
        picture = picture.resize((width, height), resample=resample)
    out = np.asarray(picture)
    return out[..., None] if mask else out


def covered_and_cropped(picture, height: int, width: int, resample):
    """``picture`` scaled to cover height x width, its centre cut out (A1111's "Crop and resize"). The
    scaled picture is at most :data:`MAX_SCALED` times the run's image: a longer, thinner one (1 x 200000
    pixels would scale to 64 x 12,800,000) has the same centre cut out of it first, then resized."""
    scale = max(width / picture.width, height / picture.height)
    w, h = max(width, round(picture.width * scale)), max(height, round(picture.height * scale))
    left, top = (w - width) // 2, (h - height) // 2
    if w * h <= MAX_SCALED * width * height:
        return picture.resize((w, h), resample=resample).crop((left, top, left + width, top + height))
    across, down = picture.width / w, picture.height / h  # source pixels per scaled pixel
    box = (left * across, top * down, (left + width) * across, (top + height) * down)
    return picture.resize((width, height), resample=resample, box=box)


@dataclass(frozen=True)
class ModeInputs:
    """The mode's images as read (fitted to the size once the model is loaded: :func:`arrays`)."""

    init: tuple[InputImage, ...] = ()
    mask: tuple[InputImage, ...] = ()
    control: tuple[InputImage, ...] = ()
    references: tuple[InputImage, ...] = ()  # reference_images: every one read by every prompt, in order

    def all(self) -> list[InputImage]:
        return [*self.init, *self.mask, *self.control, *self.references]

    def arrays(self, prompts: int, height: int, width: int, resize_mode: str) -> dict[str, np.ndarray]:
        """Per prompt, fitted: ``init`` (P, 3, H, W) in [-1, 1] (the VAE's input), ``mask`` (P, 1, H, W)
        of 0 (keep) and 1 (repaint), ``control`` (P, 3, H, W) in [0, 1] (the ControlNet's input); ``references``
        (P, R, 3, H, W) in [-1, 1], every prompt's row the same R images."""
        out = {}
        for name, images in (("init", self.init), ("mask", self.mask), ("control", self.control),
                             ("references", self.references)):
            if not images:
                continue
            each = [fitted(image, height, width, resize_mode) for image in images]  # once per distinct image
            if name == "references":  # every prompt reads all of them
                rows = np.broadcast_to(np.stack(each), (prompts, len(each), *each[0].shape))
            else:
                rows = np.stack([paired(each, k) for k in range(prompts)])
            rows = np.moveaxis(rows.astype(np.float32), -1, -3) / 255.0  # channels first
            if name in ("init", "references"):  # the VAE's input
                rows = 2.0 * rows - 1.0
            elif name == "mask":
                rows = (rows >= 0.5).astype(np.float32)
            out[name] = rows
        return out


def read_mode_inputs(mode: str, init: Any, mask: Any, control: Any, prompts: int,
                     references: Any = None) -> ModeInputs:
    """Every image ``mode`` reads (its entry in config/modes.py), checked (config/modes.py ``check`` made sure
    the keys it needs are set); a mask has its init image's size. ``references`` (reference_images), where the mode
    reads them: every one for every prompt, at most :data:`MAX_REFERENCES`."""
    values = {"init_image": init, "mask_image": mask, "controlnet.image": control}
    read = {name: read_images(key, values[key], prompts, mask=name == "mask") for name, key in MODES[mode].images}
    if "mask" in read:
        same_sizes("mask_image", read["mask"], read["init"])
    if references not in (None, "", []) and MODES[mode].optional_images:
        paths = _paths("reference_images", references)
        if len(paths) > MAX_REFERENCES:
            raise UserError("reference_images", f"has {len(paths)} images", f"at most {MAX_REFERENCES}")
        read["references"] = tuple(read_image("reference_images", path, False) for path in paths)
    return ModeInputs(**read)
