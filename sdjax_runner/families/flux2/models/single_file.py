"""A FLUX.2 transformer in Black Forest Labs' own layout (``flux-2-klein-4b.safetensors``, ``flux-2-klein-9b.safetensors``
as the hub's klein repositories and ComfyUI ship them; ComfyUI's saves prefix ``model.diffusion_model.``) -> diffusers'
``Flux2Transformer2DModel`` names, which the runner's module keeps (FLUX.1's converter then converts them as it converts
a diffusers folder's).

The renaming is diffusers 0.39's ``convert_flux2_transformer_checkpoint_to_diffusers`` (``loaders/single_file_utils.py``)
as a table: each BFL name maps to one diffusers name (a norm's ``scale`` to its ``weight``), except a double block's
fused ``img_attn.qkv`` / ``txt_attn.qkv``, split along their output rows into q, k, v (``to_q`` ... / ``add_q_proj`` ...),
and the final layer's modulation, whose shift and scale halves are swapped (BFL: shift, scale; diffusers: scale, shift).
A single block's fused projections stay fused, as diffusers' module has them. The splits are views of the
memory-mapped arrays: nothing is read until the converter reads it."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Optional

import numpy as np

from sdjax_runner.config.weight_files import without_comfy_prefix
from sdjax_runner.models.checkpoints import WeightsMismatch

# BFL name (after the block prefix, without .weight / .scale) -> diffusers name, for a double block
DOUBLE = {"img_attn.norm.query_norm": "attn.norm_q", "img_attn.norm.key_norm": "attn.norm_k",
          "img_attn.proj": "attn.to_out.0", "img_mlp.0": "ff.linear_in", "img_mlp.2": "ff.linear_out",
          "txt_attn.norm.query_norm": "attn.norm_added_q", "txt_attn.norm.key_norm": "attn.norm_added_k",
          "txt_attn.proj": "attn.to_add_out", "txt_mlp.0": "ff_context.linear_in", "txt_mlp.2": "ff_context.linear_out"}
DOUBLE_FUSED = {"img_attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
                "txt_attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj")}
SINGLE = {"linear1": "attn.to_qkv_mlp_proj", "linear2": "attn.to_out", "norm.query_norm": "attn.norm_q",
          "norm.key_norm": "attn.norm_k"}
TOP = {"img_in": "x_embedder", "txt_in": "context_embedder",
       "time_in.in_layer": "time_guidance_embed.timestep_embedder.linear_1",
       "time_in.out_layer": "time_guidance_embed.timestep_embedder.linear_2",
       "guidance_in.in_layer": "time_guidance_embed.guidance_embedder.linear_1",
       "guidance_in.out_layer": "time_guidance_embed.guidance_embedder.linear_2",
       "double_stream_modulation_img.lin": "double_stream_modulation_img.linear",
       "double_stream_modulation_txt.lin": "double_stream_modulation_txt.linear",
       "single_stream_modulation.lin": "single_stream_modulation.linear", "final_layer.linear": "proj_out"}
SWAPPED = {"final_layer.adaLN_modulation.1": "norm_out.linear"}  # shift, scale -> scale, shift


def diffusers_state_dict(tensors: Mapping[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """The transformer's tensors of a BFL-layout file under diffusers' names; WeightsMismatch naming the first BFL name
    the table does not know (the converter then checks every diffusers name and shape against the module)."""
    out: dict[str, np.ndarray] = {}
    for name, key in without_comfy_prefix(tensors).items():
        array = tensors[key]
        stem, _, kind = name.rpartition(".")
        kind = "weight" if kind == "scale" else kind
        block, _, rest = stem.partition(".")
        if block in ("double_blocks", "single_blocks"):
            number, _, inside = rest.partition(".")
            out.update(_block(block, number, inside, kind, array, source, name))
        elif stem in TOP:
            out[f"{TOP[stem]}.{kind}"] = array
        elif stem in SWAPPED:
            shift, scale = np.split(np.asarray(array), 2, axis=0)
            out[f"{SWAPPED[stem]}.{kind}"] = np.concatenate([scale, shift], axis=0)
        else:
            raise _unknown(source, name)
    return out


def _block(block: str, number: str, inside: str, kind: str, array: np.ndarray, source: str,
           name: str) -> dict[str, np.ndarray]:
    prefix = f"{'transformer_blocks' if block == 'double_blocks' else 'single_transformer_blocks'}.{number}."
    table = DOUBLE if block == "double_blocks" else SINGLE
    if inside in table:
        return {f"{prefix}{table[inside]}.{kind}": array}
    parts: Optional[tuple[str, ...]] = DOUBLE_FUSED.get(inside) if block == "double_blocks" else None
    if parts is None:
        raise _unknown(source, name)
    rows = int(np.shape(array)[0]) // len(parts)
    return {f"{prefix}{part}.{kind}": array[i * rows:(i + 1) * rows] for i, part in enumerate(parts)}


def _unknown(source: str, name: str) -> WeightsMismatch:
    return WeightsMismatch(f"{source}: {name} is no tensor of a FLUX.2 transformer in Black Forest Labs' layout")
