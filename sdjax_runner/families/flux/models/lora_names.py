"""LoRAs of the FLUX transformers in Black Forest Labs' layout (kohya's ``lora_unet_double_blocks_0_img_attn_qkv``...,
ai-toolkit's ``diffusion_model.double_blocks.0.img_attn.qkv``...: models/lora.py reads both as the same underscored
module names) renamed to the transformer's own (diffusers' paths, underscored): models/family_loader.FamilyLoader's
``lora_modules`` for FLUX.1 (:func:`kohya_modules`) and, with its own table, FLUX.2 (families/flux2/models/
lora_names.py)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Optional

import numpy as np

from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.models import single_file as bfl


def bfl_renamed(modules: dict, transformer: dict, name: str, config_key: str,
                underscored: Callable[[str], Optional[tuple[tuple[str, ...], bool]]], what: str) -> dict:
    """``modules`` with the transformer's modules in BFL's names (component ``unet``) renamed by ``underscored`` (a
    family's table: the diffusers paths a name is, and whether they are a fused projection's parts), a fused
    projection's factors split into its parts: the down factor (and alpha) shared, the up factor's rows cut as the
    weight's are -- q, k, v of the transformer's width each, then the rest (families/flux/models/single_file.py)."""
    width = int(np.shape(transformer["transformer_blocks_0"]["attn"]["to_q"]["kernel"])[-1])
    out = {}
    for (component, module), parts in modules.items():
        if component != "unet":
            out[(component, module)] = parts
            continue
        renamed = underscored(module)
        if renamed is None:
            raise UserError(config_key, f"{name}: lora_unet_{module} is no module of a {what} transformer in kohya's "
                            "layout (ai-toolkit's diffusion_model. names alike)", f"a LoRA made for {what}")
        targets, fused = renamed
        up = parts.get("up")
        bounds = bfl.part_rows(len(targets), width, None if up is None else int(np.shape(up)[0])) if fused else None
        for i, target in enumerate(targets):
            piece = dict(parts)
            if bounds is not None and up is not None:
                piece["up"] = np.asarray(up)[bounds[i]:bounds[i + 1]]
            out[("transformer", target.replace(".", "_"))] = piece
    return out


def kohya_modules(modules: dict, transformer: dict, name: str, config_key: str) -> dict:
    """:func:`bfl_renamed` with FLUX.1's table (a single block's ``linear1`` cut into q, k, v and the MLP's input)."""
    return bfl_renamed(modules, transformer, name, config_key, bfl.underscored, "FLUX.1")
