"""The UNet as k-diffusion's denoiser, and the k samplers as a denoising stage.

``denoiser(x, sigma) -> x0``: the input scaled by ``1 / sqrt(sigma^2 + 1)``, the timestep the sigma's
continuous position in the training schedule (log-sigma interpolated, as k-diffusion's
``DiscreteSchedule.sigma_to_t``), the UNet on the unconditional and conditional halves at once,
classifier-free guidance, then x0 from the prediction: ``x - sigma * eps`` (epsilon), or
``x / (sigma^2 + 1) - v * sigma / sqrt(sigma^2 + 1)`` (v-prediction, k-diffusion's DiscreteVDDPMDenoiser).
The sigmas the steps visit come from the model's scheduler config and the schedule (:mod:`.sigmas`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np

from sdjax_runner.config.samplers import SAMPLERS as ENTRIES
from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.guiders import Guidance, guided, place
from sdjax_runner.engine.modes import controlnet
from sdjax_runner.engine.modes.start import Start, initial, kept
from sdjax_runner.engine.samplers import unet
from sdjax_runner.engine.samplers.k_samplers import K_SAMPLERS, NOISE_STREAM, key_noise
from sdjax_runner.engine.samplers.sigmas import schedule, training_sigmas


def unet_denoiser(pipeline: Any, params: dict, conditioning: Conditioning, guidance: Guidance, prediction: str,
                  training: np.ndarray, steps: np.ndarray, first: Any = 0) -> Callable:
    """``steps``: the sigmas the sampler steps through; a call's step (for the guider) is the index of the nearest,
    counted from ``first`` (the step the sampler starts at: img2img's)."""
    import jax.numpy as jnp

    log_sigmas = jnp.asarray(np.log(training), jnp.float32)
    positions = jnp.arange(len(training), dtype=jnp.float32)
    # SDXL's refiner switches at the training timestep whose sigma is nearest the step's (A1111's apply_refiner)
    sigmas = jnp.asarray(training, jnp.float32) if conditioning.refiner is not None else None

    def denoiser(x, sigma):
        t = jnp.interp(jnp.log(sigma), log_sigmas, positions)
        nearest = None if sigmas is None else jnp.argmin(jnp.abs(sigmas - sigma))
        step, count = place(sigma, steps) - first, len(steps) - 1 - first
        predictions = unet.halves(pipeline, params, controlnet.at_step(conditioning, step, count),
                                  x / jnp.sqrt(sigma**2 + 1), t, nearest, guidance).as_float32()
        out = guided(predictions.unconditional, predictions.conditional, guidance, step, count,
                     predictions.perturbed, t)
        if prediction == "v_prediction":
            return x / (sigma**2 + 1) - out * sigma / jnp.sqrt(sigma**2 + 1)
        if prediction == "sample":
            return out
        return x - out * sigma

    return denoiser


def step_sigmas(name: str, sigmas: str, steps: int, training: np.ndarray) -> np.ndarray:
    """The (steps + 1,) sigmas k sampler ``name`` steps through on schedule ``sigmas`` (config/samplers.py), the
    last 0."""
    if ENTRIES[name].discard_penultimate:  # as ComfyUI's KSampler: one sigma more, the next-to-last dropped
        longer = schedule(sigmas, steps + 1, training)
        return np.append(longer[:-2], longer[-1])
    return schedule(sigmas, steps, training)


def sampler(name: str) -> Callable:
    """The denoising stage of k sampler ``name``."""

    def denoise(pipeline: Any, params: dict, conditioning: Conditioning, start: Start, guidance: Guidance, spec: Any,
                key):
        import jax
        import jax.numpy as jnp

        config = pipeline.scheduler.config
        training = training_sigmas(config)
        sigmas = step_sigmas(name, spec.sigmas, spec.steps, training)  # host values: constants of the program
        prediction = spec.prediction_type or config.get("prediction_type", "epsilon")
        model = unet_denoiser(pipeline, params, conditioning, guidance, prediction, training, sigmas, start.step)
        if start.keep is not None:
            # Inpainting with an ordinary model, as A1111 does for the k samplers: the denoised sample is the
            # init image wherever it is kept (and so is the result).
            unmasked = model
            model = lambda x, sigma: kept(start, start.image, unmasked(x, sigma))  # noqa: E731
        constants = jnp.asarray(sigmas, start.noise.dtype)
        x = initial(start, start.noise * float(sigmas[0]), lambda step: start.image + start.noise * constants[step])
        noise = key_noise(jax.random.fold_in(key, NOISE_STREAM), x.shape, x.dtype)
        options: dict[str, Any] = {} if spec.eta is None else {"eta": spec.eta}  # config/samplers.py let it through
        if ENTRIES[name].reads_training_sigmas:
            options["training"] = training
        x = K_SAMPLERS[name](model, x, sigmas, noise, start=start.step, **options)
        return x if start.keep is None else kept(start, start.image, x)

    return denoise
