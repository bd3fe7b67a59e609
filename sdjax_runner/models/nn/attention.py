"""Multi-head scaled dot-product attention for the runner's own Flax modules, in the ways diffusers' Flax
``FlaxAttention`` computes it and two of JAX's own.

:func:`attention` takes the projected queries, keys and values with the heads side by side in the last axis and
returns the heads' outputs the same way (the output projection is the caller's); :func:`attend` takes them with the
heads split out (FLUX.1's and SD 3's blocks). The UNet, the ControlNet, the MMDiT and FLUX.1's blocks all attend
through these. The implementations
(:data:`IMPLEMENTATIONS`, the runner's ``performance.attention`` values):

* ``default``: diffusers 0.39's ``FlaxAttention`` as it runs by default -- the heads folded into the batch axis,
  ``einsum`` scores, scaled by ``1/sqrt(head_dim)``, ``softmax``, ``einsum`` with the values -- op for op, in the
  inputs' dtype (bfloat16 activations give a bfloat16 softmax, as there).
* ``split_head_dim``: diffusers' ``split_head_dim=True`` path: the heads kept as an axis (faster for SD 2.x / XL).
* ``memory_efficient``: diffusers' ``use_memory_efficient_attention=True`` path (arXiv 2112.05682): queries in
  chunks (a 64th, 16th or 4th of them, whichever divides their count first), keys in chunks of 16384, the
  softmax accumulated chunk by chunk; products at ``Precision.HIGHEST``.
* ``dot_product``: ``jax.nn.dot_product_attention`` with XLA's implementation (any backend; equal to ``default``
  to rounding).
* ``cudnn_flash``: ``jax.nn.dot_product_attention(implementation="cudnn")``, cuDNN's fused flash attention on
  NVIDIA GPUs (bfloat16 / float16 inputs only).

The first three give diffusers' own results bit for bit (same operations in the same order).
"""

from __future__ import annotations

import functools
import math
from typing import Any

import jax
import jax.numpy as jnp

IMPLEMENTATIONS = ("default", "split_head_dim", "memory_efficient", "dot_product", "cudnn_flash")
KEY_CHUNK = 4096 * 4  # the key chunk diffusers' FlaxAttention asks its memory-efficient attention for


def attention(query: jax.Array, key: jax.Array, value: jax.Array, heads: int,
              implementation: str = "default") -> jax.Array:
    """Softmax attention of ``query`` over ``key`` / ``value`` with ``heads`` heads.

    ``query`` is ``(batch, query_tokens, heads * head_dim)``, ``key`` and ``value`` ``(batch, key_tokens,
    heads * head_dim)``, each head's features a contiguous slice of the last axis (the layout of a Dense
    projection's output); the result is ``(batch, query_tokens, heads * head_dim)`` in the same layout, in the
    inputs' dtype. Scores are scaled by ``head_dim ** -0.5``. ``implementation`` is one of
    :data:`IMPLEMENTATIONS` (module docstring); ValueError for another."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    scale = (query.shape[-1] // heads) ** -0.5
    if implementation == "default":
        return _folded(query, key, value, heads, scale)
    if implementation == "split_head_dim":
        return _split(query, key, value, heads, scale)
    if implementation == "memory_efficient":
        return _memory_efficient(query, key, value, heads)
    batch = query.shape[0]
    split = (batch, -1, heads, query.shape[-1] // heads)
    out = jax.nn.dot_product_attention(query.reshape(split), key.reshape(split), value.reshape(split), scale=scale,
                                       implementation="cudnn" if implementation == "cudnn_flash" else None)
    return out.reshape(batch, -1, query.shape[-1])


def attend(query: jax.Array, key: jax.Array, value: jax.Array, implementation: str = "dot_product") -> jax.Array:
    """:func:`attention` for inputs with the heads split out, ``(batch, tokens, heads, head_dim)`` -- the layout of
    the flow families' transformers (FLUX.1's and SD 3's blocks, whose per-head norms and rotary embeddings work on
    it) -- returning the same layout. Scores scaled by ``1 / sqrt(head_dim)``. ``dot_product`` and
    ``cudnn_flash`` call ``jax.nn.dot_product_attention`` on the inputs as they are (diffusers' PyTorch
    ``scaled_dot_product_attention``, which those families' references use); the others run :func:`attention`'s
    on the heads side by side."""
    if implementation not in IMPLEMENTATIONS:
        raise ValueError(f"attention implementation {implementation!r} is not one of {', '.join(IMPLEMENTATIONS)}")
    batch, tokens, heads, head_dim = query.shape
    if implementation in ("dot_product", "cudnn_flash"):
        return jax.nn.dot_product_attention(query, key, value, scale=1 / math.sqrt(head_dim),
                                            implementation="cudnn" if implementation == "cudnn_flash" else None)

    def flat(x: jax.Array) -> jax.Array:
        return x.reshape(*x.shape[:2], heads * head_dim)

    out = attention(flat(query), flat(key), flat(value), heads, implementation)
    return out.reshape(batch, tokens, heads, head_dim)


def heads_to_batch(x: jax.Array, heads: int) -> jax.Array:
    """``(B, T, heads * D)`` -> ``(B * heads, T, D)``: each head a batch entry, batch-major."""
    batch, tokens, features = x.shape
    x = x.reshape(batch, tokens, heads, features // heads).transpose(0, 2, 1, 3)
    return x.reshape(batch * heads, tokens, features // heads)


def batch_to_heads(x: jax.Array, heads: int) -> jax.Array:
    """The inverse of :func:`heads_to_batch`: ``(B * heads, T, D)`` -> ``(B, T, heads * D)``."""
    folded, tokens, features = x.shape
    x = x.reshape(folded // heads, heads, tokens, features).transpose(0, 2, 1, 3)
    return x.reshape(folded // heads, tokens, heads * features)


def _folded(query: jax.Array, key: jax.Array, value: jax.Array, heads: int, scale: float) -> jax.Array:
    """``default``: heads folded into the batch, scores ``(B*H, Tq, Tk)``, softmax over the keys."""
    q, k, v = (heads_to_batch(x, heads) for x in (query, key, value))
    scores = jnp.einsum("b i d, b j d->b i j", q, k) * scale
    probs = jax.nn.softmax(scores, axis=2)
    return batch_to_heads(jnp.einsum("b i j, b j d -> b i d", probs, v), heads)


def _split(query: jax.Array, key: jax.Array, value: jax.Array, heads: int, scale: float) -> jax.Array:
    """``split_head_dim``: ``(B, T, H, D)`` arrays, scores ``(B, H, Tq, Tk)`` (keys as the first operand)."""
    batch = query.shape[0]
    q, k, v = (x.reshape(batch, -1, heads, x.shape[-1] // heads) for x in (query, key, value))
    scores = jnp.einsum("b t n h, b f n h -> b n f t", k, q) * scale
    probs = jax.nn.softmax(scores, axis=-1)
    out = jnp.einsum("b n f t, b t n h -> b f n h", probs, v)
    return out.reshape(batch, -1, query.shape[-1])


def query_chunk_size(tokens: int) -> int:
    """The query chunk diffusers' FlaxAttention picks: a 64th of the queries if that divides them, else a 16th,
    else a 4th, else all of them."""
    for parts in (64, 16, 4):
        if tokens % parts == 0:
            return tokens // parts
    return tokens


def _memory_efficient(query: jax.Array, key: jax.Array, value: jax.Array, heads: int) -> jax.Array:
    """``memory_efficient``: the heads folded into the batch, then batch and heads taken as the ``heads`` axis of
    :func:`chunked_attention` (tokens first), as diffusers' FlaxAttention does."""
    q, k, v = (heads_to_batch(x, heads) for x in (query, key, value))
    q, k, v = (x.transpose(1, 0, 2) for x in (q, k, v))
    out = chunked_attention(q, k, v, query_chunk_size(q.shape[0]), KEY_CHUNK)
    return batch_to_heads(out.transpose(1, 0, 2), heads)


def chunked_attention(query: jax.Array, key: jax.Array, value: jax.Array, query_chunk: int, key_chunk: int,
                      precision: jax.lax.Precision = jax.lax.Precision.HIGHEST) -> jax.Array:
    """Memory-efficient attention (arXiv 2112.05682), diffusers' ``jax_memory_efficient_attention``'s arithmetic:
    ``query`` ``(Tq, N, D)``, ``key`` / ``value`` ``(Tk, N, D)`` (``N`` independent heads) -> ``(Tq, N, D)``.

    The queries go in chunks of ``query_chunk`` (a ``lax.scan``; it must divide ``Tq``); for each, the keys in
    chunks of ``key_chunk`` (a ``lax.map`` of a rematerialised step), each giving its exponentiated scores'
    values, sums and maximum; the chunks are then rescaled to the overall maximum and combined. Where
    ``key_chunk`` does not divide ``Tk`` the chunks are ``gcd(Tk, key_chunk)`` long (diffusers' last chunk would
    instead overlap the one before it and count those keys twice)."""
    tokens, heads, features = query.shape
    query_chunk = min(query_chunk, tokens)
    key_chunk = min(key_chunk, key.shape[0])
    if key.shape[0] % key_chunk:
        key_chunk = math.gcd(key.shape[0], key_chunk)

    def one_query_chunk(start: Any, _: None) -> tuple[Any, jax.Array]:
        chunk = jax.lax.dynamic_slice(query, (start, 0, 0), (query_chunk, heads, features))
        return start + query_chunk, _attend_chunk(chunk, key, value, key_chunk, precision)

    _, out = jax.lax.scan(one_query_chunk, 0, None, length=math.ceil(tokens / query_chunk))
    return out.reshape(-1, heads, value.shape[-1])


def _attend_chunk(query: jax.Array, key: jax.Array, value: jax.Array, key_chunk: int,
                  precision: jax.lax.Precision) -> jax.Array:
    """One query chunk's attention over all keys, ``key_chunk`` keys at a time."""
    query = query / jnp.sqrt(key.shape[-1])

    @functools.partial(jax.checkpoint, prevent_cse=False)
    def summarize(key: jax.Array, value: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        scores = jnp.einsum("...qhd,...khd->...qhk", query, key, precision=precision)
        peak = jax.lax.stop_gradient(jnp.max(scores, axis=-1, keepdims=True))
        weights = jnp.exp(scores - peak)
        values = jnp.einsum("...vhf,...qhv->...qhf", value, weights, precision=precision)
        peak = peak.sum(axis=-1)  # a sum of one: the peak, its axis dropped
        return values, weights.sum(axis=-1), peak

    def one_key_chunk(start: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        rows = jax.lax.dynamic_slice(key, (start, 0, 0), (key_chunk,) + key.shape[1:])
        columns = jax.lax.dynamic_slice(value, (start, 0, 0), (key_chunk,) + value.shape[1:])
        return summarize(rows, columns)

    values, sums, peaks = jax.lax.map(one_key_chunk, jnp.arange(0, key.shape[0], key_chunk))
    rescale = jnp.exp(peaks - jnp.max(peaks, axis=0, keepdims=True))
    values = values * rescale[..., None]
    sums = sums * rescale
    return values.sum(axis=0) / sums[..., None].sum(axis=0)
