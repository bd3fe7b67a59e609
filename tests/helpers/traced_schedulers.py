"""LMS and DDPM for the pipeline's jitted sampling loop (diffusers 0.39's Flax versions cannot run there).

* ``FlaxLMSDiscreteScheduler`` keeps its derivatives as a growing array, computes the LMS
  coefficients with SciPy on concrete values and indexes sigmas by the timestep instead of the
  step: none of that traces inside ``jax.lax.fori_loop``. :class:`LMSScheduler` keeps the last
  ``order`` derivatives in a fixed-size buffer (newest first) and integrates the Lagrange
  basis polynomials exactly with ``jnp.polyint`` on the traced sigmas.
* ``FlaxDDPMScheduler`` calls ``jnp.clip(a_min=...)`` (removed in JAX 0.10), steps from ``t`` to
  ``t - 1`` whatever the number of inference steps, and draws the same noise at every step.
  :class:`DDPMScheduler` steps to the previous *inference* timestep as diffusers' PyTorch
  DDPMScheduler does, and draws each image's noise from a key folded from the timestep and the
  image's own latent bits -- so the seed alone decides the images, and an image does not depend
  on which batch or device it was generated in.

And what diffusers has in PyTorch alone: :class:`LCMScheduler` (latent consistency models, LCM-LoRA); and DDIM and
Euler with diffusers' PyTorch timestep spacings.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from diffusers import FlaxDDIMScheduler, FlaxDDPMScheduler, FlaxEulerDiscreteScheduler, FlaxLMSDiscreteScheduler
from diffusers.configuration_utils import register_to_config
from diffusers.schedulers.scheduling_ddim_flax import FlaxDDIMSchedulerOutput
from diffusers.schedulers.scheduling_ddpm_flax import FlaxDDPMSchedulerOutput
from diffusers.schedulers.scheduling_lms_discrete_flax import FlaxLMSSchedulerOutput

LMS_ORDER = 4


def lms_coefficients(sigmas: jnp.ndarray, step: jnp.ndarray, order: int) -> jnp.ndarray:
    """(LMS_ORDER,) weights of the newest-first derivatives for a step of the given ``order``:
    c_j = integral over [sigma_step, sigma_step+1] of prod_{k != j} (tau - s_{step-k}) / (s_{step-j} - s_{step-k})."""
    weights = []
    for j in range(order):
        poly = jnp.ones((1,), sigmas.dtype)
        for k in range(order):
            if k != j:
                s_k = sigmas[jnp.maximum(step - k, 0)]
                poly = jnp.polymul(poly, jnp.stack([jnp.ones_like(s_k), -s_k]) / (sigmas[jnp.maximum(step - j, 0)] - s_k))
        antiderivative = jnp.polyint(poly)
        weights.append(jnp.polyval(antiderivative, sigmas[step + 1]) - jnp.polyval(antiderivative, sigmas[step]))
    return jnp.stack(weights + [jnp.zeros((), sigmas.dtype)] * (LMS_ORDER - order))


class LMSScheduler(FlaxLMSDiscreteScheduler):
    def set_timesteps(self, state, num_inference_steps: int, shape: tuple = ()):
        state = super().set_timesteps(state, num_inference_steps, shape)
        return state.replace(derivatives=jnp.zeros((LMS_ORDER,) + tuple(shape), dtype=self.dtype))

    def step(self, state, model_output, timestep, sample, order: int = LMS_ORDER, return_dict: bool = True):
        step = jnp.argmax(state.timesteps == timestep)  # the pipeline passes the timestep, not the step
        sigma = state.sigmas[step]
        if self.config.prediction_type == "epsilon":
            pred_original_sample = sample - sigma * model_output
        elif self.config.prediction_type == "v_prediction":
            pred_original_sample = model_output * (-sigma / (sigma**2 + 1) ** 0.5) + (sample / (sigma**2 + 1))
        else:
            raise ValueError(f"prediction_type {self.config.prediction_type!r}: LMS takes epsilon or v_prediction")
        # The first steps have fewer derivatives, so a lower order (diffusers' min(len(derivatives), order)):
        # counted from those kept so far, so a run that starts part-way down (img2img) warms up as well.
        kept = jnp.sum(jnp.any(state.derivatives != 0, axis=tuple(range(1, state.derivatives.ndim))))
        derivatives = jnp.roll(state.derivatives, 1, axis=0).at[0].set((sample - pred_original_sample) / sigma)
        available = jnp.minimum(kept + 1, order)
        weights = jnp.select([available == o for o in range(1, order + 1)],
                             [lms_coefficients(state.sigmas, step, o) for o in range(1, order + 1)])
        prev_sample = sample + jnp.tensordot(weights.astype(sample.dtype), derivatives, axes=1)
        state = state.replace(derivatives=derivatives)
        return FlaxLMSSchedulerOutput(prev_sample=prev_sample, state=state) if return_dict else (prev_sample, state)


def image_noise(key: jax.Array, timestep, sample: jnp.ndarray) -> jnp.ndarray:
    """Standard normal noise per image, keyed by the timestep and the image's latent bits
    (an integer sum: exact and independent of reduction order)."""
    def one(image):
        bits = jax.lax.bitcast_convert_type(image.astype(jnp.float32), jnp.uint32).sum(dtype=jnp.uint32)
        return jax.random.normal(jax.random.fold_in(jax.random.fold_in(key, timestep), bits), image.shape, image.dtype)

    return jax.vmap(one)(sample)


def original_sample(prediction_type: str, model_output, sample, alpha_prod_t, name: str):
    """x0 from the model's output at a timestep of ``alpha_prod_t`` (diffusers' schedulers' "predicted original
    sample"), for ``prediction_type`` epsilon, sample or v_prediction; ``name``: the scheduler, for the error."""
    if prediction_type == "epsilon":
        return (sample - (1 - alpha_prod_t) ** 0.5 * model_output) / alpha_prod_t**0.5
    if prediction_type == "sample":
        return model_output
    if prediction_type == "v_prediction":
        return alpha_prod_t**0.5 * sample - (1 - alpha_prod_t) ** 0.5 * model_output
    raise ValueError(f"prediction_type {prediction_type!r}: {name} takes epsilon, sample or v_prediction")


class DDPMScheduler(FlaxDDPMScheduler):
    def step(self, state, model_output, timestep, sample, key=None, return_dict: bool = True):
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
        if not return_dict:
            return pred_prev_sample, state
        return FlaxDDPMSchedulerOutput(prev_sample=pred_prev_sample, state=state)


def spaced_timesteps(spacing: str, train_steps: int, steps: int, steps_offset: int = 0) -> np.ndarray:
    """diffusers' PyTorch schedulers' ``timestep_spacing`` (DDIMScheduler.set_timesteps, Table 2 of Lin et al. 2023):
    ``linspace`` evenly from T - 1 to 0; ``leading`` every T // n-th from 0, plus steps_offset; ``trailing`` every
    T / n-th from T down, minus one -- the last training timestep always visited. Decreasing."""
    if spacing == "linspace":
        return np.linspace(0, train_steps - 1, steps).round()[::-1].copy()
    if spacing == "leading":
        return (np.arange(0, steps) * (train_steps // steps)).round()[::-1].copy() + steps_offset
    if spacing == "trailing":
        return np.round(np.arange(train_steps, 0, -train_steps / steps)) - 1
    raise ValueError(f"timestep_spacing {spacing!r}: linspace, leading or trailing")


class DDIMScheduler(FlaxDDIMScheduler):
    """diffusers' Flax DDIM with diffusers' PyTorch ``timestep_spacing`` (its Flax one steps ``leading`` only):
    models/schedulers.py registers the setting in its config; ``leading`` is the Flax scheduler's own."""

    def set_timesteps(self, state, num_inference_steps: int, shape: tuple = ()):
        spacing = self.config.get("timestep_spacing", "leading")
        if spacing == "leading":
            return super().set_timesteps(state, num_inference_steps, shape)
        timesteps = spaced_timesteps(spacing, self.config.num_train_timesteps, num_inference_steps)
        return state.replace(num_inference_steps=num_inference_steps, timesteps=jnp.asarray(timesteps, jnp.int32))


class EulerScheduler(FlaxEulerDiscreteScheduler):
    """diffusers' Flax Euler with ``timestep_spacing="trailing"`` too (SDXL Lightning's), as diffusers' PyTorch
    EulerDiscreteScheduler spaces it: the sigmas interpolated at those timesteps, the largest the initial noise's."""

    def set_timesteps(self, state, num_inference_steps: int, shape: tuple = ()):
        if self.config.timestep_spacing != "trailing":
            return super().set_timesteps(state, num_inference_steps, shape)
        timesteps = jnp.asarray(spaced_timesteps("trailing", self.config.num_train_timesteps, num_inference_steps),
                                self.dtype)
        sigmas = ((1 - state.common.alphas_cumprod) / state.common.alphas_cumprod) ** 0.5
        sigmas = jnp.interp(timesteps, jnp.arange(0, len(sigmas)), sigmas)
        sigmas = jnp.concatenate([sigmas, jnp.array([0.0], dtype=self.dtype)])
        return state.replace(timesteps=timesteps, sigmas=sigmas, num_inference_steps=num_inference_steps,
                             init_noise_sigma=sigmas.max())


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


class LCMScheduler(FlaxDDIMScheduler):
    """diffusers' PyTorch ``LCMScheduler`` (latent consistency models and LCM-LoRA, as diffusers' documentation runs
    them), which diffusers has no Flax class for: its timesteps (:func:`lcm_timesteps`), and at each step the x0
    estimate under its boundary condition (``c_skip * sample + c_out * x0``, ``timestep_scaling`` 10, sigma_data 0.5)
    noised to the next timestep -- the last step returns it. The noise is each image's own, keyed by the timestep and
    its latent bits, as :class:`DDPMScheduler`'s. DDIM's state (alphas, ``add_noise`` for image to image)."""

    @register_to_config
    def __init__(self, num_train_timesteps: int = 1000, beta_start: float = 0.00085, beta_end: float = 0.012,
                 beta_schedule: str = "scaled_linear", trained_betas=None, clip_sample: bool = False,
                 clip_sample_range: float = 1.0, set_alpha_to_one: bool = True, steps_offset: int = 0,
                 prediction_type: str = "epsilon", original_inference_steps: int = 50,
                 timestep_scaling: float = 10.0, dtype=jnp.float32):
        self.dtype = dtype  # (FlaxDDIMScheduler's __init__ holds nothing else; its config is this one's)

    def set_timesteps(self, state, num_inference_steps: int, shape: tuple = ()):
        timesteps = lcm_timesteps(num_inference_steps, self.config.num_train_timesteps,
                                  self.config.original_inference_steps)
        return state.replace(num_inference_steps=num_inference_steps, timesteps=jnp.asarray(timesteps, jnp.int32))

    def step(self, state, model_output, timestep, sample, key=None, return_dict: bool = True):
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
        if not return_dict:
            return prev_sample, state
        return FlaxDDIMSchedulerOutput(prev_sample=prev_sample, state=state)


# The runner's former zero-terminal-SNR state (models/schedulers.py before its own schedulers): diffusers'
# CommonSchedulerState with its betas rescaled, for the schedulers above and diffusers' own.
ZERO_SNR_FLOORED = ("euler", "dpm_solver_pp")  # their last alphas_cumprod 2**-24, as diffusers' PyTorch ones


def rescale_zero_terminal_snr(betas):
    """diffusers' ``rescale_zero_terminal_snr`` (Lin et al. 2023, algorithm 1), in NumPy float64."""
    alphas_bar_sqrt = np.sqrt(np.cumprod(1.0 - np.asarray(betas, np.float64)))
    first, last = alphas_bar_sqrt[0], alphas_bar_sqrt[-1]
    alphas_bar_sqrt = (alphas_bar_sqrt - last) * (first / (first - last))
    alphas_bar = alphas_bar_sqrt**2
    alphas = np.concatenate([alphas_bar[:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1 - alphas


def zero_terminal_snr_state(scheduler, floored: bool):
    """The scheduler's CommonSchedulerState with its betas rescaled to zero terminal SNR."""
    from diffusers.schedulers.scheduling_utils_flax import CommonSchedulerState

    common = CommonSchedulerState.create(scheduler)
    betas = rescale_zero_terminal_snr(np.asarray(common.betas))
    alphas = 1.0 - betas
    alphas_cumprod = np.cumprod(alphas)
    if floored:
        alphas_cumprod[-1] = 2.0**-24
    dtype = common.betas.dtype
    return CommonSchedulerState(alphas=jnp.asarray(alphas, dtype), betas=jnp.asarray(betas, dtype),
                                alphas_cumprod=jnp.asarray(alphas_cumprod, dtype))
