"""A diffusers FluxTransformer2DModel state dict written back in Black Forest Labs' own layout (flux1-dev.safetensors'
tensor names), for tests: each step of diffusers 0.39's ``convert_flux_transformer_checkpoint_to_diffusers``
(``loaders/single_file_utils.py``) undone -- the q/k/v of a double block's image and text attention concatenated
into ``img_attn.qkv`` / ``txt_attn.qkv``, a single block's q/k/v and MLP input into ``linear1``, the final
modulation's halves swapped back to shift, scale. Written from diffusers' converter, not from the runner's."""

from __future__ import annotations

import numpy as np

RENAMED = {
    "time_text_embed.timestep_embedder.linear_1": "time_in.in_layer",
    "time_text_embed.timestep_embedder.linear_2": "time_in.out_layer",
    "time_text_embed.text_embedder.linear_1": "vector_in.in_layer",
    "time_text_embed.text_embedder.linear_2": "vector_in.out_layer",
    "time_text_embed.guidance_embedder.linear_1": "guidance_in.in_layer",
    "time_text_embed.guidance_embedder.linear_2": "guidance_in.out_layer",
    "context_embedder": "txt_in", "x_embedder": "img_in", "proj_out": "final_layer.linear",
}
DOUBLE = {"norm1.linear": "img_mod.lin", "norm1_context.linear": "txt_mod.lin", "ff.net.0.proj": "img_mlp.0",
          "ff.net.2": "img_mlp.2", "ff_context.net.0.proj": "txt_mlp.0", "ff_context.net.2": "txt_mlp.2",
          "attn.to_out.0": "img_attn.proj", "attn.to_add_out": "txt_attn.proj"}
DOUBLE_NORMS = {"attn.norm_q.weight": "img_attn.norm.query_norm.scale", "attn.norm_k.weight": "img_attn.norm.key_norm.scale",
                "attn.norm_added_q.weight": "txt_attn.norm.query_norm.scale",
                "attn.norm_added_k.weight": "txt_attn.norm.key_norm.scale"}


def to_bfl(state: dict[str, np.ndarray], num_layers: int, num_single_layers: int,
           prefix: str = "") -> dict[str, np.ndarray]:
    out: dict[str, np.ndarray] = {}
    for ours, theirs in RENAMED.items():
        for kind in ("weight", "bias"):
            if f"{ours}.{kind}" in state:
                out[f"{theirs}.{kind}"] = state[f"{ours}.{kind}"]
    for kind in ("weight", "bias"):
        scale, shift = np.split(state[f"norm_out.linear.{kind}"], 2, axis=0)
        out[f"final_layer.adaLN_modulation.1.{kind}"] = np.concatenate([shift, scale], axis=0)
    for i in range(num_layers):
        ours, theirs = f"transformer_blocks.{i}.", f"double_blocks.{i}."
        for kind in ("weight", "bias"):
            for a, b in DOUBLE.items():
                out[f"{theirs}{b}.{kind}"] = state[f"{ours}{a}.{kind}"]
            out[f"{theirs}img_attn.qkv.{kind}"] = np.concatenate(
                [state[f"{ours}attn.to_{x}.{kind}"] for x in "qkv"], axis=0)
            out[f"{theirs}txt_attn.qkv.{kind}"] = np.concatenate(
                [state[f"{ours}attn.add_{x}_proj.{kind}"] for x in "qkv"], axis=0)
        for a, b in DOUBLE_NORMS.items():
            out[theirs + b] = state[ours + a]
    for i in range(num_single_layers):
        ours, theirs = f"single_transformer_blocks.{i}.", f"single_blocks.{i}."
        for kind in ("weight", "bias"):
            out[f"{theirs}modulation.lin.{kind}"] = state[f"{ours}norm.linear.{kind}"]
            out[f"{theirs}linear2.{kind}"] = state[f"{ours}proj_out.{kind}"]
            out[f"{theirs}linear1.{kind}"] = np.concatenate(
                [state[f"{ours}attn.to_{x}.{kind}"] for x in "qkv"] + [state[f"{ours}proj_mlp.{kind}"]], axis=0)
        out[f"{theirs}norm.query_norm.scale"] = state[f"{ours}attn.norm_q.weight"]
        out[f"{theirs}norm.key_norm.scale"] = state[f"{ours}attn.norm_k.weight"]
    return {prefix + name: np.ascontiguousarray(array) for name, array in out.items()}
