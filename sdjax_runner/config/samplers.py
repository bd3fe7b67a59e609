"""Sampler names as users type them, in A1111's and ComfyUI's spellings, resolved to what runs.

``sampler=NAME`` picks a k-diffusion sampler (engine/samplers/k_samplers.py) or one of the diffusers
schedulers; the sigma schedule comes from an A1111 name's suffix (``DPM++ 2M Karras``) or, ComfyUI's way,
from ``scheduler=karras`` (the ``scheduler`` group holds the sigma schedules beside diffusers' schedulers).
Names are matched without regard to case. ``sampler`` left null runs ``scheduler=NAME``'s diffusers
scheduler, as before samplers existed.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Optional

from sdjax_runner.config.schema import SCHEDULERS
from sdjax_runner.errors import UserError


@dataclass(frozen=True)
class SamplerEntry:
    """Everything the config knows of one k sampler: one entry here, and its function under the same name in
    engine/samplers/k_samplers.py (that registry is checked against this one when it is imported)."""

    name: str  # k-diffusion's and ComfyUI's name: sampler=NAME
    a1111: Optional[str]  # A1111's name (its sampler list); None: A1111 has none, ComfyUI's name is written
    eta: Optional[float] = None  # the default of sampling.eta for a sampler that adds noise; None: takes no eta
    min_steps: int = 1  # fewer steps are refused (UniPC's predictor needs a step to warm up on)
    # ComfyUI's KSampler makes one sigma more for it and drops the next-to-last (DISCARD_PENULTIMATE_SIGMA_SAMPLERS)
    discard_penultimate: bool = False
    # The further A1111 settings that pick it among samplers of the same A1111 name, as A1111 writes them into
    # the infotext when they are not its defaults: ("UniPC variant", "bh2").
    a1111_settings: tuple[tuple[str, str], ...] = ()
    reads_training_sigmas: bool = False  # the engine passes it the model's training sigmas (TCD's landing timesteps)


def _registry(*entries: SamplerEntry) -> dict[str, SamplerEntry]:
    return {entry.name: entry for entry in entries}


SAMPLERS = _registry(
    SamplerEntry("euler", "Euler"),
    SamplerEntry("euler_ancestral", "Euler a", eta=1.0),
    SamplerEntry("heun", "Heun"),
    SamplerEntry("dpm_2", "DPM2"),
    SamplerEntry("dpm_2_ancestral", "DPM2 a", eta=1.0),
    SamplerEntry("lms", "LMS"),
    SamplerEntry("dpmpp_2s_ancestral", "DPM++ 2S a", eta=1.0),
    SamplerEntry("dpmpp_sde", "DPM++ SDE", eta=1.0),
    SamplerEntry("dpmpp_2m", "DPM++ 2M"),
    SamplerEntry("dpmpp_2m_sde", "DPM++ 2M SDE", eta=1.0),
    SamplerEntry("dpmpp_3m_sde", "DPM++ 3M SDE", eta=1.0),
    SamplerEntry("lcm", "LCM"),
    # ComfyUI's (TCD LoRAs' and Hyper-SD's sampler); eta is the paper's gamma (ComfyUI's default 0.3)
    SamplerEntry("tcd", None, eta=0.3, reads_training_sigmas=True),
    # A1111's UniPC runs the variant its "UniPC variant" setting says (bh1 by default): ComfyUI's uni_pc is
    # bh1, uni_pc_bh2 is A1111's UniPC at bh2.
    SamplerEntry("uni_pc", "UniPC", min_steps=2, discard_penultimate=True),
    SamplerEntry("uni_pc_bh2", "UniPC", min_steps=2, discard_penultimate=True,
                 a1111_settings=(("UniPC variant", "bh2"),)),
)
# A1111's names for diffusers' own schedulers, which step on their own timesteps (sampler=DDIM runs scheduler=ddim),
# and the eta of the one that takes it.
A1111_SCHEDULERS = {"DDIM": "ddim", "PLMS": "pndm"}
SCHEDULER_ETA = {"ddim": 0.0}
SCHEDULES = ("normal", "karras", "exponential", "sgm_uniform", "simple")  # engine/samplers/sigmas.py
# The schedules' names in A1111's "Schedule type" (its sd_schedulers.py); older versions wrote the schedule
# into the sampler's name: "DPM++ 2M Karras".
A1111_SCHEDULES = {"normal": "Normal", "karras": "Karras", "exponential": "Exponential", "sgm_uniform": "SGM Uniform",
                   "simple": "Simple", "beta": "Beta"}

# Read off the registry (the lookups below and other modules use these).
K_SAMPLERS = tuple(SAMPLERS)
A1111 = {**{e.a1111: e.name for e in SAMPLERS.values() if e.a1111 and not e.a1111_settings}, **A1111_SCHEDULERS}
BY_K_NAME = {e.name: e.a1111 for e in SAMPLERS.values() if e.a1111}  # a k sampler's A1111 name, where it has one
UNIPC_VARIANTS = {"bh1": "uni_pc", **{value: e.name for e in SAMPLERS.values()
                                      for setting, value in e.a1111_settings if setting == "UniPC variant"}}
MIN_STEPS = {e.name: e.min_steps for e in SAMPLERS.values() if e.min_steps > 1}
ETA = {**{e.name: e.eta for e in SAMPLERS.values() if e.eta is not None}, **SCHEDULER_ETA}
DIFFUSERS = {"ddim": "ddim", "pndm": "pndm", "plms": "pndm"}  # names that run a diffusers scheduler


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
        if self.sigmas is None:  # FLUX.1's Euler on the model's own flow schedule (resolve_flow): no schedule type
            return BY_K_NAME.get(self.sampler, self.sampler), None
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
        entry = SAMPLERS.get(self.sampler)
        return dict(entry.a1111_settings) if entry else {}


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


def label_of(sampler: Optional[str], scheduler: str, resolver: Optional[Callable[..., Sampling]] = None) -> str:
    """:attr:`Sampling.label` of a recorded config's ``sampler`` and ``scheduler.name``, as ``resolver`` (the model
    family's: config/families.py; default the SD family's :func:`resolve`) reads them; where they do not
    resolve (a refused run's), the sampler as given, or the scheduler."""
    try:
        return (resolver or resolve)(sampler, scheduler).label
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
    """``sampler``, ``scheduler.name``, the step count and ``sampling.eta`` as given -> what runs, for the SD
    family; a UserError for what does not fit."""
    if scheduler == FLOW_SCHEDULER:
        raise UserError("scheduler", f"{FLOW_SCHEDULER} is FLUX.1's scheduler; Stable Diffusion runs diffusers' "
                        "noise schedulers", ", ".join(SCHEDULERS))
    if scheduler in FLOW_ONLY_SCHEDULES:
        raise UserError("scheduler", f"{scheduler}: ComfyUI's {scheduler} schedule runs for FLUX.1's k samplers so "
                        "far", ", ".join(SCHEDULES))
    if sampler is None:
        if scheduler in SCHEDULES:
            raise UserError("scheduler", f"{scheduler} is a sigma schedule of the k-diffusion samplers: pick one "
                            "with sampler=NAME too", f"sampler=dpmpp_2m scheduler={scheduler}, or scheduler="
                            + ", ".join(SCHEDULERS))
        return Sampling("scheduler", scheduler, None, _eta(eta, scheduler, f"scheduler={scheduler}"))
    found, carried = lookup(str(sampler))
    # DDIM / PLMS: diffusers' own scheduler, with its own timesteps. (Euler and LMS are k samplers here, as A1111
    # and ComfyUI run them, though diffusers has schedulers of those names: scheduler=euler runs diffusers'.)
    if found not in SAMPLERS:
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


# FLUX.1's own scheduler (diffusers' FlowMatchEulerDiscreteScheduler; families/flux/engine/stages.py steps it).
FLOW_SCHEDULER = "flow_match_euler"
# The scheduler names that leave FLUX.1 on its own schedule: its own, or the root config's default (pndm), which
# names the SD family's scheduler and is read as "the model's own" for FLUX.1.
FLOW_SCHEDULER_NAMES = (FLOW_SCHEDULER, "pndm")
# The k samplers FLUX.1 runs as ComfyUI runs them on flow models (families/flux/engine/sigmas.py): the deterministic ones
# (ComfyUI gives the ancestral and SDE samplers their own rectified-flow variants, not run here), on ComfyUI's
# schedules over the model's flow sigmas; without a schedule named, simple (ComfyUI's FLUX workflows', Forge's).
FLOW_K_SAMPLERS = ("euler", "heun", "dpmpp_2m", "lms")
FLOW_SCHEDULES = ("simple", "normal", "sgm_uniform", "karras", "exponential", "beta")
FLOW_ONLY_SCHEDULES = tuple(name for name in FLOW_SCHEDULES if name not in SCHEDULES)
FLOW_DEFAULT_SCHEDULE = "simple"


def resolve_flow(sampler: Optional[str], scheduler: str, steps: Optional[int] = None,
                 eta: Optional[float] = None) -> Sampling:
    """What runs for a flow model (FLUX.1, SD 3): with ``sampler`` null, or euler and no schedule, the flow-matching
    Euler on the model's own schedule (diffusers' FluxPipeline / StableDiffusion3Pipeline); a k sampler of :data:`FLOW_K_SAMPLERS` on a ComfyUI schedule (from
    ``scheduler``, the name's suffix, else simple); anything else refused in one line."""
    if eta is not None:
        raise UserError("sampling.eta", "the flow models' samplers (FLUX.1, SD 3) add no noise: eta would change "
                        "nothing", "null")
    if scheduler not in FLOW_SCHEDULER_NAMES + FLOW_SCHEDULES:
        raise UserError("scheduler", f"{scheduler}: the flow models (FLUX.1, SD 3) step with their own {FLOW_SCHEDULER} (diffusers' "
                        "FlowMatchEulerDiscreteScheduler, as its folder's scheduler/ says) or a k sampler on one of "
                        "ComfyUI's schedules", ", ".join((FLOW_SCHEDULER, *FLOW_SCHEDULES)))
    schedule = scheduler if scheduler in FLOW_SCHEDULES else None
    found, carried = lookup(str(sampler)) if sampler is not None else ("euler", None)
    if found not in FLOW_K_SAMPLERS:
        raise UserError("sampler", f"{sampler}: the flow models (FLUX.1, SD 3) run {', '.join(FLOW_K_SAMPLERS)} (ComfyUI's flow-model "
                        "sampling)", ", ".join(FLOW_K_SAMPLERS) + ", or null")
    if carried and schedule and carried != schedule:
        raise UserError("scheduler", f"{scheduler}, but sampler={sampler} names the {carried} schedule",
                        f"{carried}, or a sampler name without a schedule")
    schedule = carried or schedule
    if found == "euler" and schedule is None:
        return Sampling("euler", FLOW_SCHEDULER, None)  # diffusers' FlowMatchEulerDiscreteScheduler
    return Sampling(found, FLOW_SCHEDULER, schedule or FLOW_DEFAULT_SCHEDULE)
