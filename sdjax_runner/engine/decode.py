"""Last stage, decode: latents -> pixels in [0, 1], (batch, height, width, 3), with the model's VAE."""

from __future__ import annotations

from typing import Any


def decode(pipeline: Any, params: dict, latents):
    latents = 1 / pipeline.vae.config.scaling_factor * latents
    image = pipeline.vae.apply({"params": params["vae"]}, latents, method=pipeline.vae.decode).sample
    return (image / 2 + 0.5).clip(0, 1).transpose(0, 2, 3, 1)
