"""Make the PyTorch reference fixtures for SDXL's base + refiner "ensemble of experts" in ``tests/fixtures/refiner/``.

The runner never imports torch. This script runs in the reference environment of
``tests/helpers/make_flux_reference.py`` (the same pinned versions; see its docstring) and builds, with diffusers'
own PyTorch classes and fixed torch seeds (one per component), two tiny random-weight pipelines laid out as the
published pair is:

* ``tiny-sdxl-base/``: a ``StableDiffusionXLPipeline`` with the text encoders of the runner's built-in
  ``tiny-random-xl`` (sdjax_runner/models/builtin.py) and a narrower UNet and VAE, with stabilityai/stable-diffusion-xl-base-1.0's scheduler and
  ``force_zeros_for_empty_prompt=True``;
* ``tiny-sdxl-refiner/``: a ``StableDiffusionXLImg2ImgPipeline`` as stabilityai/stable-diffusion-xl-refiner-1.0 is:
  no first text encoder or tokenizer, the base's second text encoder, second tokenizer and VAE (the same weights;
  the folder holds its own copies, as the published refiner does), its own UNet (the refiner's structure at toy
  size: conditioned on encoder 2's penultimate states alone, 5 time ids with the aesthetic score),
  ``requires_aesthetics_score=True``, ``force_zeros_for_empty_prompt=False``.

It then runs diffusers' ensemble from the runner's own initial noise (seed 0, 2 devices, one 32x32 image each):
the base alone, and the base to ``denoising_end`` followed by the refiner from ``denoising_start`` at the same
fraction (0.8 and 0.5, and with a negative prompt at 0.8), and records the images, the latents handed over, the
refiner's conditioning and the timesteps and sigmas each pass ran, in ``refiner.npz``. It ends by loading both
saved folders back with ``from_pretrained`` (offline) and checking that they give the recorded images. Running it
twice writes identical files; ``tests/fixtures/refiner/README.md`` (written by this script) describes every file
and key.

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_refiner_reference.py            # writes tests/fixtures/refiner/
    /work/refvenv/bin/python tests/helpers/make_refiner_reference.py --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import _builtin_tokenizer_code, _np, _save_npz, _versions, quiet_deterministic_torch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "refiner"
SEED = 0
NUM_DEVICES = 2
HEIGHT = WIDTH = 32
LATENT_CHANNELS = 4

PROMPT = "a red cube on a table"
NEGATIVE_PROMPT = "blurry"
STEPS = 10
GUIDANCE = 5.0
SWITCHES = (0.8, 0.5)  # denoising_end of the base = denoising_start of the refiner
# The refiner's __call__ defaults (aesthetic_score, negative_aesthetic_score), as its conditioning is recorded.
AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE = 6.0, 2.5

# stabilityai/stable-diffusion-xl-base-1.0's and -refiner-1.0's scheduler_config.json (the same in both).
SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                 timestep_spacing="leading", steps_offset=1, prediction_type="epsilon")
# The built-in tiny-random-xl's text towers: CLIP ViT-L (quick_gelu, no projection) and OpenCLIP bigG (gelu, with
# projection) at toy width; the vocabulary and special ids are the built-in tokenizer's (set in build_pipelines).
CLIP_1 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
              hidden_act="quick_gelu", max_position_embeddings=77)
CLIP_2 = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, hidden_act="gelu",
              projection_dim=32, max_position_embeddings=77)
# SDXL-base's UNet structure at toy size (the built-in tiny-random-xl's, narrower: 32 at both levels): no attention at
# the top level, two transformer layers deeper down, linear projections, text_time added conditioning on both
# encoders' states (64 = 32 + 32) and on the pooled 32 + 6 time ids of 8. Widths are multiples of 32, the GroupNorm
# groups of the real UNets, which Flax's UNet fixes and the runner's UNet requires (NEUTRAL in families/sd/models/unet.py).
BASE_UNET = dict(sample_size=8, in_channels=4, out_channels=4, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                 up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(32, 32), layers_per_block=1,
                 attention_head_dim=(2, 4), transformer_layers_per_block=(1, 2), cross_attention_dim=64,
                 use_linear_projection=True, addition_embed_type="text_time", addition_time_embed_dim=8,
                 projection_class_embeddings_input_dim=32 + 6 * 8)
# The refiner's UNet at toy size: cross-attention on encoder 2's penultimate states alone (32), the pooled 32 + 5
# time ids (original size, crop, aesthetic score) of 8, one transformer layer per level, heads of 4 at the deeper
# level (the base's 2 x 16 there is 4 of 8 here).
REFINER_UNET = dict(BASE_UNET, transformer_layers_per_block=(1, 1), cross_attention_dim=32, attention_head_dim=(2, 8),
                    projection_class_embeddings_input_dim=32 + 5 * 8)
# A VAE of four levels (8x down-sampling, as SD's) at toy width, SDXL's scaling factor.
VAE = dict(in_channels=3, out_channels=3, latent_channels=LATENT_CHANNELS, down_block_types=("DownEncoderBlock2D",) * 4,
           up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(8, 8, 16, 16), layers_per_block=1,
           norm_num_groups=8, sample_size=64, scaling_factor=0.13025)
COMPONENT_SEEDS = dict(unet=20, vae=21, text_encoder=22, text_encoder_2=23, refiner_unet=24)
BASE_FOLDER, REFINER_FOLDER = "tiny-sdxl-base", "tiny-sdxl-refiner"


# --- the pipelines -----------------------------------------------------------------------------------------


def build_pipelines(staging: Path):
    """(base, refiner): the refiner shares the base's text_encoder_2, tokenizer_2 and vae objects, as diffusers'
    ensemble example passes them (``text_encoder_2=base.text_encoder_2, vae=base.vae``)."""
    import torch
    from diffusers import (
        AutoencoderKL,
        EulerDiscreteScheduler,
        StableDiffusionXLImg2ImgPipeline,
        StableDiffusionXLPipeline,
        UNet2DConditionModel,
    )
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTextModelWithProjection, CLIPTokenizer

    write_tokenizer = _builtin_tokenizer_code()["write_clip_tokenizer"]
    size = write_tokenizer(staging / "tokenizer")
    # SDXL's second tokenizer pads with "!" (as builtin.py's _build_into writes it, and the published one is).
    if write_tokenizer(staging / "tokenizer_2", pad_token="!") != size:
        raise RuntimeError("the two tokenizers' vocabularies differ")
    tokenizer = CLIPTokenizer.from_pretrained(staging / "tokenizer")
    tokenizer_2 = CLIPTokenizer.from_pretrained(staging / "tokenizer_2")
    if tokenizer_2.pad_token != "!" or tokenizer_2.pad_token_id == tokenizer.pad_token_id:
        raise RuntimeError("tokenizer_2 does not pad with '!'")
    special = dict(vocab_size=size, bos_token_id=size - 2, eos_token_id=size - 1, pad_token_id=size - 1)
    modules = {}
    for name, build in (("unet", lambda: UNet2DConditionModel(**BASE_UNET)),
                        ("vae", lambda: AutoencoderKL(**VAE)),
                        ("text_encoder", lambda: CLIPTextModel(CLIPTextConfig(**special, **CLIP_1))),
                        ("text_encoder_2", lambda: CLIPTextModelWithProjection(CLIPTextConfig(**special, **CLIP_2))),
                        ("refiner_unet", lambda: UNet2DConditionModel(**REFINER_UNET))):
        torch.manual_seed(COMPONENT_SEEDS[name])
        modules[name] = build().eval()
    base = StableDiffusionXLPipeline(
        vae=modules["vae"], text_encoder=modules["text_encoder"], text_encoder_2=modules["text_encoder_2"],
        tokenizer=tokenizer, tokenizer_2=tokenizer_2, unet=modules["unet"],
        scheduler=EulerDiscreteScheduler(**SCHEDULER), force_zeros_for_empty_prompt=True, add_watermarker=False)
    refiner = StableDiffusionXLImg2ImgPipeline(
        vae=base.vae, text_encoder=None, text_encoder_2=base.text_encoder_2, tokenizer=None,
        tokenizer_2=base.tokenizer_2, unet=modules["refiner_unet"], scheduler=EulerDiscreteScheduler(**SCHEDULER),
        requires_aesthetics_score=True, force_zeros_for_empty_prompt=False, add_watermarker=False)
    for pipeline in (base, refiner):
        pipeline.set_progress_bar_config(disable=True)
    return base, refiner


def load_pipelines(out: Path):
    from diffusers import StableDiffusionXLImg2ImgPipeline, StableDiffusionXLPipeline

    base = StableDiffusionXLPipeline.from_pretrained(out / BASE_FOLDER, local_files_only=True, add_watermarker=False)
    refiner = StableDiffusionXLImg2ImgPipeline.from_pretrained(out / REFINER_FOLDER, local_files_only=True,
                                                               add_watermarker=False)
    if refiner.text_encoder is not None or refiner.tokenizer is not None:
        raise RuntimeError("the saved refiner has a first text encoder")
    for pipeline in (base, refiner):
        pipeline.set_progress_bar_config(disable=True)
    return base, refiner


# --- the references ----------------------------------------------------------------------------------------


def runner_noise(height: int = HEIGHT, width: int = WIDTH) -> np.ndarray:
    """The runner's initial latents for seed SEED on NUM_DEVICES devices, one image each: device i draws
    ``jax.random.normal(split(PRNGKey(seed), num_devices)[i], (1, 4, H/8, W/8), float32)``
    (make_flux_reference.runner_noise with SDXL's 4 latent channels)."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(SEED), NUM_DEVICES)
    shape = (1, LATENT_CHANNELS, height // 8, width // 8)
    return np.concatenate([np.asarray(jax.random.normal(key, shape, dtype=jnp.float32)) for key in keys])


def _recorded_call(pipeline, **kwargs):
    """``pipeline(**kwargs).images`` and, for each UNet call, what it got: the timestep, the scheduler's sigma at
    that step (``sigmas[step_index]``: scale_model_input has set the index before the UNet runs) and, for the
    first call, its inputs."""
    import torch

    calls: list[dict] = []

    def hook(module, args, kwargs_in):
        scheduler = pipeline.scheduler
        call = {"timestep": _np(torch.as_tensor(args[1])), "sigma": _np(scheduler.sigmas[scheduler.step_index]),
                "step_index": scheduler.step_index}
        if not calls:
            call.update(sample=_np(args[0]), encoder_hidden_states=_np(kwargs_in["encoder_hidden_states"]),
                        text_embeds=_np(kwargs_in["added_cond_kwargs"]["text_embeds"]),
                        time_ids=_np(kwargs_in["added_cond_kwargs"]["time_ids"]))
        calls.append(call)

    handle = pipeline.unet.register_forward_pre_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            images = pipeline(**kwargs).images
    finally:
        handle.remove()
    return images, calls


def ensemble(base, refiner, latents: np.ndarray, switch: float | None, negative: str | None = None) -> dict:
    """The base alone (switch None) or diffusers' ensemble of experts at ``switch``: the base with
    ``denoising_end=switch, output_type="latent"``, its latents straight into the refiner with
    ``denoising_start=switch``."""
    import torch

    batch = len(latents)
    common = dict(prompt=[PROMPT] * batch, num_inference_steps=STEPS, guidance_scale=GUIDANCE)
    if negative is not None:
        common["negative_prompt"] = [negative] * batch
    if switch is None:
        images, base_calls = _recorded_call(base, **common, height=HEIGHT, width=WIDTH,
                                            latents=torch.from_numpy(latents), output_type="np")
        return {"images": np.asarray(images, dtype=np.float32), "base_calls": base_calls}
    switch_latents, base_calls = _recorded_call(base, **common, height=HEIGHT, width=WIDTH,
                                                latents=torch.from_numpy(latents), denoising_end=switch,
                                                output_type="latent")
    images, refiner_calls = _recorded_call(refiner, **common, image=switch_latents, denoising_start=switch,
                                           output_type="np")
    return {"switch_latents": _np(switch_latents), "images": np.asarray(images, dtype=np.float32),
            "base_calls": base_calls, "refiner_calls": refiner_calls}


def references(base, refiner) -> dict[str, np.ndarray]:
    import torch

    latents = runner_noise()
    batch = len(latents)
    alone = ensemble(base, refiner, latents, None)
    runs = {switch: ensemble(base, refiner, latents, switch) for switch in SWITCHES}
    negative = ensemble(base, refiner, latents, SWITCHES[0], NEGATIVE_PROMPT)

    arrays: dict[str, np.ndarray] = {
        "latents": latents, "prompt": np.asarray(PROMPT), "negative_prompt": np.asarray(NEGATIVE_PROMPT),
        "steps": np.asarray(STEPS, dtype=np.int64), "guidance_scale": np.asarray(GUIDANCE, dtype=np.float64),
        "height": np.asarray(HEIGHT, dtype=np.int64), "width": np.asarray(WIDTH, dtype=np.int64),
        "seed": np.asarray(SEED, dtype=np.int64), "num_devices": np.asarray(NUM_DEVICES, dtype=np.int64),
        "switches": np.asarray(SWITCHES, dtype=np.float64),
        "base_images": alone["images"],
    }
    for switch, run in runs.items():
        suffix = "" if switch == SWITCHES[0] else "_" + f"{switch:.1f}".replace(".", "")
        arrays[f"switch_latents{suffix}"] = run["switch_latents"]
        arrays[f"ensemble_images{suffix}"] = run["images"]
        arrays[f"base_timesteps{suffix}"] = np.stack([c["timestep"] for c in run["base_calls"]])
        arrays[f"base_step_sigmas{suffix}"] = np.stack([c["sigma"] for c in run["base_calls"]])
        arrays[f"refiner_timesteps{suffix}"] = np.stack([c["timestep"] for c in run["refiner_calls"]])
        arrays[f"refiner_step_sigmas{suffix}"] = np.stack([c["sigma"] for c in run["refiner_calls"]])
    arrays["negative_switch_latents"] = negative["switch_latents"]
    arrays["negative_ensemble_images"] = negative["images"]

    with torch.no_grad():
        embeds, negative_embeds, pooled, negative_pooled = refiner.encode_prompt(
            prompt=[PROMPT] * batch, device=torch.device("cpu"), num_images_per_prompt=1,
            do_classifier_free_guidance=True)
        # as StableDiffusionXLImg2ImgPipeline.__call__ calls it (step 8): sizes from the latents, crops (0, 0)
        size = (HEIGHT, WIDTH)
        add_time_ids, add_neg_time_ids = refiner._get_add_time_ids(
            size, (0, 0), size, AESTHETIC_SCORE, NEGATIVE_AESTHETIC_SCORE, size, (0, 0), size,
            dtype=embeds.dtype, text_encoder_projection_dim=refiner.text_encoder_2.config.projection_dim)
        base_time_ids = base._get_add_time_ids(size, (0, 0), size, dtype=embeds.dtype,
                                               text_encoder_projection_dim=base.text_encoder_2.config.projection_dim)
    arrays.update(refiner_prompt_embeds=_np(embeds), refiner_negative_prompt_embeds=_np(negative_embeds),
                  refiner_pooled=_np(pooled), refiner_negative_pooled=_np(negative_pooled),
                  add_time_ids=_np(add_time_ids), add_neg_time_ids=_np(add_neg_time_ids),
                  base_add_time_ids=_np(base_time_ids))
    scheduler = base.scheduler
    scheduler.set_timesteps(STEPS)
    arrays.update(timesteps=_np(scheduler.timesteps), sigmas=_np(scheduler.sigmas),
                  init_noise_sigma=np.asarray(scheduler.init_noise_sigma, dtype=np.float32))

    _check_calls(arrays, runs, negative)
    return arrays


def _check_calls(arrays: dict, runs: dict, negative: dict) -> None:
    """What the UNets got agrees with the recorded conditioning, and the refiner starts from the base's latents
    as they are (no noise added: its first UNet input is the switch latents scaled by 1/sqrt(sigma^2 + 1))."""
    import torch

    batch = NUM_DEVICES
    for switch, run in runs.items():
        first = run["refiner_calls"][0]
        sigma = torch.from_numpy(first["sigma"])
        latents = torch.from_numpy(run["switch_latents"])
        expected = torch.cat([latents] * 2) / ((sigma**2 + 1) ** 0.5)
        if not np.array_equal(first["sample"], expected.numpy()):
            raise RuntimeError(f"switch {switch}: the refiner's first UNet input is not the base's latents")
        checks = {"encoder_hidden_states": np.concatenate([arrays["refiner_negative_prompt_embeds"],
                                                           arrays["refiner_prompt_embeds"]]),
                  "text_embeds": np.concatenate([arrays["refiner_negative_pooled"], arrays["refiner_pooled"]]),
                  "time_ids": np.concatenate([np.repeat(arrays["add_neg_time_ids"], batch, 0),
                                              np.repeat(arrays["add_time_ids"], batch, 0)])}
        for key, value in checks.items():
            if not np.array_equal(first[key], value):
                raise RuntimeError(f"switch {switch}: the refiner's UNet got another {key}")
        indices = [c["step_index"] for c in run["base_calls"] + run["refiner_calls"]]
        if indices != list(range(len(indices))):
            raise RuntimeError(f"switch {switch}: the scheduler's step indices are not 0..N-1 across both passes: "
                               f"{indices}")
    if len(negative["base_calls"]) + len(negative["refiner_calls"]) != STEPS:
        raise RuntimeError("the negative-prompt ensemble did not run every step once")


def _fresh_memory(*pipelines) -> None:
    """Copy every parameter to fresh (aligned) memory: from_pretrained leaves memory-mapped safetensors at
    unaligned addresses, where torch's CPU kernels may sum in another order (see make_flux_reference)."""
    import torch

    with torch.no_grad():
        for pipeline in pipelines:
            for name in ("unet", "vae", "text_encoder", "text_encoder_2"):
                module = getattr(pipeline, name, None)
                if module is not None:
                    for tensor in itertools.chain(module.parameters(), module.buffers()):
                        tensor.data = tensor.data.clone()


def check_saved(out: Path) -> float:
    """The saved folders, loaded back offline with from_pretrained (the refiner from its own folder: its own
    copies of text_encoder_2 and vae), give the recorded images: within 1e-5 as loaded, bit for bit once the
    parameters are in fresh memory. Returns the largest difference as loaded."""
    with np.load(out / "refiner.npz") as data:
        recorded = {key: data[key] for key in data.files}
    latents = recorded["latents"]
    expected = {"base_images": (None, None), "ensemble_images": (SWITCHES[0], None),
                "ensemble_images_05": (SWITCHES[1], None), "negative_ensemble_images": (SWITCHES[0], NEGATIVE_PROMPT)}
    as_loaded = 0.0
    for fresh in (False, True):
        base, refiner = load_pipelines(out)
        if fresh:
            _fresh_memory(base, refiner)
        for key, (switch, negative) in expected.items():
            images = ensemble(base, refiner, latents, switch, negative)["images"]
            difference = float(np.abs(images - recorded[key]).max())
            if fresh and difference != 0.0:
                raise RuntimeError(f"loaded back (fresh memory), {key} differs by {difference}")
            if not fresh:
                if difference > 1e-5:
                    raise RuntimeError(f"loaded back, {key} differs by {difference}")
                as_loaded = max(as_loaded, difference)
    return as_loaded


# --- the README --------------------------------------------------------------------------------------------

KEY_NOTES = {
    "latents": "the runner's initial noise: device i: jax.random.normal(split(PRNGKey(0), 2)[i], (1, 4, 4, 4)); "
               "passed as `latents=` to the base (which multiplies it by `init_noise_sigma`)",
    "prompt": "the prompt of both images, both passes",
    "negative_prompt": "the negative prompt of the `negative_*` run (both passes)",
    "steps": "num_inference_steps, both passes", "guidance_scale": "guidance_scale, both passes",
    "height": "image height", "width": "image width", "seed": "the runner's seed",
    "num_devices": "devices (one image each)", "switches": "the switch fractions recorded (0.8: no suffix; 0.5: `_05`)",
    "base_images": "the base alone, all 10 steps, output_type='np' (NHWC, [0, 1])",
    "switch_latents": "base(..., denoising_end=0.8, output_type='latent').images: scaled latents (not divided by "
                      "scaling_factor) after the base's last step",
    "ensemble_images": "refiner(prompt, image=switch_latents, num_inference_steps=10, denoising_start=0.8, "
                       "guidance_scale=5, output_type='np').images",
    "base_timesteps": "the timesteps the base's UNet ran at switch 0.8 (recorded by a forward pre-hook)",
    "base_step_sigmas": "scheduler.sigmas[step_index] at each of those UNet calls",
    "refiner_timesteps": "the timesteps the refiner's UNet ran at switch 0.8",
    "refiner_step_sigmas": "scheduler.sigmas[step_index] at each of the refiner's UNet calls (its first: the sigma "
                           "the base stepped to)",
    "switch_latents_05": "as switch_latents, at denoising_end=0.5",
    "ensemble_images_05": "as ensemble_images, at denoising_start=0.5",
    "base_timesteps_05": "the base's timesteps at switch 0.5", "base_step_sigmas_05": "their sigmas",
    "refiner_timesteps_05": "the refiner's timesteps at switch 0.5", "refiner_step_sigmas_05": "their sigmas",
    "negative_switch_latents": "switch_latents with negative_prompt=NEGATIVE passed to the base (0.8)",
    "negative_ensemble_images": "the ensemble at 0.8 with negative_prompt passed to both pipelines",
    "refiner_prompt_embeds": "refiner.encode_prompt([prompt] * 2) prompt_embeds: text_encoder_2's penultimate "
                             "hidden state (hidden_states[-2]), alone",
    "refiner_negative_prompt_embeds": "its negative_prompt_embeds: force_zeros_for_empty_prompt is False, so the "
                                      "empty prompt \"\" encoded (padded with '!')",
    "refiner_pooled": "its pooled_prompt_embeds: text_encoder_2's text_embeds (projection of the EOS state)",
    "refiner_negative_pooled": "its negative_pooled_prompt_embeds: text_embeds of \"\"",
    "add_time_ids": "refiner._get_add_time_ids: original size + crop + aesthetic score 6.0 (requires_aesthetics_score)",
    "add_neg_time_ids": "the negative row: original size + crop + negative aesthetic score 2.5",
    "base_add_time_ids": "base._get_add_time_ids: original size + crop + target size (its negative row is the same)",
    "timesteps": "EulerDiscreteScheduler.set_timesteps(10).timesteps (leading spacing, steps_offset 1)",
    "sigmas": "the scheduler's sigmas for 10 steps (a final 0 appended), float32",
    "init_noise_sigma": "sqrt(sigmas.max()^2 + 1) (leading spacing): what the base multiplies `latents` by",
}


def _describe(folder: Path) -> str:
    lines = ["| key | shape | dtype | meaning |", "| --- | --- | --- | --- |"]
    with np.load(folder / "refiner.npz") as data:
        for key in data.files:
            value = data[key]
            lines.append(f"| `{key}` | {tuple(value.shape)} | {value.dtype} | {KEY_NOTES[key]} |")
    return "\n".join(lines) + "\n"


def _readme(folder: Path, schedules: dict, as_loaded: float) -> str:
    tree = [f"    {p.relative_to(folder)}  ({p.stat().st_size} bytes)" for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != "README.md"]
    sizes = {name: sum(p.stat().st_size for p in (folder / name).rglob("*") if p.is_file())
             for name in (BASE_FOLDER, REFINER_FOLDER)}
    schedule_lines = [f"* full schedule ({STEPS} steps): timesteps = {schedules['timesteps']}, sigmas = "
                      f"{schedules['sigmas']}"]
    for switch in SWITCHES:
        values = schedules[switch]
        schedule_lines.append(
            f"* switch {switch}: base timesteps {values['base_timesteps']} (sigmas {values['base_sigmas']}); "
            f"refiner timesteps {values['refiner_timesteps']} (sigmas {values['refiner_sigmas']})")

    def call(name, config):
        return f"`{name}({', '.join(f'{k}={v!r}' for k, v in config.items())})`"

    return "\n".join([
        "# SDXL base + refiner (ensemble of experts) PyTorch references",
        "",
        "Written by `tests/helpers/make_refiner_reference.py` (do not edit by hand); made with",
        "",
        "    /work/refvenv/bin/python tests/helpers/make_refiner_reference.py",
        "",
        "in the reference environment of `tests/helpers/make_flux_reference.py` (versions in `VERSIONS.json`). All "
        "weights are random (fixed torch seeds, one per component), so the images are noise-like; what matters is "
        "that the runner reproduces them. Everything ran in float32 on CPU with one torch thread. Running the "
        "script again writes identical files. Loaded back with `from_pretrained`, the folders reproduce the images "
        "bit for bit once the parameters are copied to fresh memory, and as loaded (memory-mapped) within "
        f"{as_loaded:.3g} (make_flux_reference saw an ulp or so there: compare with a tolerance).",
        "",
        "## Files",
        "",
        f"* `{BASE_FOLDER}/` ({sizes[BASE_FOLDER]} bytes): `StableDiffusionXLPipeline.save_pretrained` "
        "(safetensors) of a tiny random SDXL base (the text encoders of the runner's built-in `tiny-random-xl`, a "
        "narrower UNet and VAE); "
        "`force_zeros_for_empty_prompt=True` as sdxl-base-1.0's model_index.",
        f"* `{REFINER_FOLDER}/` ({sizes[REFINER_FOLDER]} bytes): `StableDiffusionXLImg2ImgPipeline.save_pretrained` "
        "laid out as stabilityai/stable-diffusion-xl-refiner-1.0: `text_encoder` and `tokenizer` null in "
        "model_index.json, `requires_aesthetics_score=True`, `force_zeros_for_empty_prompt=False`; its "
        "`text_encoder_2/`, `tokenizer_2/` and `vae/` are copies of the base's (the same weights, byte-identical "
        "files), its `unet/` its own.",
        "* `refiner.npz`: the runner's initial latents and diffusers' results from them (keys below).",
        "* `VERSIONS.json`: the versions the script ran with.",
        "",
        "```",
        *tree,
        "```",
        "",
        "## Components",
        "",
        f"* base unet: {call('UNet2DConditionModel', BASE_UNET)}, torch seed {COMPONENT_SEEDS['unet']}",
        f"* refiner unet: {call('UNet2DConditionModel', REFINER_UNET)}, torch seed {COMPONENT_SEEDS['refiner_unet']}",
        f"* vae (shared): {call('AutoencoderKL', VAE)}, torch seed {COMPONENT_SEEDS['vae']}",
        f"* text_encoder (base only): `CLIPTextModel(CLIPTextConfig("
        f"{', '.join(f'{k}={v!r}' for k, v in CLIP_1.items())}))`, torch seed {COMPONENT_SEEDS['text_encoder']}",
        f"* text_encoder_2 (shared): `CLIPTextModelWithProjection(CLIPTextConfig("
        f"{', '.join(f'{k}={v!r}' for k, v in CLIP_2.items())}))`, torch seed {COMPONENT_SEEDS['text_encoder_2']}",
        "* both text encoders: vocab_size, bos/eos/pad ids of the built-in tiny models' CLIP tokenizer "
        "(sdjax_runner/models/builtin.py `_write_tokenizer`): ids end with <|startoftext|>, <|endoftext|>",
        "* tokenizer: that CLIPTokenizer (pad <|endoftext|>); tokenizer_2 (shared): the same vocabulary with "
        "pad_token '!' (as builtin.py's SDXL build and the published SDXL tokenizer_2 pad)",
        f"* scheduler (each pipeline its own instance): `EulerDiscreteScheduler({SCHEDULER})`",
        "",
        "## Calls",
        "",
        f"Prompt {PROMPT!r} for both images, {HEIGHT}x{WIDTH}, num_inference_steps={STEPS}, guidance_scale="
        f"{GUIDANCE}, `latents=torch.from_numpy(latents)` into the base. The ensemble: `base(..., "
        "denoising_end=s, output_type='latent')`, then `refiner(prompt, image=those latents, num_inference_steps=10, "
        f"denoising_start=s, guidance_scale={GUIDANCE}, output_type='np')` with s in {list(SWITCHES)}; the "
        f"negative run passes negative_prompt={NEGATIVE_PROMPT!r} to both. The refiner's aesthetic scores are its "
        f"defaults ({AESTHETIC_SCORE}, {NEGATIVE_AESTHETIC_SCORE}). Timesteps and sigmas of each pass are what a "
        "forward pre-hook on each UNet saw (the timestep argument, and `scheduler.sigmas[scheduler.step_index]`, "
        "which scale_model_input has set before the UNet runs).",
        "",
        "## Schedules",
        "",
        *schedule_lines,
        "",
        "## Keys of `refiner.npz`",
        "",
        _describe(folder),
        "## Notes on diffusers' ensemble (0.39.0)",
        "",
        "* The base's cutoff: `int(round(1000 - denoising_end * 1000))`; it keeps the timesteps `>=` the cutoff.",
        "* The refiner's: the same cutoff; it keeps the scheduler's timesteps `<` the cutoff (from the end), and "
        "`set_begin_index(t_start)` so its Euler step index continues from the base's: its first step uses the "
        "sigma the base stepped to.",
        "* With denoising_start the refiner adds no noise (`add_noise=False`); 4-channel `image` is taken as "
        "latents as they are (already scaled by scaling_factor).",
        "* The refiner encodes only with text_encoder_2 (penultimate hidden state, no concatenation; the pooled "
        "embedding is its text_embeds) and, with force_zeros_for_empty_prompt False and no negative prompt, encodes "
        "\"\" (padded with '!') for the negative side. With no first encoder it encodes `prompt` (and "
        "`negative_prompt`) with tokenizer_2, not `prompt_2`.",
        "* The base multiplies `latents` by `init_noise_sigma` (its prepare_latents); the refiner does not scale the "
        "latents it is given.",
        "* The refiner's time ids: (original h, w, crop top, left, aesthetic score); negative: the negative "
        "aesthetic score.",
        "",
    ])


# --- main --------------------------------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the fixture folder (replaced)")
    args = parser.parse_args(argv)

    quiet_deterministic_torch()
    out: Path = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    versions = _versions()
    with tempfile.TemporaryDirectory(prefix="refiner-reference-") as temp:
        staging, result = Path(temp) / "staging", Path(temp) / "refiner"
        staging.mkdir()
        result.mkdir()
        base, refiner = build_pipelines(staging)
        base.save_pretrained(result / BASE_FOLDER, safe_serialization=True)
        refiner.save_pretrained(result / REFINER_FOLDER, safe_serialization=True)
        arrays = references(base, refiner)
        _save_npz(result / "refiner.npz", arrays)
        as_loaded = check_saved(result)
        print(f"loaded back: reproduced bit for bit (as from_pretrained leaves the weights: within {as_loaded:.3g})")
        schedules: dict = {"timesteps": arrays["timesteps"].tolist(), "sigmas": arrays["sigmas"].tolist()}
        for switch in SWITCHES:
            suffix = "" if switch == SWITCHES[0] else "_" + f"{switch:.1f}".replace(".", "")
            schedules[switch] = {name: arrays[f"{key}{suffix}"].tolist() for name, key in (
                ("base_timesteps", "base_timesteps"), ("base_sigmas", "base_step_sigmas"),
                ("refiner_timesteps", "refiner_timesteps"), ("refiner_sigmas", "refiner_step_sigmas"))}
        (result / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n", encoding="utf-8")
        (result / "README.md").write_text(_readme(result, schedules, as_loaded), encoding="utf-8")
        for path in result.rglob("*"):  # (some writers leave 0600 files)
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(result), str(out))
    for name in (BASE_FOLDER, REFINER_FOLDER, "."):
        size = sum(p.stat().st_size for p in (out / name).rglob("*") if p.is_file())
        print(f"{out / name}: {size} bytes")
    print(f"full schedule: timesteps={schedules['timesteps']} sigmas={schedules['sigmas']}")
    for switch in SWITCHES:
        print(f"switch {switch}: {schedules[switch]}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
