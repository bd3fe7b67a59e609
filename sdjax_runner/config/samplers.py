"""Sampler names as users type them, in A1111's and ComfyUI's spellings, resolved to what runs.

``sampler=NAME`` picks a k-diffusion sampler (engine/samplers/k_samplers.py) or one of the diffusers
schedulers; the sigma schedule comes from an A1111 name's suffix (``DPM++ 2M Karras``) or, ComfyUI's way,
from ``scheduler=karras`` (the ``scheduler`` group holds the sigma schedules beside diffusers' schedulers).
Names are matched without regard to case. ``sampler`` left null runs ``scheduler=NAME``'s diffusers
scheduler, as before samplers existed.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from sdjax_runner.config.schema import SCHEDULERS
from sdjax_runner.errors import UserError

# k-diffusion's sampler names (ComfyUI's too); engine/samplers checks its registry against this list.
K_SAMPLERS = ("euler", "euler_ancestral", "heun", "dpm_2", "dpm_2_ancestral", "lms", "dpmpp_2s_ancestral",
              "dpmpp_sde", "dpmpp_2m", "dpmpp_2m_sde", "dpmpp_3m_sde", "lcm", "uni_pc", "uni_pc_bh2")
SCHEDULES = ("normal", "karras", "exponential", "sgm_uniform", "simple")  # engine/samplers/sigmas.py
# A1111's names (its sampler list, with its schedule in a separate field since 1.9; older versions wrote it
# into the name: "DPM++ 2M Karras"). DDIM and PLMS are diffusers' DDIM and PNDM schedulers here.
A1111 = {"Euler": "euler", "Euler a": "euler_ancestral", "Heun": "heun", "DPM2": "dpm_2", "DPM2 a": "dpm_2_ancestral",
         "LMS": "lms", "DPM++ 2S a": "dpmpp_2s_ancestral", "DPM++ SDE": "dpmpp_sde", "DPM++ 2M": "dpmpp_2m",
         "DPM++ 2M SDE": "dpmpp_2m_sde", "DPM++ 3M SDE": "dpmpp_3m_sde", "LCM": "lcm", "UniPC": "uni_pc",
         "DDIM": "ddim", "PLMS": "pndm"}
BY_K_NAME = {k: a for a, k in A1111.items()}  # a k sampler's A1111 name, where A1111 has one
# A1111's UniPC runs the variant its "UniPC variant" setting says (bh1 by default) and writes the setting into
# the infotext when it is not the default: ComfyUI's uni_pc is bh1, uni_pc_bh2 is A1111's UniPC at bh2.
UNIPC_VARIANTS = {"bh1": "uni_pc", "bh2": "uni_pc_bh2"}
BY_K_NAME["uni_pc_bh2"] = "UniPC"
# The schedules' names in A1111's "Schedule type" (its sd_schedulers.py).
A1111_SCHEDULES = {"normal": "Normal", "karras": "Karras", "exponential": "Exponential", "sgm_uniform": "SGM Uniform",
                   "simple": "Simple"}
DIFFUSERS = {"ddim": "ddim", "pndm": "pndm", "plms": "pndm"}  # names that run a diffusers scheduler
MIN_STEPS = {"uni_pc": 2, "uni_pc_bh2": 2}  # UniPC's predictor needs a step to warm up on
# The samplers that take sampling.eta (k-diffusion's eta; DDIM's), and their default.
ETA = {"euler_ancestral": 1.0, "dpm_2_ancestral": 1.0, "dpmpp_2s_ancestral": 1.0, "dpmpp_sde": 1.0,
       "dpmpp_2m_sde": 1.0, "dpmpp_3m_sde": 1.0, "ddim": 0.0}


@dataclass(frozen=True)
class Sampling:
    """What runs: ``sampler`` -- a k-diffusion name, or "scheduler" for diffusers' scheduler ``scheduler``;
    ``sigmas``: the k sampler's sigma schedule (None for a diffusers scheduler)."""

    sampler: str
    scheduler: str
    sigmas: Optional[str]
    eta: Optional[float] = None  # as given (sampling.eta); None: the sampler's default

    @property
    def a1111(self) -> tuple[str, Optional[str]]:
        """(Sampler, Schedule type) as A1111 writes them in a PNG's ``parameters`` (``DPM++ 2M``, ``Karras``).
        A diffusers scheduler keeps its own name (``pndm``) and has no schedule type: it is not A1111's
        sampler of a similar name. ``uni_pc_bh2`` is A1111's ``UniPC`` with the setting :attr:`a1111_settings`
        says. A k sampler A1111 has no name for keeps its own (ComfyUI's), which reads back as itself."""
        if self.sampler == "scheduler":
            return self.scheduler, None
        return BY_K_NAME.get(self.sampler, self.sampler), A1111_SCHEDULES[self.sigmas]

    @property
    def label(self) -> str:
        """What runs, in one name as A1111 spells it (its names before 1.9 carried the schedule): ``DPM++ 2M
        Karras``, ``Euler a`` (the normal schedule is left unsaid), ``UniPC (bh2)``; a diffusers scheduler by
        its own name (``pndm``). The plan line, ``runs list`` and the tracker's ``sampler`` param show it."""
        name, schedule = self.a1111
        text = name if schedule in (None, "Normal") else f"{name} {schedule}"
        return text + "".join(f" ({value})" for value in self.a1111_settings.values())

    @property
    def a1111_settings(self) -> dict[str, str]:
        """The further settings A1111 writes for this sampler: ``UniPC variant: bh2`` (not its default)."""
        return {"UniPC variant": "bh2"} if self.sampler == "uni_pc_bh2" else {}


def allowed() -> str:
    return ", ".join([*A1111, *K_SAMPLERS, "ddim", "pndm"]) + " (A1111 names may end in Karras or Exponential)"


def lookup(name: str) -> tuple[str, Optional[str]]:
    """(k-diffusion name or diffusers scheduler, the schedule the name carries or None)."""
    text = " ".join(name.split()).lower()
    carried = None
    for schedule, suffix in (("karras", " karras"), ("exponential", " exponential")):
        if text.endswith(suffix) and text != suffix.strip():
            text, carried = text[: -len(suffix)], schedule
    by_a1111 = {a.lower(): k for a, k in A1111.items()}
    found = by_a1111.get(text) or (text if text in K_SAMPLERS else None) or DIFFUSERS.get(text)
    if found is None:
        raise UserError("sampler", f"unknown sampler {name!r}", allowed())
    return found, carried


def a1111_name(name: str) -> str:
    """A ``sampler=`` value as :attr:`Sampling.label` spells what it runs, with the schedule the name carries
    (``dpmpp_2m karras`` -> ``DPM++ 2M Karras``; ``PLMS`` -> ``pndm``, the diffusers scheduler it runs); a
    name that is no sampler as it is."""
    return label_of(name, "pndm")  # a diffusers scheduler's name says nothing of the schedule: none is added


def label_of(sampler: Optional[str], scheduler: str) -> str:
    """:attr:`Sampling.label` of a recorded config's ``sampler`` and ``scheduler.name``; where they do not
    resolve (a refused run's), the sampler as given, or the scheduler."""
    try:
        return resolve(sampler, scheduler).label
    except UserError:
        return str(sampler if sampler is not None else scheduler)


def _eta(eta: Optional[float], runs: str, named: str) -> Optional[float]:
    """``sampling.eta`` checked against what runs (a k sampler's name, or a diffusers scheduler's)."""
    if eta is None:
        return None
    if not 0 <= eta <= 1:  # (NaN fails too)
        raise UserError("sampling.eta", f"must be between 0 and 1, got {eta}", "0 (no noise) .. 1 (full), or null")
    if runs not in ETA:
        takers = [a for a, k in A1111.items() if k in ETA]
        raise UserError("sampling.eta", f"{named} adds no noise: eta would change nothing",
                        f"null, or one of the samplers that take it: {', '.join(takers)}")
    return float(eta)


def resolve(sampler: Optional[str], scheduler: str, steps: Optional[int] = None,
            eta: Optional[float] = None) -> Sampling:
    """``sampler``, ``scheduler.name``, the step count and ``sampling.eta`` as given -> what runs; a UserError
    for what does not fit."""
    if sampler is None:
        if scheduler in SCHEDULES:
            raise UserError("scheduler", f"{scheduler} is a sigma schedule of the k-diffusion samplers: pick one "
                            "with sampler=NAME too", f"sampler=dpmpp_2m scheduler={scheduler}, or scheduler="
                            + ", ".join(SCHEDULERS))
        return Sampling("scheduler", scheduler, None, _eta(eta, scheduler, f"scheduler={scheduler}"))
    found, carried = lookup(str(sampler))
    if found in SCHEDULERS:  # DDIM / PLMS: diffusers' own scheduler, with its own timesteps
        if carried or scheduler in SCHEDULES:
            raise UserError("sampler", f"{sampler} steps on its own timesteps and takes no sigma schedule",
                            f"sampler={found} with scheduler={found} (or any diffusers scheduler)")
        return Sampling("scheduler", found, None, _eta(eta, found, str(sampler)))
    if carried and scheduler in SCHEDULES and scheduler != carried:
        raise UserError("scheduler", f"{scheduler}, but sampler={sampler} names the {carried} schedule",
                        f"{carried}, or a sampler name without a schedule")
    if steps is not None and steps < MIN_STEPS.get(found, 1):
        raise UserError("sampling.num_inference_steps", f"{steps}: {sampler} takes at least {MIN_STEPS[found]} steps",
                        f"{MIN_STEPS[found]}, {MIN_STEPS[found] + 1}, ...")
    # A diffusers scheduler name (the experiment's default) says nothing about sigmas: normal.
    return Sampling(found, scheduler, carried or (scheduler if scheduler in SCHEDULES else "normal"),
                    _eta(eta, found, str(sampler)))
