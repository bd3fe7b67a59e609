"""The sigmas FLUX.1's k samplers visit, as ComfyUI makes them for flow models (``comfy/model_sampling.py``,
``comfy/samplers.py``; made on the host in float32, as ComfyUI's torch code computes them, and constants of
the program).

ComfyUI's model sampling of a flow model is a table of sigmas over ``(1..T) / T`` and two maps between a
sigma and the model's timestep. FLUX.1 [dev] (dynamic shifting in its scheduler config) is
``ModelSamplingFlux`` as ComfyUI's ``ModelSamplingFlux`` node sets it for the image's size -- ``sigma(t) =
exp(mu) / (exp(mu) + 1/t - 1)`` with ``mu`` the resolution-dependent shift diffusers calls ``calculate_shift``
(the node's ``width * height / (8 * 8 * 2 * 2)`` tokens, its ``base_shift``/``max_shift`` the scheduler
config's), T = 10000, ``timestep(sigma) = sigma``; [schnell] (a fixed ``shift``) is ``ModelSamplingDiscreteFlow``
with multiplier 1 -- ``sigma(t) = shift t / (1 + (shift - 1) t)``, T = 1000 -- as ComfyUI's FluxSchnell model
config asks. The schedules pick ``steps`` sigmas from them, then 0:

    simple       every (T / n)-th table sigma, from the top
    normal       n timesteps evenly from timestep(sigma_max) to timestep(sigma_min), each through sigma(t)
    sgm_uniform  n + 1 such timesteps, the last dropped
    karras       k-diffusion's get_sigmas_karras between the table's ends (rho 7)
    exponential  k-diffusion's get_sigmas_exponential between them
    beta         the table at Beta(0.6, 0.6) quantiles (arXiv 2407.12173), repeated timesteps dropped
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from sdjax_runner.families.flux.engine.stages import image_seq_len, shift_mu


def flow_model(config: dict[str, Any], height: int, width: int, vae_scale_factor: int):
    """(table of T sigmas, increasing, float32; sigma(t) for a float32 array of timesteps) of ComfyUI's model
    sampling for a FLUX.1 scheduler ``config`` at ``height`` x ``width`` (module docstring)."""
    if config.get("use_dynamic_shifting", False):
        return exponential_model(shift_mu(image_seq_len(height, width, vae_scale_factor), config))
    shift = np.float32(config.get("shift", 1.0))

    def sigma(t: np.ndarray) -> np.ndarray:
        if shift == 1.0:
            return t.astype(np.float32)
        return (shift * t / (np.float32(1) + (shift - np.float32(1)) * t)).astype(np.float32)

    table = sigma(np.arange(1, 1001, dtype=np.float32) / np.float32(1000))
    return table, sigma


def exponential_model(mu: float):
    """(table, sigma(t)) of ComfyUI's ModelSamplingFlux for the shift ``mu``: ``sigma(t) = exp(mu) / (exp(mu) + 1/t -
    1)`` in float32 over T = 10000 (FLUX.1 [dev]'s ``calculate_shift``; FLUX.2's ``compute_empirical_mu``)."""
    scale = np.float32(math.exp(mu))

    def sigma(t: np.ndarray) -> np.ndarray:
        return (scale / (scale + (np.float32(1) / t - np.float32(1)))).astype(np.float32)

    return sigma(np.arange(1, 10001, dtype=np.float32) / np.float32(10000)), sigma


def schedule(name: str, steps: int, table: np.ndarray, sigma) -> np.ndarray:
    """(steps + 1,) float32 sigmas, decreasing, the last 0 (beta: fewer where quantiles repeat a timestep)."""
    low, high = float(table[0]), float(table[-1])
    if name == "simple":
        stride = len(table) / steps
        visited = np.array([table[-(1 + int(k * stride))] for k in range(steps)], np.float32)
    elif name in ("normal", "sgm_uniform"):
        start, end = np.float32(high), np.float32(low)  # timestep(sigma) = sigma
        if name == "sgm_uniform":
            timesteps = np.linspace(start, end, steps + 1, dtype=np.float32)[:-1]
        elif math.isclose(float(sigma(np.array([end], np.float32))[0]), 0, abs_tol=1e-5):
            return sigma(np.linspace(start, end, steps + 1, dtype=np.float32))  # its last sigma is the zero
        else:
            timesteps = np.linspace(start, end, steps, dtype=np.float32)
        visited = sigma(timesteps)
    elif name == "karras":
        ramp = np.linspace(0, 1, steps)
        visited = ((high ** (1 / 7) + ramp * (low ** (1 / 7) - high ** (1 / 7))) ** 7).astype(np.float32)
    elif name == "exponential":
        visited = np.exp(np.linspace(math.log(high), math.log(low), steps)).astype(np.float32)
    elif name == "beta":
        from scipy.stats import beta

        positions = np.rint(beta.ppf(1 - np.linspace(0, 1, steps, endpoint=False), 0.6, 0.6) * (len(table) - 1))
        kept = [int(t) for i, t in enumerate(positions) if i == 0 or t != positions[i - 1]]
        visited = table[kept]
    else:
        raise KeyError(name)
    return np.append(visited, np.float32(0)).astype(np.float32)
