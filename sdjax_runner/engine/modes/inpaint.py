"""Inpainting: repaint the mask's white area of the init image, keep the rest.

An inpainting model (a UNet with 9 input channels, as runwayml/stable-diffusion-inpainting's) reads, after
the 4 latent channels, the mask at latent size (nearest neighbour) and the latents of the init image with
the repainted area blacked out -- diffusers 0.39's ``FlaxStableDiffusionInpaintPipeline._generate``: the
noise drawn from the device's key, the masked image's VAE sample drawn with the second half of
``jax.random.split(key)``. An ordinary model (4 channels) repaints by blending: at every step the kept area
is set back to the init image at the current noise level (engine/samplers do that with ``Start.keep``).

``strength`` < 1 starts part-way down the schedule from the init image noised to that level (as diffusers'
PyTorch inpaint pipeline does); at 1, the default, from pure noise."""

from __future__ import annotations

from typing import Any

from sdjax_runner.engine.modes.img2img import encode_image
from sdjax_runner.engine.modes.start import Start
from sdjax_runner.engine.modes.txt2img import noise


def is_inpainting_model(pipeline: Any) -> bool:
    return pipeline.unet.config.in_channels == 9


def prepare(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    import jax
    import jax.numpy as jnp

    image, mask = inputs["init"], inputs["mask"]  # mask: 1 repaints, 0 keeps
    latent_channels = pipeline.vae.config.latent_channels
    drawn = noise(pipeline, key, spec, batch, latent_channels)
    latents = encode_image(pipeline, params, image, key)
    small = jax.image.resize(mask, (*mask.shape[:-2], *latents.shape[-2:]), method="nearest")
    if not is_inpainting_model(pipeline):
        return Start(drawn, image=latents, step=inputs["start"], keep=1.0 - small, pure_at_zero=True)
    _, mask_key = jax.random.split(key)
    masked = encode_image(pipeline, params, image * (mask < 0.5), mask_key)
    concat = jnp.concatenate([small, masked], axis=1)
    return Start(drawn, image=latents, step=inputs["start"], pure_at_zero=True,
                 conditioning={"concat": jnp.concatenate([concat] * 2)})
