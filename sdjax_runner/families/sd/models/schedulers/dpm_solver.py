"""DPM-Solver and DPM-Solver++ multistep (Lu et al. 2022): exponential integrators in lambda = log(alpha / sigma),
of order 1 to 3, on the last model outputs converted to x0 (``dpmsolver++``) or noise (``dpmsolver``).

diffusers 0.39's ``FlaxDPMSolverMultistepScheduler``: every order's update is computed and the one the step's
history allows selected (``lower_order_final``: the last steps of a run under 15 steps drop to lower orders).
``steps_offset`` (added to ``leading`` timesteps) is read from the config, as diffusers reads it. Dynamic
thresholding, which fails in diffusers' Flax scheduler, is its PyTorch scheduler's (:func:`dynamic_threshold`).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp

from sdjax_runner.families.sd.models.schedulers.common import Scheduler, output, training_timesteps


def dynamic_threshold(x0: jnp.ndarray, ratio: float, max_value: float) -> jnp.ndarray:
    """Imagen's dynamic thresholding (Saharia et al. 2022), as diffusers' PyTorch ``_threshold_sample`` does it: per
    image, s = the ``ratio`` quantile of |x0| clipped to [1, ``max_value``]; x0 clipped to [-s, s], divided by s.
    (diffusers 0.39's Flax scheduler fails here: its per-image percentile does not broadcast over the image.)"""
    flat = x0.astype(jnp.float32).reshape(x0.shape[0], -1)
    s = jnp.clip(jnp.quantile(jnp.abs(flat), ratio, axis=1), 1, max_value)[:, None]
    return (jnp.clip(flat, -s, s) / s).reshape(x0.shape).astype(x0.dtype)


@flax.struct.dataclass
class DPMSolverState:
    common: Any
    alpha_t: jnp.ndarray  # (T,) sqrt(alphas_cumprod)
    sigma_t: jnp.ndarray  # (T,) sqrt(1 - alphas_cumprod)
    lambda_t: jnp.ndarray  # (T,) log(alpha_t) - log(sigma_t)
    init_noise_sigma: jnp.ndarray
    timesteps: jnp.ndarray
    num_inference_steps: Any = None  # an int, traced in a loop
    model_outputs: Any = None  # (solver_order, *shape) the converted outputs, newest last
    lower_order_nums: Any = None  # steps taken, up to solver_order
    prev_timestep: Any = None
    cur_sample: Any = None


class DPMSolverMultistepScheduler(Scheduler):
    """DPM-Solver(++) multistep. ``timestep_spacing``: ``linspace``, ``leading`` or ``trailing`` over n + 1 points,
    the last dropped; ``thresholding``: dynamic thresholding of x0 (:func:`dynamic_threshold`, diffusers' PyTorch
    one: its Flax one fails)."""

    SETTINGS: ClassVar[dict[str, Any]] = dict(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", trained_betas=None,
        solver_order=2, prediction_type="epsilon", thresholding=False, dynamic_thresholding_ratio=0.995,
        sample_max_value=1.0, algorithm_type="dpmsolver++", solver_type="midpoint", lower_order_final=True,
        timestep_spacing="linspace", steps_offset=0, rescale_betas_zero_snr=False)
    ZERO_SNR = True

    def create_state(self, common: Any = None) -> DPMSolverState:
        config = self.config
        if config.algorithm_type not in ("dpmsolver", "dpmsolver++"):
            raise ValueError(f"algorithm_type {config.algorithm_type!r}: dpmsolver++ or dpmsolver")
        if config.solver_type not in ("midpoint", "heun"):
            raise ValueError(f"solver_type {config.solver_type!r}: midpoint or heun")
        common = self.common_state() if common is None else common
        alpha_t = jnp.sqrt(common.alphas_cumprod)
        sigma_t = jnp.sqrt(1 - common.alphas_cumprod)
        lambda_t = jnp.log(alpha_t) - jnp.log(sigma_t)
        return DPMSolverState(common=common, alpha_t=alpha_t, sigma_t=sigma_t, lambda_t=lambda_t,
                              init_noise_sigma=jnp.array(1.0, dtype=self.dtype), timesteps=training_timesteps(config))

    def set_timesteps(self, state: DPMSolverState, num_inference_steps: int, shape: tuple = ()) -> DPMSolverState:
        config = self.config
        last = config.num_train_timesteps
        if config.timestep_spacing == "linspace":
            timesteps = jnp.linspace(0, last - 1, num_inference_steps + 1).round()[::-1][:-1].astype(jnp.int32)
        elif config.timestep_spacing == "leading":
            step_ratio = last // (num_inference_steps + 1)
            timesteps = (jnp.arange(0, num_inference_steps + 1) * step_ratio).round()[::-1][:-1].astype(jnp.int32)
            timesteps += config.steps_offset
        elif config.timestep_spacing == "trailing":
            timesteps = jnp.arange(last, 0, -(last / num_inference_steps)).round().astype(jnp.int32) - 1
        else:
            raise ValueError(f"timestep_spacing {config.timestep_spacing!r}: linspace, leading or trailing")
        return replace(state, num_inference_steps=num_inference_steps, timesteps=timesteps,
                             model_outputs=jnp.zeros((config.solver_order, *shape), dtype=self.dtype),
                             lower_order_nums=jnp.int32(0), prev_timestep=jnp.int32(-1),
                             cur_sample=jnp.zeros(shape, dtype=self.dtype))

    def convert_model_output(self, state: DPMSolverState, model_output, timestep, sample):
        """The model's output as the solver's: x0 (``dpmsolver++``, thresholded if asked) or noise."""
        config = self.config
        alpha_t, sigma_t = state.alpha_t[timestep], state.sigma_t[timestep]
        if config.prediction_type not in ("epsilon", "sample", "v_prediction"):
            raise ValueError(f"prediction_type {config.prediction_type!r}: DPM-Solver takes epsilon, sample or "
                             "v_prediction")
        if config.algorithm_type == "dpmsolver":
            if config.prediction_type == "epsilon":
                return model_output
            if config.prediction_type == "sample":
                return (sample - alpha_t * model_output) / sigma_t
            return alpha_t * model_output + sigma_t * sample
        if config.prediction_type == "epsilon":
            x0_pred = (sample - sigma_t * model_output) / alpha_t
        elif config.prediction_type == "sample":
            x0_pred = model_output
        else:
            x0_pred = alpha_t * sample - sigma_t * model_output
        if config.thresholding:
            x0_pred = dynamic_threshold(x0_pred, config.dynamic_thresholding_ratio, config.sample_max_value)
        return x0_pred

    def _update(self, state: DPMSolverState, outputs, timesteps, prev_timestep, sample, order: int):
        """The order-``order`` update from the newest ``order`` of ``outputs`` at ``timesteps`` (newest last) to
        ``prev_timestep``."""
        t, s0 = prev_timestep, timesteps[-1]
        lambda_t, lambda_s0 = state.lambda_t[t], state.lambda_t[s0]
        alpha_t, alpha_s0 = state.alpha_t[t], state.alpha_t[s0]
        sigma_t, sigma_s0 = state.sigma_t[t], state.sigma_t[s0]
        h = lambda_t - lambda_s0
        plus = self.config.algorithm_type == "dpmsolver++"
        m0 = outputs[-1]
        if order == 1:
            if plus:
                return (sigma_t / sigma_s0) * sample - (alpha_t * (jnp.exp(-h) - 1.0)) * m0
            return (alpha_t / alpha_s0) * sample - (sigma_t * (jnp.exp(h) - 1.0)) * m0
        m1 = outputs[-2]
        lambda_s1 = state.lambda_t[timesteps[-2]]
        h_0 = lambda_s0 - lambda_s1
        r0 = h_0 / h
        if order == 2:
            d0, d1 = m0, (1.0 / r0) * (m0 - m1)
            midpoint = self.config.solver_type == "midpoint"
            if plus and midpoint:
                return ((sigma_t / sigma_s0) * sample - (alpha_t * (jnp.exp(-h) - 1.0)) * d0
                        - 0.5 * (alpha_t * (jnp.exp(-h) - 1.0)) * d1)
            if plus:
                return ((sigma_t / sigma_s0) * sample - (alpha_t * (jnp.exp(-h) - 1.0)) * d0
                        + (alpha_t * ((jnp.exp(-h) - 1.0) / h + 1.0)) * d1)
            if midpoint:
                return ((alpha_t / alpha_s0) * sample - (sigma_t * (jnp.exp(h) - 1.0)) * d0
                        - 0.5 * (sigma_t * (jnp.exp(h) - 1.0)) * d1)
            return ((alpha_t / alpha_s0) * sample - (sigma_t * (jnp.exp(h) - 1.0)) * d0
                    - (sigma_t * ((jnp.exp(h) - 1.0) / h - 1.0)) * d1)
        m2 = outputs[-3]
        lambda_s2 = state.lambda_t[timesteps[-3]]
        h_1 = lambda_s1 - lambda_s2
        r1 = h_1 / h
        d0 = m0
        d1_0, d1_1 = (1.0 / r0) * (m0 - m1), (1.0 / r1) * (m1 - m2)
        d1 = d1_0 + (r0 / (r0 + r1)) * (d1_0 - d1_1)
        d2 = (1.0 / (r0 + r1)) * (d1_0 - d1_1)
        if plus:
            return ((sigma_t / sigma_s0) * sample - (alpha_t * (jnp.exp(-h) - 1.0)) * d0
                    + (alpha_t * ((jnp.exp(-h) - 1.0) / h + 1.0)) * d1
                    - (alpha_t * ((jnp.exp(-h) - 1.0 + h) / h**2 - 0.5)) * d2)
        return ((alpha_t / alpha_s0) * sample - (sigma_t * (jnp.exp(h) - 1.0)) * d0
                - (sigma_t * ((jnp.exp(h) - 1.0) / h - 1.0)) * d1
                - (sigma_t * ((jnp.exp(h) - 1.0 - h) / h**2 - 0.5)) * d2)

    def step(self, state: DPMSolverState, model_output, timestep, sample, return_dict: bool = True):
        config = self.config
        (step_index,) = jnp.where(state.timesteps == timestep, size=1)
        step_index = step_index[0]
        count = len(state.timesteps)
        prev_timestep = jax.lax.select(step_index == count - 1, 0, state.timesteps[step_index + 1])
        model_output = self.convert_model_output(state, model_output, timestep, sample)
        model_outputs = jnp.roll(state.model_outputs, -1, axis=0).at[-1].set(model_output)
        state = replace(state, model_outputs=model_outputs, prev_timestep=prev_timestep, cur_sample=sample)
        timesteps = state.timesteps

        def update(order: int):
            history = jnp.array([timesteps[step_index - k] for k in reversed(range(order))])
            return self._update(state, state.model_outputs, history, state.prev_timestep, state.cur_sample, order)

        lower_final = config.lower_order_final and count < 15
        first = update(1)
        if config.solver_order == 1:
            prev_sample = first
        else:
            second = update(2)
            if config.solver_order == 2:
                higher = second
            else:  # 3
                third = update(3)
                if lower_final:
                    third = jax.lax.select(step_index == count - 2, second, third)
                higher = jax.lax.select(state.lower_order_nums < 2, second, third)
            if lower_final:
                higher = jax.lax.select(step_index == count - 1, first, higher)
            prev_sample = jax.lax.select(state.lower_order_nums < 1, first, higher)
        state = replace(state, lower_order_nums=jnp.minimum(state.lower_order_nums + 1, config.solver_order))
        return output(prev_sample, state, return_dict)
