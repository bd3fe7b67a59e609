"""The generation modes' settings (``mode``, ``init_image``, ``mask_image``, ``strength``, ``controlnet.*``):
which keys each mode needs, its strength and where in the schedule it starts, one :class:`ModeEntry` per mode in
:data:`MODES`. The modes themselves run in engine/modes/: a new mode is an entry here, its name in the schema's
``GenerationMode`` and its ``prepare`` module there."""

from __future__ import annotations

import logging
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config.samplers import MIN_STEPS
from sdjax_runner.config.schema import GenerationMode
from sdjax_runner.errors import UserError

log = logging.getLogger("sdjax_runner")

BUILTIN_CONTROLNETS = ("tiny-random-controlnet", "tiny-random-flux-controlnet",
                       "tiny-random-flux-controlnet-union", "tiny-random-sd3-controlnet",
                       "tiny-random-sd3-controlnet-single", "tiny-random-sd3-controlnet-inpaint")  # models/builtin.py builds them
CONTROLNET_ALLOWED = ("a diffusers ControlNet folder (config.json + Flax or PyTorch safetensors weights), or "
                      + ", ".join(BUILTIN_CONTROLNETS))


def check_controlnet_folder(cfg: Any) -> None:
    """controlnet mode: ``controlnet.model`` is a built-in or a folder with a config.json."""
    net = cfg.controlnet.model
    if net in BUILTIN_CONTROLNETS:
        return
    path = Path(str(net)).expanduser()
    if not path.is_dir():
        raise UserError("controlnet.model", f"no such directory: {path}", CONTROLNET_ALLOWED)
    if not (path / "config.json").is_file():
        raise UserError("controlnet.model", f"{path} has no config.json", CONTROLNET_ALLOWED)


@dataclass(frozen=True)
class ModeEntry:
    """Everything the config knows of one mode: one entry here, and its ``prepare`` function under the same
    name in engine/modes/ (that registry is checked against this one when it is imported)."""

    name: str  # mode=NAME (the schema's GenerationMode lists the same names)
    # The images it reads: (traced input name, config key), in reading order; each is a per-image array of the
    # program (engine/generate.py places the prompt's row with each image), fitted by config/input_images.py.
    images: tuple[tuple[str, str], ...] = ()
    # Images it reads where they are given and the family takes them (FamilyEntry.reference_images): (traced input
    # name, config key), placed as its images are
    optional_images: tuple[tuple[str, str], ...] = ()
    other_keys: tuple[str, ...] = ()  # further keys it needs set (besides its images')
    numbers: tuple[str, ...] = ()  # its traced numbers: "start" (the start step, from strength), "control_scale"
    default_strength: Optional[float] = None  # diffusers' default strength; None: the mode takes no strength
    check: Optional[Callable[[Any], None]] = None  # its own check of the typed config, after the keys are set

    @property
    def needs(self) -> tuple[str, ...]:
        """The config keys that must be set with this mode."""
        return tuple(key for _, key in self.images) + self.other_keys

    @property
    def per_image(self) -> tuple[str, ...]:
        """Its traced per-image inputs' names (the optional ones' too: placed where given)."""
        return tuple(name for name, _ in self.images + self.optional_images)

    @property
    def reads(self) -> tuple[str, ...]:
        """Every config key of an image it reads: its needed ones and its optional ones."""
        return tuple(key for _, key in self.images + self.optional_images)


# A ControlNet's traced numbers (engine/generate.py places them): its scale, a union model's mode, its window of steps
CONTROLNET_NUMBERS = ("control_scale", "control_mode", "control_start", "control_end")


# More reference images (reference_images), every prompt reading all of them: FLUX.2 [klein]'s editing and inpainting
REFERENCES = ("references", "reference_images")


def _registry(*entries: ModeEntry) -> dict[str, ModeEntry]:
    return {entry.name: entry for entry in entries}


MODES = _registry(
    ModeEntry("txt2img"),
    # diffusers' default strengths: its img2img pipelines 0.8, its inpaint pipelines 1.0 (pure noise).
    ModeEntry("img2img", images=(("init", "init_image"),), numbers=("start",), default_strength=0.8),
    ModeEntry("inpaint", images=(("init", "init_image"), ("mask", "mask_image")), numbers=("start",),
              optional_images=(REFERENCES,),
              default_strength=1.0),
    ModeEntry("controlnet", images=(("control", "controlnet.image"),), other_keys=("controlnet.model",),
              numbers=CONTROLNET_NUMBERS, check=check_controlnet_folder),
    # FLUX.1 Kontext's in-context editing (diffusers' FluxKontextPipeline): from noise, the init image's latents as
    # more tokens beside the noise's in every transformer call; no strength (the whole schedule runs)
    ModeEntry("edit", images=(("init", "init_image"),), optional_images=(REFERENCES,)),
    # FLUX.1 Canny [dev] and Depth [dev] (diffusers' FluxControlPipeline): from noise, the control image's latents
    # (an edge map, a depth map: the model's own kind of control image, made by the user) as more input channels of
    # every transformer call; no strength, no separate ControlNet (the transformer is the control model)
    ModeEntry("control", images=(("control", "controlnet.image"),)),
    # ... from an init image (diffusers' FluxControlImg2ImgPipeline) and repainting its mask's area by latent
    # blending (FluxControlInpaintPipeline), at their default strength
    ModeEntry("control_img2img", images=(("init", "init_image"), ("control", "controlnet.image")), numbers=("start",),
              default_strength=0.6),
    ModeEntry("control_inpaint", images=(("init", "init_image"), ("mask", "mask_image"), ("control", "controlnet.image")),
              numbers=("start",), default_strength=0.6),
    # an inpainting ControlNet (diffusers' StableDiffusion3ControlNetInpaintingPipeline): from noise, the ControlNet
    # reading the init image with the mask's area masked out, and the mask; no strength, no blend
    ModeEntry("controlnet_inpaint", images=(("init", "init_image"), ("mask", "mask_image")),
              other_keys=("controlnet.model",), numbers=CONTROLNET_NUMBERS, check=check_controlnet_folder),
)
if tuple(MODES) != tuple(GenerationMode.__members__):
    raise RuntimeError(f"config/modes.py lists {tuple(MODES)}, the schema's GenerationMode "
                       f"{tuple(GenerationMode.__members__)}")
# Read off the registry.
DEFAULT_STRENGTH = {e.name: e.default_strength for e in MODES.values() if e.default_strength is not None}
# Keys whose sweep reads images (config/sweep_points.py).
IMAGE_KEYS = tuple(dict.fromkeys(key for e in MODES.values() for key in e.reads))


def strength(mode: str, value: Optional[float]) -> Optional[float]:
    """The strength ``mode`` runs at (None where the mode has none)."""
    if mode not in DEFAULT_STRENGTH:
        return None
    return DEFAULT_STRENGTH[mode] if value is None else float(value)


def start_step(steps: int, strength: Optional[float]) -> int:
    """The step the sampler starts at: the schedule's last ``int(steps * strength)`` steps run -- diffusers'
    ``get_timestep_start`` (``init_timestep = min(int(steps * strength), steps)``, ``t_start = steps -
    init_timestep``), computed on the host, so the program takes it as a number (no recompile per strength)."""
    if strength is None:
        return 0
    return max(steps - min(int(steps * strength), steps), 0)


def flow_start_step(steps: int, strength: Optional[float]) -> int:
    """:func:`start_step` as diffusers' PyTorch flow pipelines have it (FluxImg2ImgPipeline.get_timesteps,
    StableDiffusion3Img2ImgPipeline's alike): ``init_timestep = min(steps * strength, steps)`` unrounded, ``t_start =
    int(max(steps - init_timestep, 0))`` -- one step earlier than the Flax rule wherever ``steps * strength`` is not
    whole (4 steps at 0.6: start 1, the last 3 run; the Flax pipelines run 2)."""
    if strength is None:
        return 0
    return int(max(steps - min(steps * strength, steps), 0))


def check(cfg: Any, sampler: str, start: Callable[[int, Optional[float]], int] = start_step) -> None:
    """The mode's keys of the typed config ``cfg`` (plan.admit): present where needed, in range.
    ``sampler``: the resolved sampler's name (UniPC needs two steps to run); ``start``: the family's start rule
    (FamilyEntry.start_step)."""
    entry = MODES[cfg.mode.name]
    values = {"init_image": cfg.init_image, "mask_image": cfg.mask_image, "controlnet.model": cfg.controlnet.model,
              "controlnet.image": cfg.controlnet.image, "reference_images": cfg.reference_images}
    for key in entry.needs:
        if values[key] in (None, "", []):
            raise UserError(key, f"a value is required with mode={entry.name}", f"{key}=PATH")
    read = entry.needs + entry.reads
    unused = [key for key, value in values.items() if value not in (None, "", []) and key not in read]
    if cfg.strength is not None and entry.default_strength is None:
        unused.append("strength")
    if unused:
        log.warning("%s: set, but mode=%s does not read %s", ", ".join(unused), entry.name,
                    "it" if len(unused) == 1 else "them")
    if cfg.strength is not None:
        check_strength(cfg, entry, sampler, start)
    if entry.check is not None:
        entry.check(cfg)
    scale = cfg.controlnet.conditioning_scale
    if not math.isfinite(scale):
        raise UserError("controlnet.conditioning_scale", f"must be a finite number, got {scale}",
                        "0 (no control) .. 1 (full) .. 2")
    check_control_window(cfg.controlnet.guidance_start, cfg.controlnet.guidance_end)
    if cfg.controlnet.control_mode is not None and cfg.controlnet.control_mode < 0:
        raise UserError("controlnet.control_mode", f"{cfg.controlnet.control_mode}",
                        "a union ControlNet's mode number (0 and up, by its card), or null")


def outside_control_window(step: Any, count: Any, start: Any, end: Any) -> Any:
    """Whether step ``step`` (0 at the first) of ``count`` is outside the window ``start``..``end`` a ControlNet
    steers: diffusers' ``controlnet_keep`` is ``1 - (i / N < start or (i + 1) / N > end)``. Python numbers or JAX
    arrays (the engine's traced scale, engine/modes/controlnet.scale_at) alike."""
    return (step / count < start) | ((step + 1) / count > end)


def check_control_window(first: float, last: float) -> None:
    """controlnet.guidance_start and guidance_end: ``0 <= start < end <= 1``."""
    if not (math.isfinite(first) and math.isfinite(last) and 0 <= first < last <= 1):
        raise UserError("controlnet.guidance_start" if not (math.isfinite(first) and 0 <= first < 1)
                        else "controlnet.guidance_end", f"{first} to {last}: the part of the steps the ControlNet steers",
                        "0 <= controlnet.guidance_start < controlnet.guidance_end <= 1 (e.g. 0 and 0.6)")


def check_strength(cfg: Any, entry: ModeEntry, sampler: str,
                   start: Callable[[int, Optional[float]], int] = start_step) -> None:
    """``strength`` in (0, 1], and leaving ``sampler`` the steps it needs to run (from ``start``, the family's rule)."""
    if not (math.isfinite(cfg.strength) and 0 < cfg.strength <= 1):
        raise UserError("strength", f"must be in (0, 1], got {cfg.strength}",
                        "0.3 (little change) .. 1.0 (from pure noise)")
    steps = cfg.sampling.num_inference_steps
    runs = steps - start(steps, cfg.strength)
    least = MIN_STEPS.get(sampler, 1)
    if entry.default_strength is not None and runs < least:
        raise UserError("strength", f"{cfg.strength} of {steps} steps runs {runs} step(s) (int(steps * strength)); "
                        f"{sampler if least > 1 else 'a run'} needs {least}",
                        f"at least {least / steps:g}, or more steps")


def fits_model(mode: str, unet_in_channels: int, model_name: str) -> None:
    """Once the model is loaded: an inpainting model (9 UNet input channels) runs mode=inpaint only, and a
    UNet that reads another number of channels (instruct-pix2pix's 8, ...) is none this runner drives."""
    if unet_in_channels == 9 and mode != "inpaint":
        raise UserError("mode", f"{mode}, but {model_name} is an inpainting model (its UNet reads 9 channels: "
                        "latents, mask, masked image)", "inpaint (with init_image and mask_image)")
    if unet_in_channels not in (4, 9):
        raise UserError("model.pretrained_model_name_or_path", f"{model_name}'s UNet reads {unet_in_channels} "
                        "input channels", "a text-to-image model (4 channels) or an inpainting model (9)")
