"""Config -> plan: validate every value and lay the run's images out on batches and devices.

Nothing here loads a model or touches a device, so bad input fails in
milliseconds. The layout follows the Diffusers JAX guide: a batch is
``num_devices x per_device_batch_size`` images; the prompt list is cycled
across the image slots of all batches in order (slot ``i`` gets prompt
``i % len(prompts)``), so eight prompts on eight devices give one batch with
one prompt per device, and one prompt is repeated on every device.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Optional

from omegaconf import DictConfig

from sdjax_runner.errors import UserError
from sdjax_runner.prompts import load_prompts
from sdjax_runner.schedulers import check_overrides
from sdjax_runner.random_models import BUILTIN_MODELS
from sdjax_runner.sources import is_local


@dataclass(frozen=True)
class ImageSlot:
    index: int  # position in the run (batch-major, then device, then per-device slot)
    batch: int
    device: int
    slot: int
    prompt: str
    kept: bool  # False for padding images that are generated but not written


@dataclass(frozen=True)
class Plan:
    prompts: tuple[str, ...]
    negative: Optional[str]
    num_devices: int
    per_device_batch_size: int
    num_batches: int
    images: tuple[ImageSlot, ...]
    seed: int
    num_inference_steps: int
    guidance_scale: float
    height: Optional[int]  # None: the model's native size, resolved once it is loaded
    width: Optional[int]
    repeats: int

    @property
    def images_per_batch(self) -> int:
        return self.num_devices * self.per_device_batch_size

    def batch_prompts(self, batch: int) -> list[str]:
        start = batch * self.images_per_batch
        return [s.prompt for s in self.images[start : start + self.images_per_batch]]

    @property
    def kept_images(self) -> list[ImageSlot]:
        return [s for s in self.images if s.kept]


def _positive(key: str, value: Optional[int], *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if value is None or value < 1:
        raise UserError(key, f"must be a positive integer, got {value}", "1, 2, 3, ..." + (" or null" if optional else ""))


# Upper bounds, checked before anything is allocated: far above any real run, low enough that
# a typo (height=1000000) fails in milliseconds instead of exhausting device or host memory.
MAX_SIZE = 4096  # pixels per side (SDXL's native size is 1024)
MAX_STEPS = 1000  # the schedulers' num_train_timesteps
MAX_PER_DEVICE_BATCH = 1024
MAX_IMAGES = 1_000_000  # per run
MAX_REPEATS = 1000
MAX_SEED = 2**32 - 1  # jax.random.PRNGKey takes 32 bits


def _check_size(key: str, value: Optional[int]) -> None:
    if value is not None and (value < 8 or value % 8 or value > MAX_SIZE):
        raise UserError(key, f"must be a positive multiple of 8 up to {MAX_SIZE}, got {value}",
                        f"8, 16, ..., 512, ..., {MAX_SIZE} or null")


def _at_most(key: str, value: Optional[int], limit: int) -> None:
    if value is not None and value > limit:
        raise UserError(key, f"{value} is more than this runner allows", f"1..{limit}")


def check_private_dir(key: str, path: str) -> None:
    """Refuse a cache directory that other users can write: a compiled XLA program or a model they
    plant there would be loaded and run as this user. Group-writable ones get a warning."""
    import logging
    import os
    import stat

    directory = Path(path).expanduser()
    if directory.exists():
        info = directory.stat()
        if info.st_mode & stat.S_IWOTH:
            raise UserError(key, f"{directory} is writable by other users, who could plant code this run would load",
                            f"a directory only you can write (chmod o-w {directory}), or another {key}")
        if info.st_uid not in (os.getuid(), 0):
            raise UserError(key, f"{directory} belongs to another user (uid {info.st_uid})",
                            f"a directory of your own, or another {key}")
        if info.st_mode & stat.S_IWGRP:
            logging.getLogger("sdjax_runner").warning("%s: %s is writable by its group; members could plant code "
                                                      "this run would load", key, directory)
        return
    parent = directory.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    mode = parent.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise UserError(key, f"{directory} would be created in {parent}, which other users can write",
                        f"a path under a directory only you can write, or another {key}")


def check_model(model: DictConfig) -> None:
    if model.builtin is not None:
        if model.builtin not in BUILTIN_MODELS:
            raise UserError("model.builtin", f"unknown built-in model {model.builtin!r}", BUILTIN_MODELS)
        if model.safety_checker:
            raise UserError("model.safety_checker", f"the built-in {model.builtin} model has no safety checker", "false")
        return
    path = str(model.pretrained_model_name_or_path)
    if is_local(path):
        directory = Path(path).expanduser()
        if not directory.is_dir():
            raise UserError("model.pretrained_model_name_or_path", f"no such directory: {directory}",
                            "a diffusers-format pipeline directory or a hub id such as CompVis/stable-diffusion-v1-4")
        if not (directory / "model_index.json").is_file():
            raise UserError("model.pretrained_model_name_or_path", f"{directory} has no model_index.json",
                            "a directory written by save_pretrained")


def make_plan(cfg: DictConfig, available_devices: int) -> Plan:
    """Validate ``cfg`` and lay out its images; raises UserError naming the first bad key."""
    sampling, par = cfg.sampling, cfg.parallelism

    _check_size("sampling.height", sampling.height)
    _check_size("sampling.width", sampling.width)
    _positive("sampling.num_inference_steps", sampling.num_inference_steps, optional=False)
    _at_most("sampling.num_inference_steps", sampling.num_inference_steps, MAX_STEPS)
    if not math.isfinite(sampling.guidance_scale):
        raise UserError("sampling.guidance_scale", f"must be a finite number, got {sampling.guidance_scale}",
                        "any finite float, e.g. 7.5")
    _positive("parallelism.per_device_batch_size", par.per_device_batch_size, optional=False)
    _at_most("parallelism.per_device_batch_size", par.per_device_batch_size, MAX_PER_DEVICE_BATCH)
    _positive("parallelism.num_devices", par.num_devices)
    _positive("parallelism.num_batches", par.num_batches)
    _positive("parallelism.host_device_count", par.host_device_count)
    _positive("timing.repeats", cfg.timing.repeats, optional=False)
    _at_most("timing.repeats", cfg.timing.repeats, MAX_REPEATS)
    if not 0 <= cfg.seed <= MAX_SEED:
        raise UserError("seed", f"{cfg.seed} is not a 32-bit PRNG seed", f"0..{MAX_SEED}")
    _positive("output.grid_rows", cfg.output.grid_rows)
    _positive("output.grid_cols", cfg.output.grid_cols)
    num_devices = par.num_devices or available_devices
    if num_devices > available_devices:
        raise UserError("parallelism.num_devices", f"{num_devices} requested but only {available_devices} available",
                        f"1..{available_devices} or null")
    _check_size("model.resolution", cfg.model.resolution)
    check_model(cfg.model)
    check_private_dir("paths.cache_dir", cfg.paths.cache_dir)
    if cfg.compilation_cache.enabled:
        check_private_dir("compilation_cache.dir", cfg.compilation_cache.dir)
    check_overrides(cfg.scheduler.name, dict(cfg.scheduler.config_overrides))

    prompts = load_prompts(list(cfg.prompts.texts), cfg.prompts.file)
    per_batch = num_devices * par.per_device_batch_size
    needed = math.ceil(len(prompts) / per_batch)
    num_batches = par.num_batches or needed
    if num_batches < needed:
        raise UserError("parallelism.num_batches",
                        f"{num_batches} batch(es) of {per_batch} cannot hold {len(prompts)} prompts",
                        f">= {needed} or null")
    total = num_batches * per_batch
    if total > MAX_IMAGES:
        raise UserError("parallelism.num_batches", f"{num_batches} batch(es) of {per_batch} are {total} images",
                        f"at most {MAX_IMAGES} images per run")
    # pad keeps only whole copies of the prompt list; cycle keeps every slot.
    kept = total if cfg.prompts.fill.name == "cycle" else len(prompts) * (total // len(prompts))
    slots = []
    for i in range(total):
        batch, within = divmod(i, per_batch)
        device, slot = divmod(within, par.per_device_batch_size)
        slots.append(ImageSlot(i, batch, device, slot, prompts[i % len(prompts)], i < kept))
    rows, cols = cfg.output.grid_rows, cfg.output.grid_cols
    for key, value in (("output.grid_rows", rows), ("output.grid_cols", cols)):
        if value and value > kept:
            raise UserError(key, f"{value} is more than the run's {kept} images", f"1..{kept} or null")
    if rows and cols and rows * cols < kept:
        raise UserError("output.grid_rows", f"a {rows} x {cols} grid cannot hold {kept} images",
                        f"rows x cols >= {kept}, or null for automatic")
    return Plan(
        prompts=tuple(prompts),
        negative=cfg.prompts.negative or None,
        num_devices=num_devices,
        per_device_batch_size=par.per_device_batch_size,
        num_batches=num_batches,
        images=tuple(slots),
        seed=cfg.seed,
        num_inference_steps=sampling.num_inference_steps,
        guidance_scale=float(sampling.guidance_scale),
        height=sampling.height,
        width=sampling.width,
        repeats=cfg.timing.repeats,
    )
