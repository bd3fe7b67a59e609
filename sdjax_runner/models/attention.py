"""The UNet's attention implementation, selected by ``performance.attention``.

* ``default``           diffusers' FlaxAttention as shipped (heads folded into the batch, einsum + softmax).
* ``split_head_dim``    diffusers' own option: heads kept as an axis (faster for SD 2.x / SDXL).
* ``memory_efficient``  diffusers' own chunked attention (arXiv 2112.05682): less memory, usually slower.
* ``dot_product``       ``jax.nn.dot_product_attention`` with XLA's implementation (any backend).
* ``cudnn_flash``       ``jax.nn.dot_product_attention(implementation="cudnn")``: cuDNN's fused flash
                        attention on NVIDIA GPUs (bf16/fp16 only).

The last two replace the computation inside diffusers' ``FlaxAttention`` -- same submodules and
parameter names, so the same weights load -- while the generate function is traced; the
compiled program keeps it, and the attention choice is part of what decides reuse.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

UNET_FLAGS = {"split_head_dim": {"split_head_dim": True}, "memory_efficient": {"use_memory_efficient_attention": True}}


def configure_unet(unet: Any, name: str) -> Any:
    """The UNet module with diffusers' own attention flags for ``name`` (a clone; the weights are unchanged)."""
    return unet.clone(**UNET_FLAGS[name]) if name in UNET_FLAGS else unet


def _attention_class(implementation):
    """A FlaxAttention whose product runs through jax.nn.dot_product_attention (same submodules, same params)."""
    from diffusers.models.attention_flax import FlaxAttention

    class DotProductAttention(FlaxAttention):
        def __call__(self, hidden_states, context=None, deterministic=True):
            import jax

            context = hidden_states if context is None else context
            batch = hidden_states.shape[0]
            split = (batch, -1, self.heads, self.dim_head)  # (B, T, N, H), as jax.nn.dot_product_attention takes
            query = self.query(hidden_states).reshape(split)
            key = self.key(context).reshape(split)
            value = self.value(context).reshape(split)
            out = jax.nn.dot_product_attention(query, key, value, scale=self.scale, implementation=implementation)
            out = self.proj_attn(out.reshape(batch, -1, self.heads * self.dim_head))
            return self.dropout_layer(out, deterministic=deterministic)

    return DotProductAttention


@contextlib.contextmanager
def tracing_with(name: str) -> Iterator[None]:
    """While tracing, diffusers' transformer blocks build ``name``'s attention module."""
    if name not in ("dot_product", "cudnn_flash"):
        yield
        return
    from diffusers.models import attention_flax

    original = attention_flax.FlaxAttention
    attention_flax.FlaxAttention = _attention_class("cudnn" if name == "cudnn_flash" else None)
    try:
        yield
    finally:
        attention_flax.FlaxAttention = original
