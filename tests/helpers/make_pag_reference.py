"""Make the PyTorch reference for perturbed-attention guidance (``guider=pag``, issue #62 item 1) in
``tests/fixtures/pag/``.

diffusers' own ``StableDiffusionXLPAGPipeline`` (0.39) on the tiny SDXL base of ``tests/fixtures/refiner`` (made by
``tests/helpers/make_refiner_reference.py``: diffusers' PyTorch classes, random weights, the folders' Euler scheduler),
from the runner's initial latents for seed 0 on 2 devices at 32 x 32 (``refiner.npz``'s ``latents``), for each case in
CASES: PAG on the default ``mid`` layers with classifier-free guidance; on other layers (a block's every self-attention,
and one module by its name) with the adaptive scale; and without classifier-free guidance (guidance 1: the
conditional and perturbed predictions alone). The images go to ``pag.npz`` (float32, [0, 1]); the versions to
``VERSIONS.json``. Running it twice writes identical files.

Run from the checkout's root (the reference environment of make_flux_reference.py: torch 2.14.1, diffusers 0.39.0)::

    /work/refvenv/bin/python tests/helpers/make_pag_reference.py            # writes tests/fixtures/pag/
    /work/refvenv/bin/python tests/helpers/make_pag_reference.py --out DIR  # somewhere else
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

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import _save_npz, _versions, quiet_deterministic_torch

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "pag"
BASE = ROOT / "tests" / "fixtures" / "refiner" / "tiny-sdxl-base"
REFINER_REFERENCE = ROOT / "tests" / "fixtures" / "refiner" / "refiner.npz"
PROMPT = "a red cube on a table"
STEPS = 6
HEIGHT = WIDTH = 32
# name -> (pag_applied_layers, guidance_scale, pag_scale, pag_adaptive_scale)
CASES = {
    "mid": (["mid"], 5.0, 3.0, 0.0),
    "layers_adaptive": (["down_blocks.1", "up_blocks.0.attentions.1.transformer_blocks.0.attn1"], 5.0, 4.0, 0.004),
    "no_cfg": (["mid"], 1.0, 2.0, 0.0),
}


README = """# Perturbed-attention guidance PyTorch references

Written by `tests/helpers/make_pag_reference.py` (do not edit by hand); made with

    /work/refvenv/bin/python tests/helpers/make_pag_reference.py

`pag.npz`: diffusers' `StableDiffusionXLPAGPipeline` on `tests/fixtures/refiner/tiny-sdxl-base`, 6 steps of the
folder's Euler scheduler at 32 x 32, from `latents` (the runner's initial noise for seed 0 on 2 devices, as
`tests/fixtures/refiner/refiner.npz` has it), `prompt` for both images. For each case (`mid`, `layers_adaptive`,
`no_cfg`) the images, float32 (2, 32, 32, 3) in [0, 1], and `CASE_settings`, a JSON text of its
`pag_applied_layers`, `guidance_scale`, `pag_scale` and `pag_adaptive_scale`. `VERSIONS.json`: the packages it ran on.
"""


def images(case: str, latents: np.ndarray) -> np.ndarray:
    import torch
    from diffusers import StableDiffusionXLPAGPipeline

    layers, guidance, scale, adaptive = CASES[case]
    pipeline = StableDiffusionXLPAGPipeline.from_pretrained(BASE, local_files_only=True, add_watermarker=False,
                                                            enable_pag=True, pag_applied_layers=layers)
    pipeline.set_progress_bar_config(disable=True)
    with torch.no_grad():
        out = pipeline(prompt=[PROMPT] * len(latents), num_inference_steps=STEPS, guidance_scale=guidance,
                       pag_scale=scale, pag_adaptive_scale=adaptive, height=HEIGHT, width=WIDTH,
                       latents=torch.from_numpy(latents), output_type="np").images
    return np.asarray(out, dtype=np.float32)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args(argv)
    quiet_deterministic_torch()
    latents = np.load(REFINER_REFERENCE)["latents"]
    arrays = {"latents": latents, "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS)}
    for case, (layers, guidance, scale, adaptive) in CASES.items():
        arrays[case] = images(case, latents)
        arrays[f"{case}_settings"] = np.asarray(json.dumps({"layers": layers, "guidance_scale": guidance,
                                                            "pag_scale": scale, "pag_adaptive_scale": adaptive}))
    args.out.mkdir(parents=True, exist_ok=True)
    _save_npz(args.out / "pag.npz", arrays)
    versions = dict(_versions(), script="tests/helpers/make_pag_reference.py")
    (args.out / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    (args.out / "README.md").write_text(README)
    print(f"wrote {args.out}/pag.npz ({', '.join(CASES)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
