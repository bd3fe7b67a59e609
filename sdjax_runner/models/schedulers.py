"""The schedulers a run can select, built from the model's own scheduler config."""

from __future__ import annotations

from typing import Any

from sdjax_runner.config.schema import SCHEDULERS as NAMES
from sdjax_runner.errors import UserError

# scheduler.name -> the Flax scheduler class. diffusers 0.39's LMS and DDPM cannot run in the
# pipeline's jitted loop; the project's own (sdjax_runner.models.traced_schedulers) replace them.
SCHEDULERS = {
    "pndm": "diffusers:FlaxPNDMScheduler",
    "ddim": "diffusers:FlaxDDIMScheduler",
    "lms": "sdjax_runner.models.traced_schedulers:LMSScheduler",
    "dpm_solver_pp": "diffusers:FlaxDPMSolverMultistepScheduler",
    "euler": "diffusers:FlaxEulerDiscreteScheduler",
    "ddpm": "sdjax_runner.models.traced_schedulers:DDPMScheduler",
}
if set(SCHEDULERS) != set(NAMES):  # config/schema.py names them for the checks
    raise RuntimeError(f"models/schedulers.py runs {sorted(SCHEDULERS)}, config/schema.py lists {sorted(NAMES)}")


def scheduler_class(name: str):
    if name not in SCHEDULERS:
        raise UserError("scheduler.name", f"unknown scheduler {name!r}", sorted(SCHEDULERS))
    import importlib

    module, cls = SCHEDULERS[name].split(":")
    return getattr(importlib.import_module(module), cls)


def build_scheduler(name: str, overrides: dict[str, Any], model_path: str):
    """(scheduler, fp32 state) from the model's scheduler/ config with ``overrides`` applied."""
    cls = scheduler_class(name)
    config = cls.load_config(model_path, subfolder="scheduler")
    betas_in_order({**config, **overrides}, overrides)
    scheduler = cls.from_config(config, **overrides)
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
