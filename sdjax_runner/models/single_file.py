"""Single-file checkpoints, torch-free: one ``.safetensors`` in the original (LDM) layout, as model
sites distribute fine-tuned SD 1.x, 2.x and SDXL models and A1111/ComfyUI write them.

The file holds every network under one prefix per component; each tensor is renamed to the
PyTorch name diffusers uses (the renaming rules of diffusers' single-file conversion, written
here per key so a multi-GB file is read one tensor at a time) and then converted to Flax like any
PyTorch safetensors component (:mod:`.checkpoints`)::

    model.diffusion_model.                UNet         input_blocks / middle_block / output_blocks
    first_stage_model.                    VAE          encoder.down / decoder.up (reversed) / mid
    cond_stage_model.transformer.         CLIP text encoder (SD 1.x; Hugging Face names)
    cond_stage_model.model.               OpenCLIP text encoder (SD 2.x; fused q/k/v)
    conditioner.embedders.0.transformer.  SDXL's CLIP ViT-L text encoder
    conditioner.embedders.1.model.        SDXL's OpenCLIP ViT-bigG text encoder, with projection

The architecture is told from those prefixes; configs, tokenizers and the scheduler come from a
base model (``model.pretrained_model_name_or_path``, or the standard one for the architecture).
Training leftovers (EMA copies, the noise schedule, OpenCLIP's vision tower) are not weights of
the pipeline and are skipped; anything else the runner does not recognise is named in a warning.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.weight_files import Checkpoint
from sdjax_runner.errors import UserError

# Prefix -> (component, text encoder layout or None).
PREFIXES = (
    ("model.diffusion_model.", "unet", None),
    ("first_stage_model.", "vae", None),
    ("cond_stage_model.transformer.", "text_encoder", "clip"),
    ("cond_stage_model.model.", "text_encoder", "open_clip"),
    ("conditioner.embedders.0.transformer.", "text_encoder", "clip"),
    ("conditioner.embedders.1.model.", "text_encoder_2", "open_clip"),
)
# Tensors of a training checkpoint that are not pipeline weights (EMA copies, the DDPM schedule
# buffers, OpenCLIP's image tower and logit scale, the VAE's training loss).
SKIPPED = re.compile(r"^(model_ema\.|betas$|alphas_cumprod|sqrt_|log_one_minus|posterior_|logvar$|lvlb_weights$"
                     r"|first_stage_model\.loss\."
                     r"|(cond_stage_model|conditioner\.embedders\.\d)\.model\.(visual\.|logit_scale$)"
                     r"|.*\.position_ids$)")
# Tensor -> the tensor(s) diffusers' PyTorch model holds: (name, transform) pairs.
Renamed = list[tuple[str, Callable[[np.ndarray], np.ndarray]]]


def _same(array: np.ndarray) -> np.ndarray:
    return array


def _as_linear(array: np.ndarray) -> np.ndarray:
    """The LDM VAE's attention projections are 1x1 convolutions; diffusers' are linear layers."""
    return array[:, :, 0, 0] if array.ndim == 4 else array


def _transposed(array: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(array.T)


def _third(index: int) -> Callable[[np.ndarray], np.ndarray]:
    """One of OpenCLIP's fused q, k, v (stacked along the first axis)."""
    def take(array: np.ndarray) -> np.ndarray:
        size = array.shape[0] // 3
        return array[index * size:(index + 1) * size]
    return take


# --- UNet --------------------------------------------------------------------------------------

_UNET_FIXED = {"time_embed.0.": "time_embedding.linear_1.", "time_embed.2.": "time_embedding.linear_2.",
               "label_emb.0.0.": "add_embedding.linear_1.", "label_emb.0.2.": "add_embedding.linear_2.",
               "input_blocks.0.0.": "conv_in.", "out.0.": "conv_norm_out.", "out.2.": "conv_out."}
_RESNET = {"in_layers.0.": "norm1.", "in_layers.2.": "conv1.", "out_layers.0.": "norm2.", "out_layers.3.": "conv2.",
           "emb_layers.1.": "time_emb_proj.", "skip_connection.": "conv_shortcut."}


def _resnet(tail: str) -> Optional[str]:
    return next((new + tail[len(old):] for old, new in _RESNET.items() if tail.startswith(old)), None)


def unet_name(key: str, layers_per_block: int) -> Optional[str]:
    """diffusers' name of an LDM UNet tensor (without ``model.diffusion_model.``), or None.

    LDM numbers the UNet's layers flatly: ``input_blocks.i`` is down level ``(i-1) // (L+1)``,
    layer ``(i-1) % (L+1)`` with ``L`` = layers per block, the last of a level being its
    down-sampler; ``output_blocks.i`` is up level ``i // (L+1)``, layer ``i % (L+1)``, whose
    last element is the up-sampler (``.1.conv`` without attention, ``.2.conv`` with)."""
    for old, new in _UNET_FIXED.items():
        if key.startswith(old):
            return new + key[len(old):]
    per_level = layers_per_block + 1
    if match := re.fullmatch(r"input_blocks\.(\d+)\.([01])\.(.+)", key):
        index, part, tail = int(match[1]), match[2], match[3]
        level, layer = divmod(index - 1, per_level)
        if part == "1":
            return f"down_blocks.{level}.attentions.{layer}.{tail}"
        if tail.startswith("op."):
            return f"down_blocks.{level}.downsamplers.0.conv.{tail[3:]}"
        tail = _resnet(tail)
        return tail and f"down_blocks.{level}.resnets.{layer}.{tail}"
    if match := re.fullmatch(r"middle_block\.([012])\.(.+)", key):
        part, tail = match[1], match[2]
        if part == "1":
            return f"mid_block.attentions.0.{tail}"
        tail = _resnet(tail)
        return tail and f"mid_block.resnets.{int(part) // 2}.{tail}"
    if match := re.fullmatch(r"output_blocks\.(\d+)\.([012])\.(.+)", key):
        index, part, tail = int(match[1]), match[2], match[3]
        level, layer = divmod(index, per_level)
        if part == "0":
            tail = _resnet(tail)
            return tail and f"up_blocks.{level}.resnets.{layer}.{tail}"
        if tail.startswith("conv."):
            return f"up_blocks.{level}.upsamplers.0.{tail}"
        return f"up_blocks.{level}.attentions.{layer}.{tail}" if part == "1" else None
    return None


# --- VAE ---------------------------------------------------------------------------------------

_VAE_ATTENTION = {"norm.": "group_norm.", "q.": "to_q.", "k.": "to_k.", "v.": "to_v.", "proj_out.": "to_out.0."}


def vae_name(key: str, levels: int) -> Optional[tuple[str, Callable]]:
    """diffusers' name (and transform) of an LDM VAE tensor (without ``first_stage_model.``), or None.
    The decoder's ``up.i`` is diffusers' ``up_blocks.{levels-1-i}``."""
    if key.split(".")[0] in ("quant_conv", "post_quant_conv"):
        return key, _same
    match = re.fullmatch(r"(encoder|decoder)\.(.+)", key)
    if not match:
        return None
    coder, rest = match[1], match[2]
    if rest.split(".")[0] in ("conv_in", "conv_out"):
        return f"{coder}.{rest}", _same
    if rest.startswith("norm_out."):
        return f"{coder}.conv_norm_out.{rest[len('norm_out.'):]}", _same
    if match := re.fullmatch(r"mid\.block_([12])\.(.+)", rest):
        tail = match[2].replace("nin_shortcut.", "conv_shortcut.")
        return f"{coder}.mid_block.resnets.{int(match[1]) - 1}.{tail}", _same
    if match := re.fullmatch(r"mid\.attn_1\.(.+)", rest):
        tail = match[1]
        new = next((n + tail[len(o):] for o, n in _VAE_ATTENTION.items() if tail.startswith(o)), None)
        if new is None:
            return None
        return f"{coder}.mid_block.attentions.0.{new}", _same if tail.startswith("norm.") else _as_linear
    if match := re.fullmatch(r"(down|up)\.(\d+)\.(block\.(\d+)|downsample|upsample)\.(.+)", rest):
        direction, level, tail = match[1], int(match[2]), match[5]
        if direction == "up":
            level = levels - 1 - level
        blocks = f"{coder}.{direction}_blocks.{level}"
        if match[4] is not None:
            return f"{blocks}.resnets.{match[4]}.{tail.replace('nin_shortcut.', 'conv_shortcut.')}", _same
        return f"{blocks}.{direction}samplers.0.{tail}", _same
    return None


# --- text encoders -----------------------------------------------------------------------------

_OPEN_CLIP = {"ln_1.": "layer_norm1.", "ln_2.": "layer_norm2.", "mlp.c_fc.": "mlp.fc1.", "mlp.c_proj.": "mlp.fc2.",
              "attn.out_proj.": "self_attn.out_proj."}


def clip_name(key: str) -> str:
    """SD 1.x / SDXL's first text encoder is a Hugging Face CLIPTextModel saved under a prefix
    (older checkpoints without the ``text_model.`` level)."""
    return key if key.startswith("text_model.") else f"text_model.{key}"


def open_clip_names(key: str) -> Optional[Renamed]:
    """transformers' CLIP names of an OpenCLIP text tower tensor: the fused attention input
    projection becomes q, k and v; the projection matrix is stored input-major."""
    if key == "positional_embedding":
        return [("text_model.embeddings.position_embedding.weight", _same)]
    if key == "token_embedding.weight":
        return [("text_model.embeddings.token_embedding.weight", _same)]
    if key.startswith("ln_final."):
        return [(f"text_model.final_layer_norm.{key[len('ln_final.'):]}", _same)]
    if key == "text_projection":
        return [("text_projection.weight", _transposed)]
    if key == "text_projection.weight":
        return [(key, _same)]
    match = re.fullmatch(r"transformer\.resblocks\.(\d+)\.(.+)", key)
    if not match:
        return None
    layer, tail = f"text_model.encoder.layers.{match[1]}", match[2]
    if tail in ("attn.in_proj_weight", "attn.in_proj_bias"):
        kind = "weight" if tail.endswith("weight") else "bias"
        return [(f"{layer}.self_attn.{name}_proj.{kind}", _third(i)) for i, name in enumerate("qkv")]
    new = next((n + tail[len(o):] for o, n in _OPEN_CLIP.items() if tail.startswith(o)), None)
    return None if new is None else [(f"{layer}.{new}", _same)]


# --- the file ----------------------------------------------------------------------------------

def on_base(checkpoint: Checkpoint, base: Path) -> Checkpoint:
    """``checkpoint`` with the block structure of the base model at ``base`` (its UNet and VAE configs)."""
    import dataclasses
    import json

    try:
        unet = json.loads((base / "unet" / "config.json").read_text(encoding="utf-8"))
        vae = json.loads((base / "vae" / "config.json").read_text(encoding="utf-8"))
        layers, levels = int(unet.get("layers_per_block", 2)), len(vae.get("block_out_channels", (0,) * 4))
    except (OSError, ValueError, TypeError) as exc:
        raise UserError("model.pretrained_model_name_or_path", f"{base}: the base model's unet/ or vae/ config cannot "
                        f"be read ({type(exc).__name__})", "a diffusers-format pipeline folder or hub id") from None
    return dataclasses.replace(checkpoint, layers_per_block=layers, vae_levels=levels)


def renamed(key: str, layers_per_block: int, vae_levels: int) -> Optional[tuple[str, Renamed]]:
    """(component, [(diffusers PyTorch name, transform)]) of one checkpoint tensor, or None."""
    for prefix, component, layout in PREFIXES:
        if not key.startswith(prefix):
            continue
        rest = key[len(prefix):]
        if component == "unet":
            name = unet_name(rest, layers_per_block)
            return None if name is None else (component, [(name, _same)])
        if component == "vae":
            found = vae_name(rest, vae_levels)
            return None if found is None else (component, [found])
        if layout == "clip":
            return component, [(clip_name(rest), _same)]
        names = open_clip_names(rest)
        return None if names is None else (component, names)
    return None


def component_tensors(checkpoint: Checkpoint, component: str) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(diffusers PyTorch name, loader) of every tensor of ``component``, read lazily from the file."""
    from sdjax_runner.tensor_files import read_safetensors

    tensors = read_safetensors(checkpoint.path)  # memory-mapped; bfloat16 checkpoints too
    for key in checkpoint.keys:
        found = renamed(key, checkpoint.layers_per_block, checkpoint.vae_levels)
        if found is None or found[0] != component:
            continue
        for name, transform in found[1]:
            yield name, _loader(tensors, key, transform)


def _loader(tensors: Any, key: str, transform: Callable[[np.ndarray], np.ndarray]) -> Callable[[], np.ndarray]:
    """Reads ``key`` from the mapped file (a copy in memory) and transforms it, when called."""
    return lambda: transform(np.array(tensors[key]))


def unrecognised(checkpoint: Checkpoint) -> list[str]:
    """Tensors that are neither pipeline weights nor known training leftovers."""
    return [k for k in checkpoint.keys
            if not SKIPPED.match(k) and renamed(k, checkpoint.layers_per_block, checkpoint.vae_levels) is None]


def vae_tensors(tensors: Any, prefix: str, levels: int, source: str) -> dict[str, np.ndarray]:
    """A VAE in the LDM layout (``prefix`` + ``encoder.down.0.block.0...``: a checkpoint's ``first_stage_model.``, or
    "" for a VAE file such as vae-ft-mse-840000-ema-pruned.safetensors or sdxl_vae.safetensors) under diffusers'
    PyTorch names (:func:`vae_name`), read from the memory-mapped ``tensors`` one at a time; ``levels``: the VAE's
    resolution levels. Training leftovers (``loss.*``, ``model_ema.*``) are left out, as A1111 leaves them;
    WeightsMismatch naming ``source`` for a tensor that is no VAE's."""
    from sdjax_runner.models.checkpoints import WeightsMismatch

    out: dict[str, np.ndarray] = {}
    for key in tensors:
        if not key.startswith(prefix):
            continue
        inner = key[len(prefix):]
        if inner.startswith(("loss.", "model_ema.")):
            continue
        found = vae_name(inner, levels)
        if found is None:
            raise WeightsMismatch(f"{source}: {key} is no tensor of a VAE in the original (LDM) layout")
        name, transform = found
        out[name] = transform(np.asarray(tensors[key]))
    if not out:
        raise WeightsMismatch(f"{source} holds no VAE tensors (encoder.* / decoder.*, or first_stage_model.*)")
    return out
