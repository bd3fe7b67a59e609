"""diffusers' guiders (src/diffusers/guiders/, as of diffusers 0.39-0.42) transcribed in NumPy, line for line, as the
reference the runner's guiders (sdjax_runner/engine/guiders.py) are checked against. ``torch.Tensor.flatten(1)``,
``.sum(dim, keepdim=True)``, ``.norm(p=2)``, ``F.normalize`` (x / max(|x|, 1e-12)) and ``.double()`` as NumPy
spells them; everything else as written there."""

from __future__ import annotations

import math

import numpy as np


def classifier_free_guidance(pred_cond, pred_uncond, guidance_scale):
    """ClassifierFreeGuidance.forward (use_original_formulation False)."""
    shift = pred_cond - pred_uncond
    return pred_uncond + guidance_scale * shift


def cfg_zero_star_scale(cond, uncond, eps=1e-8):
    cond = cond.astype(np.float32)
    uncond = uncond.astype(np.float32)
    dot_product = np.sum(cond * uncond, axis=1, keepdims=True)
    squared_norm = np.sum(uncond**2, axis=1, keepdims=True) + eps
    return dot_product / squared_norm


def classifier_free_zero_star_guidance(pred_cond, pred_uncond, guidance_scale, step, zero_init_steps=1):
    """ClassifierFreeZeroStarGuidance.forward (use_original_formulation False, guidance_rescale 0)."""
    if step < zero_init_steps:
        return np.zeros_like(pred_cond)
    if math.isclose(guidance_scale, 1.0):
        return pred_cond
    shift = pred_cond - pred_uncond
    pred_cond_flat = pred_cond.reshape(pred_cond.shape[0], -1)
    pred_uncond_flat = pred_uncond.reshape(pred_uncond.shape[0], -1)
    alpha = cfg_zero_star_scale(pred_cond_flat, pred_uncond_flat)
    alpha = alpha.reshape(-1, *(1,) * (len(pred_cond.shape) - 1))
    pred_uncond = pred_uncond * alpha
    return pred_uncond + guidance_scale * shift


def normalized_guidance(pred_cond, pred_uncond, guidance_scale, eta=1.0, norm_threshold=0.0):
    """adaptive_projected_guidance.normalized_guidance without a momentum buffer (use_original_formulation False)."""
    diff = pred_cond - pred_uncond
    dim = tuple(-i for i in range(1, len(diff.shape)))
    if norm_threshold > 0:
        ones = np.ones_like(diff)
        diff_norm = np.sqrt(np.sum(diff**2, axis=dim, keepdims=True))
        scale_factor = np.minimum(ones, norm_threshold / diff_norm)
        diff = diff * scale_factor
    v0, v1 = diff.astype(np.float64), pred_cond.astype(np.float64)
    v1 = v1 / np.maximum(np.sqrt(np.sum(v1**2, axis=dim, keepdims=True)), 1e-12)
    v0_parallel = np.sum(v0 * v1, axis=dim, keepdims=True) * v1
    v0_orthogonal = v0 - v0_parallel
    diff_parallel, diff_orthogonal = v0_parallel.astype(diff.dtype), v0_orthogonal.astype(diff.dtype)
    normalized_update = diff_orthogonal + eta * diff_parallel
    return pred_uncond + guidance_scale * normalized_update
