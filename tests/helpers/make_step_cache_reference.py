"""Make the PyTorch references for First-Block Cache and MagCache on FLUX.1 (issue #62) in
``tests/fixtures/step_cache/``.

The runner never imports torch. This script runs in the reference environment of make_flux_reference.py (its
docstring says how to make it): it loads the published tiny FLUX.1 [dev] folder (``tests/fixtures/flux/
tiny-flux-dev``, made by that script) with diffusers' PyTorch ``FluxPipeline``, turns on diffusers' own First-Block
Cache (``pipeline.transformer.enable_cache(FirstBlockCacheConfig(threshold=T))``, diffusers/hooks/
first_block_cache.py) and calls it from the runner's noise (make_flux_reference.runner_noise: seed 0, one image on
each of 2 devices) at each threshold, recording the images and, call by call, whether the hooks skipped the
transformer's blocks after the first.

The runner decides per device (each device's batch is its own program's), so the pipeline is called once per
device's image, the cache fresh for each call. ``first_block.npz`` holds, per threshold, ``images_T`` (device,
H, W, 3), ``skipped_T`` (device, step), ``changes_T`` (device, step: the relative change the hooks compared with
T, NaN on the first call) and the settings; ``VERSIONS.json`` the libraries it ran with. Running it again writes
identical files. ``magcache.npz`` holds the same for MagCache (``MagCacheConfig`` with diffusers' FLUX_MAG_RATIOS) at
each of ``settings`` (threshold, max_skip_steps, retention_ratio): ``images_N`` and ``skipped_N``.

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_step_cache_reference.py
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import (
    HEIGHT,
    MAX_SEQUENCE_LENGTH,
    NUM_DEVICES,
    PROMPT,
    SEED,
    VARIANTS,
    WIDTH,
    _save_npz,
    _versions,
    load_aligned,
    quiet_deterministic_torch,
    runner_noise,
)

ROOT = Path(__file__).resolve().parents[2]
FOLDER = ROOT / "tests" / "fixtures" / "flux" / "tiny-flux-dev"
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "step_cache"
# 0: every block of every call (the plain pipeline); a million: every call after the first skips; between: a mix
# (the tiny random model's first block changes by 0.3 to 0.75 from step to step; each threshold at least 0.01 from
# every change it is compared with, so float32 rounding cannot flip a decision)
THRESHOLDS = (0.0, 0.05, 0.38, 0.6, 1e6)
STEPS = 8  # more than make_flux_reference's 4: room for a mix of calls that run and calls that skip
# MagCache: (threshold, max_skip_steps, retention_ratio) with diffusers' FLUX_MAG_RATIOS: its defaults and two
# thresholds that let more or fewer calls skip (a threshold sweep in the test), and one that skips every call it may
# from the first step, two in a row at most
MAG_SETTINGS = ((0.06, 3, 0.2), (0.3, 3, 0.2), (0.02, 3, 0.2), (1.0, 2, 0.0))


def threshold_runs(out: dict, thresholds: tuple, call, noise: np.ndarray, plain: np.ndarray, title: str) -> None:
    """Into ``out``, per threshold: each device's image (``images_T``), the calls the hooks skipped (``skipped_T``)
    and the changes they compared (``changes_T``), from ``call(threshold, one device's noise)``; threshold 0 must
    skip nothing and give ``plain``, the pipeline's images without the cache."""
    for threshold in thresholds:
        calls = [call(threshold, noise[i:i + 1]) for i in range(NUM_DEVICES)]
        out[f"images_{threshold:g}"] = np.stack([image for image, _, _ in calls])
        out[f"skipped_{threshold:g}"] = np.asarray([skipped for _, skipped, _ in calls], dtype=np.bool_)
        out[f"changes_{threshold:g}"] = np.asarray([changes for _, _, changes in calls], dtype=np.float64)
        print(f"{title}threshold {threshold:g}: skipped {out[f'skipped_{threshold:g}'].astype(int).tolist()}, changes "
              f"{np.round(out[f'changes_{threshold:g}'], 3).tolist()}, largest difference from the plain images "
              f"{np.abs(out[f'images_{threshold:g}'] - plain).max():.4f}")
    if out["skipped_0"].any() or not np.array_equal(out["images_0"], plain):
        raise RuntimeError(f"{title}threshold 0 skipped a call, or its images are not the pipeline's without the cache")


def _head_state(pipeline, hook: str = "fbc_leader_block_hook"):
    """A cache's shared state, as its head block's hook holds it (the transformer's first block)."""
    registry = pipeline.transformer.transformer_blocks[0]._diffusers_hook
    return registry.get_hook(hook).state_manager.get_state()


def _call_mag(pipeline, settings: tuple, latents_unpacked: np.ndarray) -> tuple[np.ndarray, list[bool]]:
    """One image from its noise with MagCache at ``settings`` (FLUX.1's published ratios), fresh; the image and the
    calls that skipped."""
    import torch
    from diffusers import MagCacheConfig
    from diffusers.hooks.mag_cache import FLUX_MAG_RATIOS

    threshold, max_skip_steps, retention_ratio = settings
    pipeline.transformer.enable_cache(MagCacheConfig(threshold=threshold, max_skip_steps=max_skip_steps,
                                                     retention_ratio=retention_ratio, num_inference_steps=STEPS,
                                                     mag_ratios=FLUX_MAG_RATIOS))
    skipped: list[bool] = []
    handle = pipeline.transformer.register_forward_hook(
        lambda module, args, output: skipped.append(not _head_state(pipeline, "mag_cache_leader_block_hook")
                                                    .should_compute))
    try:
        batch, channels, h, w = latents_unpacked.shape
        packed = pipeline._pack_latents(torch.from_numpy(latents_unpacked), batch, channels, h, w)
        with torch.no_grad():
            images = pipeline(prompt=[PROMPT] * batch, height=HEIGHT, width=WIDTH, num_inference_steps=STEPS,
                              guidance_scale=VARIANTS["dev"]["guidance_scale"], max_sequence_length=MAX_SEQUENCE_LENGTH,
                              latents=packed, output_type="np").images
    finally:
        handle.remove()
        pipeline.transformer.disable_cache()
    if len(skipped) != STEPS:
        raise RuntimeError(f"MagCache {settings}: {len(skipped)} transformer calls for {STEPS} steps")
    return np.asarray(images[0], dtype=np.float32), skipped


def _changes(changes: list[float]):
    """Record each relative change diffusers' head hook compares with the threshold (NaN for a call with no earlier
    residual): its own ``_should_compute_remaining_blocks``, wrapped."""
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook

    original = FBCHeadBlockHook._should_compute_remaining_blocks

    def recording(self, hidden_states_residual):
        state = self.state_manager.get_state()
        previous = state.head_block_residual
        changes.append(float("nan") if previous is None else float(
            (hidden_states_residual - previous).abs().mean() / previous.abs().mean()))
        return original(self, hidden_states_residual)

    FBCHeadBlockHook._should_compute_remaining_blocks = recording
    return original


def _call(pipeline, threshold: float, latents_unpacked: np.ndarray) -> tuple[np.ndarray, list[bool], list[float]]:
    """One image from its noise with the cache at ``threshold``, fresh; the image, the calls that skipped and the
    relative changes the hooks compared with the threshold."""
    import torch
    from diffusers import FirstBlockCacheConfig
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook

    spec = VARIANTS["dev"]
    pipeline.transformer.enable_cache(FirstBlockCacheConfig(threshold=threshold))
    skipped: list[bool] = []
    changes: list[float] = []
    original = _changes(changes)
    handle = pipeline.transformer.register_forward_hook(
        lambda module, args, output: skipped.append(not _head_state(pipeline).should_compute))
    try:
        batch, channels, h, w = latents_unpacked.shape
        packed = pipeline._pack_latents(torch.from_numpy(latents_unpacked), batch, channels, h, w)
        with torch.no_grad():
            images = pipeline(prompt=[PROMPT] * batch, height=HEIGHT, width=WIDTH,
                              num_inference_steps=STEPS, guidance_scale=spec["guidance_scale"],
                              max_sequence_length=MAX_SEQUENCE_LENGTH, latents=packed, output_type="np").images
    finally:
        handle.remove()
        pipeline.transformer.disable_cache()
        FBCHeadBlockHook._should_compute_remaining_blocks = original
    if len(skipped) != STEPS:
        raise RuntimeError(f"threshold {threshold}: {len(skipped)} transformer calls for {STEPS} steps")
    return np.asarray(images[0], dtype=np.float32), skipped, changes


# SD 3 (issue #62 item 2): the tiny SD 3.5 Medium-shaped pipeline of make_sd3_reference.py, its prompt, guidance,
# size and T5 length, from the runner's noise; thresholds at least 0.01 from every change the hooks compare (the
# tiny transformer's first block changes by 0.18 to 0.58 from step to step).
SD3_FOLDER = ROOT / "tests" / "fixtures" / "sd3" / "tiny-sd3"
SD3_STEPS = 8
SD3_THRESHOLDS = (0.0, 0.24, 0.35, 1e6)


def _sd3_call(pipeline, threshold: float, latents: np.ndarray) -> tuple[np.ndarray, list[bool], list[float]]:
    """:func:`_call` for SD 3, whose classes diffusers' First-Block Cache does not run as they are: the pipeline sets
    no cache context (StableDiffusion3Pipeline has no ``cache_context``: set here, once for its calls, as FluxPipeline
    sets "cond"), and the last block makes no text output (``context_pre_only``: None, which the tail hook subtracts
    from; zeros stand for it here -- nothing reads a last block's text). One image from its noise (a batch of its
    negative and positive halves, as the pipeline calls the transformer), on a fresh copy of the transformer."""
    import copy

    import torch
    from diffusers.hooks import FirstBlockCacheConfig, HookRegistry, apply_first_block_cache
    from diffusers.hooks.first_block_cache import FBCHeadBlockHook
    from make_sd3_reference import GUIDANCE, HEIGHT, MAX_SEQUENCE_LENGTH, PROMPT

    base = pipeline.transformer
    transformer = copy.deepcopy(base)
    last = transformer.transformer_blocks[-1]
    forward = last.forward

    def text_as_zeros(*args, **kwargs):
        context, x = forward(*args, **kwargs)
        return (torch.zeros_like(kwargs["encoder_hidden_states"]) if context is None else context), x

    last.forward = text_as_zeros
    apply_first_block_cache(transformer, FirstBlockCacheConfig(threshold=threshold))
    HookRegistry.check_if_exists_or_initialize(transformer)._set_context("cond_uncond")
    pipeline.transformer = transformer
    skipped: list[bool] = []
    changes: list[float] = []
    original = _changes(changes)
    handle = transformer.register_forward_hook(
        lambda module, args, output: skipped.append(not _head_state(pipeline).should_compute))
    try:
        with torch.no_grad():
            images = pipeline(prompt=[PROMPT], height=HEIGHT, width=WIDTH, num_inference_steps=SD3_STEPS,
                              guidance_scale=GUIDANCE, max_sequence_length=MAX_SEQUENCE_LENGTH,
                              latents=torch.from_numpy(latents), output_type="np").images
    finally:
        handle.remove()
        pipeline.transformer = base
        FBCHeadBlockHook._should_compute_remaining_blocks = original
    if len(skipped) != SD3_STEPS:
        raise RuntimeError(f"SD 3, threshold {threshold}: {len(skipped)} transformer calls for {SD3_STEPS} steps")
    return np.asarray(images[0], dtype=np.float32), skipped, changes


def sd3_first_block(noise: np.ndarray) -> dict[str, np.ndarray]:
    """``first_block_sd3.npz``: per threshold the images, the calls skipped and the changes compared, per device."""
    import torch
    from diffusers import StableDiffusion3Pipeline
    from make_sd3_reference import GUIDANCE, MAX_SEQUENCE_LENGTH, PROMPT

    pipeline = StableDiffusion3Pipeline.from_pretrained(SD3_FOLDER, torch_dtype=torch.float32, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    out: dict[str, np.ndarray] = {
        "prompt": np.asarray(PROMPT), "steps": np.asarray(SD3_STEPS, dtype=np.int64),
        "guidance_scale": np.asarray(GUIDANCE, dtype=np.float64), "height": np.asarray(HEIGHT, dtype=np.int64),
        "width": np.asarray(WIDTH, dtype=np.int64), "max_sequence_length": np.asarray(MAX_SEQUENCE_LENGTH, np.int64),
        "seed": np.asarray(SEED, dtype=np.int64), "num_devices": np.asarray(NUM_DEVICES, dtype=np.int64),
        "thresholds": np.asarray(SD3_THRESHOLDS, dtype=np.float64)}
    with torch.no_grad():
        plain = np.stack([np.asarray(pipeline(
            prompt=[PROMPT], height=HEIGHT, width=WIDTH, num_inference_steps=SD3_STEPS, guidance_scale=GUIDANCE,
            max_sequence_length=MAX_SEQUENCE_LENGTH, latents=torch.from_numpy(noise[i:i + 1]),
            output_type="np").images[0], dtype=np.float32) for i in range(NUM_DEVICES)])
    threshold_runs(out, SD3_THRESHOLDS, lambda threshold, one: _sd3_call(pipeline, threshold, one), noise, plain,
                   "SD 3: ")
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the fixture folder")
    args = parser.parse_args(argv)
    quiet_deterministic_torch()
    pipeline = load_aligned("FluxPipeline", FOLDER)
    noise = runner_noise()
    spec = VARIANTS["dev"]
    out: dict[str, np.ndarray] = {
        "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS, dtype=np.int64),
        "guidance_scale": np.asarray(spec["guidance_scale"], dtype=np.float64),
        "height": np.asarray(HEIGHT, dtype=np.int64), "width": np.asarray(WIDTH, dtype=np.int64),
        "max_sequence_length": np.asarray(MAX_SEQUENCE_LENGTH, dtype=np.int64),
        "seed": np.asarray(SEED, dtype=np.int64), "num_devices": np.asarray(NUM_DEVICES, dtype=np.int64),
        "thresholds": np.asarray(THRESHOLDS, dtype=np.float64)}
    plain = np.stack([_call(pipeline, 0.0, noise[i:i + 1])[0] for i in range(NUM_DEVICES)])
    threshold_runs(out, THRESHOLDS, lambda threshold, one: _call(pipeline, threshold, one), noise, plain, "")
    mag: dict[str, np.ndarray] = {key: out[key] for key in ("prompt", "steps", "guidance_scale", "height", "width",
                                                            "max_sequence_length", "seed", "num_devices")}
    mag["settings"] = np.asarray(MAG_SETTINGS, dtype=np.float64)
    for number, settings in enumerate(MAG_SETTINGS):
        calls = [_call_mag(pipeline, settings, noise[i:i + 1]) for i in range(NUM_DEVICES)]
        mag[f"images_{number}"] = np.stack([image for image, _ in calls])
        mag[f"skipped_{number}"] = np.asarray([skipped for _, skipped in calls], dtype=np.bool_)
        print(f"MagCache {settings}: skipped {mag[f'skipped_{number}'].astype(int).tolist()}, largest difference "
              f"from the plain images {np.abs(mag[f'images_{number}'] - plain).max():.4f}")
    sd3 = sd3_first_block(runner_noise())  # make_sd3_reference's noise: make_flux_reference's 32 x 32 for 2 devices
    args.out.mkdir(parents=True, exist_ok=True)
    _save_npz(args.out / "first_block.npz", out)
    _save_npz(args.out / "magcache.npz", mag)
    _save_npz(args.out / "first_block_sd3.npz", sd3)
    (args.out / "VERSIONS.json").write_text(json.dumps(_versions(), indent=2) + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
