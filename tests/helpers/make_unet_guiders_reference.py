"""Make the PyTorch references for the guiders that work inside the UNet (issue #62 item 1): perturbed-attention
guidance (``guider=pag``) in ``tests/fixtures/pag/``, smoothed-energy guidance (``guider=seg``) in
``tests/fixtures/seg/`` and FreeU (``guider=freeu``) in ``tests/fixtures/freeu/``.

Both run diffusers' own PyTorch pipelines (0.39) on the tiny SDXL base of ``tests/fixtures/refiner`` (made by
``tests/helpers/make_refiner_reference.py``: diffusers' PyTorch classes, random weights, the folder's Euler scheduler)
from the runner's initial latents for seed 0 on 2 devices (that script's ``runner_noise``), 6 steps, one prompt:

* PAG: ``StableDiffusionXLPAGPipeline`` at 32 x 32 for each case of PAG_CASES -- the default ``mid`` layers with
  classifier-free guidance; a level's every self-attention and one module by its name, with the adaptive scale; and
  without classifier-free guidance (guidance 1: the conditional and perturbed predictions alone).
* SEG: ``StableDiffusionXLPAGPipeline`` at 64 x 64 (the self-attention then sees 4 x 4 latent pixels) with its
  perturbed-attention processors replaced by SEG's (:class:`SEGSelfAttention`, a transcription of the published
  SEG-SDXL pipeline's ``SEGCFGSelfAttnProcessor``: the perturbed chunk's queries blurred by its
  ``gaussian_blur_2d``, or made their image's mean above its infinite-blur threshold) and the adaptive scale 0: the
  PAG pipeline's loop then makes SEG-SDXL's prediction, ``uncond + g (cond - uncond) + seg_scale (cond -
  perturbed)`` (SEG-SDXL writes the same sum as ``cond + (g - 1) (cond - uncond) + ...``). Cases of SEG_CASES: the
  infinite blur (SEG's default) and two Gaussians on the same layers, and other layers without classifier-free
  guidance; and ``plain``/``plain_no_cfg``, the pipeline without PAG.
* FreeU: ``StableDiffusionXLPipeline`` with ``unet.enable_freeu(s1, s2, b1, b2)`` at 64 x 64 (so both up blocks FreeU
  reweighs see more than the centre of their spectrum: 4 x 4 and 8 x 8 latents) at FreeU's published SDXL and SD 1.5
  factors, and once without FreeU.

Each folder gets its ``.npz`` (float32 images in [0, 1]), ``VERSIONS.json`` and ``README.md``. Running it twice writes
identical files.

Run from the checkout's root (the reference environment of make_flux_reference.py: torch 2.14.1, diffusers 0.39.0,
jax for the runner's noise)::

    /work/refvenv/bin/python tests/helpers/make_unet_guiders_reference.py            # writes tests/fixtures/{pag,freeu}/
    /work/refvenv/bin/python tests/helpers/make_unet_guiders_reference.py --out DIR  # DIR/pag, DIR/freeu
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import quiet_deterministic_torch, write_reference
from make_refiner_reference import BASE_FOLDER, runner_noise  # (it sets the offline environment)

ROOT = Path(__file__).resolve().parents[2]
BASE = ROOT / "tests" / "fixtures" / "refiner" / BASE_FOLDER
PROMPT = "a red cube on a table"
STEPS = 6
PAG_SIZE, FREEU_SIZE = 32, 64
FREEU_GUIDANCE = 5.0
# name -> (pag_applied_layers, guidance_scale, pag_scale, pag_adaptive_scale)
PAG_CASES = {
    "mid": (["mid"], 5.0, 3.0, 0.0),
    "layers_adaptive": (["down_blocks.1", "up_blocks.0.attentions.1.transformer_blocks.0.attn1"], 5.0, 4.0, 0.004),
    "no_cfg": (["mid"], 1.0, 2.0, 0.0),
}
SEG_SIZE = 64
# name -> (layers, guidance_scale, seg_scale, seg_blur_sigma)
# (scale 8 on mid and up_blocks.0: the three blurs are 4 to 9 levels apart on the tiny model, SEG's default 3 on mid
# alone under 2)
SEG_CASES = {
    "infinite": (["mid", "up_blocks.0"], 5.0, 8.0, 9999999.0),
    "sigma_1": (["mid", "up_blocks.0"], 5.0, 8.0, 1.0),
    "sigma_half": (["mid", "up_blocks.0"], 5.0, 8.0, 0.5),
    "no_cfg": (["down_blocks.1", "up_blocks.0.attentions.0"], 1.0, 8.0, 2.0),
}
SEG_INFINITE = 9999.0  # SEG-SDXL's inf_blur_threshold
# name -> FreeU's (b1, b2, s1, s2); None: without FreeU
FREEU_CASES = {"sdxl": (1.3, 1.4, 0.9, 0.2), "sd15": (1.5, 1.6, 0.9, 0.2), "plain": None}

PAG_README = """# Perturbed-attention guidance PyTorch references

Written by `tests/helpers/make_unet_guiders_reference.py` (do not edit by hand); made with

    /work/refvenv/bin/python tests/helpers/make_unet_guiders_reference.py

`pag.npz`: diffusers' `StableDiffusionXLPAGPipeline` on `tests/fixtures/refiner/tiny-sdxl-base`, 6 steps of the
folder's Euler scheduler at 32 x 32, from `latents` (the runner's initial noise for seed 0 on 2 devices, as
`tests/fixtures/refiner/refiner.npz` has it), `prompt` for both images. For each case (`mid`, `layers_adaptive`,
`no_cfg`) the images, float32 (2, 32, 32, 3) in [0, 1], and `CASE_settings`, a JSON text of its
`pag_applied_layers`, `guidance_scale`, `pag_scale` and `pag_adaptive_scale`. `VERSIONS.json`: the packages it ran on.
"""
SEG_README = """# Smoothed-energy guidance PyTorch references

Written by `tests/helpers/make_unet_guiders_reference.py` (do not edit by hand); made with

    /work/refvenv/bin/python tests/helpers/make_unet_guiders_reference.py

`seg.npz`: diffusers' `StableDiffusionXLPAGPipeline` on `tests/fixtures/refiner/tiny-sdxl-base` with its PAG
processors replaced by SEG's (the published SEG-SDXL pipeline's `SEGCFGSelfAttnProcessor`, transcribed: the perturbed
chunk's queries blurred by its `gaussian_blur_2d`, or their image's mean above sigma 9999), adaptive scale 0: 6 steps
of the folder's Euler scheduler at 64 x 64, from `latents` (the runner's initial noise for seed 0 on 2 devices),
`prompt` for both images. For each case (`infinite`, `sigma_1`, `sigma_half`: three blurs at guidance 5; `no_cfg`:
other layers at guidance 1) the images, float32 (2, 64, 64, 3) in [0, 1], and `CASE_settings`, a JSON text of its
`layers`, `guidance_scale`, `seg_scale` and `seg_blur_sigma`; `plain` and `plain_no_cfg`: `StableDiffusionXLPipeline`
at guidance 5 and 1. `VERSIONS.json`: the packages it ran on.
"""
FREEU_README = """# FreeU PyTorch references

Written by `tests/helpers/make_unet_guiders_reference.py` (do not edit by hand); made with

    /work/refvenv/bin/python tests/helpers/make_unet_guiders_reference.py

`freeu.npz`: diffusers' `StableDiffusionXLPipeline` with `unet.enable_freeu(s1, s2, b1, b2)` on
`tests/fixtures/refiner/tiny-sdxl-base`, 6 steps of the folder's Euler scheduler at guidance 5, 64 x 64, from `latents`
(the runner's initial noise for seed 0 on 2 devices), `prompt` for both images. For each case (`sdxl`, `sd15`: FreeU's
published values; `plain`: no FreeU) the images, float32 (2, 64, 64, 3) in [0, 1], and `CASE_factors`, (b1, b2, s1,
s2). `VERSIONS.json`: the packages it ran on.
"""


def gaussian_blur(images, sigma: float):
    """SEG-SDXL's ``gaussian_blur_2d`` on ``images`` (batch, channels, side, side), transcribed: an odd
    ``ceil(6 sigma) + 1 - ceil(6 sigma) % 2`` taps, at most the side (its side + 1 when even), of a normalized
    Gaussian, as the outer product on both axes, over the images reflect-padded by half the taps, each channel alone."""
    import math

    import torch
    import torch.nn.functional as F

    side = images.shape[-1]
    taps = math.ceil(6 * sigma) + 1 - math.ceil(6 * sigma) % 2
    taps = min(taps, side - (side % 2 - 1))
    offsets = torch.linspace(-(taps - 1) * 0.5, (taps - 1) * 0.5, steps=taps)
    weights = torch.exp(-0.5 * (offsets / sigma).pow(2))
    weights = (weights / weights.sum()).to(images.dtype)
    kernel = torch.outer(weights, weights).expand(images.shape[-3], 1, taps, taps)
    padded = F.pad(images, [taps // 2] * 4, mode="reflect")
    return F.conv2d(padded, kernel, groups=images.shape[-3])


class SEGSelfAttention:
    """SEG's self-attention processor, for diffusers' PAG pipeline to install where PAG's would go: the batch's last
    of ``chunks`` equal parts (3 with classifier-free guidance: unconditional, conditional, perturbed; else 2) has its
    queries blurred over the square grid of image tokens, channel by channel (:func:`gaussian_blur`, or each query
    its image's mean where ``sigma`` is over SEG_INFINITE); then attention as usual. A transcription of SEG-SDXL's
    ``SEGCFGSelfAttnProcessor`` for the UNet's self-attention (no norms, masks or residual there)."""

    def __init__(self, chunks: int, sigma: float):
        self.chunks, self.sigma = chunks, sigma

    def __call__(self, attn, hidden_states, encoder_hidden_states=None, attention_mask=None, temb=None, **kwargs):
        import math

        import torch
        import torch.nn.functional as F

        assert encoder_hidden_states is None and attention_mask is None and hidden_states.ndim == 3
        batch, tokens, _ = hidden_states.shape
        query, key, value = (attn.to_q(hidden_states), attn.to_k(hidden_states), attn.to_v(hidden_states))
        head_dim = key.shape[-1] // attn.heads
        query, key, value = (t.view(batch, -1, attn.heads, head_dim).transpose(1, 2) for t in (query, key, value))
        side, rows = math.isqrt(tokens), batch // self.chunks
        perturbed = query[-rows:].permute(0, 1, 3, 2).reshape(rows, attn.heads * head_dim, side, side)
        if self.sigma > SEG_INFINITE:
            perturbed = perturbed.mean(dim=(-2, -1), keepdim=True).expand_as(perturbed)
        else:
            perturbed = gaussian_blur(perturbed, self.sigma)
        perturbed = perturbed.reshape(rows, attn.heads, head_dim, tokens).permute(0, 1, 3, 2)
        query = torch.cat([query[:-rows], perturbed])
        out = F.scaled_dot_product_attention(query, key, value, dropout_p=0.0, is_causal=False)
        out = out.transpose(1, 2).reshape(batch, -1, attn.heads * head_dim).to(query.dtype)
        return attn.to_out[1](attn.to_out[0](out))


def sdxl_images(latents: np.ndarray, size: int, guidance: float, pag: tuple | None = None,
                freeu: tuple | None = None, seg_sigma: float | None = None) -> np.ndarray:
    """The tiny SDXL's images from ``latents``: with ``pag`` (layers, scale, adaptive scale) diffusers' PAG pipeline
    -- with ``seg_sigma`` running SEG's processor (:class:`SEGSelfAttention`) in its layers instead --, with ``freeu``
    (b1, b2, s1, s2) FreeU enabled on its UNet."""
    import torch
    from diffusers import StableDiffusionXLPAGPipeline, StableDiffusionXLPipeline

    common = dict(local_files_only=True, add_watermarker=False)
    call = dict(prompt=[PROMPT] * len(latents), num_inference_steps=STEPS, guidance_scale=guidance, height=size,
                width=size, latents=torch.from_numpy(latents), output_type="np")
    if pag is not None:
        layers, scale, adaptive = pag
        pipeline = StableDiffusionXLPAGPipeline.from_pretrained(BASE, enable_pag=True, pag_applied_layers=layers,
                                                                **common)
        if seg_sigma is not None:
            pipeline.set_pag_applied_layers(layers, pag_attn_processors=(SEGSelfAttention(3, seg_sigma),
                                                                         SEGSelfAttention(2, seg_sigma)))
        call.update(pag_scale=scale, pag_adaptive_scale=adaptive)
    else:
        pipeline = StableDiffusionXLPipeline.from_pretrained(BASE, **common)
    if freeu is not None:
        b1, b2, s1, s2 = freeu
        pipeline.enable_freeu(s1=s1, s2=s2, b1=b1, b2=b2)
    pipeline.set_progress_bar_config(disable=True)
    with torch.no_grad():
        return np.asarray(pipeline(**call).images, dtype=np.float32)


def write(folder: Path, name: str, arrays: dict, readme: str) -> None:
    write_reference(folder, name, arrays, readme, "tests/helpers/make_unet_guiders_reference.py")


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT / "tests" / "fixtures")
    args = parser.parse_args(argv)
    quiet_deterministic_torch()
    latents = runner_noise(PAG_SIZE, PAG_SIZE)
    arrays = {"latents": latents, "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS)}
    for case, (layers, guidance, scale, adaptive) in PAG_CASES.items():
        arrays[case] = sdxl_images(latents, PAG_SIZE, guidance, pag=(layers, scale, adaptive))
        arrays[f"{case}_settings"] = np.asarray(json.dumps({"layers": layers, "guidance_scale": guidance,
                                                            "pag_scale": scale, "pag_adaptive_scale": adaptive}))
    write(args.out / "pag", "pag", arrays, PAG_README)
    latents = runner_noise(SEG_SIZE, SEG_SIZE)
    arrays = {"latents": latents, "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS),
              "plain": sdxl_images(latents, SEG_SIZE, 5.0), "plain_no_cfg": sdxl_images(latents, SEG_SIZE, 1.0)}
    for case, (layers, guidance, scale, sigma) in SEG_CASES.items():
        arrays[case] = sdxl_images(latents, SEG_SIZE, guidance, pag=(layers, scale, 0.0), seg_sigma=sigma)
        arrays[f"{case}_settings"] = np.asarray(json.dumps({"layers": layers, "guidance_scale": guidance,
                                                            "seg_scale": scale, "seg_blur_sigma": sigma}))
    write(args.out / "seg", "seg", arrays, SEG_README)
    latents = runner_noise(FREEU_SIZE, FREEU_SIZE)
    arrays = {"latents": latents, "prompt": np.asarray(PROMPT), "steps": np.asarray(STEPS),
              "guidance_scale": np.asarray(FREEU_GUIDANCE)}
    for case, factors in FREEU_CASES.items():
        arrays[case] = sdxl_images(latents, FREEU_SIZE, FREEU_GUIDANCE, freeu=factors)
        if factors is not None:
            arrays[f"{case}_factors"] = np.asarray(factors)
    write(args.out / "freeu", "freeu", arrays, FREEU_README)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
