"""Every check of a value the user gives, in one place; each failure is a UserError naming the key.

The schema (:mod:`.schema`) checks keys and types at compose time. These check values:
ranges and bounds (before anything is allocated), directories, the model, the scheduler's
overrides, the process settings (devices, XLA flags, multi-host) and, once known, the
backend and the model's own constraints (attention on this backend, image size vs the
model's down-sampling).
"""

from __future__ import annotations

import logging
import math
import os
import stat
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config import families, folder_files, hires, modes, refiner
from sdjax_runner.config.samplers import SCHEDULES as SIGMA_SCHEDULES
from sdjax_runner.config.schema import BUILTIN_MODELS
from sdjax_runner.errors import UserError
from sdjax_runner.files import FOLDER_PATHS, cannot_make_folder

log = logging.getLogger("sdjax_runner")

# Upper bounds, checked before anything is allocated: far above any real run, low enough that
# a typo (height=1000000) fails in milliseconds instead of exhausting device or host memory.
MAX_SIZE = 4096  # pixels per side (SDXL's native size is 1024)
MAX_STEPS = 1000  # the schedulers' num_train_timesteps
MAX_PER_DEVICE_BATCH = 1024
MAX_IMAGES = 1_000_000  # per run
MAX_REPEATS = 1000
MAX_SEED = 2**32 - 1  # jax.random.PRNGKey takes 32 bits
MAX_HOST_DEVICES = 512  # XLA makes every forced CPU device up front
MAX_TRAIN_TIMESTEPS = 10_000  # scheduler.config_overrides.num_train_timesteps: arrays of that length (SD: 1000)

ATTENTION = ("default", "split_head_dim", "memory_efficient", "dot_product", "cudnn_flash")


def positive(key: str, value: Optional[int], *, optional: bool = True) -> None:
    if value is None and optional:
        return
    if value is None or value < 1:
        raise UserError(key, f"must be a positive integer, got {value}", "1, 2, 3, ..." + (" or null" if optional else ""))


def size(key: str, value: Optional[int]) -> None:
    if value is not None and (value < 8 or value % 8 or value > MAX_SIZE):
        raise UserError(key, f"must be a positive multiple of 8 up to {MAX_SIZE}, got {value}",
                        f"8, 16, ..., 512, ..., {MAX_SIZE} or null")


def at_most(key: str, value: Optional[int], limit: int) -> None:
    if value is not None and value > limit:
        raise UserError(key, f"{value} is more than this runner allows", f"1..{limit}")


WRITABLE_FOLDER = "a folder you can create and write in"


def folder(key: str, path: Path) -> None:
    """``path`` (``key``), a folder the run makes and writes in, refused with one line where it cannot be: a
    part of it is a file (ENOTDIR), or the nearest folder of it that exists takes no new folder (no
    permission, a read-only file system, /proc). That folder is asked by making and removing one there."""
    blocked = cannot_make_folder(path)
    if blocked:
        raise UserError(key, blocked, FOLDER_PATHS)
    existing = next(p for p in [path, *path.parents] if os.path.isdir(p))
    try:
        probe = tempfile.mkdtemp(prefix=".sdjax-runner-probe-", dir=existing)
    except OSError as exc:
        raise UserError(key, f"{path} cannot be made: {existing} takes no new folder ({exc.strerror})",
                        WRITABLE_FOLDER) from None
    os.rmdir(probe)


def private_dir(key: str, path: str) -> None:
    """Refuse a cache directory that other users -- its group included -- can write: a compiled XLA
    program or a model they plant there would be loaded and run as this user. (Every file read from the
    caches is checked the same way on each read: files.untrusted.)"""
    directory = Path(path).expanduser()
    folder(key, directory)
    if directory.exists():
        info = directory.stat()
        if info.st_mode & (stat.S_IWOTH | stat.S_IWGRP):
            who = "other users" if info.st_mode & stat.S_IWOTH else "its group"
            raise UserError(key, f"{directory} is writable by {who}, who could plant code this run would load",
                            f"a directory only you can write (chmod go-w {directory}), or another {key}")
        if info.st_uid not in (os.getuid(), 0):
            raise UserError(key, f"{directory} belongs to another user (uid {info.st_uid})",
                            f"a directory of your own, or another {key}")
        return
    parent = directory.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    mode = parent.stat().st_mode
    if mode & stat.S_IWOTH and not mode & stat.S_ISVTX:
        raise UserError(key, f"{directory} would be created in {parent}, which other users can write",
                        f"a path under a directory only you can write, or another {key}")


def is_local(name: str) -> bool:
    """Whether a model name is a local folder (else a hub id, ``owner/name``)."""
    return name.startswith(("/", ".", "~")) or Path(name).expanduser().exists() or name.count("/") != 1


def model(model: Any) -> None:
    if model.checkpoint:  # the file itself is read (and checked) once, by config/plan.py's checkpoint_record
        if model.pretrained_model_name_or_path is None:
            return  # the standard base of its architecture (config/plan.py)
    elif model.pretrained_model_name_or_path is None:  # model=single_file without its file
        raise UserError("model.checkpoint", "a value is required: with no model.pretrained_model_name_or_path the "
                        "weights come from a single-file checkpoint", "model.checkpoint=PATH.safetensors")
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
        if not os.path.lexists(directory / "model_index.json"):  # (one that is no file: check_folder's line)
            raise UserError("model.pretrained_model_name_or_path", f"{directory} has no model_index.json",
                            "a directory written by save_pretrained")
        folder_files.check_folder(directory, "model.pretrained_model_name_or_path", "a directory written by "
                                  "save_pretrained, its files as diffusers and transformers write them")


def scheduler_overrides(name: str, overrides: dict[str, Any]) -> None:
    """Reject override keys the scheduler does not take, before anything loads."""
    if not overrides:
        return
    if name not in SCHEDULER_SETTINGS:
        raise UserError("scheduler.name", f"unknown scheduler {name!r}", sorted(SCHEDULER_SETTINGS))
    accepted = list(SCHEDULER_SETTINGS[name])
    for key in overrides:
        if key not in accepted:
            raise UserError(f"scheduler.config_overrides.{key}", f"not a {name} setting", accepted)
    scheduler_values(name, overrides)


# The values a scheduler setting may take; any other fails inside the scheduler once the model is loaded (a
# traceback: a count of 0 indexes an empty table, an unknown name is NotImplementedError) or makes NaN images.
SCHEDULER_COUNTS = {"num_train_timesteps": (1, MAX_TRAIN_TIMESTEPS), "steps_offset": (0, MAX_TRAIN_TIMESTEPS),
                    "solver_order": (1, 3), "original_inference_steps": (1, MAX_TRAIN_TIMESTEPS)}
# diffusers' LCMScheduler's settings beyond DDIM's, and their defaults
LCM_SETTINGS = {"original_inference_steps": 50, "timestep_scaling": 10.0}
SCHEDULER_CHOICES = {"beta_schedule": ("linear", "scaled_linear", "squaredcos_cap_v2"),
                     "prediction_type": ("epsilon", "sample", "v_prediction"),
                     "timestep_spacing": ("linspace", "leading", "trailing"),
                     "algorithm_type": ("dpmsolver++", "dpmsolver"), "solver_type": ("midpoint", "heun"),
                     "variance_type": ("fixed_small", "fixed_large")}  # DDPM here: families/sd/models/schedulers
NARROWER_CHOICES = {(name, "prediction_type"): ("epsilon", "v_prediction") for name in ("euler", "lms", "pndm")}
SCHEDULER_FLAGS = ("clip_sample", "set_alpha_to_one", "skip_prk_steps", "thresholding", "lower_order_final",
                   "rescale_betas_zero_snr")
# Zero terminal SNR (rescale_betas_zero_snr, diffusers' PyTorch schedulers' setting; the runner's for its Flax ones,
# models/schedulers.py): the schedulers that take it -- diffusers' PyTorch DDIM, DDPM, Euler and DPM-Solver do.
ZERO_SNR = ("ddim", "ddpm", "euler", "dpm_solver_pp")
ZERO_SNR_KEY = "rescale_betas_zero_snr"

# The settings each scheduler takes (families/sd/models/schedulers: their SETTINGS, checked equal as they are imported).
_COMMON_SETTINGS = ("num_train_timesteps", "beta_start", "beta_end", "beta_schedule", "trained_betas")
_DDIM_SETTINGS = ("clip_sample", "clip_sample_range", "set_alpha_to_one", "steps_offset", "prediction_type")
SCHEDULER_SETTINGS: dict[str, tuple[str, ...]] = {
    "pndm": (*_COMMON_SETTINGS, "skip_prk_steps", "set_alpha_to_one", "steps_offset", "prediction_type"),
    "ddim": (*_COMMON_SETTINGS, *_DDIM_SETTINGS, "timestep_spacing", ZERO_SNR_KEY),
    "lms": (*_COMMON_SETTINGS, "prediction_type"),
    "dpm_solver_pp": (*_COMMON_SETTINGS, "solver_order", "prediction_type", "thresholding", "dynamic_thresholding_ratio",
                      "sample_max_value", "algorithm_type", "solver_type", "lower_order_final", "timestep_spacing",
                      "steps_offset", ZERO_SNR_KEY),
    "euler": (*_COMMON_SETTINGS, "prediction_type", "timestep_spacing", ZERO_SNR_KEY),
    "ddpm": (*_COMMON_SETTINGS, "variance_type", "clip_sample", "prediction_type", ZERO_SNR_KEY),
    "lcm": (*_COMMON_SETTINGS, *_DDIM_SETTINGS, "original_inference_steps", "timestep_scaling"),
}
BETAS = ("beta_start", "beta_end")  # 0 <= beta < 1: a beta of 1 leaves nothing of the signal


def scheduler_values(name: str, overrides: dict[str, Any]) -> None:
    """Each of ``overrides`` (settings of scheduler ``name``) a value the scheduler runs with."""
    for key, value in overrides.items():
        problem = scheduler_value_problem(name, key, value)
        if problem:
            raise UserError(f"scheduler.config_overrides.{key}", *problem)
    start, end = (overrides.get(key) for key in BETAS)
    if start is not None and end is not None and start > end:
        raise UserError("scheduler.config_overrides.beta_start", f"{start} is above beta_end {end}",
                        f"a beta_start from 0 to {end}")


def scheduler_value_problem(name: str, key: str, value: Any) -> Optional[tuple[str, Any]]:
    """(problem, allowed) of ``value`` for scheduler ``name``'s setting ``key``, or None."""
    is_number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if key in SCHEDULER_COUNTS:
        low, high = SCHEDULER_COUNTS[key]
        if not (is_number and isinstance(value, int) and low <= value <= high):
            return f"{value!r} is not a count {name} can use", f"a whole number {low}..{high}"
    elif key in SCHEDULER_CHOICES:
        choices = NARROWER_CHOICES.get((name, key), SCHEDULER_CHOICES[key])
        if value not in choices:
            return f"{value!r} is not a {key} {name} takes", choices
    elif key in SCHEDULER_FLAGS and not isinstance(value, bool):
        return f"{value!r} is not true or false", "true, false"
    elif key in BETAS and not (is_number and 0 <= value < 1):  # (NaN fails too)
        return f"{value!r} is not a beta", "a number from 0 up to (not including) 1"
    return None


def attention(name: str, backend: str, activations_dtype: str) -> None:
    """``performance.attention`` on this backend (known once JAX has started)."""
    if name not in ATTENTION:
        raise UserError("performance.attention", f"unknown attention {name!r}", ATTENTION)
    if name == "cudnn_flash":
        if backend != "gpu":
            raise UserError("performance.attention", f"cudnn_flash needs an NVIDIA GPU, this run has {backend}",
                            "default, split_head_dim, memory_efficient, dot_product")
        if activations_dtype not in ("bfloat16", "float16"):
            raise UserError("performance.attention", f"cudnn_flash needs bf16 or fp16 activations, not {activations_dtype}",
                            "dtype=bf16, or another attention")
    if name == "dot_product" and backend == "cpu" and activations_dtype == "float16":
        # jax.nn.dot_product_attention accumulates the logits in float32; XLA's CPU dot has no f16 x f16 -> f32.
        raise UserError("performance.attention", "dot_product with fp16 activations does not run on the CPU",
                        "default, split_head_dim, memory_efficient; or dtype=bf16, fp32")


def image_size(height: int, width: int, multiple: int, model_name: str) -> None:
    """Height/width against the loaded model's down-sampling (VAE factor x UNet levels)."""
    for key, value in (("sampling.height", height), ("sampling.width", width)):
        if value % multiple:
            raise UserError(key, f"{value} does not fit {model_name}'s down-sampling", f"multiples of {multiple}")


# --- the process: devices, XLA settings, multi-host ---------------------------------------------

def host_device_count(count: Optional[int]) -> None:
    if count and not 1 <= count <= MAX_HOST_DEVICES:
        raise UserError("parallelism.host_device_count", f"{count} CPU devices", f"1..{MAX_HOST_DEVICES} or null")


def xla_settings(performance: Any) -> None:
    if performance.gpu_autotune_level is not None and not 0 <= performance.gpu_autotune_level <= 4:
        raise UserError("performance.gpu_autotune_level", f"{performance.gpu_autotune_level} is not a level", "0..4")
    fraction = performance.gpu_memory_fraction
    if fraction is not None and not 0 < fraction <= 1:
        raise UserError("performance.gpu_memory_fraction", f"{fraction} is not a fraction of the memory", "0 < x <= 1")


def xla_flags(flags: str) -> None:
    """Let XLA itself parse ``flags`` in a throwaway process: an unknown flag aborts the process that
    reads it, which must not be this one (it would die with a C++ log line and leave no record)."""
    # XLA parses the flags (GPU ones too) whichever backend starts; the CPU one keeps the probe off the GPU.
    probe = subprocess.run([sys.executable, "-c", "import jax; jax.devices()"], capture_output=True, text=True,
                           env=dict(os.environ, XLA_FLAGS=flags, JAX_PLATFORMS="cpu"), timeout=120)
    if probe.returncode:
        lines = [line for line in probe.stderr.splitlines() if "flag" in line.lower()] or probe.stderr.splitlines()[-1:]
        reason = lines[0].split("] ", 1)[-1] if lines else f"exit status {probe.returncode}"
        raise UserError("performance.xla_flags", f"XLA rejects them: {reason}",
                        "flags XLA knows, e.g. --xla_gpu_autotune_level=2")


def distributed(parallelism: Any) -> None:
    """Reject inconsistent multi-host settings before anything starts."""
    dist = parallelism.distributed
    if not dist.enabled:
        given = [key for key in ("coordinator_address", "num_processes", "process_id") if getattr(dist, key) is not None]
        if given:  # each process would run alone: two runs writing one directory
            raise UserError("parallelism.distributed.enabled", f"false, but {', '.join(given)} given: each process "
                            "would run alone, all writing the same outputs", "true, with all three settings")
        return
    positive("parallelism.distributed.timeout_s", dist.timeout_s, optional=False)
    if parallelism.mode.name != "sharded":
        raise UserError("parallelism.distributed.enabled", "multi-host runs need the sharded path",
                        "parallelism=sharded")
    present = [dist.coordinator_address is not None, dist.num_processes is not None, dist.process_id is not None]
    if any(present) and not all(present):
        raise UserError("parallelism.distributed", "give coordinator_address, num_processes and process_id "
                        "together, or none of them (auto-detection on TPU pods and SLURM)")
    if all(present):
        if dist.num_processes < 1:
            raise UserError("parallelism.distributed.num_processes", f"must be >= 1, got {dist.num_processes}")
        if not 0 <= dist.process_id < dist.num_processes:
            raise UserError("parallelism.distributed.process_id", f"{dist.process_id} is out of range",
                            f"0..{dist.num_processes - 1}")


# --- a whole run's values, before anything loads -------------------------------------------------

def known_keys(node: Any, schema: Any, prefix: str = "") -> None:
    """Every key of ``node`` is one the schema ``schema`` (a dataclass) defines. Hydra's ``+key=value``
    adds a key even to a typed node, so a misspelled key given with ``+`` (``+sampling.num_inference_step=3``)
    would be carried along and ignored; it is refused here instead. Free-form entries (dicts such as
    ``scheduler.config_overrides``) take any key."""
    import dataclasses
    import typing

    from sdjax_runner.config.schema import field_types, without_null

    fields = field_types(schema)
    for key in node:
        if not prefix and key == "hydra":  # Hydra's own node, present in a sweep's job configs
            continue
        if key not in fields:
            raise UserError(f"{prefix}{key}", "unknown key", fields)
        kind = without_null(fields[key])[0]
        if dataclasses.is_dataclass(kind) and node[key] is not None:  # (leaves are not read: no interpolation resolved)
            known_keys(node[key], kind, f"{prefix}{key}.")
        elif typing.get_origin(kind) is list and dataclasses.is_dataclass(typing.get_args(kind)[0]):
            for number, item in enumerate(node[key] or []):
                known_keys(item, typing.get_args(kind)[0], f"{prefix}{key}.{number}.")


def lists_are_lists(config: Any, prefix: str = "") -> None:
    """Every list key of ``config`` (a schema dataclass, as plan.admit builds it) holds a list. OmegaConf checks a
    list's items, but a whole list given as an interpolation (``prompts.texts=${seed}``) is resolved into whatever
    it names, unchecked."""
    import dataclasses
    import typing

    from sdjax_runner.config.schema import field_types, without_null

    schema: Any = type(config)
    for key, declared in field_types(schema).items():
        kind, nullable = without_null(declared)
        value = getattr(config, key)
        if value is None and nullable:
            continue
        if dataclasses.is_dataclass(kind):
            lists_are_lists(value, f"{prefix}{key}.")
        elif typing.get_origin(kind) is list:
            if not isinstance(value, list):
                raise UserError(f"{prefix}{key}", "must be a list, got " + ("null" if value is None else repr(value)),
                                f"a list: {prefix}{key}=[...]")
            if dataclasses.is_dataclass(typing.get_args(kind)[0]):
                for number, item in enumerate(value):
                    lists_are_lists(item, f"{prefix}{key}.{number}.")


def run_values(cfg: Any) -> None:
    """Every value of ``cfg`` (a typed RunConfig: plan.admit) that can be checked without JAX, a model or a device."""
    sampling, par = cfg.sampling, cfg.parallelism
    size("sampling.height", sampling.height)
    size("sampling.width", sampling.width)
    positive("sampling.num_inference_steps", sampling.num_inference_steps, optional=False)
    at_most("sampling.num_inference_steps", sampling.num_inference_steps, MAX_STEPS)
    if sampling.guidance_scale is not None and not math.isfinite(sampling.guidance_scale):
        raise UserError("sampling.guidance_scale", f"must be a finite number, got {sampling.guidance_scale}",
                        "any finite float, e.g. 7.5")
    positive("prompts.clip_skip", cfg.prompts.clip_skip, optional=False)
    if par.params.name == "sharded" and par.mode.name != "sharded":
        raise UserError("parallelism.params", "sharded needs parallelism=sharded (pmap gives every device a whole copy "
                        "of the weights)", "replicated, or parallelism=sharded")
    if par.params.name == "sharded" and cfg.lora:
        raise UserError("parallelism.params", f"sharded weights with LoRA adapters ({len(cfg.lora)} given) are not "
                        "merged yet", "replicated")
    positive("parallelism.per_device_batch_size", par.per_device_batch_size, optional=False)
    at_most("parallelism.per_device_batch_size", par.per_device_batch_size, MAX_PER_DEVICE_BATCH)
    positive("parallelism.num_devices", par.num_devices)
    positive("parallelism.num_batches", par.num_batches)
    positive("parallelism.host_device_count", par.host_device_count)
    positive("timing.repeats", cfg.timing.repeats, optional=False)
    at_most("timing.repeats", cfg.timing.repeats, MAX_REPEATS)
    share = cfg.timing.max_extra_share
    if share is not None and not (math.isfinite(share) and share >= 0):
        raise UserError("timing.max_extra_share", f"must be a share of the job's cost, 0 or more, got {share}",
                        "0.5 (the default), 0 (no timing re-runs), 2, ... or null (no bound)")
    if not 0 <= cfg.seed <= MAX_SEED:
        raise UserError("seed", f"{cfg.seed} is not a 32-bit PRNG seed", f"0..{MAX_SEED}")
    for index, adapter in enumerate(cfg.lora):  # a sweep over lora.N.scale is refused here, before it starts
        if not math.isfinite(float(adapter.scale)):
            raise UserError(f"lora.{index}.scale", f"must be a finite number, got {adapter.scale}",
                            "any finite float, e.g. 0.8")
    positive("output.grid_rows", cfg.output.grid_rows)
    positive("output.grid_cols", cfg.output.grid_cols)
    size("model.resolution", cfg.model.resolution)
    model(cfg.model)
    private_dir("paths.cache_dir", cfg.paths.cache_dir)
    if cfg.compilation_cache.enabled:
        private_dir("compilation_cache.dir", cfg.compilation_cache.dir)
    cache_bound = cfg.compilation_cache.max_size_gb
    if cache_bound is not None and not (math.isfinite(cache_bound) and cache_bound > 0):
        raise UserError("compilation_cache.max_size_gb", f"must be a positive number of GB, got {cache_bound}",
                        "e.g. 10, 0.5, or null for no bound (compilation_cache.enabled=false turns caching off)")
    if cfg.compilation_cache.min_compile_time_s < 0:
        raise UserError("compilation_cache.min_compile_time_s",
                        f"must be >= 0, got {cfg.compilation_cache.min_compile_time_s}", "0 (cache everything), 1.5, ...")
    family = families.planned(cfg.model)  # (it may read the model's index or a checkpoint's header: once)
    chosen = family.sampling(cfg.sampler, cfg.scheduler.name, sampling.num_inference_steps, sampling.eta)
    overrides = dict(cfg.scheduler.config_overrides)
    if overrides and not family.scheduler_settings:  # applied nowhere: the baseline's images, recorded as changed
        key = sorted(overrides)[0]
        raise UserError(f"scheduler.config_overrides.{key}", f"{overrides[key]!r}: {cfg.model.name} is "
                        f"{family.title.split(':')[0]}, whose flow-matching schedule (its shift) is the model's own "
                        "scheduler/scheduler_config.json's; scheduler settings are the SD family's", "none (leave scheduler.config_overrides empty)")
    if chosen.sampler == "scheduler" and chosen.scheduler == cfg.scheduler.name:
        scheduler_overrides(cfg.scheduler.name, overrides)
    else:  # a k sampler (or DDIM / PLMS named by sampler=) steps on its own: only the training schedule's is read
        unread = sorted(set(overrides) - {ZERO_SNR_KEY})
        # (a diffusers scheduler's group brings its own defaults, dpm_solver_pp's algorithm_type: not the user's to
        # answer for; a sigma schedule's group has none, so what it holds was given)
        if unread and cfg.scheduler.name in SIGMA_SCHEDULES:
            raise UserError(f"scheduler.config_overrides.{unread[0]}", f"{chosen.sampler} runs on the {cfg.scheduler.name} "
                            "sigma schedule, which reads no diffusers scheduler setting", f"{ZERO_SNR_KEY} only (the "
                            "training schedule's), or a diffusers scheduler with sampler=null")
        if ZERO_SNR_KEY in overrides:
            scheduler_values(cfg.scheduler.name, {ZERO_SNR_KEY: overrides[ZERO_SNR_KEY]})
    refiner.check(cfg, family)  # (before the mode's inputs: a mode it does not run with is the line to read)
    height, width = sampling.height or cfg.model.resolution, sampling.width or cfg.model.resolution
    if height and width:
        families.check_side(cfg, family, height, width)
    modes.check(cfg, chosen.sampler, family.start_step)
    second = hires.check(cfg, family, chosen.sampler, MAX_SIZE)
    if chosen.sampler == "scheduler" and chosen.scheduler == "lcm":
        lcm_steps(cfg, overrides, second)
    metrics(cfg.metrics)
    tracking_uri(cfg.tracking)


def lcm_steps(cfg: Any, overrides: dict[str, Any], second: Any) -> None:
    """diffusers' LCMScheduler takes at most its ``original_inference_steps`` (50) steps: a longer schedule -- the
    run's, or Hires. fix's (``second``, config/hires.Hires: steps / strength) -- is one line here rather than an
    error inside the program."""
    most = int(overrides.get("original_inference_steps", LCM_SETTINGS["original_inference_steps"]))
    schedules = [("sampling.num_inference_steps", cfg.sampling.num_inference_steps, "")]
    if second is not None:
        schedules.append(("sampling.hires.steps", second.schedule, " (the second pass's schedule: steps / strength)"))
    for key, steps, what in schedules:
        if steps is not None and steps > most:
            raise UserError(key, f"{steps} steps{what}: scheduler=lcm runs at most its {most} distillation steps "
                            "(original_inference_steps)", f"1..{most} (LCM models run 2-8)")


# What a tracking URI may be, for the one-line error.
TRACKING_URIS = ("http(s)://HOST:PORT for a tracking server, sqlite:///PATH, postgresql://, mysql:// or "
                 "mssql:// with its driver installed, databricks")


def tracking_uri(tracking: Any) -> None:
    """A tracking URI that MLflow has no store for -- a misspelled scheme, a server's host:port without
    http://, MLflow 3's file store (refused unless MLFLOW_ALLOW_FILE_STORE=true), a database whose
    driver is not installed -- is refused before the run: nothing could ever be logged there. Whether
    a server answers is not checked: a server down is a tracker failure (the run goes on; sync logs
    it later). The embedded SQLite store is not opened here (opening creates it)."""
    uri = tracking.uri or os.environ.get("MLFLOW_TRACKING_URI")
    if tracking.backend.name == "mlflow" and uri:
        mlflow_uri("tracking.uri" if tracking.uri else "MLFLOW_TRACKING_URI", uri,
                   "null for the embedded store under paths.output_root")


def mlflow_uri(key: str, uri: str, unset: str) -> None:
    """``uri`` (given as ``key``) refused with one line if MLflow has no store for it (see tracking_uri);
    ``unset``: what leaving it out means, for the list of what is allowed."""
    if uri.startswith("sqlite:"):
        return
    from mlflow.tracking import MlflowClient

    try:
        MlflowClient(tracking_uri=uri)  # resolves the store for the URI's scheme; connects to nothing
    except ModuleNotFoundError as exc:
        raise UserError(key, f"{uri} needs the Python module {exc.name}, which is not installed",
                        f"{TRACKING_URIS}, or {unset}") from None
    except Exception as exc:
        if "://" not in uri and ":" in uri:
            problem = f"{uri} is no URI MLflow can log to (a server's address needs its scheme: http://{uri})"
        elif "filesystem tracking backend" in str(exc):
            problem = f"{uri} is MLflow's file store, which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true"
        else:
            problem = f"MLflow has no store for {uri} (scheme {uri.split(':', 1)[0]!r}: {type(exc).__name__})"
        raise UserError(key, problem, f"{TRACKING_URIS}, or {unset}") from None


def metrics(metrics: Any) -> None:
    if metrics.reference is not None:
        directory = Path(metrics.reference).expanduser()
        if not (directory / "images.json").is_file():
            raise UserError("metrics.reference", f"{directory} is not a finished run directory (no images.json)",
                            "the directory of an earlier run, e.g. outputs/runs/<date>/<time>_<name>")
def reference_point(point: dict[str, str], swept: dict[str, list[str]]) -> dict[str, str]:
    """The reference point of a sweep: each key must be swept (``swept``: key -> the sweep's values on the
    command line) and each value one of its values. A key may be named short, as the report's axes are
    (``steps`` for sampling.num_inference_steps: ``+metrics.reference_point.steps=50``, which the command line
    can give where a dotted key cannot be one of a mapping's keys)."""
    from sdjax_runner.config.report_axes import resolve

    named = {str(key).lstrip("+~"): str(value) for key, value in point.items()}
    point = {}
    for key, value in named.items():
        try:
            point[resolve(key, list(swept), "metrics.reference_point")] = value
        except UserError:
            raise UserError("metrics.reference_point", f"{key} is not swept by this multirun",
                            ", ".join(swept) or "no swept keys") from None
    for key, value in point.items():
        if value not in swept[key]:
            raise UserError("metrics.reference_point", f"{key}={value} is not one of the sweep's points",
                            ", ".join(f"{key}={v}" for v in swept[key]))
    return point


def layout(num_devices: int, available: int, num_batches: int, needed: int, per_batch: int, prompts: int) -> None:
    if num_devices > available:
        raise UserError("parallelism.num_devices", f"{num_devices} requested but only {available} available",
                        f"1..{available} or null")
    if num_batches < needed:
        raise UserError("parallelism.num_batches", f"{num_batches} batch(es) of {per_batch} cannot hold {prompts} prompts",
                        f">= {needed} or null")
    total = num_batches * per_batch
    if total > MAX_IMAGES:
        raise UserError("parallelism.num_batches", f"{num_batches} batch(es) of {per_batch} are {total} images",
                        f"at most {MAX_IMAGES} images per run")


def grid(rows: Optional[int], cols: Optional[int], kept: int) -> None:
    for key, value in (("output.grid_rows", rows), ("output.grid_cols", cols)):
        if value and value > kept:
            raise UserError(key, f"{value} is more than the run's {kept} images", f"1..{kept} or null")
    if rows and cols and rows * cols < kept:
        raise UserError("output.grid_rows", f"a {rows} x {cols} grid cannot hold {kept} images",
                        f"rows x cols >= {kept}, or null for automatic")


def clip_skip(value: int, layers: int, xl: bool, model_name: str) -> None:
    """Once the model is loaded: prompts.clip_skip within its text encoder's layers (SD 1.x/2.x only)."""
    if value == 1:
        return
    if xl:
        raise UserError("prompts.clip_skip", f"{value}, but {model_name} is SDXL, which reads its text encoders' "
                        "penultimate layers by design", "1")
    if value > layers:
        raise UserError("prompts.clip_skip", f"{value}, but {model_name}'s text encoder has {layers} layers",
                        f"1..{layers}")
