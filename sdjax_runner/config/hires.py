"""A1111's "Hires. fix" (``sampling.hires.*``): what the second pass is, checked, as the plan holds it.

A text-to-image job with ``sampling.hires.scale`` makes its images at ``sampling.height`` x ``width``, upscales
them to ``int(side * scale)`` and denoises them again there, image to image (engine/hires.py runs both passes in
one program). The second pass counts its steps as A1111's ``setup_img2img_steps`` does for a pass given its steps
(``hr_second_pass_steps or steps``): ``steps`` run, at the end of a schedule of ``int(steps / min(strength,
0.999))``. :data:`A1111_UPSCALERS` holds A1111's names of the upscalers (its infotext's ``Hires upscaler``)."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Optional

from sdjax_runner.config.samplers import MIN_STEPS, Sampling, lookup, resolve
from sdjax_runner.config.schema import HiresUpscaler
from sdjax_runner.errors import UserError

# Our names -> A1111's (its shared.latent_upscale_modes, and its Lanczos upscaler).
A1111_UPSCALERS = {"latent": "Latent", "latent_antialiased": "Latent (antialiased)",
                   "latent_bicubic": "Latent (bicubic)", "latent_bicubic_antialiased": "Latent (bicubic antialiased)",
                   "latent_nearest": "Latent (nearest)", "latent_nearest_exact": "Latent (nearest-exact)",
                   "lanczos": "Lanczos"}
if tuple(A1111_UPSCALERS) != tuple(HiresUpscaler.__members__):
    raise RuntimeError(f"config/hires.py names {tuple(A1111_UPSCALERS)}, the schema's HiresUpscaler "
                       f"{tuple(HiresUpscaler.__members__)}")
MAX_SCALE = 4.0  # A1111's slider's end
MAX_SCHEDULE = 1000  # the schedulers' num_train_timesteps: the longest schedule a pass steps along


@dataclass(frozen=True)
class Hires:
    """The second pass of a job, as the plan holds it."""

    scale: float  # sampling.hires.scale
    steps: int  # the steps it runs (sampling.hires.steps, else sampling.num_inference_steps)
    strength: float  # sampling.hires.denoising_strength
    upscaler: str  # a HiresUpscaler name
    sampling: Optional[Sampling] = None  # sampling.hires.sampler resolved (a k sampler); None: the run's sampler
    guidance: Optional[float] = None  # sampling.hires.guidance_scale; None: the run's guidance

    @property
    def schedule(self) -> int:
        """The steps of the schedule the pass runs the end of: A1111's ``int(steps / min(strength, 0.999))``."""
        return int(self.steps / min(self.strength, 0.999))

    @property
    def start(self) -> int:
        """The schedule's step the pass starts at (A1111's ``sigmas[steps - t_enc - 1:]``, t_enc = steps - 1)."""
        return self.schedule - self.steps

    def size(self, height: int, width: int) -> tuple[int, int]:
        """The upscaled size, (height, width): A1111's ``int(side * hr_scale)``."""
        return int(height * self.scale), int(width * self.scale)

    @property
    def a1111_upscaler(self) -> str:
        return A1111_UPSCALERS[self.upscaler]


def check(cfg: Any, family: Any, sampler: str, max_size: int) -> Optional[Hires]:
    """``sampling.hires`` of the typed config ``cfg`` (its steps filled in: config/families.with_defaults), with
    ``family`` (a config/families.FamilyEntry), ``sampler`` (the resolved sampler's name) and ``max_size`` (the
    longest side a run may have): the second pass, or None where none is asked for. Its values are refused in one
    line each."""
    hires = cfg.sampling.hires
    if hires.scale is None:
        return None
    _runs_here(cfg, family)
    _values(hires)
    sampling = second_sampler(hires.sampler, cfg.scheduler.name, family.sampling)
    entry = Hires(float(hires.scale), hires.steps or cfg.sampling.num_inference_steps, float(hires.denoising_strength),
                  hires.upscaler.name, sampling, None if hires.guidance_scale is None else float(hires.guidance_scale))
    _schedule(entry, sampling.sampler if sampling else sampler)
    for key, side in (("sampling.height", cfg.sampling.height), ("sampling.width", cfg.sampling.width)):
        if side is not None and int(side * entry.scale) > max_size:
            raise UserError("sampling.hires.scale", f"{entry.scale:g} upscales {key} {side} to {int(side * entry.scale)} "
                            f"pixels, more than this runner allows ({max_size})", f"at most {max_size / side:.3g}")
    return entry


def _runs_here(cfg: Any, family: Any) -> None:
    """The scale in range, and a family and mode the second pass runs with."""
    scale = cfg.sampling.hires.scale
    if not (math.isfinite(scale) and 1 <= scale <= MAX_SCALE):
        raise UserError("sampling.hires.scale", f"{scale}", f"a number from 1 to {MAX_SCALE:g} (2: twice the side), or "
                        "null (no second pass)")
    if "img2img" not in family.modes:
        raise UserError("sampling.hires.scale", f"{scale}: Hires. fix's second pass is image to image, which "
                        f"{cfg.model.name} ({family.title}) does not run", "null")
    if cfg.mode.name != "txt2img":
        raise UserError("sampling.hires.scale", f"{scale}: Hires. fix is a text-to-image pass, not mode="
                        f"{cfg.mode.name}'s", "null, or mode=txt2img")


def _values(hires: Any) -> None:
    """Its strength, steps and guidance (a HiresConfig) in range."""
    strength = hires.denoising_strength
    if not (math.isfinite(strength) and 0 < strength <= 1):
        raise UserError("sampling.hires.denoising_strength", f"{strength}", "a number in (0, 1]: 0.7 (A1111's "
                        "default), 0.3 (little change) .. 1 (from pure noise)")
    if hires.steps is not None and hires.steps < 1:
        raise UserError("sampling.hires.steps", f"must be a positive integer, got {hires.steps}", "1, 2, 3, ... or "
                        "null (sampling.num_inference_steps)")
    guidance = hires.guidance_scale
    if guidance is not None and not math.isfinite(guidance):
        raise UserError("sampling.hires.guidance_scale", f"must be a finite number, got {guidance}",
                        "any finite float, e.g. 5, or null (sampling.guidance_scale)")


def _schedule(entry: Hires, runs: str) -> None:
    """Enough steps for the sampler ``runs`` names, on a schedule the schedulers can step along."""
    least = MIN_STEPS.get(runs, 1)
    if entry.steps < least:
        raise UserError("sampling.hires.steps", f"{entry.steps}: {runs} takes at least {least} steps",
                        f"{least}, {least + 1}, ...")
    if entry.schedule > MAX_SCHEDULE:
        why = (f"{entry.strength} with {entry.steps} steps makes a schedule of {entry.schedule} steps (steps / "
               f"strength), more than {MAX_SCHEDULE}")
        fewest = math.floor(MAX_SCHEDULE * entry.strength)
        if entry.steps > MAX_SCHEDULE:  # no strength (at most 1) fits: the steps are what to lower
            raise UserError("sampling.hires.steps", f"{entry.steps}: denoising strength {why}",
                            f"1..{fewest} at strength {entry.strength}")
        raise UserError("sampling.hires.denoising_strength", why,
                        f"{entry.steps / MAX_SCHEDULE:.3g} to 1, or at most {fewest} sampling.hires.steps")


def second_sampler(name: Optional[str], scheduler: str,
                   resolver: Callable[[Optional[str], str], Sampling] = resolve) -> Optional[Sampling]:
    """``sampling.hires.sampler`` resolved as ``sampler`` is, by the family's ``resolver`` (FamilyEntry.sampling;
    the SD family's config/samplers.resolve: on ``scheduler``'s sigma schedule unless the name carries one, which is
    its own whatever the run's; the flow families' resolve_flow refuses what they do not run): a k sampler, or None
    for the run's own. DDIM and PLMS, which step on the pipeline's diffusers scheduler, are the run's alone."""
    if name is None:
        return None
    try:
        if resolver is resolve and lookup(name)[1] is not None:  # a schedule its name carries ("DPM++ 2M Karras")
            scheduler = "pndm"  # is its own, whatever the run's
        sampling = resolver(name, scheduler)
    except UserError as error:
        raise UserError("sampling.hires.sampler", error.problem, error.allowed) from None
    if sampling.sampler == "scheduler":
        raise UserError("sampling.hires.sampler", f"{name} steps on the run's diffusers scheduler, which the second "
                        "pass shares", "a k sampler (Euler a, DPM++ 2M Karras, ...), or null (the run's sampler)")
    return sampling


def fits(entry: Hires, height: int, width: int, multiple: int, model_name: str) -> tuple[int, int]:
    """The upscaled size once the model is loaded (its size known), checked against the model's down-sampling."""
    upscaled = entry.size(height, width)
    for side, (first, second) in zip(("height", "width"), ((height, upscaled[0]), (width, upscaled[1])), strict=True):
        if second % multiple:
            raise UserError("sampling.hires.scale", f"{entry.scale:g} upscales the {side} {first} to {second} pixels, "
                            f"which does not fit {model_name}'s down-sampling (multiples of {multiple})",
                            "a scale that gives a multiple of it on both sides (2 always does)")
    return upscaled
