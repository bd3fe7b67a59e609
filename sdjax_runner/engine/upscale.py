"""Hires. fix's upscalers (``sampling.hires.upscaler``), inside the program: a resize is one (out, in) weight matrix
per axis, made on the host from the published algorithms and applied to the latents or pixels as two matrix
products.

- The latent upscalers are A1111's "Latent" variants, which call ``torch.nn.functional.interpolate`` on the
  latents with ``size=`` (so the scale is in / out) and ``align_corners=False``; the matrices follow PyTorch's
  kernels (aten/src/ATen/native/UpSample.h, cpu/UpSampleKernel.cpp): bilinear and bicubic (a = -0.75, indices
  clamped at the edges) on half-pixel centres, "nearest" as ``floor(out * scale)`` and "nearest-exact" as
  ``floor((out + 0.5) * scale)`` in float32, and the antialiased variants as its separable filters (triangle;
  cubic with a = -0.5), normalised over the taps inside the image.
- ``lanczos`` is A1111's Lanczos upscaler: the decoded image as 8-bit pixels (A1111's ``astype(np.uint8)``),
  resized as Pillow's ``Image.resize(..., LANCZOS)`` does it (libImaging/Resample.c): its coefficients in fixed
  point (22 bits), the horizontal pass first, each pass rounded to 8 bits -- integer arithmetic, so the pixels are
  Pillow's exactly.

``tests/test_hires.py`` checks them against PyTorch's own outputs (a fixture made by
``tests/helpers/make_hires_reference.py``) and Pillow's."""

from __future__ import annotations

import functools
from collections.abc import Callable

import numpy as np

from sdjax_runner.config.hires import A1111_UPSCALERS

PRECISION_BITS = 32 - 8 - 2  # Pillow's fixed point for 8-bit images (Resample.c)


def _torch_source(out_size: int, in_size: int, cubic: bool) -> np.ndarray:
    """PyTorch's area_pixel_compute_source_index with align_corners=False, in float32: ``scale * (dst + 0.5) -
    0.5``, clamped at 0 for the linear modes."""
    scale = np.float32(in_size) / np.float32(out_size)
    source = scale * (np.arange(out_size, dtype=np.float32) + np.float32(0.5)) - np.float32(0.5)
    return source if cubic else np.maximum(source, np.float32(0))


def bilinear(in_size: int, out_size: int) -> np.ndarray:
    """torch's ``interpolate(mode="bilinear", align_corners=False)`` along one axis."""
    source = _torch_source(out_size, in_size, cubic=False)
    low = source.astype(np.int64)
    high = np.where(low < in_size - 1, low + 1, low)
    frac = source - low
    weights = np.zeros((out_size, in_size), np.float32)
    np.add.at(weights, (np.arange(out_size), low), 1 - frac)
    np.add.at(weights, (np.arange(out_size), high), frac)
    return weights


def _cubic_coefficients(t: np.ndarray, a: float) -> np.ndarray:
    """PyTorch's get_cubic_upsample_coefficients: the four taps' weights at offset ``t`` in [0, 1)."""

    def near(x):  # cubic_convolution1: |x| <= 1
        return ((a + 2) * x - (a + 3)) * x * x + 1

    def far(x):  # cubic_convolution2: 1 < |x| < 2
        return ((a * x - 5 * a) * x + 8 * a) * x - 4 * a

    return np.stack([far(t + 1), near(t), near(1 - t), far(2 - t)], axis=-1)


def bicubic(in_size: int, out_size: int) -> np.ndarray:
    """torch's ``interpolate(mode="bicubic", align_corners=False)`` along one axis: a = -0.75, the taps'
    indices clamped to the image."""
    source = _torch_source(out_size, in_size, cubic=True)
    floor = np.floor(source)
    coefficients = _cubic_coefficients((source - floor).astype(np.float32), -0.75)
    weights = np.zeros((out_size, in_size), np.float32)
    for tap in range(4):
        index = np.clip(floor.astype(np.int64) - 1 + tap, 0, in_size - 1)
        np.add.at(weights, (np.arange(out_size), index), coefficients[:, tap])
    return weights


def nearest(in_size: int, out_size: int, exact: bool = False) -> np.ndarray:
    """torch's ``mode="nearest"`` (``floor(out * in / out_size)``) or ``"nearest-exact"`` (``floor((out + 0.5) *
    in / out_size)``), in float32 as its kernels compute it."""
    scale = np.float32(in_size) / np.float32(out_size)
    positions = np.arange(out_size, dtype=np.float32) + (np.float32(0.5) if exact else np.float32(0))
    if not exact and out_size == 2 * in_size:  # torch's nearest_idx special-cases a factor of 2 (out >> 1)
        index = np.arange(out_size) >> 1
    else:
        index = np.minimum(np.floor(positions * scale).astype(np.int64), in_size - 1)
    weights = np.zeros((out_size, in_size), np.float32)
    weights[np.arange(out_size), index] = 1
    return weights


def separable(in_size: int, out_size: int, kernel: Callable[[np.ndarray], np.ndarray], support: float) -> np.ndarray:
    """The antialiased separable filter of Pillow's precompute_coeffs (and PyTorch's antialiased interpolate, its
    port) along one axis, float64: the kernel widened by the downscale factor, each row normalised over the taps
    inside the image."""
    scale = in_size / out_size
    filter_scale = max(scale, 1.0)
    support *= filter_scale
    weights = np.zeros((out_size, in_size), np.float64)
    for out in range(out_size):
        center = (out + 0.5) * scale
        low = max(int(center - support + 0.5), 0)
        high = min(int(center + support + 0.5), in_size)
        taps = kernel((np.arange(low, high) - center + 0.5) / filter_scale)
        total = taps.sum()
        weights[out, low:high] = taps / total if total != 0 else taps
    return weights


def triangle(x: np.ndarray) -> np.ndarray:
    x = np.abs(x)
    return np.where(x < 1, 1 - x, 0.0)


def cubic_half(x: np.ndarray) -> np.ndarray:
    """The cubic of a = -0.5 (Pillow's BICUBIC, PyTorch's antialiased bicubic)."""
    a, x = -0.5, np.abs(x)
    return np.where(x < 1, ((a + 2) * x - (a + 3)) * x * x + 1,
                    np.where(x < 2, ((x - 5) * x + 8) * x * a - 4 * a, 0.0))


def lanczos3(x: np.ndarray) -> np.ndarray:
    """Pillow's lanczos filter: sinc(x) sinc(x / 3) on [-3, 3)."""
    return np.where((x >= -3) & (x < 3), np.sinc(x) * np.sinc(x / 3), 0.0)


@functools.cache
def latent_weights(upscaler: str, in_size: int, out_size: int) -> np.ndarray:
    """The (out, in) float32 matrix of latent upscaler ``upscaler`` along one axis."""
    if upscaler == "latent":
        return bilinear(in_size, out_size)
    if upscaler == "latent_bicubic":
        return bicubic(in_size, out_size)
    if upscaler in ("latent_nearest", "latent_nearest_exact"):
        return nearest(in_size, out_size, exact=upscaler == "latent_nearest_exact")
    if upscaler == "latent_antialiased":
        return separable(in_size, out_size, triangle, 1.0).astype(np.float32)
    if upscaler == "latent_bicubic_antialiased":
        return separable(in_size, out_size, cubic_half, 2.0).astype(np.float32)
    raise ValueError(f"no latent upscaler {upscaler!r}")


@functools.cache
def pillow_lanczos_weights(in_size: int, out_size: int) -> np.ndarray:
    """Pillow's fixed-point LANCZOS coefficients (normalize_coeffs_8bpc) along one axis, as int32."""
    weights = separable(in_size, out_size, lanczos3, 3.0) * (1 << PRECISION_BITS)
    return np.where(weights < 0, np.trunc(weights - 0.5), np.trunc(weights + 0.5)).astype(np.int32)


def upscale_latents(latents, height: int, width: int, upscaler: str):
    """(batch, channels, h, w) latents -> (batch, channels, height, width), as A1111's latent upscaler
    ``upscaler`` makes them."""
    import jax.numpy as jnp

    rows = jnp.asarray(latent_weights(upscaler, latents.shape[2], height))
    columns = jnp.asarray(latent_weights(upscaler, latents.shape[3], width))
    return jnp.einsum("oh,bchw,pw->bcop", rows, latents.astype(jnp.float32), columns,
                      precision="highest")


def _pillow_pass(pixels, weights, axis: int):
    """One of Pillow's 8-bit passes along ``axis`` of (batch, H, W, 3) int32 pixels: the fixed-point sum,
    rounded half up, clipped to 0..255."""
    import jax.numpy as jnp

    summed = jnp.tensordot(pixels, jnp.asarray(weights), axes=([axis], [1]))  # the new axis comes last
    summed = jnp.moveaxis(summed, -1, axis)
    return jnp.clip((summed + (1 << (PRECISION_BITS - 1))) >> PRECISION_BITS, 0, 255)


def upscale_pixels(pixels, height: int, width: int):
    """(batch, h, w, 3) pixels in [0, 1] (a decoded image) -> (batch, height, width, 3) in [0, 1]: A1111's 8-bit
    image (``(255 * x).astype(uint8)``) resized as Pillow's LANCZOS does, read back as ``x / 255``."""
    import jax.numpy as jnp

    levels = jnp.floor(jnp.clip(pixels.astype(jnp.float32), 0, 1) * 255).astype(jnp.int32)
    if levels.shape[2] != width:  # Pillow: horizontal first, where the width changes
        levels = _pillow_pass(levels, pillow_lanczos_weights(levels.shape[2], width), axis=2)
    if levels.shape[1] != height:
        levels = _pillow_pass(levels, pillow_lanczos_weights(levels.shape[1], height), axis=1)
    return levels.astype(jnp.float32) / 255


LATENT = tuple(name for name in A1111_UPSCALERS if name.startswith("latent"))
PIXEL = ("lanczos",)
if set(LATENT + PIXEL) != set(A1111_UPSCALERS):
    raise RuntimeError(f"engine/upscale runs {LATENT + PIXEL}, config/hires.py names {tuple(A1111_UPSCALERS)}")
