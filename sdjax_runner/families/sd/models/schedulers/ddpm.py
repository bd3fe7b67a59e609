"""DDPM (Ho et al. 2020): ancestral steps between inference timesteps, fresh noise at each.

diffusers 0.39's ``FlaxDDPMScheduler`` steps from ``t`` to ``t - 1`` whatever the number of inference steps and
draws the same noise at every step (and calls ``jnp.clip(a_min=...)``, gone from JAX). This one steps to the
previous *inference* timestep, as diffusers' PyTorch DDPMScheduler does, and draws each image's noise from a key
folded from the timestep and the image's own latent bits (:func:`~.common.image_noise`): the seed alone decides
the images, whichever batch or device an image is generated in. Its timesteps and state are the Flax one's.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Optional

import flax
import jax
import jax.numpy as jnp

from sdjax_runner.families.sd.models.schedulers.common import (
    Scheduler,
    image_noise,
    original_sample,
    output,
    training_timesteps,
    velocity_at,
)


@flax.struct.dataclass
class DDPMState:
    common: Any
    init_noise_sigma: jnp.ndarray
    timesteps: jnp.ndarray
    num_inference_steps: Any = None  # an int, traced in a loop


class DDPMScheduler(Scheduler):
    """DDPM. ``variance_type``: ``fixed_small`` (the posterior's, floored at 1e-20) or ``fixed_large`` (beta);
    ``clip_sample`` clips x0 to [-1, 1]. ``step`` takes ``key`` (default ``jax.random.key(0)``)."""

    SETTINGS: ClassVar[dict[str, Any]] = dict(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", trained_betas=None,
        variance_type="fixed_small", clip_sample=True, prediction_type="epsilon", rescale_betas_zero_snr=False)
    ZERO_SNR = False

    def create_state(self, common: Any = None) -> DDPMState:
        common = self.common_state() if common is None else common
        return DDPMState(common=common, init_noise_sigma=jnp.array(1.0, dtype=self.dtype),
                         timesteps=training_timesteps(self.config))

    def set_timesteps(self, state: DDPMState, num_inference_steps: int, shape: tuple = ()) -> DDPMState:
        """Every ``T // n``-th training timestep from 0, decreasing (no ``steps_offset``: the Flax one's)."""
        step_ratio = self.config.num_train_timesteps // num_inference_steps
        timesteps = (jnp.arange(0, num_inference_steps) * step_ratio).round()[::-1]
        return replace(state, num_inference_steps=num_inference_steps, timesteps=timesteps)

    def step(self, state: DDPMState, model_output, timestep, sample, key: Optional[jax.Array] = None,
             return_dict: bool = True):
        config = self.config
        t = timestep
        prev_t = t - config.num_train_timesteps // state.num_inference_steps
        alphas_cumprod = state.common.alphas_cumprod
        alpha_prod_t = alphas_cumprod[t]
        alpha_prod_t_prev = jnp.where(prev_t >= 0, alphas_cumprod[jnp.maximum(prev_t, 0)], jnp.ones((), self.dtype))
        beta_prod_t, beta_prod_t_prev = 1 - alpha_prod_t, 1 - alpha_prod_t_prev
        current_alpha_t = alpha_prod_t / alpha_prod_t_prev
        current_beta_t = 1 - current_alpha_t

        pred_original_sample = original_sample(config.prediction_type, model_output, sample, alpha_prod_t, "DDPM")
        if config.clip_sample:
            pred_original_sample = jnp.clip(pred_original_sample, -1, 1)

        pred_prev_sample = ((alpha_prod_t_prev**0.5 * current_beta_t / beta_prod_t) * pred_original_sample
                            + (current_alpha_t**0.5 * beta_prod_t_prev / beta_prod_t) * sample)
        if config.variance_type == "fixed_small":
            variance = jnp.maximum((1 - alpha_prod_t_prev) / (1 - alpha_prod_t) * current_beta_t, 1e-20)
        elif config.variance_type == "fixed_large":
            variance = current_beta_t
        else:
            raise ValueError(f"variance_type {config.variance_type!r}: DDPM here takes fixed_small or fixed_large")
        noise = image_noise(jax.random.key(0) if key is None else key, t, sample)
        pred_prev_sample = pred_prev_sample + jnp.where(t > 0, variance**0.5, 0.0) * noise
        return output(pred_prev_sample, state, return_dict)

    def get_velocity(self, state: DDPMState, sample, noise, timesteps):
        return velocity_at(state.common, sample, noise, timesteps)
