"""Sigma schedules for the k-diffusion samplers: which noise levels the steps visit, from the model's training
schedule. Made on the host (NumPy, float64) when the program is traced: the steps' sigmas are constants of it.

    normal       k-diffusion's DiscreteSchedule.get_sigmas (A1111's "Automatic"/none, ComfyUI's normal):
                 n timesteps evenly from the last training timestep to 0, sigma interpolated in log-sigma
    karras       Karras et al. (2022): sigma^(1/7) evenly from sigma_max to sigma_min
    exponential  log-sigma evenly from sigma_max to sigma_min
    sgm_uniform  ComfyUI's: n + 1 timesteps evenly from the last to the first, the last dropped
    simple       ComfyUI's: every (T / n)-th training sigma, from the top

Each ends with 0, as k-diffusion's do; sigma_min and sigma_max are the model's first and last training sigmas.
"""

from __future__ import annotations

from typing import Any

import numpy as np

SCHEDULES = ("normal", "karras", "exponential", "sgm_uniform", "simple")
# A zero-terminal-SNR schedule's last alphas_cumprod for the k samplers, as A1111's rescale_zero_terminal_snr_abar
# and ComfyUI's ModelSamplingDiscrete(zsnr=True) set it.
ZERO_SNR_LAST = 4.8973451890853435e-08


def training_sigmas(config: Any) -> np.ndarray:
    """The model's (T,) training sigmas, increasing: sqrt((1 - alphas_cumprod) / alphas_cumprod) of its
    scheduler config's beta schedule (``scaled_linear`` for Stable Diffusion, ``linear``)."""
    steps = int(config.get("num_train_timesteps", 1000))
    start, end = float(config.get("beta_start", 0.00085)), float(config.get("beta_end", 0.012))
    kind = config.get("beta_schedule", "scaled_linear")
    if kind == "scaled_linear":
        betas = np.linspace(start**0.5, end**0.5, steps, dtype=np.float64) ** 2
    elif kind == "linear":
        betas = np.linspace(start, end, steps, dtype=np.float64)
    else:
        raise ValueError(f"beta_schedule {kind!r}: the k-diffusion samplers know scaled_linear and linear")
    alphas_cumprod = np.cumprod(1.0 - betas)
    if config.get("rescale_betas_zero_snr", False):  # zero terminal SNR, as A1111 and ComfyUI sample it
        from sdjax_runner.models.schedulers import rescale_zero_terminal_snr

        alphas_cumprod = np.cumprod(1.0 - rescale_zero_terminal_snr(betas))
        alphas_cumprod[-1] = ZERO_SNR_LAST  # a finite largest sigma (~4518)
    return np.sqrt((1.0 - alphas_cumprod) / alphas_cumprod)


def _sigma_at(t: np.ndarray, log_sigmas: np.ndarray) -> np.ndarray:
    """Sigma at fractional timesteps ``t``: log-sigma interpolated between the neighbouring timesteps."""
    low = np.floor(t).astype(int)
    high = np.ceil(t).astype(int)
    weight = t - low
    return np.exp((1 - weight) * log_sigmas[low] + weight * log_sigmas[high])


def schedule(name: str, steps: int, sigmas: np.ndarray, rho: float = 7.0) -> np.ndarray:
    """(steps + 1,) sigmas, decreasing, the last 0."""
    last = len(sigmas) - 1
    low, high = float(sigmas[0]), float(sigmas[-1])
    if name == "normal":
        visited = _sigma_at(np.linspace(last, 0, steps), np.log(sigmas))
    elif name == "karras":
        ramp = np.linspace(0, 1, steps)
        visited = (high ** (1 / rho) + ramp * (low ** (1 / rho) - high ** (1 / rho))) ** rho
    elif name == "exponential":
        visited = np.exp(np.linspace(np.log(high), np.log(low), steps))
    elif name == "sgm_uniform":
        visited = _sigma_at(np.linspace(last, 0, steps + 1)[:-1], np.log(sigmas))
    elif name == "simple":
        stride = len(sigmas) / steps
        visited = np.array([sigmas[-(1 + int(k * stride))] for k in range(steps)])
    else:
        raise KeyError(name)
    return np.append(visited, 0.0)
