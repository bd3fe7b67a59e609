"""Where a PyTorch state dict's tensor goes in a Flax parameter tree, and in what layout: the naming rules of the
two libraries whose published folders the runner reads, written down without them.

* ``diffusers`` (UNet, VAE, ControlNet, FLUX.1's and SD 3's transformers): a list index joins its name
  (``down_blocks.0`` -> ``down_blocks_0``, ``to_out.0`` -> ``to_out_0``), then the path splits at the dots.
* ``transformers`` (CLIP, T5): the path splits at every dot (``encoder.layers.0`` -> ``encoder/layers/0``).

Then, for both, the leaf: a norm's ``weight`` (or old ``gamma``) is Flax's ``scale``; an embedding table's
``weight`` is ``embedding``; a 4-dimensional ``weight`` is a convolution's ``kernel`` (O, I, H, W -> H, W, I, O);
another ``weight`` a dense layer's ``kernel``, transposed; old layer norms' ``gamma``/``beta`` are ``weight`` /
``bias``. diffusers' attention layers (``to_q``, ``to_k``, ``to_v``, ``to_out.0``) are named ``query``, ``key``,
``value``, ``proj_attn`` where the Flax tree has those (diffusers' Flax attention modules). Which rule applies is
decided by what the module's parameter tree (``reference``: flattened path -> shape) holds, as the libraries'
own converters decide it (diffusers 0.39 ``modeling_flax_pytorch_utils``, transformers 4.57
``modeling_flax_pytorch_utils``; tests/test_pytorch_names.py compares every published name with theirs).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

import numpy as np

# diffusers' PyTorch attention layers -> the Flax names of its (and our) attention modules
ATTENTION = {"to_q": "query", "to_k": "key", "to_v": "value", "to_out_0": "proj_attn"}
_INDEXED = re.compile(r"\w+[.]\d+")  # "down_blocks.0": a name and its list index


def diffusers_path(name: str) -> tuple[str, ...]:
    """``down_blocks.0.attentions.1.to_out.0.weight`` -> ``(down_blocks_0, attentions_1, to_out_0, weight)``."""
    for indexed in _INDEXED.findall(name):
        name = name.replace(indexed, indexed.replace(".", "_"))
    return tuple(name.split("."))


def _leaf(path: tuple[str, ...], tensor: np.ndarray, reference: Mapping[tuple, Any]) -> tuple[tuple, np.ndarray]:
    """The rules both libraries share, for the leaf of ``path``."""
    parent, leaf = path[:-1], path[-1]
    if leaf in ("weight", "gamma") and parent + ("scale",) in reference:
        return parent + ("scale",), tensor
    if leaf == "weight" and parent + ("embedding",) in reference:
        return parent + ("embedding",), tensor
    if leaf == "weight" and path not in reference:
        return parent + ("kernel",), tensor.transpose(2, 3, 1, 0) if tensor.ndim == 4 else tensor.T
    if leaf == "gamma":
        return parent + ("weight",), tensor
    if leaf == "beta":
        return parent + ("bias",), tensor
    return path, tensor


def diffusers_param(name: str, tensor: np.ndarray, reference: Mapping[tuple, Any]) -> tuple[tuple, np.ndarray]:
    """(Flax path, array in Flax's layout) of diffusers' PyTorch tensor ``name``."""
    path = diffusers_path(name)
    if len(path) > 1 and path[-2] in ATTENTION:
        renamed = path[:-2] + (ATTENTION[path[-2]], "kernel" if path[-1] == "weight" else path[-1])
        if renamed in reference:
            return renamed, tensor.T
    if (path[-1] == "bias" and any("norm" in part for part in path) and path not in reference
            and path[:-1] + ("scale",) in reference):
        return path[:-1] + ("scale",), tensor  # diffusers' rule for a norm whose Flax twin has a scale alone
    return _leaf(path, tensor, reference)


def transformers_param(name: str, tensor: np.ndarray, reference: Mapping[tuple, Any]) -> tuple[tuple, np.ndarray]:
    """(Flax path, array in Flax's layout) of transformers' PyTorch tensor ``name``."""
    return _leaf(tuple(name.split(".")), tensor, reference)


PARAM_RULES = {"diffusers": diffusers_param, "transformers": transformers_param}
