"""Write a Flax pipeline directory as a PyTorch-only one (the inverse of the runner's conversion).

Each Flax weights file becomes PyTorch-layout safetensors with PyTorch names, written with
NumPy (no torch), and model_index.json names the PyTorch classes -- the way a repository that
ships only PyTorch weights looks.
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import numpy as np

# diffusers' VAE attention: Flax names -> PyTorch names (PyTorch Linear weights are (out, in)).
VAE_ATTENTION = {"query": "to_q", "key": "to_k", "value": "to_v", "proj_attn": "to_out.0"}


def _pt_part(part: str) -> str:
    # Flax "down_blocks_0" is PyTorch "down_blocks.0"; "linear_1" is literally "linear_1" in both.
    match = re.fullmatch(r"(.+)_(\d+)", part)
    return f"{match.group(1)}.{match.group(2)}" if match and match.group(1) != "linear" else part


def pytorch_state_dict(params: dict, library: str, cast: bool = True) -> dict[str, np.ndarray]:
    """``cast=False`` keeps the leaves' own dtype and memory layout (views: the shapes of a full-size
    model can be carried by zero-strided arrays that take no memory)."""
    from flax.traverse_util import flatten_dict

    state = {}
    for path, value in flatten_dict(params).items():
        value = np.asarray(value, dtype=np.float32) if cast else value
        *parents, leaf = path
        if library == "diffusers":
            parents = [VAE_ATTENTION.get(p, p) if i == len(parents) - 1 else p for i, p in enumerate(parents)]
            parents = [_pt_part(p) for p in parents]
        if leaf == "kernel":
            value = value.transpose(3, 2, 0, 1) if value.ndim == 4 else value.T
            leaf = "weight"
        elif leaf in ("scale", "embedding"):
            leaf = "weight"
        state[".".join(parents + [leaf])] = np.ascontiguousarray(value) if cast else value
    return state


def write_pytorch_only(flax_dir: Path, target: Path, components=("unet", "vae", "text_encoder", "text_encoder_2"),
                       as_pickle: tuple[str, ...] = ()) -> Path:
    """Copy ``flax_dir`` to ``target`` with ``components``' Flax weights replaced by safetensors
    (or, for those in ``as_pickle``, by a file named like a PyTorch pickle)."""
    from flax.serialization import msgpack_restore
    from safetensors.numpy import save_file

    shutil.copytree(flax_dir, target)
    index = json.loads((target / "model_index.json").read_text())
    for name in components:
        folder = target / name
        if not folder.is_dir():
            continue
        library = index[name][0]
        flax_file = folder / ("diffusion_flax_model.msgpack" if library == "diffusers" else "flax_model.msgpack")
        params = msgpack_restore(flax_file.read_bytes())
        flax_file.unlink()
        stem = "diffusion_pytorch_model" if library == "diffusers" else "model"
        if name in as_pickle:
            (folder / f"{stem}.bin").write_bytes(b"not loaded: a pickle would run code")
            continue
        save_file(pytorch_state_dict(params, library), str(folder / f"{stem}.safetensors"), metadata={"format": "pt"})
    index["_class_name"] = index["_class_name"].removeprefix("Flax")
    for spec in index.values():
        if isinstance(spec, list) and spec[1]:
            spec[1] = spec[1].removeprefix("Flax")
    (target / "model_index.json").write_text(json.dumps(index, indent=2))
    return target
