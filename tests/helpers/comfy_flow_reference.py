"""An independent NumPy transcription of how ComfyUI samples a flow model (FLUX.1), for tests.

Written from ComfyUI's published sources, not from the runner (step order, formulas and defaults as published;
torch float32 tensors become NumPy float32 arrays, Python floats stay Python floats):

* ``comfy/model_sampling.py``: ``flux_time_shift``, ``ModelSamplingFlux`` (``set_parameters(shift,
  timesteps=10000)``: ``sigmas = sigma(arange(1, T + 1) / T)``; ``timestep(sigma) = sigma``),
  ``time_snr_shift`` and ``ModelSamplingDiscreteFlow`` (``set_parameters(shift=1.0, timesteps=1000,
  multiplier=1000)``; FluxSchnell's model config sets ``multiplier`` 1.0 and ``shift`` 1.0), and ``CONST``
  (``noise_scaling``: ``sigma * noise + (1 - sigma) * latent``; ``calculate_denoised``: ``x - v * sigma``;
  ``inverse_noise_scaling``: ``latent / (1 - sigma)``).
* ``comfy_extras/nodes_model_advanced.py``: the ``ModelSamplingFlux`` node's shift for a width and height
  (``x1 = 256, x2 = 4096, mm = (max_shift - base_shift) / (x2 - x1), b = base_shift - mm * x1, shift = (width
  * height / (8 * 8 * 2 * 2)) * mm + b``).
* ``comfy/samplers.py``: ``simple_scheduler``, ``normal_scheduler`` (and ``sgm=True``), ``beta_scheduler``;
  ``comfy/k_diffusion/sampling.py``: ``get_sigmas_karras``, ``get_sigmas_exponential``.

The samplers themselves are k-diffusion's, which ComfyUI runs unchanged on flow models: tests/helpers/k_reference.py.
"""

from __future__ import annotations

import math

import numpy as np
import scipy.stats


def flux_time_shift(mu: float, sigma: float, t):
    return math.exp(mu) / (math.exp(mu) + (1 / t - 1) ** sigma)


def time_snr_shift(alpha, t):
    if alpha == 1.0:
        return t
    return alpha * t / (1 + (alpha - 1) * t)


class _Table:
    """The two properties both of ComfyUI's flow model samplings define alike."""

    sigmas: np.ndarray

    @property
    def sigma_min(self):
        return self.sigmas[0]

    @property
    def sigma_max(self):
        return self.sigmas[-1]


class ModelSamplingFlux(_Table):
    def __init__(self, shift=1.15, timesteps=10000):
        self.shift = shift
        self.sigmas = self.sigma(np.arange(1, timesteps + 1, 1, dtype=np.float32) / np.float32(timesteps))

    def timestep(self, sigma):
        return sigma

    def sigma(self, timestep):
        return np.asarray(flux_time_shift(self.shift, 1.0, timestep), dtype=np.float32)


class ModelSamplingDiscreteFlow(_Table):
    def __init__(self, shift=1.0, timesteps=1000, multiplier=1000):
        self.shift, self.multiplier = shift, multiplier
        ts = self.sigma((np.arange(1, timesteps + 1, 1, dtype=np.float32) / np.float32(timesteps)) * multiplier)
        self.sigmas = ts

    def timestep(self, sigma):
        return sigma * self.multiplier

    def sigma(self, timestep):
        return np.asarray(time_snr_shift(self.shift, timestep / self.multiplier), dtype=np.float32)


def flux_node_shift(width: int, height: int, max_shift=1.15, base_shift=0.5) -> float:
    x1, x2 = 256, 4096
    mm = (max_shift - base_shift) / (x2 - x1)
    b = base_shift - mm * x1
    return (width * height / (8 * 8 * 2 * 2)) * mm + b


def model_sampling(config: dict, width: int, height: int):
    """What ComfyUI samples a FLUX.1 checkpoint with: [dev] the ModelSamplingFlux node at the image's size (its
    max/base shift the scheduler config's), [schnell] FluxSchnell's ModelSamplingDiscreteFlow(shift 1, multiplier 1)."""
    if config.get("use_dynamic_shifting"):
        return ModelSamplingFlux(flux_node_shift(width, height, config["max_shift"], config["base_shift"]))
    return ModelSamplingDiscreteFlow(shift=config.get("shift", 1.0), multiplier=1.0)


def simple_scheduler(model_sampling, steps):
    s = model_sampling
    sigs = []
    ss = len(s.sigmas) / steps
    for x in range(steps):
        sigs += [float(s.sigmas[-(1 + int(x * ss))])]
    sigs += [0.0]
    return np.asarray(sigs, dtype=np.float32)


def normal_scheduler(model_sampling, steps, sgm=False, floor=False):
    s = model_sampling
    start = s.timestep(s.sigma_max)
    end = s.timestep(s.sigma_min)
    append_zero = True
    if sgm:
        timesteps = np.linspace(start, end, steps + 1, dtype=np.float32)[:-1]
    else:
        if math.isclose(float(s.sigma(end)), 0, abs_tol=0.00001):
            steps += 1
            append_zero = False
        timesteps = np.linspace(start, end, steps, dtype=np.float32)
    sigs = []
    for x in range(len(timesteps)):
        ts = timesteps[x]
        sigs.append(float(s.sigma(ts)))
    if append_zero:
        sigs += [0.0]
    return np.asarray(sigs, dtype=np.float32)


def beta_scheduler(model_sampling, steps, alpha=0.6, beta=0.6):
    total_timesteps = (len(model_sampling.sigmas) - 1)
    ts = 1 - np.linspace(0, 1, steps, endpoint=False)
    ts = np.rint(scipy.stats.beta.ppf(ts, alpha, beta) * total_timesteps)
    sigs = []
    last_t = -1
    for t in ts:
        if t != last_t:
            sigs += [float(model_sampling.sigmas[int(t)])]
        last_t = t
    sigs += [0.0]
    return np.asarray(sigs, dtype=np.float32)


def get_sigmas_karras(n, sigma_min, sigma_max, rho=7.0):
    ramp = np.linspace(0, 1, n)
    min_inv_rho = sigma_min ** (1 / rho)
    max_inv_rho = sigma_max ** (1 / rho)
    sigmas = (max_inv_rho + ramp * (min_inv_rho - max_inv_rho)) ** rho
    return np.append(sigmas, 0.0).astype(np.float32)


def get_sigmas_exponential(n, sigma_min, sigma_max):
    sigmas = np.exp(np.linspace(math.log(sigma_max), math.log(sigma_min), n))
    return np.append(sigmas, 0.0).astype(np.float32)


def calculate_sigmas(model_sampling, scheduler_name: str, steps: int) -> np.ndarray:
    if scheduler_name == "karras":
        return get_sigmas_karras(steps, float(model_sampling.sigma_min), float(model_sampling.sigma_max))
    if scheduler_name == "exponential":
        return get_sigmas_exponential(steps, float(model_sampling.sigma_min), float(model_sampling.sigma_max))
    if scheduler_name == "normal":
        return normal_scheduler(model_sampling, steps)
    if scheduler_name == "simple":
        return simple_scheduler(model_sampling, steps)
    if scheduler_name == "sgm_uniform":
        return normal_scheduler(model_sampling, steps, sgm=True)
    if scheduler_name == "beta":
        return beta_scheduler(model_sampling, steps)
    raise KeyError(scheduler_name)
