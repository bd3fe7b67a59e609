"""Write a diffusers-format pipeline as one single-file checkpoint in the original (LDM) layout --
the inverse of the runner's conversion, built the other way round (from diffusers' block
structure to LDM's flat numbering) so that the two are not one table read twice.

Also: tensor names and shapes of published checkpoints (SD 1.5, SDXL base), as anchors that
neither direction's code produced.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np

from helpers.pt_layout import pytorch_state_dict

RESNET = {"norm1": "in_layers.0", "conv1": "in_layers.2", "norm2": "out_layers.0", "conv2": "out_layers.3",
          "time_emb_proj": "emb_layers.1", "conv_shortcut": "skip_connection"}
UNET_FIXED = {"time_embedding.linear_1": "time_embed.0", "time_embedding.linear_2": "time_embed.2",
              "add_embedding.linear_1": "label_emb.0.0", "add_embedding.linear_2": "label_emb.0.2",
              "conv_in": "input_blocks.0.0", "conv_norm_out": "out.0", "conv_out": "out.2"}
VAE_ATTENTION = {"group_norm": "norm", "to_q": "q", "to_k": "k", "to_v": "v", "to_out.0": "proj_out"}
CLIP_TO_OPEN_CLIP = {"layer_norm1": "ln_1", "layer_norm2": "ln_2", "mlp.fc1": "mlp.c_fc", "mlp.fc2": "mlp.c_proj",
                     "self_attn.out_proj": "attn.out_proj"}


def ldm_unet(state: dict, layers_per_block: int) -> dict:
    per_level = layers_per_block + 1
    with_attention = {int(m[1]) for k in state if (m := re.match(r"up_blocks\.(\d+)\.attentions\.", k))}
    out = {}
    for name, value in state.items():
        *module, leaf = name.split(".")
        module = ".".join(module)
        if module in UNET_FIXED:
            out[f"{UNET_FIXED[module]}.{leaf}"] = value
            continue
        kind, level, rest = re.fullmatch(r"(down_blocks|up_blocks|mid_block)\.?(\d*)\.(.+)", module).groups()
        if m := re.fullmatch(r"resnets\.(\d+)\.(\w+)", rest):
            layer, part = int(m[1]), RESNET[m[2]]
            block = {"down_blocks": f"input_blocks.{1 + int(level or 0) * per_level + layer}.0",
                     "up_blocks": f"output_blocks.{int(level or 0) * per_level + layer}.0",
                     "mid_block": f"middle_block.{2 * layer}"}[kind]
            out[f"{block}.{part}.{leaf}"] = value
        elif m := re.fullmatch(r"attentions\.(\d+)\.(.+)", rest):
            layer, inner = int(m[1]), m[2]
            block = {"down_blocks": f"input_blocks.{1 + int(level or 0) * per_level + layer}.1",
                     "up_blocks": f"output_blocks.{int(level or 0) * per_level + layer}.1",
                     "mid_block": "middle_block.1"}[kind]
            out[f"{block}.{inner}.{leaf}"] = value
        elif rest == "downsamplers.0.conv":
            out[f"input_blocks.{(int(level) + 1) * per_level}.0.op.{leaf}"] = value
        elif rest == "upsamplers.0.conv":
            position = 2 if int(level) in with_attention else 1
            out[f"output_blocks.{int(level) * per_level + layers_per_block}.{position}.conv.{leaf}"] = value
        else:
            raise AssertionError(f"unexpected UNet tensor {name}")
    return out


def ldm_vae(state: dict, levels: int) -> dict:
    out = {}
    for name, value in state.items():
        m = re.fullmatch(r"(encoder|decoder)\.(.+)", name)
        if not m:
            out[name] = value  # quant_conv, post_quant_conv
            continue
        coder, rest = m[1], m[2].replace("conv_norm_out.", "norm_out.").replace("conv_shortcut.", "nin_shortcut.")
        if m := re.fullmatch(r"mid_block\.resnets\.(\d)\.(.+)", rest):
            rest = f"mid.block_{int(m[1]) + 1}.{m[2]}"
        elif m := re.fullmatch(r"mid_block\.attentions\.0\.(.+)\.(weight|bias)", rest):
            rest = f"mid.attn_1.{VAE_ATTENTION[m[1]]}.{m[2]}"
            if m[1] != "group_norm" and m[2] == "weight":
                value = value.reshape(*value.shape, 1, 1)  # LDM's attention projections are 1x1 convolutions
        elif m := re.fullmatch(r"down_blocks\.(\d+)\.(resnets\.(\d+)|downsamplers\.0)\.(.+)", rest):
            rest = f"down.{m[1]}." + (f"block.{m[3]}" if m[3] else "downsample") + f".{m[4]}"
        elif m := re.fullmatch(r"up_blocks\.(\d+)\.(resnets\.(\d+)|upsamplers\.0)\.(.+)", rest):
            rest = f"up.{levels - 1 - int(m[1])}." + (f"block.{m[3]}" if m[3] else "upsample") + f".{m[4]}"
        out[f"{coder}.{rest}"] = value
    return out


def open_clip(state: dict) -> dict:
    """A transformers CLIP text model in OpenCLIP's names: q, k, v fused, projection input-major."""
    out, fused = {}, {}
    for name, value in state.items():
        if name == "text_model.embeddings.position_embedding.weight":
            out["positional_embedding"] = value
        elif name == "text_model.embeddings.token_embedding.weight":
            out["token_embedding.weight"] = value
        elif name.startswith("text_model.final_layer_norm."):
            out["ln_final." + name.rsplit(".", 1)[1]] = value
        elif name == "text_projection.weight":
            out["text_projection"] = value.T
        elif m := re.fullmatch(r"text_model\.encoder\.layers\.(\d+)\.self_attn\.([qkv])_proj\.(weight|bias)", name):
            fused.setdefault((m[1], m[3]), {})[m[2]] = value
        elif m := re.fullmatch(r"text_model\.encoder\.layers\.(\d+)\.(.+)\.(weight|bias)", name):
            out[f"transformer.resblocks.{m[1]}.{CLIP_TO_OPEN_CLIP[m[2]]}.{m[3]}"] = value
        elif not name.endswith("position_ids"):
            raise AssertionError(f"unexpected text encoder tensor {name}")
    for (layer, kind), parts in fused.items():
        out[f"transformer.resblocks.{layer}.attn.in_proj_{kind}"] = np.concatenate([parts[c] for c in "qkv"])
    return out


def ldm_state(params: dict, layers_per_block: int, vae_levels: int, xl: bool, open_clip_text: bool = False,
              cast: bool = True) -> dict:
    """One checkpoint's tensors from per-component Flax params (``open_clip_text``: SD 2.x's text encoder)."""
    pt = {name: pytorch_state_dict(tree, "diffusers" if name in ("unet", "vae") else "transformers", cast)
          for name, tree in params.items()}
    state = {f"model.diffusion_model.{k}": v for k, v in ldm_unet(pt["unet"], layers_per_block).items()}
    state.update({f"first_stage_model.{k}": v for k, v in ldm_vae(pt["vae"], vae_levels).items()})
    if xl:
        state.update({f"conditioner.embedders.0.transformer.{k}": v for k, v in pt["text_encoder"].items()})
        state.update({f"conditioner.embedders.1.model.{k}": v for k, v in open_clip(pt["text_encoder_2"]).items()})
    elif open_clip_text:
        state.update({f"cond_stage_model.model.{k}": v for k, v in open_clip(pt["text_encoder"]).items()})
    else:
        state.update({f"cond_stage_model.transformer.{k}": v for k, v in pt["text_encoder"].items()})
    return state


def write_single_file(model_dir: Path, target: Path, open_clip_text: bool = False, extra: dict | None = None,
                      dtype=np.float16) -> Path:
    """``model_dir``'s weights as one LDM-layout safetensors file (fp16 by default, as most are shared),
    plus what a training checkpoint carries besides (EMA weights, the noise schedule)."""
    from flax.serialization import msgpack_restore
    from safetensors.numpy import save_file

    index = json.loads((model_dir / "model_index.json").read_text())
    files = {"unet": "diffusion_flax_model.msgpack", "vae": "diffusion_flax_model.msgpack",
             "text_encoder": "flax_model.msgpack", "text_encoder_2": "flax_model.msgpack"}
    params = {name: msgpack_restore((model_dir / name / file).read_bytes())
              for name, file in files.items() if name in index}
    layers = json.loads((model_dir / "unet" / "config.json").read_text())["layers_per_block"]
    levels = len(json.loads((model_dir / "vae" / "config.json").read_text())["block_out_channels"])
    state = ldm_state(params, layers, levels, "text_encoder_2" in index, open_clip_text)
    state = {k: np.ascontiguousarray(v, dtype=dtype) for k, v in state.items()}
    state["alphas_cumprod"] = np.linspace(1, 0, 1000, dtype=np.float32)
    state["model_ema.decay"] = np.array(0.9999, dtype=np.float32)
    state.update(extra or {})
    save_file(state, str(target))
    return target


# Tensors of the published checkpoints (v1-5-pruned-emaonly.safetensors; sd_xl_base_1.0.safetensors)
# with their shapes, and the module each belongs to in diffusers.
PUBLISHED_SD15 = {
    "model.diffusion_model.time_embed.0.weight": ((1280, 320), "time_embedding.linear_1.weight"),
    "model.diffusion_model.input_blocks.1.1.transformer_blocks.0.attn1.to_q.weight":
        ((320, 320), "down_blocks.0.attentions.0.transformer_blocks.0.attn1.to_q.weight"),
    "model.diffusion_model.input_blocks.3.0.op.weight": ((320, 320, 3, 3), "down_blocks.0.downsamplers.0.conv.weight"),
    "model.diffusion_model.input_blocks.4.0.skip_connection.weight":
        ((640, 320, 1, 1), "down_blocks.1.resnets.0.conv_shortcut.weight"),
    "model.diffusion_model.middle_block.1.proj_in.weight": ((1280, 1280, 1, 1), "mid_block.attentions.0.proj_in.weight"),
    "model.diffusion_model.middle_block.2.out_layers.3.weight": ((1280, 1280, 3, 3), "mid_block.resnets.1.conv2.weight"),
    "model.diffusion_model.output_blocks.2.1.conv.weight": ((1280, 1280, 3, 3), "up_blocks.0.upsamplers.0.conv.weight"),
    "model.diffusion_model.output_blocks.5.2.conv.weight": ((1280, 1280, 3, 3), "up_blocks.1.upsamplers.0.conv.weight"),
    "model.diffusion_model.output_blocks.8.2.conv.weight": ((640, 640, 3, 3), "up_blocks.2.upsamplers.0.conv.weight"),
    "model.diffusion_model.output_blocks.11.1.proj_out.weight":
        ((320, 320, 1, 1), "up_blocks.3.attentions.2.proj_out.weight"),
    "model.diffusion_model.out.2.weight": ((4, 320, 3, 3), "conv_out.weight"),
    "first_stage_model.decoder.up.0.block.0.nin_shortcut.weight":
        ((128, 256, 1, 1), "decoder.up_blocks.3.resnets.0.conv_shortcut.weight"),
    "first_stage_model.decoder.up.3.upsample.conv.weight": ((512, 512, 3, 3), "decoder.up_blocks.0.upsamplers.0.conv.weight"),
    "first_stage_model.encoder.mid.attn_1.q.weight": ((512, 512, 1, 1), "encoder.mid_block.attentions.0.to_q.weight"),
    "first_stage_model.encoder.norm_out.bias": ((512,), "encoder.conv_norm_out.bias"),
    "cond_stage_model.transformer.text_model.encoder.layers.11.mlp.fc2.weight":
        ((768, 3072), "text_model.encoder.layers.11.mlp.fc2.weight"),
}
PUBLISHED_SDXL = {
    "model.diffusion_model.label_emb.0.0.weight": ((1280, 2816), "add_embedding.linear_1.weight"),
    "model.diffusion_model.input_blocks.4.1.transformer_blocks.1.attn2.to_k.weight":
        ((640, 2048), "down_blocks.1.attentions.0.transformer_blocks.1.attn2.to_k.weight"),
    "model.diffusion_model.input_blocks.7.1.transformer_blocks.9.ff.net.2.weight":
        ((1280, 5120), "down_blocks.2.attentions.0.transformer_blocks.9.ff.net.2.weight"),
    "model.diffusion_model.output_blocks.2.2.conv.weight": ((1280, 1280, 3, 3), "up_blocks.0.upsamplers.0.conv.weight"),
    "model.diffusion_model.output_blocks.5.2.conv.weight": ((640, 640, 3, 3), "up_blocks.1.upsamplers.0.conv.weight"),
    "model.diffusion_model.output_blocks.8.0.skip_connection.weight":
        ((320, 640, 1, 1), "up_blocks.2.resnets.2.conv_shortcut.weight"),
    "conditioner.embedders.0.transformer.text_model.final_layer_norm.weight":
        ((768,), "text_model.final_layer_norm.weight"),
    "conditioner.embedders.1.model.transformer.resblocks.31.attn.in_proj_weight":
        ((3840, 1280), "text_model.encoder.layers.31.self_attn.q_proj.weight"),
    "conditioner.embedders.1.model.text_projection": ((1280, 1280), "text_projection.weight"),
}
