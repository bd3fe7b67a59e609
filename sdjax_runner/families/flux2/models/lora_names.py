"""FLUX.2's LoRAs in Black Forest Labs' layout (ai-toolkit's ``diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight``
..., kohya's ``lora_unet_double_blocks_0_img_attn_qkv``...; models/lora.py reads both as the same underscored module
names) renamed to the transformer's own (diffusers' paths, underscored): models/family_loader.FamilyLoader's
``lora_modules`` for FLUX.2. As diffusers' ``_convert_non_diffusers_flux2_lora_to_diffusers``: a double block's fused
q/k/v shares its down factor and has its up factor's rows cut in three; a single block's fused projections stay fused
(``to_qkv_mlp_proj``, ``to_out``), as the module has them."""

from __future__ import annotations

import re
from typing import Optional

import numpy as np

from sdjax_runner.errors import UserError
from sdjax_runner.families.flux2.models.single_file import DOUBLE, DOUBLE_FUSED, SINGLE, SWAPPED, TOP


def underscored(module: str) -> Optional[tuple[tuple[str, ...], bool]]:
    """An underscored BFL module name (``double_blocks_0_img_attn_qkv``, ``single_blocks_3_linear1``, ``img_in``) -> (the
    diffusers module paths it is, whether they are a fused projection's parts); None for one the tables do not know
    (the final layer's modulation among them: its halves are swapped in the weights, and diffusers' LoRA conversion
    does not swap them)."""
    found = re.fullmatch(r"(double_blocks|single_blocks)_(\d+)_(.+)", module)
    if found:
        block, number, inside = found.groups()
        prefix = f"{'transformer_blocks' if block == 'double_blocks' else 'single_transformer_blocks'}.{number}."
        table = {key.replace(".", "_"): value for key, value in (DOUBLE if block == "double_blocks" else SINGLE).items()}
        fused = {key.replace(".", "_"): value for key, value in DOUBLE_FUSED.items()} if block == "double_blocks" else {}
        if inside in table:
            return (prefix + table[inside],), False
        if inside in fused:
            return tuple(prefix + part for part in fused[inside]), True
        return None
    top = {key.replace(".", "_"): value for key, value in TOP.items() if key not in SWAPPED}
    return ((top[module],), False) if module in top else None


def bfl_modules(modules: dict, transformer: dict, name: str, config_key: str) -> dict:
    """``modules`` with the transformer's modules in BFL's names (component ``unet``) renamed to its own; a fused q/k/v's
    up factor cut into three equal row blocks, the down factor (and alpha) shared."""
    out = {}
    for (component, module), parts in modules.items():
        if component != "unet":
            out[(component, module)] = parts
            continue
        renamed = underscored(module)
        if renamed is None:
            raise UserError(config_key, f"{name}: {module} is no module of a FLUX.2 transformer in Black Forest Labs' "
                            "layout a LoRA adapts", "a LoRA made for FLUX.2 [klein]")
        targets, fused = renamed
        up = parts.get("up")
        rows = int(np.shape(up)[0]) // len(targets) if fused and up is not None else None
        for i, target in enumerate(targets):
            piece = dict(parts)
            if rows is not None and up is not None:
                piece["up"] = np.asarray(up)[i * rows:(i + 1) * rows]
            out[("transformer", target.replace(".", "_"))] = piece
    return out
