"""FLUX.1's LoRAs in kohya's layout (``lora_unet_double_blocks_0_img_attn_qkv``...: Black Forest Labs' module names,
underscored; ai-toolkit's ``diffusion_model.double_blocks.0...`` are read so too): renamed to the transformer's own
(diffusers' paths, underscored), models/family_loader.FamilyLoader's ``lora_modules`` for FLUX.1 (models/lora.py
calls it with the adapter's modules)."""

from __future__ import annotations

import numpy as np

from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.models import single_file as bfl


def kohya_modules(modules: dict, transformer: dict, name: str, config_key: str) -> dict:
    """``modules`` with kohya's FLUX.1 transformer modules (``unet`` ``double_blocks_0_img_attn_qkv``...) renamed to
    the transformer's own, a fused projection's factors split into its parts: the down factor (and alpha) shared, the
    up factor's rows cut as the weight's are (families/flux/models/single_file.py)."""
    width = int(np.shape(transformer["transformer_blocks_0"]["attn"]["to_q"]["kernel"])[-1])
    out = {}
    for (component, module), parts in modules.items():
        if component != "unet":
            out[(component, module)] = parts
            continue
        renamed = bfl.underscored(module)
        if renamed is None:
            raise UserError(config_key, f"{name}: lora_unet_{module} is no module of a FLUX.1 transformer in kohya's "
                            "layout", "a LoRA made for FLUX.1")
        targets, fused = renamed
        up = parts.get("up")
        bounds = bfl.part_rows(len(targets), width, None if up is None else int(np.shape(up)[0])) if fused else None
        for i, target in enumerate(targets):
            piece = dict(parts)
            if bounds is not None and up is not None:
                piece["up"] = np.asarray(up)[bounds[i]:bounds[i + 1]]
            out[("transformer", target.replace(".", "_"))] = piece
    return out
