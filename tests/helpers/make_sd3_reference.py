"""Make the PyTorch reference fixtures for Stable Diffusion 3 / 3.5 (issue #48) in ``tests/fixtures/sd3/``.

The runner never imports torch. This script runs in the reference environment of
``tests/helpers/make_flux_reference.py`` (the same pinned versions; see its docstring) and builds, with diffusers'
own PyTorch classes and fixed torch seeds, tiny random-weight ``SD3Transformer2DModel`` s in the three published
shapes of the family -- ``sd3`` (SD 3.0 Medium: no q/k norm), ``large`` (SD 3.5 Large: RMS q/k norm) and
``medium`` (SD 3.5 Medium, MMDiT-X: RMS q/k norm and dual attention in its first blocks) -- saves each with
``save_pretrained`` (the published layout: config.json and diffusion_pytorch_model.safetensors) and records what
diffusers computes with them for fixed inputs, all blocks and with a block skipped (skip-layer guidance), in
``transformers.npz``. Running it twice writes identical files.

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_sd3_reference.py            # writes tests/fixtures/sd3/
    /work/refvenv/bin/python tests/helpers/make_sd3_reference.py --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from make_flux_reference import _np, _save_npz, _versions  # the FLUX maker's helpers, unchanged

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "sd3"
SEED = 0

# SD 3's transformer at toy size: 4 heads of 8, three blocks (the last one context_pre_only), 2x2 patches of the
# 16-channel latents, T5 width 32 (CLIP features are padded to it), pooled CLIP-L + CLIP-G width 24; a 16 x 16
# patch position table (the real ones: 192 for SD 3.5 Large, 384 for Medium), base size sample_size / patch.
TRANSFORMER = dict(sample_size=16, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=8,
                   num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=32,
                   pooled_projection_dim=24, out_channels=16, pos_embed_max_size=16)
VARIANTS = {
    "sd3": dict(qk_norm=None, dual_attention_layers=()),
    "large": dict(qk_norm="rms_norm", dual_attention_layers=()),
    "medium": dict(qk_norm="rms_norm", dual_attention_layers=(0, 1)),
}
# Module inputs: NCHW latents of 8 x 12 (4 x 6 patches: a crop off the table's centre, not square), 10 text
# tokens, a timestep on the scheduler's 0..1000 scale, a batch of 2 (different timesteps per row).
LATENT_H, LATENT_W = 8, 12
TEXT_TOKENS = 10
TIMESTEPS = (700.0, 31.5)
SKIP_LAYERS = (1,)


def transformer_references(out: Path) -> None:
    import torch
    from diffusers import SD3Transformer2DModel

    rng = np.random.RandomState(SEED)
    batch = len(TIMESTEPS)
    hidden = rng.standard_normal((batch, TRANSFORMER["in_channels"], LATENT_H, LATENT_W)).astype(np.float32)
    context = rng.standard_normal((batch, TEXT_TOKENS, TRANSFORMER["joint_attention_dim"])).astype(np.float32)
    pooled = rng.standard_normal((batch, TRANSFORMER["pooled_projection_dim"])).astype(np.float32)
    arrays = {"hidden_states": hidden, "encoder_hidden_states": context, "pooled_projections": pooled,
              "timestep": np.asarray(TIMESTEPS, np.float32)}
    for index, (variant, extra) in enumerate(VARIANTS.items()):
        torch.manual_seed(SEED + index)
        model = SD3Transformer2DModel(**TRANSFORMER, **extra).eval()
        folder = out / f"transformer-{variant}"
        model.save_pretrained(folder, safe_serialization=True)
        with torch.no_grad():
            for name, skip in (("all", None), ("skip", list(SKIP_LAYERS))):
                sample = model(hidden_states=torch.from_numpy(hidden), encoder_hidden_states=torch.from_numpy(context),
                               pooled_projections=torch.from_numpy(pooled), timestep=torch.tensor(TIMESTEPS),
                               skip_layers=skip, return_dict=False)[0]
                arrays[f"{variant}_{name}"] = _np(sample)
    _save_npz(out / "transformers.npz", arrays)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    args = parser.parse_args()
    if args.out.exists():
        shutil.rmtree(args.out)
    args.out.mkdir(parents=True)
    transformer_references(args.out)
    versions = _versions()
    versions["skip_layers"] = list(SKIP_LAYERS)
    (args.out / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    (args.out / "README.md").write_text(
        "# SD 3 / 3.5 reference fixtures\n\nMade by `tests/helpers/make_sd3_reference.py` with diffusers' PyTorch "
        "classes (versions in VERSIONS.json; the environment is make_flux_reference.py's).\n\n"
        "* `transformer-{sd3,large,medium}/`: `SD3Transformer2DModel.save_pretrained` of a tiny random transformer in "
        "each published shape (SD 3.0: no q/k norm; SD 3.5 Large: RMS q/k norm; SD 3.5 Medium: RMS q/k norm and "
        "dual attention in blocks 0 and 1), torch seeds 0, 1, 2.\n"
        "* `transformers.npz`: the inputs (`hidden_states` NCHW, `encoder_hidden_states`, `pooled_projections`, "
        "`timestep`) and, per variant, its output with every block (`<variant>_all`) and with block 1 skipped "
        "(`<variant>_skip`, diffusers' `skip_layers`), NCHW.\n")


if __name__ == "__main__":
    main()
