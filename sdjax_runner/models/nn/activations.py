"""The activation functions transformers' configs name (``hidden_act``, ``dense_act_fn``): its Flax ``ACT2FN``
(modeling_flax_utils.py), the same functions, for the runner's CLIP and T5."""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import flax.linen as nn
import jax


def quick_gelu(x: jax.Array) -> jax.Array:
    """OpenAI CLIP's GELU approximation, ``x * sigmoid(1.702 x)`` (SD 1.x's CLIP-L)."""
    return x * jax.nn.sigmoid(1.702 * x)


ACTIVATIONS: dict[str, Callable[[jax.Array], jax.Array]] = {
    "gelu": partial(nn.gelu, approximate=False),
    "relu": nn.relu,
    "silu": nn.swish,
    "swish": nn.swish,
    "gelu_new": partial(nn.gelu, approximate=True),
    "quick_gelu": quick_gelu,
    "gelu_pytorch_tanh": partial(nn.gelu, approximate=True),
    "tanh": nn.tanh,
}
