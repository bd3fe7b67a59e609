"""Perturbed-attention guidance's choice of layers (``guider=pag``, ``guider.layers``; engine/guiders.py), shared by
every denoiser that runs it (the SD family's UNet, SD 3's transformer): which self-attention modules a batch's
perturbed chunk runs perturbed, picked as diffusers' PAG pipelines pick them -- regular expressions searched in the
modules' PyTorch names (``mid_block.attentions.0.transformer_blocks.0.attn1``, ``transformer_blocks.1.attn``).
How a module runs perturbed is the model's own (the UNet: the identity; SD 3: image tokens that see only
themselves among the image tokens)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import NamedTuple


class Perturbed(NamedTuple):
    """A denoiser call's perturbation: in the self-attention modules whose PyTorch names (:func:`torch_name`)
    ``layers`` match (:func:`perturbs`), the last of the batch's ``chunks`` equal parts runs perturbed (3 chunks:
    unconditional, conditional, perturbed -- diffusers' ``PAGCFG...`` processors; 2: conditional, perturbed)."""

    layers: tuple[str, ...]
    chunks: int


def torch_name(path: Sequence[str]) -> str:
    """A module's name in diffusers' PyTorch model from its path here: ``down_blocks_1/attentions_0/attn1`` ->
    ``down_blocks.1.attentions.0.attn1``."""
    return ".".join(re.sub(r"_(\d+)$", r".\1", part) for part in path)


def perturbs(layers: Sequence[str], name: str) -> bool:
    """Whether one of ``layers`` picks the self-attention module ``name``, by diffusers' rule (PAGMixin's
    ``_set_pag_attn_processor``): the pattern found in the name (``re.search``), unless the pattern and the name end
    in the same number (its ``is_fake_integral_match``; self-attention names end in ``attn1``, ``attn``, ``attn2``)."""

    def fake_integral_match(layer: str) -> bool:
        last, name_last = layer.split(".")[-1], name.split(".")[-1]
        return last.isnumeric() and name_last.isnumeric() and last == name_last

    return any(re.search(layer, name) is not None and not fake_integral_match(layer) for layer in layers)


def check_layers(layers: Sequence[str], names: Sequence[str], model: str, shown: Sequence[str], example: str) -> None:
    """Each of ``layers`` picks at least one of the model's self-attention modules ``names`` (diffusers raises
    "Cannot find PAG layer" otherwise); else a UserError naming ``shown`` (what the model has, shortly) and an
    ``example`` of a full name."""
    from sdjax_runner.errors import UserError

    for layer in layers:
        if not any(perturbs((layer,), name) for name in names):
            raise UserError("guider.layers", f"{layer[:60]!r} picks none of {model}'s self-attention layers",
                            f"patterns of their names: {', '.join(shown)} ({example}, ...)")
