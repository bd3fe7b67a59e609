"""Make the PyTorch references for perturbed-attention guidance on SD 3 (``guider=pag``, issue #62 item 1) in
``tests/fixtures/pag_sd3/`` and for smoothed-energy guidance on SD 3 (``guider=seg``) in ``tests/fixtures/seg_sd3/``.

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

SEG: the same pipeline at 64 x 64 (the image's 4 x 4 patches) with its PAG processors replaced by SEG's
(:class:`SEGJointAttention`: diffusers' ``JointAttnProcessor2_0`` with the perturbed chunk's ``to_q`` output blurred as
the published SEG-SDXL processor blurs its queries -- what diffusers' SEG hook blurs on an MMDiT) and the adaptive scale
0, for each case of SEG_CASES; ``seg.npz`` beside its ``VERSIONS.json``.

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
from make_flux_reference import quiet_deterministic_torch, runner_noise, write_reference
from make_sd3_reference import GUIDANCE, HEIGHT, MAX_SEQUENCE_LENGTH, PROMPT, STEPS

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

SEG_SIZE = 64
# name -> (layers, guidance_scale, seg_scale, seg_blur_sigma); seg_scale 0: the plain pipeline
SEG_CASES = {
    "infinite": (["blocks.1"], GUIDANCE, 20.0, 9999999.0),
    "sigma_half": (["blocks.1"], GUIDANCE, 20.0, 0.5),
    "no_cfg": (["blocks.0", "transformer_blocks.2"], 1.0, 20.0, 1.0),
    "plain": (["blocks.1"], GUIDANCE, 0.0, 9999999.0),
    "plain_no_cfg": (["blocks.1"], 1.0, 0.0, 9999999.0),
}

SEG_README = """# Smoothed-energy guidance on SD 3: PyTorch references

Written by `tests/helpers/make_sd3_pag_reference.py` (do not edit by hand); made with

    /work/refvenv/bin/python tests/helpers/make_sd3_pag_reference.py

`seg.npz`: diffusers' `StableDiffusion3PAGPipeline` on `tests/fixtures/sd3/tiny-sd3` with its transformer replaced by
`tests/fixtures/sd3/transformer-sd3` (SD 3.0's shape) and its PAG processors by SEG's (`SEGJointAttention` in the
script: diffusers' joint attention with the perturbed chunk's `to_q` output blurred as the published SEG-SDXL processor
blurs queries), adaptive scale 0, 4 steps at 64 x 64, 32 T5 tokens, from `latents` (the runner's initial noise for
seed 0 on 2 devices), `prompt` for both images. For each case (`infinite`, `sigma_half`, `no_cfg`, and without SEG
`plain` and `plain_no_cfg`) the images, float32 (2, 64, 64, 3) in [0, 1], and `CASE_settings`, a JSON text of its
`layers`, `guidance_scale`, `seg_scale` and `seg_blur_sigma`. `VERSIONS.json`: the packages it ran on.
"""

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


class SEGJointAttention:
    """SEG's joint attention, for diffusers' SD 3 PAG pipeline to install where PAG's processors go: diffusers'
    ``JointAttnProcessor2_0`` (transcribed), but the batch's last of ``chunks`` equal parts has its ``to_q`` output
    -- the image tokens' queries, before the q norm, where diffusers' SEG hook sits -- blurred over the square grid of
    image tokens as the published SEG-SDXL processor blurs its queries (make_unet_guiders_reference.gaussian_blur, or
    their image's mean above its infinite-blur threshold)."""

    def __init__(self, chunks: int, sigma: float):
        self.chunks, self.sigma = chunks, sigma

    def _blurred(self, query):
        import math

        import torch
        from make_unet_guiders_reference import SEG_INFINITE, gaussian_blur

        rows, (_, tokens, channels) = query.shape[0] // self.chunks, query.shape
        side = math.isqrt(tokens)
        last = query[-rows:].transpose(1, 2).reshape(rows, channels, side, side)
        if self.sigma > SEG_INFINITE:
            last = last.mean(dim=(-2, -1), keepdim=True).expand_as(last)
        else:
            last = gaussian_blur(last, self.sigma)
        return torch.cat([query[:-rows], last.reshape(rows, channels, tokens).transpose(1, 2)])

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, *args, **kwargs):
        import torch
        import torch.nn.functional as F

        batch, image_tokens, _ = hidden_states.shape
        key, value = attn.to_k(hidden_states), attn.to_v(hidden_states)
        head_dim = key.shape[-1] // attn.heads

        def heads(t):
            return t.view(batch, -1, attn.heads, head_dim).transpose(1, 2)

        query, key, value = heads(self._blurred(attn.to_q(hidden_states))), heads(key), heads(value)
        if attn.norm_q is not None:
            query = attn.norm_q(query)
        if attn.norm_k is not None:
            key = attn.norm_k(key)
        if encoder_hidden_states is not None:
            added = [heads(proj(encoder_hidden_states)) for proj in (attn.add_q_proj, attn.add_k_proj, attn.add_v_proj)]
            if attn.norm_added_q is not None:
                added[0] = attn.norm_added_q(added[0])
            if attn.norm_added_k is not None:
                added[1] = attn.norm_added_k(added[1])
            query, key, value = (torch.cat([mine, theirs], dim=2) for mine, theirs in zip((query, key, value), added, strict=True))
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        image = attn.to_out[1](attn.to_out[0](out[:, :image_tokens]))
        if encoder_hidden_states is None:
            return image
        text = out[:, image_tokens:]
        return image, (text if attn.context_pre_only else attn.to_add_out(text))


def seg_noise(size: int) -> np.ndarray:
    """make_flux_reference.runner_noise at ``size`` x ``size``: the runner's initial latents for its seed on its
    devices, one image each."""
    import jax
    import jax.numpy as jnp
    from make_flux_reference import NUM_DEVICES, SEED, VAE

    keys = jax.random.split(jax.random.PRNGKey(SEED), NUM_DEVICES)
    shape = (1, VAE["latent_channels"], size // 8, size // 8)
    return np.concatenate([np.asarray(jax.random.normal(key, shape, dtype=jnp.float32)) for key in keys])


def images(folder: Path, latents: np.ndarray, layers: list, guidance: float, scale: float, adaptive: float,
           seg_sigma: float | None = None, size: int = HEIGHT):
    """The pipeline's images; with ``seg_sigma`` SEG's processors (:class:`SEGJointAttention`) in PAG's place."""
    import torch
    from diffusers import StableDiffusion3PAGPipeline

    pipeline = StableDiffusion3PAGPipeline.from_pretrained(folder, pag_applied_layers=layers, local_files_only=True)
    if seg_sigma is not None:
        pipeline.set_pag_applied_layers(layers, pag_attn_processors=(SEGJointAttention(3, seg_sigma),
                                                                     SEGJointAttention(2, seg_sigma)))
    pipeline.set_progress_bar_config(disable=True)
    with torch.no_grad():
        out = pipeline(prompt=[PROMPT] * len(latents), height=size, width=size, num_inference_steps=STEPS,
                       guidance_scale=guidance, pag_scale=scale, pag_adaptive_scale=adaptive,
                       max_sequence_length=MAX_SEQUENCE_LENGTH, latents=torch.from_numpy(latents), output_type="np")
    return np.asarray(out.images, dtype=np.float32)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures" / "pag_sd3")
    parser.add_argument("--seg-out", type=Path, default=ROOT / "tests" / "fixtures" / "seg_sd3")
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
        seg_latents = seg_noise(SEG_SIZE)
        seg = {"latents": seg_latents, "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS)}
        for case, (layers, guidance, scale, sigma) in SEG_CASES.items():
            seg[case] = images(folder, seg_latents, layers, guidance, scale, 0.0, seg_sigma=sigma, size=SEG_SIZE)
            seg[f"{case}_settings"] = np.asarray(json.dumps({"layers": layers, "guidance_scale": guidance,
                                                             "seg_scale": scale, "seg_blur_sigma": sigma}))
    write(args.out, "pag", arrays, README)
    write(args.seg_out, "seg", seg, SEG_README)
    return 0


def write(folder: Path, name: str, arrays: dict, readme: str) -> None:
    write_reference(folder, name, arrays, readme, "tests/helpers/make_sd3_pag_reference.py")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
