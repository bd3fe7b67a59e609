"""ControlNet: text to image, steered at every UNet call by a ControlNet that reads the control image (a
canny edge map, a depth map, ...) and adds its residuals, times the conditioning scale, to the UNet's skip
connections -- diffusers 0.39's ``FlaxStableDiffusionControlNetPipeline._generate``. The ControlNet is
loaded beside the model (models/controlnet.py) and its weights are ``params["controlnet"]``."""

from __future__ import annotations

from typing import Any

from sdjax_runner.engine.modes.start import Start
from sdjax_runner.engine.modes.txt2img import noise


def prepare(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    import jax.numpy as jnp

    control = jnp.concatenate([inputs["control"]] * 2)  # both halves of classifier-free guidance see it
    return Start(noise(pipeline, key, spec, batch), conditioning={"control": (control, inputs["control_scale"])})
