"""SDXL's refiner (``model.refiner``, ``sampling.refiner_switch``): checked before anything loads, as the plan holds it.

A1111's "Refiner" and "Refiner switch at"; diffusers' base + refiner "ensemble of experts" (``denoising_end`` on the
base, ``denoising_start`` on the refiner). The base denoises the noisier part of the schedule, the refiner the rest,
in one program (engine/program.py). Both switch by the timestep a UNet call runs at: diffusers' base keeps the
timesteps ``t >= round(T - switch * T)`` (``StableDiffusionXLPipeline.__call__``, denoising_end) and its refiner
takes those below (``StableDiffusionXLImg2ImgPipeline.get_timesteps`` with denoising_start, no noise added to the
base's latents); A1111 swaps in the refiner at the first call whose timestep ``t`` -- the training sigma nearest the
step's -- has ``(999 - t) / 1000 >= switch`` (``sd_samplers_common.apply_refiner``). For whole timesteps and
1000 * switch whole, the same calls: :meth:`Refiner.cutoff`. With Hires. fix the refiner runs in the second pass
alone, as A1111's default ("Hires fix: which pass to enable refiner for": second pass) has it."""

from __future__ import annotations

import hashlib
import math
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config.folder_files import TEXT_BYTES, bounded_weights, check_folder
from sdjax_runner.errors import UserError
from sdjax_runner.files import file_sha256, read_json

KEY = "model.refiner"
ALLOWED = ("a diffusers SDXL refiner folder (stabilityai/stable-diffusion-xl-refiner-1.0's layout: model_index.json, "
           "unet/, text_encoder_2/, tokenizer_2/)")
# What its model_index.json may name (diffusers' refiner pipeline, PyTorch or Flax)
PIPELINES = ("StableDiffusionXLImg2ImgPipeline", "FlaxStableDiffusionXLImg2ImgPipeline")
# Each component it is read for, and the weights files that component may hold (Flax first, then PyTorch's)
WEIGHTS = {"unet": ("diffusion_flax_model.msgpack", "diffusion_pytorch_model.safetensors"),
           "text_encoder_2": ("flax_model.msgpack", "model.safetensors")}
MODES = ("txt2img", "img2img")


@dataclass(frozen=True)
class Refiner:
    """The refiner of a job, as the plan holds it."""

    path: str  # its folder, the user part expanded
    sha256: str  # its UNet's and second text encoder's weights, hashed when the run was planned
    switch: float  # sampling.refiner_switch
    aesthetic: bool  # its index's requires_aesthetics_score (the refiner-1.0's true): 5 time ids, else 6

    def cutoff(self, train_timesteps: int) -> int:
        """The first timestep the base does not run: a UNet call below it runs the refiner (module docstring)."""
        return round(train_timesteps - self.switch * train_timesteps)

    @property
    def name(self) -> str:
        """What A1111's infotext calls it (``Refiner: NAME``): the folder's name."""
        return Path(self.path).name


def check(cfg: Any, family: Any) -> Optional[Refiner]:
    """``model.refiner`` and ``sampling.refiner_switch`` of the typed config ``cfg``, with ``family`` (a
    config/families.FamilyEntry): the refiner, or None where none is given. Refused in one line each."""
    switch = cfg.sampling.refiner_switch
    if not (math.isfinite(switch) and 0 < switch < 1):
        raise UserError("sampling.refiner_switch", f"{switch}", "a share of the schedule strictly between 0 and 1 "
                        "(A1111's default 0.8: the base runs the noisier 80%)")
    if not cfg.model.refiner:
        return None
    _runs_here(cfg, family)
    path = Path(str(cfg.model.refiner)).expanduser()
    index = _index(path)
    return Refiner(str(path), weights_sha256(path), float(switch), bool(index.get("requires_aesthetics_score", False)))


def _runs_here(cfg: Any, family: Any) -> None:
    if not family.refiner:
        raise UserError(KEY, f"a refiner takes over from an SDXL base; this run's model is {family.title}",
                        "null, or an SDXL base model")
    if cfg.mode.name not in MODES:
        raise UserError(KEY, f"mode={cfg.mode.name} with a refiner is not supported", f"mode={' or '.join(MODES)}")


def _index(path: Path) -> dict:
    """The folder's model_index.json, checked to be a refiner's with the components it is read for."""
    if not path.is_dir():
        raise UserError(KEY, f"no such directory: {path}", ALLOWED)
    if not os.path.lexists(path / "model_index.json"):
        raise UserError(KEY, f"{path} has no model_index.json", ALLOWED)
    check_folder(path, KEY, ALLOWED)  # every file a loader reads as text: bounded, regular, JSON, sizes
    index = read_json(path / "model_index.json", TEXT_BYTES)
    name = index.get("_class_name") if isinstance(index, dict) else None
    if name not in PIPELINES:
        raise UserError(KEY, f"{path} holds a {name or 'folder without a _class_name'}, not an SDXL refiner", ALLOWED)
    for component in (*WEIGHTS, "tokenizer_2"):
        if not (path / component).is_dir():
            raise UserError(KEY, f"{path} has no {component}/", ALLOWED)
    return index


def weights_file(path: Path, component: str) -> Path:
    """The file ``component``'s weights are read from (its Flax file, else its safetensors)."""
    for name in WEIGHTS[component]:
        if (path / component / name).is_file():
            return path / component / name
    raise UserError(KEY, f"{path}/{component}/ has none of {', '.join(WEIGHTS[component])}",
                    f"{ALLOWED}, each component with its weights in one file")


def weights_sha256(path: Path) -> str:
    """One hash of the weights the refiner is read for: each component's file name and content hash."""
    files = bounded_weights([weights_file(path, component) for component in WEIGHTS], "refiner", KEY)
    lines = "".join(f"{file.parent.name}/{file.name}:{file_sha256(file)}\n" for file in files)
    return hashlib.sha256(lines.encode()).hexdigest()
