"""The schedulers a run can select, built from the model's own scheduler config."""

from __future__ import annotations

from typing import Any

from sdjax_runner.config.checks import ZERO_SNR, ZERO_SNR_KEY
from sdjax_runner.config.schema import SCHEDULERS as NAMES
from sdjax_runner.errors import UserError

# scheduler.name -> the Flax scheduler class. diffusers 0.39's LMS and DDPM cannot run in the
# pipeline's jitted loop; the project's own (sdjax_runner.models.traced_schedulers) replace them, and its DDIM and
# Euler add diffusers' PyTorch timestep spacings (trailing) to the Flax ones; its LCM is diffusers' PyTorch one.
SCHEDULERS = {
    "pndm": "diffusers:FlaxPNDMScheduler",
    "ddim": "sdjax_runner.models.traced_schedulers:DDIMScheduler",
    "lms": "sdjax_runner.models.traced_schedulers:LMSScheduler",
    "dpm_solver_pp": "diffusers:FlaxDPMSolverMultistepScheduler",
    "euler": "sdjax_runner.models.traced_schedulers:EulerScheduler",
    "ddpm": "sdjax_runner.models.traced_schedulers:DDPMScheduler",
    "lcm": "sdjax_runner.models.traced_schedulers:LCMScheduler",
}
if set(SCHEDULERS) != set(NAMES):  # config/schema.py names them for the checks
    raise RuntimeError(f"models/schedulers.py runs {sorted(SCHEDULERS)}, config/schema.py lists {sorted(NAMES)}")


def scheduler_class(name: str):
    if name not in SCHEDULERS:
        raise UserError("scheduler.name", f"unknown scheduler {name!r}", sorted(SCHEDULERS))
    import importlib

    module, cls = SCHEDULERS[name].split(":")
    return getattr(importlib.import_module(module), cls)


# Zero terminal SNR (``rescale_betas_zero_snr``, diffusers' PyTorch schedulers' setting, which its Flax ones lack;
# config/checks.ZERO_SNR: the schedulers that take it): those whose last alphas_cumprod diffusers then sets to 2**-24
# (their sigmas would be infinite), as its PyTorch EulerDiscreteScheduler and DPMSolverMultistepScheduler do.
ZERO_SNR_FLOORED = ("euler", "dpm_solver_pp")


def build_scheduler(name: str, overrides: dict[str, Any], model_path: str):
    """(scheduler, fp32 state) from the model's scheduler/ config with ``overrides`` applied; with
    ``rescale_betas_zero_snr`` (the config's or an override) its betas rescaled to zero terminal SNR."""
    cls = scheduler_class(name)
    config = cls.load_config(model_path, subfolder="scheduler")
    overrides = dict(overrides)
    zero_snr = bool(overrides.pop(ZERO_SNR_KEY, config.get(ZERO_SNR_KEY, False)))
    spacing = overrides.pop("timestep_spacing", config.get("timestep_spacing")) if name == "ddim" else None
    betas_in_order({**config, **overrides}, overrides)
    scheduler = cls.from_config({k: v for k, v in config.items() if k != ZERO_SNR_KEY}, **overrides)
    if spacing is not None:  # diffusers' Flax DDIM has no such setting; the runner's reads it (traced_schedulers.py)
        scheduler.register_to_config(timestep_spacing=spacing)
    if not zero_snr:
        return scheduler, scheduler.create_state()
    if name not in ZERO_SNR:
        raise UserError(f"scheduler.config_overrides.{ZERO_SNR_KEY}", f"true: diffusers' {name} scheduler has no zero "
                        "terminal SNR (the model's scheduler config, or the override, asks for it)",
                        f"scheduler={' / '.join(ZERO_SNR)}, or a k sampler (sampler=euler, ...)")
    scheduler.register_to_config(**{ZERO_SNR_KEY: True})  # what the k samplers' sigmas read (engine/samplers/sigmas.py)
    return scheduler, scheduler.create_state(zero_terminal_snr_state(scheduler, floored=name in ZERO_SNR_FLOORED))


def rescale_zero_terminal_snr(betas):
    """diffusers' ``rescale_zero_terminal_snr`` (Lin et al. 2023, algorithm 1): sqrt(alphas_cumprod) shifted so the
    last is 0 and scaled so the first is unchanged, back to betas (NumPy, float64)."""
    import numpy as np

    alphas_bar_sqrt = np.sqrt(np.cumprod(1.0 - np.asarray(betas, np.float64)))
    first, last = alphas_bar_sqrt[0], alphas_bar_sqrt[-1]
    alphas_bar_sqrt = (alphas_bar_sqrt - last) * (first / (first - last))
    alphas_bar = alphas_bar_sqrt**2
    alphas = np.concatenate([alphas_bar[:1], alphas_bar[1:] / alphas_bar[:-1]])
    return 1 - alphas


def zero_terminal_snr_state(scheduler: Any, floored: bool) -> Any:
    """The scheduler's CommonSchedulerState with its betas rescaled to zero terminal SNR; ``floored``: the last
    alphas_cumprod 2**-24 instead of 0."""
    import jax.numpy as jnp
    import numpy as np
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


def betas_in_order(settings: dict[str, Any], overrides: dict[str, Any]) -> None:
    """An overridden beta_start above the model's beta_end (or beta_end below its beta_start) makes NaN images:
    refused once the model's scheduler config is read (config/checks.py checks the overrides alone)."""
    start, end = settings.get("beta_start"), settings.get("beta_end")
    if start is None or end is None or start <= end or not {"beta_start", "beta_end"} & set(overrides):
        return
    if "beta_start" in overrides:
        raise UserError("scheduler.config_overrides.beta_start", f"{start} is above the model's beta_end {end}",
                        f"a beta_start from 0 to {end}")
    raise UserError("scheduler.config_overrides.beta_end", f"{end} is below the model's beta_start {start}",
                    f"a beta_end from {start} up to (not including) 1")
