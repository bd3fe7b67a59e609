"""ControlNet: text to image, steered at every UNet call by a ControlNet that reads the control image (a
canny edge map, a depth map, ...) and adds its residuals, times the conditioning scale, to the UNet's skip
connections -- diffusers 0.39's ``FlaxStableDiffusionControlNetPipeline._generate``. The ControlNet is
loaded beside the model (models/controlnet.py) and its weights are ``params["controlnet"]``. Where
``controlnet.guidance_start``/``guidance_end`` leave it part of the steps, the scale is 0 on the others
(:func:`scale_at`, every family's: diffusers' ``control_guidance_start``/``end``)."""

from __future__ import annotations

from typing import Any

from sdjax_runner.config.modes import outside_control_window
from sdjax_runner.engine.modes.start import Start
from sdjax_runner.engine.modes.txt2img import noise


def prepare(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    import jax.numpy as jnp

    control = jnp.concatenate([inputs["control"]] * 2)  # both halves of classifier-free guidance see it
    return Start(noise(pipeline, key, spec, batch),
                 conditioning={"control": (control, inputs["control_scale"], window(inputs))})


def window(inputs: dict) -> tuple[Any, Any]:
    """The traced (controlnet.guidance_start, guidance_end) of a controlnet-mode run's inputs."""
    return inputs["control_start"], inputs["control_end"]


def scale_at(scale, steered: tuple[Any, Any], step, count):
    """The conditioning scale at step ``step`` (0 at the first) of the ``count`` that run: ``scale`` where the
    window ``steered`` (start, end: fractions) holds the step, else 0 -- diffusers' ``controlnet_keep``, ``1 - (i /
    N < start or (i + 1) / N > end)``, times the scale (its ``cond_scale``)."""
    import jax.numpy as jnp

    start, end = (jnp.ravel(jnp.asarray(value, jnp.float32))[0] for value in steered)
    outside = outside_control_window(jnp.asarray(step, jnp.float32), jnp.asarray(count, jnp.float32), start, end)
    scale = jnp.asarray(scale)
    return jnp.where(outside, jnp.zeros_like(scale), scale)


def at_step(conditioning: Any, step, count) -> Any:
    """The SD family's ``conditioning`` with its ControlNet's scale for step ``step`` of ``count`` (:func:`scale_at`);
    as it is without a ControlNet."""
    if conditioning.control is None:
        return conditioning
    image, scale, steered = conditioning.control
    return conditioning._replace(control=(image, scale_at(scale, steered, step, count), steered))
