"""SD 1.x's safety checker: diffusers' ``StableDiffusionSafetyChecker`` (its Flax twin, 0.39), the runner's own.

A CLIP vision tower (:class:`~sdjax_runner.models.nn.clip.CLIPVisionModel`) and its projection embed each image;
the image is flagged when its cosine similarity to any of 17 concept embeddings, less that concept's threshold
and rounded to 3 decimals, is above 0 -- with every threshold 0.01 lower for an image near any of 3 "special care"
concepts (the same rule, rounding included). Parameter names are diffusers' Flax module's (``vision_model/
vision_model/...``, ``visual_projection``, ``concept_embeds``, ``special_care_embeds`` and their ``_weights``),
so the published folder's PyTorch weights convert with transformers' naming. Norms are kept at least 1e-12
(diffusers 0.39's own called ``jnp.clip(a_min=...)``, a keyword JAX removed in 0.10).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, ClassVar

import jax
import jax.numpy as jnp

from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.clip import CLIPVisionModel, FrozenConfig, clip_tower_configs
from sdjax_runner.models.nn.config import Config

CONCEPTS, SPECIAL_CARE = 17, 3


def cosine_similarity(a: jax.Array, b: jax.Array, eps: float = 1e-12) -> jax.Array:
    """Row-wise cosine similarity matrix of ``a`` (n, d) and ``b`` (m, d); norms kept at least ``eps``."""
    a = a / jnp.maximum(jnp.linalg.norm(a, axis=1), eps)[:, None]
    b = b / jnp.maximum(jnp.linalg.norm(b, axis=1), eps)[:, None]
    return a @ b.T


class SafetyChecker(layers.Module):
    """``__call__(pixel_values)`` (N, 3, H, W, the feature extractor's output) -> (N,) booleans: flagged.
    Build it with :meth:`from_config` from the folder's config.json (a CLIPConfig naming
    ``StableDiffusionSafetyChecker``)."""

    vision_config: FrozenConfig
    projection_dim: int = 768
    dtype: Any = jnp.float32

    ARCHITECTURE: ClassVar[str] = "StableDiffusionSafetyChecker"

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> SafetyChecker:
        """The module for a safety checker's config.json (ValueError for another architecture)."""
        architectures = config.get("architectures") or [cls.ARCHITECTURE]
        if list(architectures) != [cls.ARCHITECTURE]:
            raise ValueError(f"safety checker config has architectures {architectures}, not {cls.ARCHITECTURE}")
        vision = CLIPVisionModel.from_config(clip_tower_configs(config)[1]).config
        return cls(FrozenConfig(vision), int(config.get("projection_dim", 512)), **kwargs)

    @property
    def config(self) -> Config:
        return Config(vision_config=dict(self.vision_config), projection_dim=self.projection_dim)

    def setup(self) -> None:
        self.vision_model = CLIPVisionModel(**self.vision_config, dtype=self.dtype)
        self.visual_projection = layers.Dense(self.projection_dim, use_bias=False, dtype=self.dtype)
        ones = jax.nn.initializers.ones
        self.concept_embeds = self.param("concept_embeds", ones, (CONCEPTS, self.projection_dim))
        self.special_care_embeds = self.param("special_care_embeds", ones, (SPECIAL_CARE, self.projection_dim))
        self.concept_embeds_weights = self.param("concept_embeds_weights", ones, (CONCEPTS,))
        self.special_care_embeds_weights = self.param("special_care_embeds_weights", ones, (SPECIAL_CARE,))

    def embed(self, pixel_values: jax.Array) -> jax.Array:
        """The images' projected CLIP embeddings, (N, projection_dim)."""
        return self.visual_projection(self.vision_model(pixel_values).pooler_output)

    def __call__(self, pixel_values: jax.Array) -> jax.Array:
        image_embeds = self.embed(pixel_values)
        special_scores = jnp.round(cosine_similarity(image_embeds, self.special_care_embeds)
                                   - self.special_care_embeds_weights[None, :], 3)
        special_adjustment = jnp.any(special_scores > 0, axis=1, keepdims=True) * 0.01
        concept_scores = jnp.round(cosine_similarity(image_embeds, self.concept_embeds)
                                   - self.concept_embeds_weights[None, :] + special_adjustment, 3)
        return jnp.any(concept_scores > 0, axis=1)

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (without the ``params`` key); cheap under ``jax.eval_shape``."""
        side = self.vision_config["image_size"]
        return self.init(rng, jnp.zeros((1, 3, side, side), jnp.float32))["params"]
