"""The perturbing guiders' choice of layers (``guider=pag``, ``guider=seg``, ``guider.layers``; engine/guiders.py),
shared by every denoiser that runs them (the SD family's UNet, SD 3's transformer): which self-attention modules a
batch's perturbed chunk runs perturbed, picked as diffusers' PAG pipelines pick them -- regular expressions searched
in the modules' PyTorch names (``mid_block.attentions.0.transformer_blocks.0.attn1``, ``transformer_blocks.1.attn``).
How a module runs perturbed is the model's own for PAG (the UNet: the identity; SD 3: image tokens that see only
themselves among the image tokens); for smoothed-energy guidance (SEG) the perturbed chunk's queries are blurred
(:func:`blurred_queries`)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Any, NamedTuple

import numpy as np

# SEG's sigma above which the blur is infinite: each query the mean of its image's (SEG-SDXL's inf_blur_threshold)
INFINITE_BLUR = 9999.0


class Perturbed(NamedTuple):
    """A denoiser call's perturbation: in the self-attention modules whose PyTorch names (:func:`torch_name`)
    ``layers`` match (:func:`perturbs`), the last of the batch's ``chunks`` equal parts runs perturbed (3 chunks:
    unconditional, conditional, perturbed -- diffusers' ``PAGCFG...`` processors; 2: conditional, perturbed):
    with ``blur_sigma`` None as PAG perturbs, else (SEG's sigma, traced) with its queries blurred."""

    layers: tuple[str, ...]
    chunks: int
    blur_sigma: Any = None


def torch_name(path: Sequence[str]) -> str:
    """A module's name in diffusers' PyTorch model from its path here: ``down_blocks_1/attentions_0/attn1`` ->
    ``down_blocks.1.attentions.0.attn1``."""
    return ".".join(re.sub(r"_(\d+)$", r".\1", part) for part in path)


def perturbs(layers: Sequence[str], name: str) -> bool:
    """Whether one of ``layers`` picks the self-attention module ``name``, by diffusers' rule (PAGMixin's
    ``_set_pag_attn_processor``): the pattern found in the name (``re.search``), unless the pattern and the name end
    in the same number (its ``is_fake_integral_match``; self-attention names end in ``attn1``, ``attn``, ``attn2``)."""

    def fake_integral_match(layer: str) -> bool:
        last, name_last = layer.split(".")[-1], name.split(".")[-1]
        return last.isnumeric() and name_last.isnumeric() and last == name_last

    return any(re.search(layer, name) is not None and not fake_integral_match(layer) for layer in layers)


def check_layers(layers: Sequence[str], names: Sequence[str], model: str, shown: Sequence[str], example: str) -> None:
    """Each of ``layers`` picks at least one of the model's self-attention modules ``names`` (diffusers raises
    "Cannot find PAG layer" otherwise); else a UserError naming ``shown`` (what the model has, shortly) and an
    ``example`` of a full name."""
    from sdjax_runner.errors import UserError

    for layer in layers:
        if not any(perturbs((layer,), name) for name in names):
            raise UserError("guider.layers", f"{layer[:60]!r} picks none of {model}'s self-attention layers",
                            f"patterns of their names: {', '.join(shown)} ({example}, ...)")


def blur_matrix(side: int, sigma) -> Any:
    """The (side, side) matrix that blurs one spatial axis as smoothed-energy guidance's published code does
    (SEG-SDXL's ``gaussian_blur_2d``, in its ``SEGCFGSelfAttnProcessor``): a Gaussian of ``sigma`` (traced) over an
    odd ``ceil(6 sigma) + 1 - ceil(6 sigma) % 2`` taps, at most ``side`` (``side + 1`` for an even side), normalized, on
    the axis reflect-padded by half the taps; above :data:`INFINITE_BLUR` the mean of the axis. The taps are those of
    the largest kernel, those beyond sigma's weighing 0 (the same sums: the padding's values do not hang on its
    width), so sigma is a traced input. A 2-D blur is this matrix on each axis (the published kernel is the outer
    product of the 1-D one)."""
    import jax.numpy as jnp

    most = side - (side % 2 - 1)
    offsets = np.arange(most) - (most - 1) // 2
    source = np.arange(side)[None, :] + offsets[:, None]  # (taps, side): where each tap reads for each output
    source = np.where(source < 0, -source, np.where(source >= side, 2 * (side - 1) - source, source))
    taps = np.zeros((most, side, side), np.float32)  # taps[j, i, source[j, i]] = 1
    taps[np.arange(most)[:, None], np.arange(side)[None, :], source] = 1.0
    sigma = jnp.asarray(sigma, jnp.float32)
    width = jnp.ceil(6 * sigma)
    size = jnp.minimum(width + 1 - jnp.mod(width, 2), most)
    weights = jnp.where(jnp.abs(offsets) <= (size - 1) / 2, jnp.exp(-0.5 * (offsets / sigma) ** 2), 0.0)
    gaussian = jnp.tensordot(weights / jnp.sum(weights), taps, axes=1)
    return jnp.where(sigma > INFINITE_BLUR, jnp.full((side, side), 1.0 / side, jnp.float32), gaussian)


def blurred_queries(queries, height: int, width: int, sigma):
    """SEG's perturbation: the queries ``(batch, height * width, channels)`` of a ``height`` x ``width`` grid of image
    tokens, each channel blurred over the grid by :func:`blur_matrix` (in float32), in their dtype. (The published
    code takes the grid to be square; here each axis has its own.)"""
    import jax.numpy as jnp

    grid = queries.reshape(queries.shape[0], height, width, queries.shape[-1]).astype(jnp.float32)
    out = jnp.einsum("hi,bijc,wj->bhwc", blur_matrix(height, sigma), grid, blur_matrix(width, sigma))
    return out.reshape(queries.shape).astype(queries.dtype)
