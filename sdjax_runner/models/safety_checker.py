"""The SD 1.x safety checker, runnable on current JAX.

diffusers 0.39's ``FlaxStableDiffusionSafetyChecker`` (its last Flax release: upstream is frozen)
normalises embeddings with ``jnp.clip(..., a_min=eps)``, a keyword JAX removed in 0.10, so every
run with ``model.safety_checker=true`` -- the guide's own pipeline -- failed in the checker. This
module is the same computation (same parameters, same thresholds, same rounding) with
``jnp.maximum``; the loader uses it wherever a model index names ``StableDiffusionSafetyChecker``.
"""

from __future__ import annotations

import jax.numpy as jnp
from diffusers.pipelines.stable_diffusion.safety_checker_flax import (
    FlaxStableDiffusionSafetyChecker,
    FlaxStableDiffusionSafetyCheckerModule,
)


def cosine_similarity(a, b, eps: float = 1e-12):
    """Row-wise cosine similarity matrix of ``a`` (n, d) and ``b`` (m, d); norms kept at least ``eps``."""
    a = a / jnp.maximum(jnp.linalg.norm(a, axis=1), eps)[:, None]
    b = b / jnp.maximum(jnp.linalg.norm(b, axis=1), eps)[:, None]
    return a @ b.T


class SafetyCheckerModule(FlaxStableDiffusionSafetyCheckerModule):
    def __call__(self, clip_input):
        image_embeds = self.visual_projection(self.vision_model(clip_input)[1])
        # An image near any "special care" concept is judged with a 0.01 lower threshold (diffusers' rule).
        special_scores = jnp.round(cosine_similarity(image_embeds, self.special_care_embeds)
                                   - self.special_care_embeds_weights[None, :], 3)
        special_adjustment = jnp.any(special_scores > 0, axis=1, keepdims=True) * 0.01
        concept_scores = jnp.round(cosine_similarity(image_embeds, self.concept_embeds)
                                   - self.concept_embeds_weights[None, :] + special_adjustment, 3)
        return jnp.any(concept_scores > 0, axis=1)


class SafetyChecker(FlaxStableDiffusionSafetyChecker):
    module_class = SafetyCheckerModule


# diffusers' class -> the project's, for the loader (models/loading.py).
REPLACEMENTS = {FlaxStableDiffusionSafetyChecker: SafetyChecker}
