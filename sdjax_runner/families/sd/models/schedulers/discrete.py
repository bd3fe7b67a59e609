"""The sigma-space schedulers (Karras et al. 2022's ODE in sigma = sqrt((1 - a) / a)): Euler and LMS.

Their states hold ``sigmas`` (the engine tells them apart by it: an image-to-image start is noised by
``sigmas[index]``), and ``scale_model_input`` divides the sample by sqrt(sigma**2 + 1).

* :class:`EulerDiscreteScheduler`: diffusers 0.39's ``FlaxEulerDiscreteScheduler``, with
  ``timestep_spacing="trailing"`` (SDXL Lightning's) as diffusers' PyTorch one spaces it.
* :class:`LMSDiscreteScheduler`: diffusers' ``FlaxLMSDiscreteScheduler``'s timesteps and sigmas, stepped as its
  PyTorch scheduler steps in a jitted loop: the last four derivatives in a fixed-size buffer (newest first), the
  LMS coefficients the Lagrange basis polynomials integrated exactly (``jnp.polyint``) on the traced sigmas, the
  step found from the timestep.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, ClassVar

import flax
import jax.numpy as jnp

from sdjax_runner.families.sd.models.schedulers.common import (
    Scheduler,
    broadcast_from_left,
    output,
    spaced_timesteps,
    training_timesteps,
)

LMS_ORDER = 4


@flax.struct.dataclass
class EulerState:
    common: Any
    init_noise_sigma: jnp.ndarray
    timesteps: jnp.ndarray  # float
    sigmas: jnp.ndarray  # (steps + 1,), the last 0
    num_inference_steps: Any = None  # an int, traced in a loop


@flax.struct.dataclass
class LMSState:
    common: Any
    init_noise_sigma: jnp.ndarray
    timesteps: jnp.ndarray  # int32
    sigmas: jnp.ndarray  # (steps + 1,), the last 0; a new state's: the (T,) training sigmas
    num_inference_steps: Any = None  # an int, traced in a loop
    derivatives: Any = None  # (4, *shape), newest first; zeros before the first step


def training_sigmas(common: Any) -> jnp.ndarray:
    """(T,) sqrt((1 - alphas_cumprod) / alphas_cumprod), increasing."""
    return ((1 - common.alphas_cumprod) / common.alphas_cumprod) ** 0.5


class SigmaScheduler(Scheduler):
    """What Euler and LMS share: ``scale_model_input`` and ``add_noise`` (diffusers' Flax ones: the latter
    indexes ``sigmas`` by the timestep's value -- the engine noises by ``sigmas[index]`` instead)."""

    def scale_model_input(self, state: Any, sample: jnp.ndarray, timestep: Any = None) -> jnp.ndarray:
        (step_index,) = jnp.where(state.timesteps == timestep, size=1)
        sigma = state.sigmas[step_index[0]]
        return sample / ((sigma**2 + 1) ** 0.5)

    def add_noise(self, state: Any, original_samples: jnp.ndarray, noise: jnp.ndarray, timesteps: jnp.ndarray):
        sigma = broadcast_from_left(state.sigmas[timesteps].flatten(), noise.shape)
        return original_samples + noise * sigma

    def original(self, model_output, sample, sigma):
        """x0 from the model's output at ``sigma`` (epsilon or v_prediction)."""
        prediction_type = self.config.prediction_type
        if prediction_type == "epsilon":
            return sample - sigma * model_output
        if prediction_type == "v_prediction":
            return model_output * (-sigma / (sigma**2 + 1) ** 0.5) + (sample / (sigma**2 + 1))
        raise ValueError(f"prediction_type {prediction_type!r}: {type(self).__name__} takes epsilon or v_prediction")


class EulerDiscreteScheduler(SigmaScheduler):
    """Euler. ``timestep_spacing``: ``linspace`` (T - 1 to 0, fractional), ``leading`` (every T // n-th from 0,
    plus 1 -- diffusers' Flax one adds 1 whatever ``steps_offset``) or ``trailing``; the sigmas interpolated
    linearly at those timesteps. ``init_noise_sigma``: the largest sigma, sqrt(max**2 + 1) for ``leading``."""

    SETTINGS: ClassVar[dict[str, Any]] = dict(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", trained_betas=None,
        prediction_type="epsilon", timestep_spacing="linspace", rescale_betas_zero_snr=False)
    ZERO_SNR = True

    def _with_sigmas(self, common: Any, timesteps: jnp.ndarray) -> tuple[jnp.ndarray, jnp.ndarray]:
        """(sigmas at ``timesteps`` then 0, init_noise_sigma)."""
        sigmas = training_sigmas(common)
        sigmas = jnp.interp(timesteps, jnp.arange(0, len(sigmas)), sigmas)
        sigmas = jnp.concatenate([sigmas, jnp.array([0.0], dtype=self.dtype)])
        if self.config.timestep_spacing in ("linspace", "trailing"):
            return sigmas, sigmas.max()
        return sigmas, (sigmas.max() ** 2 + 1) ** 0.5

    def create_state(self, common: Any = None) -> EulerState:
        common = self.common_state() if common is None else common
        timesteps = training_timesteps(self.config)
        sigmas, init_noise_sigma = self._with_sigmas(common, timesteps)
        return EulerState(common=common, init_noise_sigma=init_noise_sigma, timesteps=timesteps, sigmas=sigmas)

    def set_timesteps(self, state: EulerState, num_inference_steps: int, shape: tuple = ()) -> EulerState:
        config = self.config
        if config.timestep_spacing == "linspace":
            timesteps = jnp.linspace(config.num_train_timesteps - 1, 0, num_inference_steps, dtype=self.dtype)
        elif config.timestep_spacing == "leading":
            step_ratio = config.num_train_timesteps // num_inference_steps
            timesteps = (jnp.arange(0, num_inference_steps) * step_ratio).round()[::-1].astype(float) + 1
        elif config.timestep_spacing == "trailing":
            timesteps = jnp.asarray(spaced_timesteps("trailing", config.num_train_timesteps, num_inference_steps),
                                    self.dtype)
        else:
            raise ValueError(f"timestep_spacing {config.timestep_spacing!r}: linspace, leading or trailing")
        sigmas, init_noise_sigma = self._with_sigmas(state.common, timesteps)
        return replace(state, timesteps=timesteps, sigmas=sigmas, num_inference_steps=num_inference_steps,
                             init_noise_sigma=init_noise_sigma)

    def step(self, state: EulerState, model_output, timestep, sample, return_dict: bool = True):
        (step_index,) = jnp.where(state.timesteps == timestep, size=1)
        step_index = step_index[0]
        sigma = state.sigmas[step_index]
        pred_original_sample = self.original(model_output, sample, sigma)
        derivative = (sample - pred_original_sample) / sigma
        dt = state.sigmas[step_index + 1] - sigma
        return output(sample + derivative * dt, state, return_dict)


def lms_coefficients(sigmas: jnp.ndarray, step: jnp.ndarray, order: int) -> jnp.ndarray:
    """(LMS_ORDER,) weights of the newest-first derivatives for a step of the given ``order``:
    c_j = integral over [sigma_step, sigma_step+1] of prod_{k != j} (tau - s_{step-k}) / (s_{step-j} - s_{step-k})."""
    weights = []
    for j in range(order):
        poly = jnp.ones((1,), sigmas.dtype)
        for k in range(order):
            if k != j:
                s_k = sigmas[jnp.maximum(step - k, 0)]
                s_j = sigmas[jnp.maximum(step - j, 0)]
                poly = jnp.polymul(poly, jnp.stack([jnp.ones_like(s_k), -s_k]) / (s_j - s_k))
        antiderivative = jnp.polyint(poly)
        weights.append(jnp.polyval(antiderivative, sigmas[step + 1]) - jnp.polyval(antiderivative, sigmas[step]))
    return jnp.stack(weights + [jnp.zeros((), sigmas.dtype)] * (LMS_ORDER - order))


class LMSDiscreteScheduler(SigmaScheduler):
    """LMS (linear multistep in sigma, order 4 once four derivatives are kept). Timesteps evenly from T - 1 to 0,
    truncated to integers; sigmas interpolated linearly at the fractional ones. A run that starts part-way down
    (image to image) warms up too: the order counts the derivatives kept so far."""

    SETTINGS: ClassVar[dict[str, Any]] = dict(
        num_train_timesteps=1000, beta_start=0.0001, beta_end=0.02, beta_schedule="linear", trained_betas=None,
        prediction_type="epsilon")

    def create_state(self, common: Any = None) -> LMSState:
        common = self.common_state() if common is None else common
        sigmas = training_sigmas(common)
        return LMSState(common=common, init_noise_sigma=sigmas.max(), timesteps=training_timesteps(self.config),
                        sigmas=sigmas)

    def set_timesteps(self, state: LMSState, num_inference_steps: int, shape: tuple = ()) -> LMSState:
        timesteps = jnp.linspace(self.config.num_train_timesteps - 1, 0, num_inference_steps, dtype=self.dtype)
        low_idx = jnp.floor(timesteps).astype(jnp.int32)
        high_idx = jnp.ceil(timesteps).astype(jnp.int32)
        frac = jnp.mod(timesteps, 1.0)
        sigmas = training_sigmas(state.common)
        sigmas = (1 - frac) * sigmas[low_idx] + frac * sigmas[high_idx]
        sigmas = jnp.concatenate([sigmas, jnp.array([0.0], dtype=self.dtype)])
        return replace(state, timesteps=timesteps.astype(jnp.int32), sigmas=sigmas,
                             num_inference_steps=num_inference_steps,
                             derivatives=jnp.zeros((LMS_ORDER, *shape), dtype=self.dtype))

    def step(self, state: LMSState, model_output, timestep, sample, order: int = LMS_ORDER, return_dict: bool = True):
        step = jnp.argmax(state.timesteps == timestep)  # the engine passes the timestep, not the step
        sigma = state.sigmas[step]
        pred_original_sample = self.original(model_output, sample, sigma)
        # The first steps have fewer derivatives, so a lower order (diffusers' min(len(derivatives), order)).
        kept = jnp.sum(jnp.any(state.derivatives != 0, axis=tuple(range(1, state.derivatives.ndim))))
        derivatives = jnp.roll(state.derivatives, 1, axis=0).at[0].set((sample - pred_original_sample) / sigma)
        available = jnp.minimum(kept + 1, order)
        weights = jnp.select([available == o for o in range(1, order + 1)],
                             [lms_coefficients(state.sigmas, step, o) for o in range(1, order + 1)])
        prev_sample = sample + jnp.tensordot(weights.astype(sample.dtype), derivatives, axes=1)
        return output(prev_sample, replace(state, derivatives=derivatives), return_dict)
