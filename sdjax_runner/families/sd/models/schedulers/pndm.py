"""PNDM (Liu et al. 2022, pseudo numerical methods): the linear multistep method on the DDIM transfer, started
with Runge-Kutta (PRK) steps or, with ``skip_prk_steps`` (Stable Diffusion's configs), with PLMS's own
lower-order steps (crowsonkb's PLMS). diffusers 0.39's ``FlaxPNDMScheduler``, as it runs in a jitted loop: the
state keeps the last four model outputs (``ets``, oldest first) and a step ``counter``.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import flax
import jax
import jax.numpy as jnp

from sdjax_runner.families.sd.models.schedulers.common import Scheduler, output, training_timesteps

ORDER = 4  # the multistep order, and the Runge-Kutta steps' count of model calls


@flax.struct.dataclass
class PNDMState:
    common: Any
    final_alpha_cumprod: jnp.ndarray
    init_noise_sigma: jnp.ndarray
    timesteps: jnp.ndarray
    num_inference_steps: Any = None  # an int, traced in a loop
    prk_timesteps: Any = None
    plms_timesteps: Any = None
    cur_model_output: Any = None  # PRK: the weighted sum so far; PLMS: the combined output
    counter: Any = None  # steps taken
    cur_sample: Any = None  # the sample the current (PRK or first PLMS) step started from
    ets: Any = None  # (4, *shape) the last model outputs, newest last


class PNDMScheduler(Scheduler):
    """PNDM. ``set_timesteps`` takes the sample ``shape`` (the running values' buffers)."""

    SETTINGS: ClassVar[dict[str, Any]] = dict(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", trained_betas=None,
        skip_prk_steps=False, set_alpha_to_one=False, steps_offset=0, prediction_type="epsilon")
    pndm_order = ORDER

    def create_state(self, common: Any = None) -> PNDMState:
        common = self.common_state() if common is None else common
        final = jnp.array(1.0, dtype=self.dtype) if self.config.set_alpha_to_one else common.alphas_cumprod[0]
        return PNDMState(common=common, final_alpha_cumprod=final, init_noise_sigma=jnp.array(1.0, dtype=self.dtype),
                         timesteps=training_timesteps(self.config))

    def set_timesteps(self, state: PNDMState, num_inference_steps: int, shape: tuple = ()) -> PNDMState:
        """Every ``T // n``-th training timestep plus ``steps_offset``, decreasing. PLMS alone: the second one
        visited twice (the first step is redone with the mean of two outputs). With PRK: the top four in PRK's half
        steps, then PLMS."""
        config = self.config
        ratio = config.num_train_timesteps // num_inference_steps
        base = (jnp.arange(0, num_inference_steps) * ratio).round() + config.steps_offset
        if config.skip_prk_steps:
            prk = jnp.array([], dtype=jnp.int32)
            plms = jnp.concatenate([base[:-1], base[-2:-1], base[-1:]])[::-1]
        else:
            prk = base[-ORDER:].repeat(2) + jnp.tile(jnp.array([0, ratio // 2], dtype=jnp.int32), ORDER)
            prk = (prk[:-1].repeat(2)[1:-1])[::-1]
            plms = base[:-3][::-1]
        return replace(
            state, timesteps=jnp.concatenate([prk, plms]), num_inference_steps=num_inference_steps, prk_timesteps=prk,
            plms_timesteps=plms, cur_model_output=jnp.zeros(shape, dtype=self.dtype), counter=jnp.int32(0),
            cur_sample=jnp.zeros(shape, dtype=self.dtype), ets=jnp.zeros((ORDER, *shape), dtype=self.dtype))

    def step(self, state: PNDMState, model_output, timestep, sample, return_dict: bool = True):
        if self.config.skip_prk_steps:
            prev_sample, state = self.step_plms(state, model_output, timestep, sample)
            return output(prev_sample, state, return_dict)
        prk_sample, prk_state = self.step_prk(state, model_output, timestep, sample)
        plms_sample, plms_state = self.step_plms(state, model_output, timestep, sample)
        in_prk = state.counter < len(state.prk_timesteps)
        prev_sample = jax.lax.select(in_prk, prk_sample, plms_sample)
        state = replace(state, **{name: jax.lax.select(in_prk, getattr(prk_state, name), getattr(plms_state, name))
                                  for name in ("cur_model_output", "ets", "cur_sample", "counter")})
        return output(prev_sample, state, return_dict)

    @staticmethod
    def _pushed(ets: jnp.ndarray, model_output: jnp.ndarray) -> jnp.ndarray:
        """``ets`` with the oldest output dropped and ``model_output`` appended."""
        return ets.at[0:3].set(ets[1:4]).at[3].set(model_output)

    def step_prk(self, state: PNDMState, model_output, timestep, sample) -> tuple[jnp.ndarray, PNDMState]:
        """A fourth of a Runge-Kutta step (PNDM paper eq. 13): outputs weighted 1/6, 1/3, 1/3, 1/6."""
        counter = state.counter
        diff_to_prev = jnp.where(counter % 2, 0, self.config.num_train_timesteps // state.num_inference_steps // 2)
        prev_timestep = timestep - diff_to_prev
        timestep = state.prk_timesteps[counter // 4 * 4]
        model_output = jax.lax.select((counter % 4) != 3, model_output, state.cur_model_output + 1 / 6 * model_output)
        first = (counter % 4) == 0
        state = replace(
            state,
            cur_model_output=jax.lax.select_n(counter % 4, state.cur_model_output + 1 / 6 * model_output,
                                              state.cur_model_output + 1 / 3 * model_output,
                                              state.cur_model_output + 1 / 3 * model_output,
                                              jnp.zeros_like(state.cur_model_output)),
            ets=jax.lax.select(first, self._pushed(state.ets, model_output), state.ets),
            cur_sample=jax.lax.select(first, sample, state.cur_sample))
        prev_sample = self._get_prev_sample(state, state.cur_sample, timestep, prev_timestep, model_output)
        return prev_sample, replace(state, counter=state.counter + 1)

    def step_plms(self, state: PNDMState, model_output, timestep, sample) -> tuple[jnp.ndarray, PNDMState]:
        """A linear multistep step: the outputs so far combined by Adams-Bashforth weights (order 1 to 4). Without
        PRK, step 0 goes a whole step with its output and step 1 redoes it from the same sample with the mean
        of both outputs (Heun), a step that does not move the timestep."""
        counter = state.counter
        ratio = self.config.num_train_timesteps // state.num_inference_steps
        prev_timestep = timestep - ratio
        prev_timestep = jnp.where(prev_timestep > 0, prev_timestep, 0)
        prev_timestep = jnp.where(counter == 1, timestep, prev_timestep)
        timestep = jnp.where(counter == 1, timestep + ratio, timestep)
        state = replace(state, ets=jax.lax.select(counter != 1, self._pushed(state.ets, model_output), state.ets),
                        cur_sample=jax.lax.select(counter != 1, sample, state.cur_sample))
        ets = state.ets
        state = replace(state, cur_model_output=jax.lax.select_n(
            jnp.clip(counter, 0, 4),
            model_output,
            (model_output + ets[-1]) / 2,
            (3 * ets[-1] - ets[-2]) / 2,
            (23 * ets[-1] - 16 * ets[-2] + 5 * ets[-3]) / 12,
            (1 / 24) * (55 * ets[-1] - 59 * ets[-2] + 37 * ets[-3] - 9 * ets[-4])))
        prev_sample = self._get_prev_sample(state, state.cur_sample, timestep, prev_timestep, state.cur_model_output)
        return prev_sample, replace(state, counter=state.counter + 1)

    def _get_prev_sample(self, state: PNDMState, sample, timestep, prev_timestep, model_output):
        """x_(t - delta) from x_t and the (combined) noise estimate: formula (9) of the PNDM paper."""
        alpha_prod_t = state.common.alphas_cumprod[timestep]
        alpha_prod_t_prev = jnp.where(prev_timestep >= 0, state.common.alphas_cumprod[prev_timestep],
                                      state.final_alpha_cumprod)
        beta_prod_t = 1 - alpha_prod_t
        beta_prod_t_prev = 1 - alpha_prod_t_prev
        if self.config.prediction_type == "v_prediction":
            model_output = (alpha_prod_t**0.5) * model_output + (beta_prod_t**0.5) * sample
        elif self.config.prediction_type != "epsilon":
            raise ValueError(f"prediction_type {self.config.prediction_type!r}: PNDM takes epsilon or v_prediction")
        sample_coeff = (alpha_prod_t_prev / alpha_prod_t) ** (0.5)
        model_output_denom_coeff = alpha_prod_t * beta_prod_t_prev ** (0.5) + (
            alpha_prod_t * beta_prod_t * alpha_prod_t_prev) ** (0.5)
        return sample_coeff * sample - (alpha_prod_t_prev - alpha_prod_t) * model_output / model_output_denom_coeff
