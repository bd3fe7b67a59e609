"""The schedulers a run can select, built from the model's own scheduler config."""

from __future__ import annotations

from typing import Any

from sdjax_runner.config.checks import SCHEDULER_SETTINGS, ZERO_SNR, ZERO_SNR_KEY
from sdjax_runner.config.schema import SCHEDULERS as NAMES
from sdjax_runner.errors import UserError
from sdjax_runner.families.sd.models.schedulers import (
    DDIMScheduler,
    DDPMScheduler,
    DPMSolverMultistepScheduler,
    EulerDiscreteScheduler,
    LCMScheduler,
    LMSDiscreteScheduler,
    PNDMScheduler,
    Scheduler,
)
from sdjax_runner.families.sd.models.schedulers.common import rescale_zero_terminal_snr

__all__ = ["SCHEDULERS", "build_scheduler", "rescale_zero_terminal_snr", "scheduler_class"]

# scheduler.name -> the runner's scheduler (families/sd/models/schedulers: diffusers 0.39's Flax schedulers step for step;
# DDPM, LMS and LCM as the jitted loop runs them, DDIM's and Euler's trailing spacings, zero terminal SNR).
SCHEDULERS = {
    "pndm": PNDMScheduler,
    "ddim": DDIMScheduler,
    "lms": LMSDiscreteScheduler,
    "dpm_solver_pp": DPMSolverMultistepScheduler,
    "euler": EulerDiscreteScheduler,
    "ddpm": DDPMScheduler,
    "lcm": LCMScheduler,
}
if set(SCHEDULERS) != set(NAMES):  # config/schema.py names them for the checks
    raise RuntimeError(f"models/schedulers.py runs {sorted(SCHEDULERS)}, config/schema.py lists {sorted(NAMES)}")
for _name, _cls in SCHEDULERS.items():  # config/checks.py refuses the overrides a scheduler does not take
    if list(_cls.SETTINGS) != list(SCHEDULER_SETTINGS[_name]):
        raise RuntimeError(f"{_cls.__name__} takes {list(_cls.SETTINGS)}, config/checks.py allows "
                           f"{list(SCHEDULER_SETTINGS[_name])}")


def scheduler_class(name: str) -> type[Scheduler]:
    if name not in SCHEDULERS:
        raise UserError("scheduler.name", f"unknown scheduler {name!r}", sorted(SCHEDULERS))
    return SCHEDULERS[name]


def build_scheduler(name: str, overrides: dict[str, Any], model_path: str):
    """(scheduler, fp32 state) from the model's scheduler/ config with ``overrides`` applied; with
    ``rescale_betas_zero_snr`` (the config's or an override) its betas rescaled to zero terminal SNR (the last
    alphas_cumprod floored at 2**-24 for Euler and DPM-Solver, as diffusers' PyTorch ones do)."""
    cls = scheduler_class(name)
    config = cls.load_config(model_path, subfolder="scheduler")
    overrides = dict(overrides)
    zero_snr = bool(overrides.pop(ZERO_SNR_KEY, config.get(ZERO_SNR_KEY, False)))
    betas_in_order({**config, **overrides}, overrides)
    if zero_snr and name not in ZERO_SNR:
        raise UserError(f"scheduler.config_overrides.{ZERO_SNR_KEY}", f"true: diffusers' {name} scheduler has no zero "
                        "terminal SNR (the model's scheduler config, or the override, asks for it)",
                        f"scheduler={' / '.join(ZERO_SNR)}, or a k sampler (sampler=euler, ...)")
    if name in ZERO_SNR:
        overrides[ZERO_SNR_KEY] = zero_snr
    scheduler = cls.from_config({k: v for k, v in config.items() if k != ZERO_SNR_KEY}, **overrides)
    return scheduler, scheduler.create_state()


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
