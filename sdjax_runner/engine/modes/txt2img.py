"""Text to image: the latents start as standard normal noise drawn from the device's key."""

from __future__ import annotations

from typing import Any

from sdjax_runner.engine.modes.start import Start


def noise(pipeline: Any, key, spec: Any, batch: int, channels: int = 0):
    """The device's initial noise, (batch, channels, height / 8, width / 8) float32 (``channels``: the
    latent channels; 0 for the UNet's input channels, as diffusers' text-to-image pipelines draw)."""
    import jax
    import jax.numpy as jnp

    shape = (batch, channels or pipeline.unet.config.in_channels, spec.height // pipeline.vae_scale_factor,
             spec.width // pipeline.vae_scale_factor)
    return jax.random.normal(key, shape=shape, dtype=jnp.float32)


def prepare(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    return Start(noise(pipeline, key, spec, batch))
