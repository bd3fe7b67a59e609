"""The generation modes' settings (``mode``, ``init_image``, ``mask_image``, ``strength``, ``controlnet.*``):
which keys each mode needs, its strength and where in the schedule it starts. The modes themselves run
in engine/modes/."""

from __future__ import annotations

import logging
import math
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config.samplers import MIN_STEPS
from sdjax_runner.errors import UserError

log = logging.getLogger("sdjax_runner")

MODES = ("txt2img", "img2img", "inpaint", "controlnet")
# diffusers' default strength per mode: its img2img pipelines 0.8, its inpaint pipelines 1.0 (pure noise).
DEFAULT_STRENGTH = {"img2img": 0.8, "inpaint": 1.0}
IMAGE_KEYS = ("init_image", "mask_image", "controlnet.image")  # sweeping these reads images (config/sweep_points.py)
BUILTIN_CONTROLNETS = ("tiny-random-controlnet",)  # models/builtin.py builds them
CONTROLNET_ALLOWED = ("a diffusers ControlNet folder (config.json + Flax or PyTorch safetensors weights), or "
                      + ", ".join(BUILTIN_CONTROLNETS))


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


def check(cfg: Any, sampler: str) -> None:
    """The mode's keys of the typed config ``cfg`` (plan.admit): present where needed, in range.
    ``sampler``: the resolved sampler's name (UniPC needs two steps to run)."""
    mode = cfg.mode.name
    needs = {"img2img": ["init_image"], "inpaint": ["init_image", "mask_image"],
             "controlnet": ["controlnet.model", "controlnet.image"]}.get(mode, [])
    values = {"init_image": cfg.init_image, "mask_image": cfg.mask_image, "controlnet.model": cfg.controlnet.model,
              "controlnet.image": cfg.controlnet.image}
    for key in needs:
        if values[key] in (None, "", []):
            raise UserError(key, f"a value is required with mode={mode}", f"{key}=PATH")
    unused = [key for key, value in values.items() if value not in (None, "", []) and key not in needs]
    if cfg.strength is not None and mode not in DEFAULT_STRENGTH:
        unused.append("strength")
    if unused:
        log.warning("%s: set, but mode=%s does not read %s", ", ".join(unused), mode,
                    "it" if len(unused) == 1 else "them")
    if cfg.strength is not None:
        if not (math.isfinite(cfg.strength) and 0 < cfg.strength <= 1):
            raise UserError("strength", f"must be in (0, 1], got {cfg.strength}",
                            "0.3 (little change) .. 1.0 (from pure noise)")
        runs = cfg.sampling.num_inference_steps - start_step(cfg.sampling.num_inference_steps, cfg.strength)
        least = MIN_STEPS.get(sampler, 1)
        if mode in DEFAULT_STRENGTH and runs < least:
            raise UserError("strength", f"{cfg.strength} of {cfg.sampling.num_inference_steps} steps runs {runs} "
                            f"step(s) (int(steps * strength)); {sampler if least > 1 else 'a run'} needs {least}",
                            f"at least {least / cfg.sampling.num_inference_steps:g}, or more steps")
    net = cfg.controlnet.model
    if mode == "controlnet" and net not in BUILTIN_CONTROLNETS:
        path = Path(str(net)).expanduser()
        if not path.is_dir():
            raise UserError("controlnet.model", f"no such directory: {path}", CONTROLNET_ALLOWED)
        if not (path / "config.json").is_file():
            raise UserError("controlnet.model", f"{path} has no config.json", CONTROLNET_ALLOWED)
    scale = cfg.controlnet.conditioning_scale
    if not math.isfinite(scale):
        raise UserError("controlnet.conditioning_scale", f"must be a finite number, got {scale}",
                        "0 (no control) .. 1 (full) .. 2")


def fits_model(mode: str, unet_in_channels: int, model_name: str) -> None:
    """Once the model is loaded: an inpainting model (9 UNet input channels) runs mode=inpaint only, and a
    UNet that reads another number of channels (instruct-pix2pix's 8, ...) is none this runner drives."""
    if unet_in_channels == 9 and mode != "inpaint":
        raise UserError("mode", f"{mode}, but {model_name} is an inpainting model (its UNet reads 9 channels: "
                        "latents, mask, masked image)", "inpaint (with init_image and mask_image)")
    if unet_in_channels not in (4, 9):
        raise UserError("model.pretrained_model_name_or_path", f"{model_name}'s UNet reads {unet_in_channels} "
                        "input channels", "a text-to-image model (4 channels) or an inpainting model (9)")
