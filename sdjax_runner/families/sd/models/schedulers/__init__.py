"""The Stable Diffusion schedulers, the runner's own (issue #60): diffusers 0.39's Flax schedulers step for step --
the same arithmetic in the same order, so the same images bit for bit (tests/test_own_schedulers.py) -- with what
the runner added to them (tests/helpers/traced_schedulers.py keeps its former code, a reference): LMS and DDPM
that run in a jitted loop, DDIM and Euler
with diffusers' PyTorch timestep spacings, and LCM. No diffusers import.

    pndm.py        PNDMScheduler                diffusers' FlaxPNDMScheduler (PLMS; PRK if skip_prk_steps is false)
    ddim.py        DDIMScheduler                FlaxDDIMScheduler, with timestep_spacing
                   LCMScheduler                 diffusers' PyTorch LCMScheduler (its state DDIM's)
    ddpm.py        DDPMScheduler                FlaxDDPMScheduler's timesteps, stepped as its PyTorch one steps
    discrete.py    EulerDiscreteScheduler       FlaxEulerDiscreteScheduler, with trailing spacing
                   LMSDiscreteScheduler         FlaxLMSDiscreteScheduler's schedule, stepped in the traced loop
    dpm_solver.py  DPMSolverMultistepScheduler  FlaxDPMSolverMultistepScheduler
    common.py      what they share: CommonState (the training schedule), the config, zero terminal SNR

The interface (the one the engine drives diffusers' Flax schedulers by; :mod:`.common`):

* Building: ``Cls(**settings, dtype=jnp.float32)``; ``Cls.from_config(config_dict, **overrides)`` from a
  ``scheduler_config.json`` dict (diffusers' keys; keys the class does not take -- ``_class_name``, another
  scheduler's or the PyTorch schedulers' settings -- are ignored, as diffusers' Flax schedulers ignore them);
  ``Cls.load_config(folder, subfolder="scheduler")`` (the JSON as a dict); ``Cls.from_pretrained(folder,
  subfolder=...)`` -> (scheduler, state). ``Cls.SETTINGS``: the keys taken and their defaults (diffusers'
  ``__init__`` defaults). :data:`SCHEDULER_CLASSES`: a published ``_class_name`` (PyTorch or Flax) -> the class.
* ``scheduler.config``: every setting, readable as keys and attributes (``config.num_train_timesteps``,
  ``config.get("prediction_type")``), ``_class_name`` the class's; ``scheduler.register_to_config(**values)`` sets
  values (a setting takes effect from then on); ``scheduler.dtype``.
* ``scheduler.create_state(common=None)`` -> the state (a ``flax.struct`` pytree, passed into jitted functions):
  ``common`` (:class:`CommonState`: ``alphas``, ``betas``, ``alphas_cumprod``, by ``beta_schedule`` linear,
  scaled_linear or squaredcos_cap_v2, or ``trained_betas``; pass one to run another schedule -- the runner's zero
  terminal SNR), ``init_noise_sigma``, ``timesteps`` (every training timestep) and the scheduler's own fields.
  ``rescale_betas_zero_snr`` (DDIM, DDPM, Euler, DPM-Solver) rescales ``common`` itself (:func:`zero_terminal_snr`;
  Euler's and DPM-Solver's floored at 2**-24).
* ``scheduler.set_timesteps(state, num_inference_steps, shape=())`` -> the state for a run of that many steps
  (``timesteps``, ``num_inference_steps``; ``shape``: the sample's, for the multistep buffers). Traceable.
* In the loop (``jax.lax.fori_loop``), at ``t = timesteps[i]`` (int32): ``scale_model_input(state, sample, t)``,
  then ``step(state, model_output, t, sample)`` -> :class:`SchedulerOutput` (``prev_sample``, ``state``;
  ``.to_tuple()``; ``return_dict=False``: the tuple). DDIM's takes ``eta`` (and has ``_get_variance(state, t,
  prev_t)``, which the engine's DDIM-with-eta step reads); DDPM's and LCM's take ``key``.
* ``add_noise(state, original_samples, noise, timesteps)`` (one timestep per image): the forward process. Euler's
  and LMS's states hold ``sigmas`` (their ``add_noise`` indexes sigmas by the timestep, as diffusers' Flax ones do;
  the engine noises by ``sigmas[index]`` when a state has them). DDIM's and DDPM's ``get_velocity``.

Where they are not diffusers' Flax schedulers: DDPM, LMS and LCM are the runner's (tests/helpers/traced_schedulers.py,
diffusers' Flax DDPM and LMS cannot run in the jitted loop, it has no Flax LCM); DDIM's ``timestep_spacing``,
Euler's ``trailing`` and the zero-terminal-SNR setting are the runner's additions; DPM-Solver's dynamic thresholding
(which fails in diffusers' Flax scheduler) is its PyTorch scheduler's, and its ``steps_offset`` (which diffusers'
reads from the config without taking it) a setting. ``config`` holds the settings and ``_class_name`` only, not the
file's other keys; ``Cls(unknown=...)`` is a TypeError, an unknown beta schedule or solver a ValueError.
"""

from __future__ import annotations

from sdjax_runner.families.sd.models.schedulers.common import (
    CommonState,
    Scheduler,
    SchedulerOutput,
    rescale_zero_terminal_snr,
    zero_terminal_snr,
)
from sdjax_runner.families.sd.models.schedulers.ddim import DDIMScheduler, DDIMState, LCMScheduler, lcm_timesteps
from sdjax_runner.families.sd.models.schedulers.ddpm import DDPMScheduler, DDPMState
from sdjax_runner.families.sd.models.schedulers.discrete import (
    EulerDiscreteScheduler,
    EulerState,
    LMSDiscreteScheduler,
    LMSState,
)
from sdjax_runner.families.sd.models.schedulers.dpm_solver import DPMSolverMultistepScheduler, DPMSolverState
from sdjax_runner.families.sd.models.schedulers.pndm import PNDMScheduler, PNDMState

_CLASSES: tuple[type[Scheduler], ...] = (PNDMScheduler, DDIMScheduler, LCMScheduler, DDPMScheduler,
                                         EulerDiscreteScheduler, LMSDiscreteScheduler, DPMSolverMultistepScheduler)
# A scheduler config's ``_class_name`` (diffusers' PyTorch name, or its Flax one) -> the class.
SCHEDULER_CLASSES: dict[str, type[Scheduler]] = {
    **{cls.__name__: cls for cls in _CLASSES},
    **{f"Flax{cls.__name__}": cls for cls in _CLASSES if cls is not LCMScheduler},  # (diffusers has no Flax LCM)
}

__all__ = ["SCHEDULER_CLASSES", "CommonState", "DDIMScheduler", "DDIMState", "DDPMScheduler", "DDPMState",
           "DPMSolverMultistepScheduler", "DPMSolverState", "EulerDiscreteScheduler", "EulerState", "LCMScheduler",
           "LMSDiscreteScheduler", "LMSState", "PNDMScheduler", "PNDMState", "Scheduler", "SchedulerOutput",
           "lcm_timesteps", "rescale_zero_terminal_snr", "zero_terminal_snr"]
