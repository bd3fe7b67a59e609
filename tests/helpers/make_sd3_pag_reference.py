"""Make the PyTorch reference for perturbed-attention guidance on SD 3 (``guider=pag``, issue #62 item 1) in
``tests/fixtures/pag_sd3/``.

It runs diffusers' own ``StableDiffusion3PAGPipeline`` (0.39) on an SD 3.0-shaped tiny pipeline: the folder
``tests/fixtures/sd3/tiny-sd3`` (made by ``tests/helpers/make_sd3_reference.py``) with its transformer replaced by that
script's ``transformer-sd3`` (no q/k norm, no dual attention) -- :func:`sd3_medium_folder`, which the test assembles
the same way. SD 3.5's shapes do not suit diffusers' PAG processors: ``PAGCFGJointAttnProcessor2_0`` leaves out the
q/k norms (the runner keeps them), and it fails on SD 3.5 Medium's image-only ``attn2``, which the layer patterns
pick too.

From the runner's initial latents for seed 0 on 2 devices (make_flux_reference.runner_noise, 32 x 32), the prompt
of make_sd3_reference.py, 4 steps, 32 T5 tokens, for each case of CASES: the default ``blocks.1`` with classifier-free
guidance; two blocks (one of them the last, whose text is not updated) with the adaptive scale; and without
classifier-free guidance (guidance 1); and without PAG (pag_scale 0), with and without classifier-free guidance. ``pag.npz`` holds the
float32 images in [0, 1] and each case's settings; ``VERSIONS.json`` the packages. Running it twice writes identical
files.

Run from the checkout's root (the reference environment of make_flux_reference.py)::

    /work/refvenv/bin/python tests/helpers/make_sd3_pag_reference.py            # writes tests/fixtures/pag_sd3/
    /work/refvenv/bin/python tests/helpers/make_sd3_pag_reference.py --out DIR
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import _save_npz, _versions, quiet_deterministic_torch, runner_noise
from make_sd3_reference import GUIDANCE, HEIGHT, MAX_SEQUENCE_LENGTH, PROMPT, STEPS, WIDTH

ROOT = Path(__file__).resolve().parents[2]
SD3 = ROOT / "tests" / "fixtures" / "sd3"
# name -> (pag_applied_layers, guidance_scale, pag_scale, pag_adaptive_scale); pag_scale 0: the plain pipeline. The
# tiny random transformer's attention moves its images little: scales large enough that each case is 10 or more
# 8-bit levels from its plain images.
CASES = {
    "blocks_1": (["blocks.1"], GUIDANCE, 20.0, 0.0),
    "two_blocks_adaptive": (["blocks.0", "transformer_blocks.2"], GUIDANCE, 30.0, 0.02),
    "no_cfg": (["blocks.1"], 1.0, 20.0, 0.0),
    "plain": (["blocks.1"], GUIDANCE, 0.0, 0.0),
    "plain_no_cfg": (["blocks.1"], 1.0, 0.0, 0.0),
}

README = """# Perturbed-attention guidance on SD 3: PyTorch references

Written by `tests/helpers/make_sd3_pag_reference.py` (do not edit by hand); made with

    /work/refvenv/bin/python tests/helpers/make_sd3_pag_reference.py

`pag.npz`: diffusers' `StableDiffusion3PAGPipeline` on `tests/fixtures/sd3/tiny-sd3` with its transformer replaced by
`tests/fixtures/sd3/transformer-sd3` (SD 3.0's shape), 4 steps at 32 x 32, 32 T5 tokens, from `latents` (the runner's
initial noise for seed 0 on 2 devices), `prompt` for both images. For each case (`blocks_1`, `two_blocks_adaptive`,
`no_cfg`, and without PAG `plain` and `plain_no_cfg`) the images, float32 (2, 32, 32, 3) in [0, 1], and `CASE_settings`, a JSON text of its
`pag_applied_layers`, `guidance_scale`, `pag_scale` and `pag_adaptive_scale`. `VERSIONS.json`: the packages it ran on.
"""


def sd3_medium_folder(out: Path) -> Path:
    """tiny-sd3 with SD 3.0's transformer shape (transformer-sd3's config and weights) at ``out``."""
    shutil.copytree(SD3 / "tiny-sd3", out)
    for name in ("config.json", "diffusion_pytorch_model.safetensors"):
        shutil.copyfile(SD3 / "transformer-sd3" / name, out / "transformer" / name)
    return out


def images(folder: Path, latents: np.ndarray, layers: list, guidance: float, scale: float, adaptive: float):
    import torch
    from diffusers import StableDiffusion3PAGPipeline

    pipeline = StableDiffusion3PAGPipeline.from_pretrained(folder, pag_applied_layers=layers, local_files_only=True)
    pipeline.set_progress_bar_config(disable=True)
    with torch.no_grad():
        out = pipeline(prompt=[PROMPT] * len(latents), height=HEIGHT, width=WIDTH, num_inference_steps=STEPS,
                       guidance_scale=guidance, pag_scale=scale, pag_adaptive_scale=adaptive,
                       max_sequence_length=MAX_SEQUENCE_LENGTH, latents=torch.from_numpy(latents), output_type="np")
    return np.asarray(out.images, dtype=np.float32)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "pag_sd3")
    args = parser.parse_args(argv)
    quiet_deterministic_torch()
    latents = runner_noise()
    arrays = {"latents": latents, "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS)}
    with tempfile.TemporaryDirectory() as staging:
        folder = sd3_medium_folder(Path(staging) / "tiny-sd3-medium")
        for case, (layers, guidance, scale, adaptive) in CASES.items():
            arrays[case] = images(folder, latents, layers, guidance, scale, adaptive)
            arrays[f"{case}_settings"] = np.asarray(json.dumps({"layers": layers, "guidance_scale": guidance,
                                                                "pag_scale": scale, "pag_adaptive_scale": adaptive}))
    args.out.mkdir(parents=True, exist_ok=True)
    _save_npz(args.out / "pag.npz", arrays)
    versions = dict(_versions(), script="tests/helpers/make_sd3_pag_reference.py")
    (args.out / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    (args.out / "README.md").write_text(README)
    print(f"wrote {args.out}/pag.npz")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
