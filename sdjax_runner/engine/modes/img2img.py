"""Image to image: the init image's latents, noised to the level of the start step (from ``strength``), are
where the sampler starts -- diffusers 0.39's ``FlaxStableDiffusionImg2ImgPipeline._generate``: the noise
drawn from the device's key, the VAE's latent distribution sampled with that same key, times the VAE's
scaling factor."""

from __future__ import annotations

from typing import Any

from sdjax_runner.engine.modes.start import Start
from sdjax_runner.engine.modes.txt2img import noise


def encode_image(pipeline: Any, params: dict, image, key):
    """(batch, 3, H, W) pixels in [-1, 1] -> latents (batch, 4, H / 8, W / 8), a sample of the VAE's
    posterior drawn with ``key``, scaled by the VAE's scaling factor."""
    import jax.numpy as jnp

    posterior = pipeline.vae.apply({"params": params["vae"]}, image, method=pipeline.vae.encode)
    latents = posterior.sample(key).transpose((0, 3, 1, 2))
    return (pipeline.vae.config.scaling_factor * latents).astype(jnp.float32)


def prepare(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    return Start(noise(pipeline, key, spec, batch), image=encode_image(pipeline, params, inputs["init"], key),
                 step=inputs["start"])
