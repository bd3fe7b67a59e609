"""DDIM (Song et al. 2020) and LCM (latent consistency models, Luo et al. 2023): deterministic steps between
inference timesteps on alphas_cumprod, sharing one state.

:class:`DDIMScheduler` is diffusers 0.39's ``FlaxDDIMScheduler`` with diffusers' PyTorch ``timestep_spacing``
(the Flax one steps ``leading`` only). :class:`LCMScheduler` is diffusers' PyTorch ``LCMScheduler`` (no Flax one
exists), its noise each image's own (:func:`~.common.image_noise`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar, Optional

import flax
import jax
import jax.numpy as jnp
import numpy as np

from sdjax_runner.families.sd.models.schedulers.common import (
    Scheduler,
    image_noise,
    original_sample,
    output,
    spaced_timesteps,
    training_timesteps,
    velocity_at,
)


@flax.struct.dataclass
class DDIMState:
    """``final_alpha_cumprod``: alphas_cumprod "before" timestep 0 (1, or the first one's: ``set_alpha_to_one``)."""

    common: Any
    final_alpha_cumprod: jnp.ndarray
    init_noise_sigma: jnp.ndarray
    timesteps: jnp.ndarray
    num_inference_steps: Any = None  # an int, traced in a loop


class AlphaScheduler(Scheduler):
    """DDIM's state and what DDIM and LCM share: ``create_state``, the alphas_cumprod of a step, ``add_noise``,
    ``get_velocity``."""

    def create_state(self, common: Any = None) -> DDIMState:
        common = self.common_state() if common is None else common
        final = jnp.array(1.0, dtype=self.dtype) if self.config.set_alpha_to_one else common.alphas_cumprod[0]
        return DDIMState(common=common, final_alpha_cumprod=final, init_noise_sigma=jnp.array(1.0, dtype=self.dtype),
                         timesteps=training_timesteps(self.config))

    @staticmethod
    def _alphas(state: DDIMState, timestep, prev_timestep):
        """alphas_cumprod at ``timestep`` and at ``prev_timestep`` (final_alpha_cumprod below 0)."""
        alphas_cumprod = state.common.alphas_cumprod
        previous = jnp.where(prev_timestep >= 0, alphas_cumprod[prev_timestep], state.final_alpha_cumprod)
        return alphas_cumprod[timestep], previous

    def _get_variance(self, state: DDIMState, timestep, prev_timestep):
        """sigma_t**2 / eta**2 of the DDIM paper's eq. 16, from ``timestep`` to ``prev_timestep``."""
        alpha_prod_t, alpha_prod_t_prev = self._alphas(state, timestep, prev_timestep)
        beta_prod_t = 1 - alpha_prod_t
        beta_prod_t_prev = 1 - alpha_prod_t_prev
        return (beta_prod_t_prev / beta_prod_t) * (1 - alpha_prod_t / alpha_prod_t_prev)

    def get_velocity(self, state: DDIMState, sample, noise, timesteps):
        return velocity_at(state.common, sample, noise, timesteps)


class DDIMScheduler(AlphaScheduler):
    """DDIM. ``timestep_spacing``: ``leading`` (diffusers' Flax DDIM's only one; ``steps_offset`` added),
    ``linspace`` or ``trailing`` (:func:`~.common.spaced_timesteps`). The step goes to ``t - T // n`` whatever the
    spacing, as diffusers' Flax step does; ``eta`` narrows the direction to x_t without adding noise (the engine
    adds it: engine/samplers/schedulers.ddim_step, which reads :meth:`_get_variance`)."""

    SETTINGS: ClassVar[dict[str, Any]] = dict(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", trained_betas=None,
        clip_sample=True, clip_sample_range=1.0, set_alpha_to_one=True, steps_offset=0, prediction_type="epsilon",
        timestep_spacing="leading", rescale_betas_zero_snr=False)
    ZERO_SNR = False

    def set_timesteps(self, state: DDIMState, num_inference_steps: int, shape: tuple = ()) -> DDIMState:
        config = self.config
        spacing = config.get("timestep_spacing") or "leading"
        timesteps = spaced_timesteps(spacing, config.num_train_timesteps, num_inference_steps,
                                     config.steps_offset if spacing == "leading" else 0)
        return replace(state, num_inference_steps=num_inference_steps, timesteps=jnp.asarray(timesteps, jnp.int32))

    def step(self, state: DDIMState, model_output, timestep, sample, eta: float = 0.0, return_dict: bool = True):
        config = self.config
        prev_timestep = timestep - config.num_train_timesteps // state.num_inference_steps
        alpha_prod_t, alpha_prod_t_prev = self._alphas(state, timestep, prev_timestep)
        beta_prod_t = 1 - alpha_prod_t
        if config.prediction_type == "epsilon":
            pred_original_sample = (sample - beta_prod_t ** (0.5) * model_output) / alpha_prod_t ** (0.5)
            pred_epsilon = model_output
        elif config.prediction_type == "sample":
            pred_original_sample = model_output
            pred_epsilon = (sample - alpha_prod_t ** (0.5) * pred_original_sample) / beta_prod_t ** (0.5)
        elif config.prediction_type == "v_prediction":
            pred_original_sample = (alpha_prod_t**0.5) * sample - (beta_prod_t**0.5) * model_output
            pred_epsilon = (alpha_prod_t**0.5) * model_output + (beta_prod_t**0.5) * sample
        else:
            raise ValueError(f"prediction_type {config.prediction_type!r}: DDIM takes epsilon, sample or v_prediction")
        if config.clip_sample:
            pred_original_sample = pred_original_sample.clip(-config.clip_sample_range, config.clip_sample_range)
        std_dev_t = eta * self._get_variance(state, timestep, prev_timestep) ** (0.5)
        pred_sample_direction = (1 - alpha_prod_t_prev - std_dev_t**2) ** (0.5) * pred_epsilon
        prev_sample = alpha_prod_t_prev ** (0.5) * pred_original_sample + pred_sample_direction
        return output(prev_sample, state, return_dict)


def lcm_timesteps(steps: int, train_steps: int = 1000, original_steps: int = 50) -> np.ndarray:
    """diffusers' PyTorch ``LCMScheduler.set_timesteps`` (strength 1, no custom timesteps): the distillation
    schedule ``k - 1, 2k - 1, ..., train_steps - 1`` (k = train_steps // original_steps), reversed, at ``steps``
    evenly spaced indices (floored). ValueError where diffusers raises (more steps than the schedule holds)."""
    if original_steps > train_steps or steps > original_steps or steps < 1:
        raise ValueError(f"LCM takes 1..{min(original_steps, train_steps)} steps ({original_steps} distillation "
                         f"steps of {train_steps}), got {steps}")
    k = train_steps // original_steps
    origin = (np.arange(1, original_steps + 1) * k - 1)[::-1]
    return origin[np.floor(np.linspace(0, len(origin), num=steps, endpoint=False)).astype(np.int64)]


class LCMScheduler(AlphaScheduler):
    """LCM: at each step the x0 estimate under its boundary condition (``c_skip * sample + c_out * x0``,
    ``timestep_scaling`` 10, sigma_data 0.5), noised to the next timestep; the last step returns it. DDIM's state,
    ``add_noise`` (image to image) and config, plus ``original_inference_steps`` and ``timestep_scaling``."""

    SETTINGS: ClassVar[dict[str, Any]] = dict(
        num_train_timesteps=1000, beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", trained_betas=None,
        clip_sample=False, clip_sample_range=1.0, set_alpha_to_one=True, steps_offset=0, prediction_type="epsilon",
        original_inference_steps=50, timestep_scaling=10.0)

    def set_timesteps(self, state: DDIMState, num_inference_steps: int, shape: tuple = ()) -> DDIMState:
        timesteps = lcm_timesteps(num_inference_steps, self.config.num_train_timesteps,
                                  self.config.original_inference_steps)
        return replace(state, num_inference_steps=num_inference_steps, timesteps=jnp.asarray(timesteps, jnp.int32))

    def step(self, state: DDIMState, model_output, timestep, sample, key: Optional[jax.Array] = None,
             return_dict: bool = True):
        config = self.config
        index = jnp.argmax(state.timesteps == timestep)
        last = index == state.num_inference_steps - 1
        previous = jnp.where(last, timestep, state.timesteps[jnp.minimum(index + 1, state.num_inference_steps - 1)])
        alphas_cumprod = state.common.alphas_cumprod
        alpha_t, alpha_prev = alphas_cumprod[timestep], alphas_cumprod[previous]
        original = original_sample(config.prediction_type, model_output, sample, alpha_t, "LCM")
        if config.clip_sample:
            original = jnp.clip(original, -config.clip_sample_range, config.clip_sample_range)
        scaled = timestep * config.timestep_scaling
        c_skip = 0.25 / (scaled**2 + 0.25)
        c_out = scaled / (scaled**2 + 0.25) ** 0.5
        denoised = c_out * original + c_skip * sample
        noise = image_noise(jax.random.key(0) if key is None else key, timestep, sample)
        prev_sample = jnp.where(last, denoised, alpha_prev**0.5 * denoised + (1 - alpha_prev) ** 0.5 * noise)
        return output(prev_sample, state, return_dict)
