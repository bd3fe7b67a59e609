"""Make the LCM-LoRA reference (issue #49) in ``tests/fixtures/lcm_lora/``.

LCM-LoRA (latent-consistency/lcm-lora-sdv1-5, -sdxl) and Hyper-SD's LoRAs adapt more than attention: the LCM
training script (diffusers' examples/consistency_distillation/train_lcm_distill_lora_sd_wds.py) targets
``to_q, to_k, to_v, to_out.0, proj_in, proj_out, ff.net.0.proj, ff.net.2, conv1, conv2, conv_shortcut,
downsamplers.0.conv, upsamplers.0.conv, time_emb_proj`` -- the resnets' 3x3 convolutions among them, whose down
factor is a 3x3 convolution -- and the files are published in kohya's names (``lora_unet_..._conv1.lora_down.weight``,
``.alpha``).

This script runs in the reference environment of ``tests/helpers/make_flux_reference.py`` (torch, diffusers 0.39.0,
peft; versions in ``VERSIONS.json``). With diffusers' PyTorch ``UNet2DConditionModel`` in the runner's
``tiny-random`` shape and a fixed seed, it adds a PEFT LoRA on LCM-LoRA's modules (rank 4, alpha 8, random up
factors), writes it in kohya's names (``tiny-lcm-lora.safetensors``), then loads that file back with diffusers'
own kohya reader (``StableDiffusionPipeline.lora_state_dict`` + ``load_lora_into_unet``) into a fresh copy of the
UNet, merges it with PEFT and records what the merge added to one module of each kind (``deltas.npz``: PyTorch
layout, out x in [x kh x kw]). Running it twice writes identical files.

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_lcm_lora_reference.py            # writes tests/fixtures/lcm_lora/
    /work/refvenv/bin/python tests/helpers/make_lcm_lora_reference.py --out DIR  # somewhere else
"""

from __future__ import annotations

import argparse
import copy
import importlib.metadata
import json
import os
import sys
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

import numpy as np

# The runner's tiny-random UNet (models/builtin.py), as diffusers' PyTorch class takes it.
UNET = {"sample_size": 8, "in_channels": 4, "out_channels": 4, "layers_per_block": 1,
        "block_out_channels": (32, 64), "down_block_types": ("CrossAttnDownBlock2D", "DownBlock2D"),
        "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D"), "cross_attention_dim": 32, "attention_head_dim": 8}
# LCM-LoRA's target modules (train_lcm_distill_lora_sd_wds.py)
TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "proj_in", "proj_out", "ff.net.0.proj", "ff.net.2", "conv1", "conv2",
           "conv_shortcut", "downsamplers.0.conv", "upsamplers.0.conv", "time_emb_proj"]
RANK, ALPHA = 4, 8
# One module of each kind: what the merge added to it is recorded
RECORDED = ["down_blocks.0.resnets.0.conv1", "down_blocks.1.resnets.0.conv2", "down_blocks.1.resnets.0.conv_shortcut",
            "down_blocks.0.downsamplers.0.conv", "up_blocks.0.upsamplers.0.conv", "mid_block.resnets.0.time_emb_proj",
            "down_blocks.0.attentions.0.proj_in", "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q",
            "up_blocks.1.attentions.0.transformer_blocks.0.attn2.to_out.0",
            "up_blocks.1.attentions.0.transformer_blocks.0.ff.net.0.proj",
            "up_blocks.1.attentions.0.transformer_blocks.0.ff.net.2", "up_blocks.1.attentions.0.proj_out"]


def kohya_names(peft_state: dict) -> dict:
    """PEFT's ``<module>.lora_A.weight`` / ``lora_B`` -> kohya's ``lora_unet_<module_underscored>.lora_down.weight``
    / ``lora_up``, with each module's ``.alpha``."""
    out = {}
    for key, value in peft_state.items():
        module, _, factor = key.rpartition(".lora_")
        name = "lora_unet_" + module.replace(".", "_")
        out[f"{name}.lora_{'down' if factor.startswith('A') else 'up'}.weight"] = value.contiguous()
        out[f"{name}.alpha"] = __import__("torch").tensor(float(ALPHA))
    return dict(sorted(out.items()))


def main(argv: list[str]) -> int:
    import torch
    from diffusers import StableDiffusionPipeline, UNet2DConditionModel
    from peft import LoraConfig, get_peft_model_state_dict
    from peft.tuners.tuners_utils import BaseTunerLayer
    from safetensors.torch import save_file

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path("tests/fixtures/lcm_lora"))
    args = parser.parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(0)
    base = UNet2DConditionModel(**UNET).eval()
    trained = copy.deepcopy(base)
    trained.add_adapter(LoraConfig(r=RANK, lora_alpha=ALPHA, target_modules=TARGETS, init_lora_weights=False))
    adapter = kohya_names(get_peft_model_state_dict(trained))
    lora_file = args.out / "tiny-lcm-lora.safetensors"
    save_file(adapter, str(lora_file))

    # diffusers' own reading of the kohya file, merged by PEFT into a fresh copy of the base
    state, alphas = StableDiffusionPipeline.lora_state_dict(str(args.out), weight_name=lora_file.name)
    unet = copy.deepcopy(base)
    StableDiffusionPipeline.load_lora_into_unet(state, alphas, unet=unet)
    for module in unet.modules():
        if isinstance(module, BaseTunerLayer):
            module.merge()
    merged = dict(unet.named_modules())
    originals = dict(base.named_modules())
    deltas = {}
    for name in RECORDED:
        layer = merged[name]
        weight = getattr(layer, "base_layer", layer).weight.detach()
        deltas[name] = (weight - originals[name].weight.detach()).numpy().astype(np.float32)
    np.savez_compressed(args.out / "deltas.npz", **deltas)
    conv3 = sum(1 for key, value in adapter.items() if key.endswith("lora_down.weight") and value.shape[-1] == 3)
    versions = {"torch": torch.__version__, "diffusers": importlib.metadata.version("diffusers"),
                "peft": importlib.metadata.version("peft"), "numpy": np.__version__,
                "python": sys.version.split()[0], "script": "tests/helpers/make_lcm_lora_reference.py",
                "modules": sum(1 for key in adapter if key.endswith(".alpha")), "conv3x3_modules": conv3}
    (args.out / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    print(f"wrote {lora_file} ({versions['modules']} modules, {conv3} of them 3x3 convolutions) and deltas.npz")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
