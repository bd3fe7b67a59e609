"""Last stage, decode: latents -> pixels in [0, 1], (batch, height, width, 3), with the model's VAE."""

from __future__ import annotations

from typing import Any


def decode(pipeline: Any, params: dict, latents):
    """diffusers' Flax pipelines' decode, the latents handed over channels-last: diffusers' ``FlaxAutoencoderKL.decode``
    takes channels-first latents whose last axis is not the latent channels, so a latent width equal to them (a
    32-pixel-wide SD image: 4 and 4) was read as channels-last -- the image decoded wrongly, in diffusers' own Flax
    pipelines too (``tests/test_refiner.py`` checks a 32 x 32 SDXL image against diffusers' PyTorch pipeline)."""
    latents = 1 / pipeline.vae.config.scaling_factor * latents
    image = pipeline.vae.apply({"params": params["vae"]}, latents.transpose(0, 2, 3, 1), method=pipeline.vae.decode).sample
    return (image / 2 + 0.5).clip(0, 1).transpose(0, 2, 3, 1)
