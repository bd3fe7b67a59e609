"""The schedulers a run can select, built from the model's own scheduler config."""

from __future__ import annotations

import inspect
from typing import Any

from sdjax_runner.errors import UserError

# scheduler.name -> diffusers Flax class name. Two of diffusers 0.39's Flax schedulers cannot
# run in the pipeline's jitted loop here: FlaxLMSDiscreteScheduler keeps a Python list of
# derivatives and integrates its coefficients with SciPy per step (not traceable), and
# FlaxDDPMScheduler calls jnp.clip(a_min=...), which JAX 0.10 removed.
SCHEDULERS = {
    "pndm": "FlaxPNDMScheduler",
    "ddim": "FlaxDDIMScheduler",
    "dpm_solver_pp": "FlaxDPMSolverMultistepScheduler",
    "euler": "FlaxEulerDiscreteScheduler",
}


def scheduler_class(name: str):
    if name not in SCHEDULERS:
        raise UserError("scheduler.name", f"unknown scheduler {name!r}", sorted(SCHEDULERS))
    import diffusers

    return getattr(diffusers, SCHEDULERS[name])


def check_overrides(name: str, overrides: dict[str, Any]) -> None:
    """Reject override keys the scheduler does not take, before anything loads."""
    accepted = [p for p in inspect.signature(scheduler_class(name).__init__).parameters if p not in ("self", "dtype")]
    for key in overrides:
        if key not in accepted:
            raise UserError(f"scheduler.config_overrides.{key}", f"not a {name} setting", accepted)


def build_scheduler(name: str, overrides: dict[str, Any], model_path: str, revision: str | None):
    """(scheduler, fp32 state) from the model's scheduler/ config with ``overrides`` applied."""
    cls = scheduler_class(name)
    config = cls.load_config(model_path, subfolder="scheduler", revision=revision)
    scheduler = cls.from_config(config, **overrides)
    return scheduler, scheduler.create_state()
