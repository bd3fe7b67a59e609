"""Make the PyTorch reference for FreeU (``guider=freeu``, issue #62 item 1) in ``tests/fixtures/freeu/``.

diffusers' own ``StableDiffusionXLPipeline`` (0.39) with ``enable_freeu(s1, s2, b1, b2)`` on the tiny SDXL base of
``tests/fixtures/refiner`` (made by ``tests/helpers/make_refiner_reference.py``: diffusers' PyTorch classes, random
weights, the folders' Euler scheduler), at 64 x 64 so that both up blocks FreeU reweighs see more than the centre of
their spectrum (4 x 4 and 8 x 8 latents), from the runner's initial latents for seed 0 on 2 devices, for each case in
CASES (FreeU's published SDXL values, and SD 1.5's), and once without FreeU. The images go to ``freeu.npz`` (float32,
[0, 1]); the versions to ``VERSIONS.json``; ``README.md`` says what each key holds. Running it twice writes identical
files.

Run from the checkout's root (the reference environment of make_flux_reference.py: torch 2.14.1, diffusers 0.39.0,
jax for the runner's noise)::

    /work/refvenv/bin/python tests/helpers/make_freeu_reference.py            # writes tests/fixtures/freeu/
    /work/refvenv/bin/python tests/helpers/make_freeu_reference.py --out DIR  # somewhere else
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
from make_flux_reference import _save_npz, _versions, quiet_deterministic_torch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "freeu"
BASE = ROOT / "tests" / "fixtures" / "refiner" / "tiny-sdxl-base"
PROMPT = "a red cube on a table"
SEED, NUM_DEVICES = 0, 2
STEPS, GUIDANCE = 6, 5.0
HEIGHT = WIDTH = 64
# name -> FreeU's (b1, b2, s1, s2); None: without FreeU
CASES = {"sdxl": (1.3, 1.4, 0.9, 0.2), "sd15": (1.5, 1.6, 0.9, 0.2), "plain": None}

README = """# FreeU PyTorch references

Written by `tests/helpers/make_freeu_reference.py` (do not edit by hand); made with

    /work/refvenv/bin/python tests/helpers/make_freeu_reference.py

`freeu.npz`: diffusers' `StableDiffusionXLPipeline` with `unet.enable_freeu(s1, s2, b1, b2)` on
`tests/fixtures/refiner/tiny-sdxl-base`, 6 steps of the folder's Euler scheduler at guidance 5, 64 x 64, from `latents`
(the runner's initial noise for seed 0 on 2 devices), `prompt` for both images. For each case (`sdxl`, `sd15`: FreeU's
published values; `plain`: no FreeU) the images, float32 (2, 64, 64, 3) in [0, 1], and `CASE_factors`, (b1, b2, s1,
s2). `VERSIONS.json`: the packages it ran on.
"""


def runner_noise() -> np.ndarray:
    """The runner's initial latents for seed SEED on NUM_DEVICES devices, one image each: device i draws
    ``jax.random.normal(split(PRNGKey(seed), num_devices)[i], (1, 4, H/8, W/8), float32)``."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(SEED), NUM_DEVICES)
    shape = (1, 4, HEIGHT // 8, WIDTH // 8)
    return np.concatenate([np.asarray(jax.random.normal(key, shape, dtype=jnp.float32)) for key in keys])


def images(factors, latents: np.ndarray) -> np.ndarray:
    import torch
    from diffusers import StableDiffusionXLPipeline

    pipeline = StableDiffusionXLPipeline.from_pretrained(BASE, local_files_only=True, add_watermarker=False)
    pipeline.set_progress_bar_config(disable=True)
    if factors is not None:
        b1, b2, s1, s2 = factors
        pipeline.enable_freeu(s1=s1, s2=s2, b1=b1, b2=b2)
    with torch.no_grad():
        out = pipeline(prompt=[PROMPT] * len(latents), num_inference_steps=STEPS, guidance_scale=GUIDANCE,
                       height=HEIGHT, width=WIDTH, latents=torch.from_numpy(latents), output_type="np").images
    return np.asarray(out, dtype=np.float32)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    quiet_deterministic_torch()
    latents = runner_noise()
    arrays = {"latents": latents, "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS),
              "guidance_scale": np.asarray(GUIDANCE)}
    for case, factors in CASES.items():
        arrays[case] = images(factors, latents)
        if factors is not None:
            arrays[f"{case}_factors"] = np.asarray(factors)
    args.out.mkdir(parents=True, exist_ok=True)
    _save_npz(args.out / "freeu.npz", arrays)
    versions = dict(_versions(), script="tests/helpers/make_freeu_reference.py")
    (args.out / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    (args.out / "README.md").write_text(README)
    print(f"wrote {args.out}/freeu.npz ({', '.join(CASES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
