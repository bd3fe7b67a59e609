"""Text to image: the latents start as standard normal noise drawn from the device's key."""

from __future__ import annotations

from typing import Any


def initial_latents(pipeline: Any, params: dict, key, spec: Any, batch: int):
    import jax
    import jax.numpy as jnp

    shape = (batch, pipeline.unet.config.in_channels, spec.height // pipeline.vae_scale_factor,
             spec.width // pipeline.vae_scale_factor)
    return jax.random.normal(key, shape=shape, dtype=jnp.float32)
