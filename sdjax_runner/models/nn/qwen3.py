"""Qwen3's decoder as a text encoder, in flax.linen: transformers 4.57's PyTorch ``Qwen3Model`` (the body of the
``Qwen3ForCausalLM`` FLUX.2 [klein] ships as its ``text_encoder/``), number for number, giving the hidden states a
pipeline stacks (transformers' ``output_hidden_states``: entry 0 the token embeddings, entry ``k`` the output of
decoder layer ``k``, the last one after the final norm). transformers has no Flax Qwen3; this module is the
runner's own (tests/test_flux2.py: equal to the PyTorch model on the reference's weights).

Each decoder layer, as transformers computes it (``attn_implementation`` sdpa):

* RMS norm (``input_layernorm``), grouped-query self-attention -- ``q_proj`` / ``k_proj`` / ``v_proj`` without bias,
  a per-head RMS norm of queries and keys (``q_norm`` / ``k_norm``), rotary embeddings in the halves layout
  (``rotate_half``) with ``rope_theta``, causal attention over the tokens the mask keeps, ``o_proj`` -- added to
  the input;
* RMS norm (``post_attention_layernorm``), the SiLU-gated MLP (``down_proj(silu(gate_proj(x)) * up_proj(x))``),
  added.

The RMS norms compute in float32 and scale after casting back (transformers' ``Qwen3RMSNorm``). The parameter tree
is transformers' names under diffusers' list rule (``model.layers.3.self_attn.q_proj.weight`` ->
``layers_3/self_attn/q_proj/kernel``; ``model.`` dropped, ``lm_head`` unused): :func:`convert_state_dict`.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.clip import CONFIG_IGNORED as TRANSFORMERS_IGNORED
from sdjax_runner.models.nn.config import FromDiffusersConfig

# Qwen3Config's keys that change what the text encoder computes, with transformers 4.57's defaults.
CONFIG_DEFAULTS: dict[str, Any] = {
    "vocab_size": 151936,
    "hidden_size": 4096,
    "intermediate_size": 22016,
    "num_hidden_layers": 32,
    "num_attention_heads": 32,
    "num_key_value_heads": 32,
    "head_dim": 128,
    "hidden_act": "silu",
    "max_position_embeddings": 32768,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "rope_scaling": None,
    "attention_bias": False,
    "use_sliding_window": False,
}
# Keys that change nothing a text encoder computes (generation's, the causal LM head's tying, the sliding window's
# size and layers where it is off -- checked in :meth:`Qwen3TextModel.check`).
CONFIG_IGNORED: tuple[str, ...] = (*TRANSFORMERS_IGNORED, "eos_token_id", "use_cache", "sliding_window",
                                   "max_window_layers", "layer_types")


def rms_norm(x: jax.Array, weight: jax.Array, eps: float) -> jax.Array:
    """transformers' ``Qwen3RMSNorm``: ``weight * (x / sqrt(mean(x^2) + eps))``, the normalisation in float32 and cast
    back to ``x``'s dtype before the scale."""
    x32 = x.astype(jnp.float32)
    normed = (x32 * jax.lax.rsqrt(jnp.square(x32).mean(axis=-1, keepdims=True) + eps)).astype(x.dtype)
    return weight.astype(x.dtype) * normed


class RMSNorm(layers.Module):
    """:func:`rms_norm` with its ``scale`` parameter (PyTorch: ``weight``), ones at initialisation."""

    eps: float = 1e-6

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, self.param("scale", nn.initializers.ones, (x.shape[-1],), jnp.float32), self.eps)


def rope_tables(positions: int, head_dim: int, theta: float) -> tuple[np.ndarray, np.ndarray]:
    """(cos, sin), each ``(positions, head_dim)`` float32: transformers' default rotary embedding -- ``inv_freq = 1 /
    theta ** (arange(0, d, 2) / d)`` in float32, angles ``position * inv_freq`` concatenated with themselves."""
    exponents = np.arange(0, head_dim, 2).astype(np.float32) / np.float32(head_dim)
    inv_freq = (1.0 / np.power(np.float32(theta), exponents, dtype=np.float32)).astype(np.float32)
    angles = np.arange(positions, dtype=np.float32)[:, None] * inv_freq[None, :]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """``x * cos + rotate_half(x) * sin`` on ``(batch, tokens, heads, head_dim)``, the tables cast to ``x``'s dtype."""
    half = x.shape[-1] // 2
    rotated = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[None, :, None, :].astype(x.dtype), sin[None, :, None, :].astype(x.dtype)
    return x * cos + rotated * sin


class Qwen3Attention(layers.Module):
    """``Qwen3Attention``: grouped-query attention with per-head q/k RMS norms and rotary embeddings."""

    heads: int
    kv_heads: int
    head_dim: int
    eps: float
    bias: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], mask: jax.Array) -> jax.Array:
        def dense(features: int, name: str, bias: bool) -> layers.Dense:
            return layers.Dense(features, use_bias=bias, dtype=self.dtype, name=name)

        def heads(y: jax.Array, count: int) -> jax.Array:
            return y.reshape(*y.shape[:-1], count, self.head_dim)

        query = RMSNorm(self.eps, name="q_norm")(heads(dense(self.heads * self.head_dim, "q_proj", self.bias)(x),
                                                       self.heads))
        key = RMSNorm(self.eps, name="k_norm")(heads(dense(self.kv_heads * self.head_dim, "k_proj", self.bias)(x),
                                                     self.kv_heads))
        value = heads(dense(self.kv_heads * self.head_dim, "v_proj", self.bias)(x), self.kv_heads)
        query, key = apply_rope(query, *rope), apply_rope(key, *rope)
        out = jax.nn.dot_product_attention(query, key, value, mask=mask, scale=self.head_dim ** -0.5)
        return dense(x.shape[-1], "o_proj", False)(out.reshape(*out.shape[:2], -1))


class Qwen3MLP(layers.Module):
    """``Qwen3MLP``: ``down_proj(silu(gate_proj(x)) * up_proj(x))``, no biases."""

    intermediate: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        def dense(features: int, name: str) -> layers.Dense:
            return layers.Dense(features, use_bias=False, dtype=self.dtype, name=name)

        return dense(x.shape[-1], "down_proj")(nn.silu(dense(self.intermediate, "gate_proj")(x))
                                               * dense(self.intermediate, "up_proj")(x))


class Qwen3DecoderLayer(layers.Module):
    """``Qwen3DecoderLayer``: pre-norm attention and MLP, each added to its input."""

    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    bias: bool = False
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array], mask: jax.Array) -> jax.Array:
        attention = Qwen3Attention(self.heads, self.kv_heads, self.head_dim, self.eps, self.bias, self.dtype,
                                   name="self_attn")
        x = x + attention(RMSNorm(self.eps, name="input_layernorm")(x), rope, mask)
        mlp = Qwen3MLP(self.intermediate, self.dtype, name="mlp")
        return x + mlp(RMSNorm(self.eps, name="post_attention_layernorm")(x))


class Qwen3TextModel(FromDiffusersConfig, layers.Module):
    """transformers' ``Qwen3Model`` as a text encoder (module docstring). The fields up to ``use_sliding_window`` are
    Qwen3Config's config.json keys (build it with :meth:`from_config`); ``dtype`` the activations' dtype.

    ``__call__(input_ids, attention_mask, hidden_states=(k, ...))``: ``(len(hidden_states), batch, tokens,
    hidden_size)``, transformers' ``output_hidden_states`` entries ``k`` -- only the layers up to the deepest one asked
    for run. ``attention_mask`` ``(batch, tokens)``, 1 where a token is real: a token attends to the real tokens up to
    itself (transformers' causal mask with padding)."""

    vocab_size: int = 151936
    hidden_size: int = 4096
    intermediate_size: int = 22016
    num_hidden_layers: int = 32
    num_attention_heads: int = 32
    num_key_value_heads: int = 32
    head_dim: int = 128
    hidden_act: str = "silu"
    max_position_embeddings: int = 32768
    rms_norm_eps: float = 1e-6
    rope_theta: float = 10000.0
    rope_scaling: Optional[Any] = None
    attention_bias: bool = False
    use_sliding_window: bool = False
    dtype: Any = jnp.float32

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "Qwen3 text encoder"
    CONFIG_IGNORED: ClassVar[tuple[str, ...]] = CONFIG_IGNORED

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The module for a Qwen3Config config.json (a dict; ``rope_scaling`` made hashable). ValueError for a config
        it cannot run."""
        config = dict(config)
        if isinstance(config.get("rope_scaling"), dict):
            config["rope_scaling"] = tuple(sorted(config["rope_scaling"].items()))
        return super().from_config(config, **kwargs)

    def check(self) -> None:
        """ValueError for what these modules do not compute: another activation, rotary scaling, a sliding window."""
        problems = []
        if self.hidden_act != "silu":
            problems.append(f"hidden_act is {self.hidden_act!r}, not 'silu'")
        if self.rope_scaling is not None:
            problems.append("rope_scaling is set (only the default rotary embedding is computed)")
        if self.use_sliding_window:
            problems.append("use_sliding_window is true")
        if self.num_key_value_heads < 1 or self.num_attention_heads % self.num_key_value_heads:
            problems.append(f"num_key_value_heads {self.num_key_value_heads} does not divide num_attention_heads "
                            f"{self.num_attention_heads}")
        if problems:
            raise ValueError(f"{self.CONFIG_WHAT} config not supported: {'; '.join(problems)}")

    @nn.compact
    def __call__(self, input_ids: jax.Array, attention_mask: jax.Array,
                 hidden_states: Sequence[int] = ()) -> jax.Array:
        wanted = tuple(hidden_states) or (self.num_hidden_layers,)
        if min(wanted) < 0 or max(wanted) > self.num_hidden_layers:
            raise ValueError(f"hidden states {wanted}: this Qwen3 has {self.num_hidden_layers} layers (0 is the "
                             f"embeddings, {self.num_hidden_layers} the normed last layer)")
        depth = self.num_hidden_layers if self.is_initializing() else max(wanted)
        x = layers.Embed(self.vocab_size, self.hidden_size, name="embed_tokens")(input_ids).astype(self.dtype)
        tokens = input_ids.shape[1]
        cos, sin = rope_tables(tokens, self.head_dim, self.rope_theta)
        rope = (jnp.asarray(cos), jnp.asarray(sin))
        causal = jnp.tril(jnp.ones((tokens, tokens), bool))
        mask = (causal[None] & attention_mask.astype(bool)[:, None, :])[:, None]  # (batch, 1, query, key)
        found = {0: x}
        for index in range(depth):
            x = Qwen3DecoderLayer(self.num_attention_heads, self.num_key_value_heads, self.head_dim,
                                  self.intermediate_size, self.rms_norm_eps, self.attention_bias, self.dtype,
                                  name=f"layers_{index}")(x, rope, mask)
            found[index + 1] = x
        if depth == self.num_hidden_layers:  # the last entry is the last layer's output normed
            found[depth] = RMSNorm(self.rms_norm_eps, name="norm")(x)
        return jnp.stack([found[k] for k in wanted])

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (the tree without the ``params`` key); ``jax.eval_shape`` of it costs nothing."""
        ids = jnp.zeros((1, 1), jnp.int32)
        return self.init(rng, ids, jnp.ones((1, 1), jnp.int32))["params"]


def torch_names(state_dict: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A ``Qwen3ForCausalLM`` (or ``Qwen3Model``) state dict as this module's PyTorch-style names: ``model.`` dropped,
    the causal LM head (unused by a text encoder) left out."""
    return {name.removeprefix("model."): array for name, array in state_dict.items()
            if not name.startswith("lm_head.")}
