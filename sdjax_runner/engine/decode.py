"""Last stage, decode: latents -> pixels in [0, 1], (batch, height, width, 3), with the model's VAE."""

from __future__ import annotations

from typing import Any


def decode(pipeline: Any, params: dict, latents):
    """diffusers' Flax pipelines' decode. The VAE (models/nn/vae.py) takes channels-first latents always: diffusers'
    own guessed the layout from the last axis, so a latent width equal to the latent channels (a 32-pixel-wide SD
    image: 4 and 4) was decoded wrongly in its Flax pipelines (``tests/test_refiner.py`` checks a 32 x 32 SDXL image
    against diffusers' PyTorch pipeline)."""
    latents = 1 / pipeline.vae.config.scaling_factor * latents
    image = pipeline.vae.apply({"params": params["vae"]}, latents, method=pipeline.vae.decode)
    return (image / 2 + 0.5).clip(0, 1).transpose(0, 2, 3, 1)
