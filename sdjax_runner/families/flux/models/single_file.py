"""A FLUX.1 transformer in Black Forest Labs' own layout (``flux1-dev.safetensors``, ``flux1-schnell.safetensors``;
ComfyUI's saves prefix ``model.diffusion_model.``) -> diffusers' ``FluxTransformer2DModel`` names, which the runner's
module keeps (:mod:`.convert` then converts them as it converts a diffusers folder's).

The renaming is diffusers 0.39's ``convert_flux_transformer_checkpoint_to_diffusers``
(``loaders/single_file_utils.py``), written here as a table: each BFL name maps to one diffusers name, except the
fused projections, which are split along their output rows -- a double block's ``img_attn.qkv`` / ``txt_attn.qkv``
into q, k, v (``to_q`` ... / ``add_q_proj`` ...), a single block's ``linear1`` into q, k, v and the MLP's input
(``proj_mlp``) -- and the final layer's modulation, whose shift and scale halves are swapped (BFL's
AdaLayerNormContinuous splits shift, scale; diffusers' scale, shift). The file's arrays are memory-mapped views and
the splits are views of them: nothing is read until the converter reads it, one tensor at a time."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.weight_files import without_comfy_prefix
from sdjax_runner.models.checkpoints import WeightsMismatch

# BFL name (after the block prefix) -> diffusers name, for a double block (transformer_blocks.N).
DOUBLE = {
    "img_mod.lin": "norm1.linear", "txt_mod.lin": "norm1_context.linear",
    "img_attn.norm.query_norm.scale": "attn.norm_q.weight", "img_attn.norm.key_norm.scale": "attn.norm_k.weight",
    "txt_attn.norm.query_norm.scale": "attn.norm_added_q.weight",
    "txt_attn.norm.key_norm.scale": "attn.norm_added_k.weight",
    "img_mlp.0": "ff.net.0.proj", "img_mlp.2": "ff.net.2", "txt_mlp.0": "ff_context.net.0.proj",
    "txt_mlp.2": "ff_context.net.2", "img_attn.proj": "attn.to_out.0", "txt_attn.proj": "attn.to_add_out",
}
# Fused projections of a double block, split along the output rows into equal parts.
DOUBLE_FUSED = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
                "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}
# A single block (single_transformer_blocks.N).
SINGLE = {"modulation.lin": "norm.linear", "norm.query_norm.scale": "attn.norm_q.weight",
          "norm.key_norm.scale": "attn.norm_k.weight", "linear2": "proj_out"}
SINGLE_FUSED = ("attn.to_q", "attn.to_k", "attn.to_v", "proj_mlp")  # linear1: inner, inner, inner, mlp rows
# Outside the blocks.
TOP = {"time_in.in_layer": "time_text_embed.timestep_embedder.linear_1",
       "time_in.out_layer": "time_text_embed.timestep_embedder.linear_2",
       "vector_in.in_layer": "time_text_embed.text_embedder.linear_1",
       "vector_in.out_layer": "time_text_embed.text_embedder.linear_2",
       "guidance_in.in_layer": "time_text_embed.guidance_embedder.linear_1",
       "guidance_in.out_layer": "time_text_embed.guidance_embedder.linear_2",
       "txt_in": "context_embedder", "img_in": "x_embedder", "final_layer.linear": "proj_out"}
SWAPPED = {"final_layer.adaLN_modulation.1": "norm_out.linear"}  # shift, scale -> scale, shift

def diffusers_state_dict(tensors: Mapping[str, np.ndarray], width: int, source: str) -> dict[str, np.ndarray]:
    """The transformer's tensors of a BFL-layout file (``tensors``: name -> array) under diffusers' names;
    ``width``: the transformer's heads x head dim, which sizes the fused projections' parts. WeightsMismatch naming
    the first BFL name the table does not know (the converter then checks every diffusers name and shape against
    the module)."""
    out: dict[str, np.ndarray] = {}
    for name, key in without_comfy_prefix(tensors).items():
        array = tensors[key]
        block, _, rest = name.partition(".")
        if block in ("double_blocks", "single_blocks"):
            number, _, inside = rest.partition(".")
            out.update(_block(block, number, inside, array, width, source, name))
            continue
        stem, _, kind = name.rpartition(".")
        if stem in TOP:
            out[f"{TOP[stem]}.{kind}"] = array
        elif stem in SWAPPED:
            shift, scale = np.split(np.asarray(array), 2, axis=0)
            out[f"{SWAPPED[stem]}.{kind}"] = np.concatenate([scale, shift], axis=0)
        else:
            raise WeightsMismatch(f"{source}: {name} is no tensor of a FLUX.1 transformer in Black Forest Labs' layout")
    return out


def _block(block: str, number: str, inside: str, array: np.ndarray, width: int, source: str,
           name: str) -> dict[str, np.ndarray]:
    prefix = f"{'transformer_blocks' if block == 'double_blocks' else 'single_transformer_blocks'}.{number}."
    table, fused = (DOUBLE, DOUBLE_FUSED) if block == "double_blocks" else (SINGLE, {"linear1": SINGLE_FUSED})
    if inside in table:  # a norm's scale, named whole
        return {prefix + table[inside]: array}
    stem, _, kind = inside.rpartition(".")
    if stem in table:
        return {f"{prefix}{table[stem]}.{kind}": array}
    if stem not in fused:
        raise WeightsMismatch(f"{source}: {name} is no tensor of a FLUX.1 transformer in Black Forest Labs' layout")
    parts = fused[stem]
    bounds = part_rows(len(parts), width, int(np.shape(array)[0]))
    return {f"{prefix}{part}.{kind}": array[bounds[i]:bounds[i + 1]] for i, part in enumerate(parts)}


def part_rows(parts: int, width: int, rows: Optional[int]) -> list[int]:
    """Where a fused projection's output rows are cut: q, k, v (``width`` rows each), then a single block's MLP
    input (the rest of its ``rows``)."""
    return [width * i for i in range(parts)] + [rows if rows is not None else width * parts]


def underscored(module: str) -> Optional[tuple[tuple[str, ...], bool]]:
    """kohya's underscored BFL module name (``double_blocks_0_img_attn_qkv``, ``single_blocks_3_linear1``,
    ``final_layer_linear``) -> (the diffusers module paths it is, whether they are a fused projection's parts);
    None for a name the table does not know (:func:`underscored_in` FLUX.1's tables)."""
    return underscored_in(module, (DOUBLE, DOUBLE_FUSED), (SINGLE, {"linear1": SINGLE_FUSED}), TOP)


def underscored_in(module: str, double: tuple[dict, dict], single: tuple[dict, dict],
                   top: dict) -> Optional[tuple[tuple[str, ...], bool]]:
    """An underscored BFL module name looked up in a transformer's tables -- ``double`` and ``single``: (BFL name ->
    diffusers name, fused BFL name -> its parts' diffusers names) of a double or single block; ``top``: outside the
    blocks (the swapped final modulation left out: refused) -- as :func:`underscored` returns it."""
    found = re.fullmatch(r"(double_blocks|single_blocks)_(\d+)_(.+)", module)
    if found:
        block, number, inside = found.groups()
        prefix = f"{'transformer_blocks' if block == 'double_blocks' else 'single_transformer_blocks'}.{number}."
        table, fused = double if block == "double_blocks" else single
        plain = {key.replace(".", "_"): value for key, value in table.items()}
        joined = {key.replace(".", "_"): value for key, value in fused.items()}
        if inside in plain:
            return (prefix + plain[inside],), False
        if inside in joined:
            return tuple(prefix + part for part in joined[inside]), True
        return None
    outside = {key.replace(".", "_"): value for key, value in top.items()}
    return ((outside[module],), False) if module in outside else None


def inner_dim(module: Any) -> int:
    """The transformer's width: heads x head dim (3072 for FLUX.1)."""
    return int(module.num_attention_heads) * int(module.attention_head_dim)
