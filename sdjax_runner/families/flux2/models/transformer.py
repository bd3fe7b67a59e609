"""FLUX.2's transformer in flax.linen: the JAX twin of diffusers 0.39's PyTorch ``Flux2Transformer2DModel``
(``diffusers/models/transformers/transformer_flux2.py``), number for number, with diffusers' module names (the
generic PyTorch -> Flax renaming converts its weights: families/flux/models/convert.py's ``convert_state_dict``).

What sets it apart from FLUX.1's (families/flux/models/transformer.py, whose embeddings, rotary tables and norms it
reads):

* no biases anywhere, and no pooled text: ``time_guidance_embed`` embeds ``1000 * timestep`` alone ([klein] has no
  guidance embedder; one with ``guidance_embeds`` adds ``1000 * guidance``'s);
* the modulation is shared: one ``double_stream_modulation_img`` / ``_txt`` for every double-stream block (two sets of
  shift, scale, gate each) and one ``single_stream_modulation`` for every single-stream block, all ``linear(silu(temb))``;
* the feed-forwards are SwiGLU (``linear_in`` to twice the width, ``silu(first half) * second half``, ``linear_out``);
  the single-stream blocks fuse the attention's q, k, v and the MLP's input in one projection (``to_qkv_mlp_proj``) and
  their outputs in another (``to_out``);
* four rotary axes (``axes_dims_rope``, ``rope_theta`` 2000): position ids ``(t, h, w, l)``.

Numerics as FLUX.1's module: sinusoids, rotary tables, norms and the attention softmax in float32, cast back.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from sdjax_runner.families.flux.models.transformer import (
    RMSNorm,
    apply_rope,
    check_rope,
    layer_norm,
    rope_tables,
    timestep_embedding,
)
from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.attention import attend
from sdjax_runner.models.nn.config import FromDiffusersConfig

# The keys of diffusers' Flux2Transformer2DModel config.json (its __init__ arguments) and their defaults there.
CONFIG_DEFAULTS: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 128,
    "out_channels": None,
    "num_layers": 8,
    "num_single_layers": 48,
    "attention_head_dim": 128,
    "num_attention_heads": 48,
    "joint_attention_dim": 15360,
    "timestep_guidance_channels": 256,
    "mlp_ratio": 3.0,
    "axes_dims_rope": (32, 32, 32, 32),
    "rope_theta": 2000,
    "eps": 1e-6,
    "guidance_embeds": True,
}


def _dense(features: int, name: str, dtype: Any, param_dtype: Any) -> layers.Dense:
    return layers.Dense(features, use_bias=False, dtype=dtype, param_dtype=param_dtype, name=name)


class TimestepEmbedding(layers.Module):
    """diffusers' ``TimestepEmbedding(in, dim, sample_proj_bias=False)``: ``linear_2(silu(linear_1(x)))``, no biases."""

    features: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _dense(self.features, "linear_1", self.dtype, self.param_dtype)(x)
        return _dense(self.features, "linear_2", self.dtype, self.param_dtype)(nn.silu(x))


class TimeGuidanceEmbedding(layers.Module):
    """``Flux2TimestepGuidanceEmbeddings``: ``timestep_embedder(sinusoid(t))`` (+ ``guidance_embedder(sinusoid(g))``
    with ``guidance_embeds``), the sinusoids cast to ``dtype``; ``timestep`` and ``guidance`` arrive already x1000."""

    dim: int
    channels: int
    guidance_embeds: bool
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, timestep: jax.Array, guidance: Optional[jax.Array] = None) -> jax.Array:
        def embedded(name: str, t: jax.Array) -> jax.Array:
            sinusoid = timestep_embedding(t, self.channels).astype(self.dtype)
            return TimestepEmbedding(self.dim, self.dtype, self.param_dtype, name=name)(sinusoid)

        conditioning = embedded("timestep_embedder", timestep)
        if self.guidance_embeds and guidance is not None:
            conditioning = conditioning + embedded("guidance_embedder", guidance)
        return conditioning


class Modulation(layers.Module):
    """``Flux2Modulation(dim, sets)``: ``linear(silu(temb))`` cut in ``3 * sets`` pieces, each ``(batch, 1, dim)`` --
    (shift, scale, gate) per set."""

    dim: int
    sets: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, temb: jax.Array) -> tuple[tuple[jax.Array, jax.Array, jax.Array], ...]:
        mod = _dense(self.dim * 3 * self.sets, "linear", self.dtype, self.param_dtype)(nn.silu(temb))[:, None]
        pieces = jnp.split(mod, 3 * self.sets, axis=-1)
        return tuple((pieces[3 * i], pieces[3 * i + 1], pieces[3 * i + 2]) for i in range(self.sets))


def modulated(x: jax.Array, shift: jax.Array, scale: jax.Array) -> jax.Array:
    """``(1 + scale) * LayerNorm(x) + shift`` (eps 1e-6, no affine)."""
    return (1 + scale) * layer_norm(x) + shift


def swiglu(x: jax.Array) -> jax.Array:
    """``Flux2SwiGLU``: ``silu(first half) * second half`` of the last axis."""
    half = x.shape[-1] // 2
    return nn.silu(x[..., :half]) * x[..., half:]


class FeedForward(layers.Module):
    """``Flux2FeedForward(dim, mult)``: ``linear_out(swiglu(linear_in(x)))``, the inner width ``int(dim * mult)``."""

    dim: int
    mult: float
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        inner = int(self.dim * self.mult)
        x = _dense(2 * inner, "linear_in", self.dtype, self.param_dtype)(x)
        return _dense(self.dim, "linear_out", self.dtype, self.param_dtype)(swiglu(x))


class Attention(layers.Module):
    """``Flux2Attention`` with ``Flux2AttnProcessor`` (the double-stream blocks'): image and text each through their
    own q, k, v (``to_*``, ``add_*_proj``) and per-head RMS norms, attended as ``[text; image]`` with the rotary
    tables, split again through ``to_out_0`` and ``to_add_out``. Returns ``(image, text)``."""

    heads: int
    head_dim: int
    eps: float
    implementation: str = "dot_product"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, context: jax.Array, rope: tuple[jax.Array, jax.Array]) -> tuple[Any, Any]:
        inner = self.heads * self.head_dim

        def project(y: jax.Array, name: str, norm: Optional[str] = None) -> jax.Array:
            out = _dense(inner, name, self.dtype, self.param_dtype)(y).reshape(*y.shape[:-1], self.heads, self.head_dim)
            return RMSNorm(self.eps, self.dtype, self.param_dtype, name=norm)(out) if norm else out

        query = jnp.concatenate([project(context, "add_q_proj", "norm_added_q"), project(x, "to_q", "norm_q")], 1)
        key = jnp.concatenate([project(context, "add_k_proj", "norm_added_k"), project(x, "to_k", "norm_k")], 1)
        value = jnp.concatenate([project(context, "add_v_proj"), project(x, "to_v")], 1)
        query, key = apply_rope(query, *rope), apply_rope(key, *rope)
        out = attend(query, key, value, self.implementation)
        out = out.reshape(*out.shape[:2], inner).astype(query.dtype)
        text = context.shape[1]
        return (_dense(x.shape[-1], "to_out_0", self.dtype, self.param_dtype)(out[:, text:]),
                _dense(context.shape[-1], "to_add_out", self.dtype, self.param_dtype)(out[:, :text]))


class BlockFields(layers.Module):
    """What every block (and the single-stream blocks' attention) is built with: the width, the heads, the MLP's
    ratio, the norms' eps, the attention implementation and the dtypes."""

    dim: int
    heads: int
    head_dim: int
    mlp_ratio: float
    eps: float
    implementation: str = "dot_product"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32


class TransformerBlock(BlockFields):
    """``Flux2TransformerBlock`` (double stream) with the shared modulations ``mod_img`` / ``mod_txt`` (two sets each:
    attention, then feed-forward). Returns ``(context, x)``, as diffusers does."""


    @nn.compact
    def __call__(self, x: jax.Array, context: jax.Array, mod_img: Any, mod_txt: Any,
                 rope: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        (shift_msa, scale_msa, gate_msa), (shift_mlp, scale_mlp, gate_mlp) = mod_img
        (c_shift_msa, c_scale_msa, c_gate_msa), (c_shift_mlp, c_scale_mlp, c_gate_mlp) = mod_txt
        attn_x, attn_c = Attention(self.heads, self.head_dim, self.eps, self.implementation, name="attn", **kw)(
            modulated(x, shift_msa, scale_msa), modulated(context, c_shift_msa, c_scale_msa), rope)
        x = x + gate_msa * attn_x
        x = x + gate_mlp * FeedForward(self.dim, self.mlp_ratio, name="ff", **kw)(modulated(x, shift_mlp, scale_mlp))
        context = context + c_gate_msa * attn_c
        context = context + c_gate_mlp * FeedForward(self.dim, self.mlp_ratio, name="ff_context", **kw)(
            modulated(context, c_shift_mlp, c_scale_mlp))
        if context.dtype == jnp.float16:
            context = jnp.clip(context, -65504, 65504)
        return context, x


class ParallelSelfAttention(BlockFields):
    """``Flux2ParallelSelfAttention`` (the single-stream blocks'): one projection to q, k, v and the MLP's input
    (``to_qkv_mlp_proj``), per-head RMS norms and rotary tables on q and k, attention, SwiGLU on the MLP part, both
    through one output projection (``to_out``)."""


    @nn.compact
    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array]) -> jax.Array:
        inner, mlp = self.heads * self.head_dim, int(self.dim * self.mlp_ratio)
        hidden = _dense(3 * inner + 2 * mlp, "to_qkv_mlp_proj", self.dtype, self.param_dtype)(x)
        qkv, mlp_in = hidden[..., :3 * inner], hidden[..., 3 * inner:]
        query, key, value = (part.reshape(*part.shape[:-1], self.heads, self.head_dim)
                             for part in jnp.split(qkv, 3, axis=-1))
        query = RMSNorm(self.eps, self.dtype, self.param_dtype, name="norm_q")(query)
        key = RMSNorm(self.eps, self.dtype, self.param_dtype, name="norm_k")(key)
        query, key = apply_rope(query, *rope), apply_rope(key, *rope)
        out = attend(query, key, value, self.implementation)
        out = out.reshape(*out.shape[:2], inner).astype(query.dtype)
        return _dense(self.dim, "to_out", self.dtype, self.param_dtype)(jnp.concatenate([out, swiglu(mlp_in)], -1))


class SingleTransformerBlock(BlockFields):
    """``Flux2SingleTransformerBlock`` over ``[context; x]`` with the shared single-stream modulation ``mod`` (one
    set). Returns ``(context, x)`` split back at the text length."""


    @nn.compact
    def __call__(self, x: jax.Array, context: jax.Array, mod: Any,
                 rope: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        (shift, scale, gate), = mod
        text = context.shape[1]
        hidden = jnp.concatenate([context, x], axis=1)
        attention = ParallelSelfAttention(self.dim, self.heads, self.head_dim, self.mlp_ratio, self.eps,
                                          self.implementation, self.dtype, self.param_dtype, name="attn")
        hidden = hidden + gate * attention(modulated(hidden, shift, scale), rope)
        if hidden.dtype == jnp.float16:
            hidden = jnp.clip(hidden, -65504, 65504)
        return hidden[:, :text], hidden[:, text:]


class AdaLayerNormContinuous(layers.Module):
    """``AdaLayerNormContinuous(dim, dim, elementwise_affine=False, bias=False)`` (``norm_out``): ``linear(silu(temb))``
    cut in two -- scale first, then shift -- and ``LayerNorm(x) * (1 + scale) + shift``."""

    dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array) -> jax.Array:
        scale, shift = jnp.split(_dense(2 * self.dim, "linear", self.dtype, self.param_dtype)(nn.silu(temb)), 2, -1)
        return layer_norm(x) * (1 + scale[:, None]) + shift[:, None]


class FlaxFlux2Transformer(FromDiffusersConfig, layers.Module):
    """FLUX.2's transformer: diffusers' ``Flux2Transformer2DModel`` in flax.linen. The fields up to
    ``guidance_embeds`` are diffusers' config.json keys (:meth:`from_config`); ``dtype`` the activations' dtype,
    ``param_dtype`` the parameters' at initialisation; ``attention_implementation`` models/nn/attention.py's.

    ``__call__(hidden_states, encoder_hidden_states, timestep, img_ids, txt_ids, guidance=None)`` is diffusers'
    ``forward`` (``return_dict=False``, no KV cache): ``hidden_states`` ``(B, S, in_channels)`` packed latents,
    ``encoder_hidden_states`` ``(B, T, joint_attention_dim)``, ``timestep`` ``(B,)`` in [0, 1] (x1000 inside),
    ``img_ids`` ``(S, 4)``, ``txt_ids`` ``(T, 4)``. Returns ``(B, S, patch_size**2 * out_channels)``."""

    patch_size: int = 1
    in_channels: int = 128
    out_channels: Optional[int] = None
    num_layers: int = 8
    num_single_layers: int = 48
    attention_head_dim: int = 128
    num_attention_heads: int = 48
    joint_attention_dim: int = 15360
    timestep_guidance_channels: int = 256
    mlp_ratio: float = 3.0
    axes_dims_rope: tuple[int, ...] = (32, 32, 32, 32)
    rope_theta: int = 2000
    eps: float = 1e-6
    guidance_embeds: bool = True
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    attention_implementation: str = "dot_product"
    # Weights split across devices (parallelism.params=sharded): (block list name, a block's params as this device
    # holds them) -> the block's whole params, gathered one block at a time (as FLUX.1's transformer does)
    gather_blocks: Optional[Callable[[str, Any], Any]] = None

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "FLUX.2 transformer"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = ("axes_dims_rope",)

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    def check(self) -> None:
        """ValueError for a config this module cannot run (FLUX.1's rule for the rotary bands; patches of 1)."""
        check_rope(self.axes_dims_rope, self.attention_head_dim)
        if self.patch_size != 1:
            raise ValueError(f"patch_size {self.patch_size}: FLUX.2's transformer reads packed latents (patch_size 1)")

    def _kw(self) -> dict[str, Any]:
        return dict(dtype=self.dtype, param_dtype=self.param_dtype)

    def _block_args(self) -> tuple:
        return (self.inner_dim, self.num_attention_heads, self.attention_head_dim, self.mlp_ratio, self.eps,
                self.attention_implementation)

    def setup(self) -> None:
        self.check()
        kw, dim = self._kw(), self.inner_dim
        self.time_guidance_embed = TimeGuidanceEmbedding(dim, self.timestep_guidance_channels, self.guidance_embeds,
                                                         **kw)
        self.double_stream_modulation_img = Modulation(dim, 2, **kw)
        self.double_stream_modulation_txt = Modulation(dim, 2, **kw)
        self.single_stream_modulation = Modulation(dim, 1, **kw)
        self.x_embedder = _dense(dim, "x_embedder", **kw)
        self.context_embedder = _dense(dim, "context_embedder", **kw)
        self.transformer_blocks = [TransformerBlock(*self._block_args(), **kw) for _ in range(self.num_layers)]
        self.single_transformer_blocks = [SingleTransformerBlock(*self._block_args(), **kw)
                                          for _ in range(self.num_single_layers)]
        self.norm_out = AdaLayerNormContinuous(dim, **kw)
        self.proj_out = _dense(self.patch_size ** 2 * (self.out_channels or self.in_channels), "proj_out", **kw)

    def __call__(self, hidden_states: jax.Array, encoder_hidden_states: jax.Array, timestep: jax.Array,
                 img_ids: jax.Array, txt_ids: jax.Array, guidance: Optional[jax.Array] = None) -> jax.Array:
        if img_ids.ndim != 2 or txt_ids.ndim != 2:
            raise ValueError(f"img_ids and txt_ids must be 2-D (seq, 4), got {img_ids.shape} and {txt_ids.shape}")
        timestep = jnp.asarray(timestep).astype(self.dtype) * 1000
        if guidance is not None:
            guidance = jnp.asarray(guidance).astype(self.dtype) * 1000
        temb = self.time_guidance_embed(timestep, guidance)
        mods = {"img": self.double_stream_modulation_img(temb), "txt": self.double_stream_modulation_txt(temb),
                "single": self.single_stream_modulation(temb)}
        x, context = self.x_embedder(hidden_states), self.context_embedder(encoder_hidden_states)
        rope = rope_tables(jnp.concatenate([txt_ids, img_ids], axis=0), tuple(self.axes_dims_rope), self.rope_theta)
        if self.is_initializing():  # the blocks' params are made here
            for block in self.transformer_blocks:
                context, x = block(x, context, mods["img"], mods["txt"], rope)
            for single in self.single_transformer_blocks:
                context, x = single(x, context, mods["single"], rope)
        else:
            context, x = self._blocks(x, context, mods, rope)
        return self.proj_out(self.norm_out(x, temb))

    def _blocks(self, x: jax.Array, context: jax.Array, mods: dict, rope: Any) -> tuple[Any, Any]:
        """Every block in order, each a pure function of its params: block i's params pass an optimization barrier
        with block i - 1's output, then ``gather_blocks`` (weights split across devices) makes them whole -- one
        block's weights whole at a time, as FLUX.1's transformer gathers them."""
        params = self.variables["params"]
        gather = self.gather_blocks or (lambda kind, block: block)
        for kind, count, cls in (("transformer_blocks", self.num_layers, TransformerBlock),
                                 ("single_transformer_blocks", self.num_single_layers, SingleTransformerBlock)):
            for i in range(count):
                shards, x, context = jax.lax.optimization_barrier((params[f"{kind}_{i}"], x, context))
                block = cls(*self._block_args(), **self._kw(), parent=None)  # detached: a pure function of params
                extra = (mods["img"], mods["txt"]) if kind == "transformer_blocks" else (mods["single"],)
                out: Any = block.apply({"params": gather(kind, shards)}, x, context, *extra, rope)
                context, x = out
        return context, x

    def dummy_inputs(self) -> dict[str, Any]:
        """The smallest inputs of the right widths (one image token, one text token): for initialisation."""
        axes = len(self.axes_dims_rope)
        return {"hidden_states": jnp.zeros((1, 1, self.in_channels), self.dtype),
                "encoder_hidden_states": jnp.zeros((1, 1, self.joint_attention_dim), self.dtype),
                "timestep": jnp.zeros((1,), jnp.float32), "img_ids": jnp.zeros((1, axes), jnp.float32),
                "txt_ids": jnp.zeros((1, axes), jnp.float32),
                "guidance": jnp.zeros((1,), jnp.float32) if self.guidance_embeds else None}

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (the tree without the ``params`` collection key); ``jax.eval_shape`` of it costs
        nothing."""
        return self.init(rng, **self.dummy_inputs())["params"]
