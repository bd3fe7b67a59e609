"""Tiny LoRA adapters for the tiny model, written with safetensors from NumPy in the kohya and the
PEFT layouts, and the same update merged into a copy of the model by hand (the reference)."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import numpy as np

# Kernels the test adapter changes: attention projections, a feed-forward layer, a 1x1 conv, text encoder.
TARGETS = {
    "unet": [("down_blocks_0", "attentions_0", "transformer_blocks_0", "attn1", "to_q", "kernel"),
             ("down_blocks_0", "attentions_0", "transformer_blocks_0", "attn2", "to_k", "kernel"),
             ("down_blocks_0", "attentions_0", "transformer_blocks_0", "ff", "net_0", "proj", "kernel"),
             ("down_blocks_0", "attentions_0", "proj_in", "kernel")],
    "text_encoder": [("text_model", "encoder", "layers", "0", "self_attn", "q_proj", "kernel"),
                     ("text_model", "encoder", "layers", "1", "mlp", "fc1", "kernel")],
}
WEIGHT_FILES = {"unet": "diffusion_flax_model.msgpack", "text_encoder": "flax_model.msgpack"}


def host_params(model_dir: Path) -> dict:
    from diffusers import FlaxUNet2DConditionModel
    from transformers import FlaxCLIPTextModel

    _, unet = FlaxUNet2DConditionModel.from_pretrained(model_dir, subfolder="unet")
    text = FlaxCLIPTextModel.from_pretrained(model_dir / "text_encoder", _do_init=False)[1]
    return {"unet": unet, "text_encoder": text}


def _leaf(tree, path):
    for part in path:
        tree = tree[part]
    return np.asarray(tree)


def _torch_path(path: tuple) -> str:
    """The PyTorch module path of a Flax kernel path: down_blocks_0 -> down_blocks.0, to_out_0 -> to_out.0."""
    return ".".join(re.sub(r"_(\d+)$", r".\1", part) for part in path[:-1])


def factors(model_dir: Path, rank: int = 2, seed: int = 0) -> dict:
    """(component, kernel path) -> (A: rank x in, B: out x rank): PyTorch's LoRA layout."""
    rng = np.random.default_rng(seed)
    params, out = host_params(model_dir), {}
    for component, paths in TARGETS.items():
        for path in paths:
            kernel = _leaf(params[component], path)
            fan_in, fan_out = kernel.shape[-2], kernel.shape[-1]
            out[(component, path)] = (rng.normal(0, 0.5, (rank, fan_in)).astype(np.float32),
                                      rng.normal(0, 0.5, (fan_out, rank)).astype(np.float32))
    return out


def write_kohya(target: Path, updates: dict, alpha: float, conv_shaped=True, extra: dict | None = None) -> Path:
    from safetensors.numpy import save_file

    tensors = {}
    for (component, path), (a, b) in updates.items():
        name = ("lora_unet_" if component == "unet" else "lora_te_") + "_".join(path[:-1])
        conv = conv_shaped and path[-2] == "proj_in"  # SD 1.x's proj_in is a 1x1 conv: 4-d factors
        tensors[f"{name}.lora_down.weight"] = a[:, :, None, None] if conv else a
        tensors[f"{name}.lora_up.weight"] = b[:, :, None, None] if conv else b
        tensors[f"{name}.alpha"] = np.array(alpha, dtype=np.float32)
    tensors.update(extra or {})
    save_file(tensors, str(target))
    return target


def write_peft(target: Path, updates: dict) -> Path:
    """PEFT / diffusers names, no alpha (PEFT keeps it in adapter_config.json): alpha = rank."""
    from safetensors.numpy import save_file

    tensors = {}
    for (component, path), (a, b) in updates.items():
        name = f"{component}.{_torch_path(path)}"
        tensors[f"{name}.lora_A.weight"] = a
        tensors[f"{name}.lora_B.weight"] = b
    save_file(tensors, str(target))
    return target


def merged_by_hand(model_dir: Path, target: Path, updates: dict, scale: float, alpha: float) -> Path:
    """A copy of the model with W + scale * alpha/rank * (B @ A).T in each adapted kernel (NumPy)."""
    from flax.serialization import msgpack_restore, to_bytes

    shutil.copytree(model_dir, target)
    for component in TARGETS:
        file = target / component / WEIGHT_FILES[component]
        params = msgpack_restore(file.read_bytes())
        for (owner, path), (a, b) in updates.items():
            if owner != component:
                continue
            node = params
            for part in path[:-1]:
                node = node[part]
            kernel = np.asarray(node["kernel"])
            update = (scale * alpha / a.shape[0] * (b @ a)).T.reshape(kernel.shape)
            node["kernel"] = (kernel.astype(np.float32) + update).astype(kernel.dtype)
        file.write_bytes(to_bytes(params))
    return target
