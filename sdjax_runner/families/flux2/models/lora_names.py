"""FLUX.2's LoRAs in Black Forest Labs' layout (ai-toolkit's ``diffusion_model.double_blocks.0.img_attn.qkv.lora_A.weight``
..., kohya's ``lora_unet_double_blocks_0_img_attn_qkv``...; models/lora.py reads both as the same underscored module
names) renamed to the transformer's own (diffusers' paths, underscored): models/family_loader.FamilyLoader's
``lora_modules`` for FLUX.2. As diffusers' ``_convert_non_diffusers_flux2_lora_to_diffusers``: a double block's fused
q/k/v shares its down factor and has its up factor's rows cut in three; a single block's fused projections stay fused
(``to_qkv_mlp_proj``, ``to_out``), as the module has them."""

from __future__ import annotations

from typing import Optional

from sdjax_runner.families.flux.models.lora_names import bfl_renamed
from sdjax_runner.families.flux.models.single_file import underscored_in
from sdjax_runner.families.flux2.models.single_file import DOUBLE, DOUBLE_FUSED, SINGLE, TOP


def underscored(module: str) -> Optional[tuple[tuple[str, ...], bool]]:
    """An underscored BFL module name (``double_blocks_0_img_attn_qkv``, ``single_blocks_3_linear1``, ``img_in``) -> (the
    diffusers module paths it is, whether they are a fused projection's parts); None for one the tables do not know
    (the final layer's modulation among them: its halves are swapped in the weights, and diffusers' LoRA conversion
    does not swap them). FLUX.1's lookup (families/flux/models/single_file.underscored_in) on FLUX.2's tables."""
    return underscored_in(module, (DOUBLE, DOUBLE_FUSED), (SINGLE, {}), TOP)


def bfl_modules(modules: dict, transformer: dict, name: str, config_key: str) -> dict:
    """FLUX.1's renaming (families/flux/models/lora_names.bfl_renamed) with FLUX.2's table: a fused q/k/v's up factor
    cut into its three equal row blocks, the down factor (and alpha) shared."""
    return bfl_renamed(modules, transformer, name, config_key, underscored, "FLUX.2")
