"""An SD 3 / 3.5 transformer as one file in Stability AI's layout (``sd3.5_large.safetensors``,
``sd3.5_medium.safetensors``: ``model.diffusion_model.joint_blocks.N.x_block.attn.qkv.weight`` ...; with the
text encoders and VAE inside or not) -> diffusers' ``SD3Transformer2DModel`` state-dict names, which
families/flux/models/convert.py turns into the Flax tree. A transcription of diffusers 0.39's
``convert_sd3_transformer_checkpoint_to_diffusers`` (loaders/single_file_utils.py), with NumPy: the fused q/k/v
projections are cut in three along their rows, and the last block's context modulation and the final
modulation have their halves swapped (Stability's order is shift, scale; diffusers' AdaLayerNormContinuous reads
scale, shift).

A file may also hold the text encoders and the VAE (Stability AI's ``sd3_medium_incl_clips*.safetensors``,
ComfyUI's saves), each under its prefix (families/sd3/config.py's ``INSIDE``), as diffusers'
``StableDiffusion3Pipeline.from_single_file`` reads them (``convert_ldm_clip_checkpoint``, ``convert_sd3_t5_checkpoint_to_diffusers``,
``convert_ldm_vae_checkpoint``): the CLIPs and T5 in Hugging Face names under the prefix, CLIP-L's projection
replaced by the identity (diffusers does so for every SD 3 file), the VAE in the LDM layout
(models/single_file.vae_name). Those found replace the base folder's; the rest come from the folder (tested:
tests/test_sd3_runs.py against diffusers' own ``from_single_file`` on a file with everything inside)."""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping

import numpy as np

from sdjax_runner.families.sd3.config import INSIDE
from sdjax_runner.models.checkpoints import WeightsMismatch

PREFIX = "model.diffusion_model."
# Stability's name -> diffusers' name, outside the blocks.
TOP = {"pos_embed": "pos_embed.pos_embed", "x_embedder.proj.weight": "pos_embed.proj.weight",
       "x_embedder.proj.bias": "pos_embed.proj.bias",
       "t_embedder.mlp.0": "time_text_embed.timestep_embedder.linear_1",
       "t_embedder.mlp.2": "time_text_embed.timestep_embedder.linear_2",
       "y_embedder.mlp.0": "time_text_embed.text_embedder.linear_1",
       "y_embedder.mlp.2": "time_text_embed.text_embedder.linear_2",
       "context_embedder": "context_embedder", "final_layer.linear": "proj_out"}
# Within joint block N: Stability's module -> diffusers' (weight and bias alike; norms: weight only).
BLOCK = {"x_block.attn.proj": "attn.to_out.0", "context_block.attn.proj": "attn.to_add_out",
         "x_block.attn.ln_q": "attn.norm_q", "x_block.attn.ln_k": "attn.norm_k",
         "context_block.attn.ln_q": "attn.norm_added_q", "context_block.attn.ln_k": "attn.norm_added_k",
         "x_block.attn2.proj": "attn2.to_out.0", "x_block.attn2.ln_q": "attn2.norm_q",
         "x_block.attn2.ln_k": "attn2.norm_k", "x_block.adaLN_modulation.1": "norm1.linear",
         "context_block.adaLN_modulation.1": "norm1_context.linear", "x_block.mlp.fc1": "ff.net.0.proj",
         "x_block.mlp.fc2": "ff.net.2", "context_block.mlp.fc1": "ff_context.net.0.proj",
         "context_block.mlp.fc2": "ff_context.net.2"}
# Fused projections: Stability's -> diffusers' three, in order.
QKV = {"x_block.attn.qkv": ("attn.to_q", "attn.to_k", "attn.to_v"),
       "context_block.attn.qkv": ("attn.add_q_proj", "attn.add_k_proj", "attn.add_v_proj"),
       "x_block.attn2.qkv": ("attn2.to_q", "attn2.to_k", "attn2.to_v")}


def swap_halves(array: np.ndarray) -> np.ndarray:
    """diffusers' ``swap_scale_shift``: ``(shift, scale)`` along the first axis -> ``(scale, shift)``."""
    shift, scale = np.split(array, 2, axis=0)
    return np.concatenate([scale, shift], axis=0)


def diffusers_state_dict(checkpoint: Mapping[str, np.ndarray], source: str) -> dict[str, np.ndarray]:
    """The MMDiT's tensors of a Stability-layout file under diffusers' names (module docstring); WeightsMismatch
    naming ``source`` for a tensor of the MMDiT this table does not know."""
    inner = {k.removeprefix(PREFIX): v for k, v in checkpoint.items()
             if not k.startswith(("text_encoders.", "first_stage_model."))}
    blocks = {int(k.split(".")[1]) for k in inner if k.startswith("joint_blocks.")}
    last = max(blocks, default=-1)
    out: dict[str, np.ndarray] = {}
    for name, array in inner.items():
        module, _, leaf = name.rpartition(".")
        if name == "pos_embed" or name in TOP:
            out[TOP[name]] = array
        elif module in TOP:
            out[f"{TOP[module]}.{leaf}"] = array
        elif module == "final_layer.adaLN_modulation.1":
            out[f"norm_out.linear.{leaf}"] = swap_halves(array)
        elif name.startswith("joint_blocks."):
            _, number, rest = name.split(".", 2)
            part = rest.rpartition(".")[0]
            prefix = f"transformer_blocks.{number}."
            if part in QKV:
                for target, piece in zip(QKV[part], np.split(array, 3, axis=0), strict=True):
                    out[f"{prefix}{target}.{leaf}"] = piece
            elif part in BLOCK:
                swap = part == "context_block.adaLN_modulation.1" and int(number) == last
                out[f"{prefix}{BLOCK[part]}.{leaf}"] = swap_halves(array) if swap else array
            else:
                raise WeightsMismatch(f"{source}: {name} is no tensor of an SD 3 MMDiT this runner knows")
        else:
            raise WeightsMismatch(f"{source}: {name} is no tensor of an SD 3 MMDiT this runner knows")
    return out


def encoder_tensors(tensors: Mapping[str, np.ndarray], component: str,
                    hidden_size: int) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(Hugging Face name, loader) of a text encoder's tensors in the file (its prefix taken off), read when the
    loader is called; CLIP-L's ``text_projection.weight`` is the identity of its ``hidden_size``, as diffusers
    sets it."""
    prefix = INSIDE[component]
    for key in tensors:
        if key.startswith(prefix) and not (component == "text_encoder" and key == prefix + "text_projection.weight"):
            yield key[len(prefix):], functools.partial(np.array, tensors[key])
    if component == "text_encoder":
        yield "text_projection.weight", lambda: np.eye(hidden_size, dtype=np.float32)


def vae_state_dict(tensors: Mapping[str, np.ndarray], levels: int, source: str) -> dict[str, np.ndarray]:
    """The VAE's tensors of the file (``first_stage_model.*``, the LDM layout) under diffusers' names; ``levels``:
    the base VAE's resolution levels (len(block_out_channels)). WeightsMismatch for a tensor the table does not
    know (the VAE's training loss, which some files carry, is left out)."""
    from sdjax_runner.models.single_file import vae_tensors

    return vae_tensors(tensors, INSIDE["vae"], levels, source)
