"""FLUX.1's transformer in flax.linen: the JAX twin of diffusers 0.39's PyTorch ``FluxTransformer2DModel``
(``diffusers/models/transformers/transformer_flux.py``), number for number.

diffusers has FLUX only in PyTorch (its Flax classes are frozen), so these modules are the runner's own. They
keep diffusers' module names -- the Flax parameter tree is diffusers' state-dict names with ``.N`` written
``_N`` (``transformer_blocks.0.attn.to_q.weight`` -> ``transformer_blocks_0/attn/to_q/kernel``), so the generic
PyTorch -> Flax renaming converts the weights (:mod:`.convert`).

What the forward does, as diffusers does it:

* ``x_embedder`` / ``context_embedder``: Linear projections of the packed image latents (``in_channels`` = 16
  latent channels x 2 x 2; the pipeline packs them) and of the T5 states.
* ``time_text_embed``: sinusoidal embeddings of ``1000 * timestep`` (and, for guidance-distilled FLUX.1-dev, of
  ``1000 * guidance``) through SiLU MLPs, plus a SiLU MLP of the pooled CLIP embedding (the ``temb`` every block
  is modulated by).
* ``pos_embed``: rotary tables from the ``(seq, 3)`` position ids of ``[text; image]``, one band per id axis.
* ``num_layers`` double-stream blocks (text and image have their own weights and attend jointly), then
  ``num_single_layers`` single-stream blocks over the concatenated sequence, then the final modulated norm and
  ``proj_out`` on the image tokens.

Numerics (where diffusers upcasts, these do too): the sinusoidal embeddings, the rotary rotation, the RMS/Layer
norms and the attention softmax are computed in float32 whatever ``dtype`` is, and cast back to ``dtype``; the
timestep and guidance are cast to ``dtype`` *before* the multiplication by 1000 (as diffusers does, so in
bfloat16 they are rounded first). diffusers computes the rotary angles in float64 (on CPU and CUDA); JAX
computes them in float32 here (float64 is off in JAX by default): the tables differ by about
``|angle| * 6e-8`` -- below 1e-5 for positions under 128 (a 2048-pixel image).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.attention import attend
from sdjax_runner.models.nn.config import FromDiffusersConfig

# The keys of diffusers' FluxTransformer2DModel config.json (its __init__ arguments) and their defaults there.
CONFIG_DEFAULTS: dict[str, Any] = {
    "patch_size": 1,
    "in_channels": 64,
    "out_channels": None,
    "num_layers": 19,
    "num_single_layers": 38,
    "attention_head_dim": 128,
    "num_attention_heads": 24,
    "joint_attention_dim": 4096,
    "pooled_projection_dim": 768,
    "guidance_embeds": False,
    "axes_dims_rope": (16, 56, 56),
}
ROPE_THETA = 10000  # FluxPosEmbed(theta=10000, ...), fixed in diffusers
TIME_CHANNELS = 256  # Timesteps(num_channels=256, flip_sin_to_cos=True, downscale_freq_shift=0)


# -- embeddings (diffusers/models/embeddings.py) -----------------------------------------------------------------


def timestep_embedding(timesteps: jax.Array, channels: int = TIME_CHANNELS, max_period: int = 10000) -> jax.Array:
    """diffusers' ``get_timestep_embedding(timesteps, channels, flip_sin_to_cos=True, downscale_freq_shift=0)``
    (what FLUX's ``Timesteps`` module calls): ``[cos(t * f), sin(t * f)]`` with ``f_i = exp(-ln(max_period) * i /
    (channels // 2))``, in float32, shape ``(N, channels)``. The frequencies are made as diffusers makes them in
    float32 (the exponent rounded to float32 twice, then exp) and exp taken in float64 and rounded, so they are
    the correctly rounded values of the same float32 exponents."""
    half = channels // 2
    exponent = np.float32(-math.log(max_period)) * np.arange(half, dtype=np.float32)
    exponent = exponent / np.float32(half)
    freqs = np.exp(exponent.astype(np.float64)).astype(np.float32)
    args = timesteps.astype(jnp.float32)[:, None] * jnp.asarray(freqs)[None, :]
    embedding = jnp.concatenate([jnp.cos(args), jnp.sin(args)], axis=-1)
    if channels % 2:
        embedding = jnp.pad(embedding, ((0, 0), (0, 1)))
    return embedding


def rope_tables(ids: jax.Array, axes_dims: tuple[int, ...], theta: float = ROPE_THETA) -> tuple[jax.Array, jax.Array]:
    """diffusers' ``FluxPosEmbed(theta, axes_dim)(ids)``: for each id axis ``i`` the angles ``ids[:, i] * theta **
    (-2k / axes_dims[i])``, ``k < axes_dims[i] // 2``, each repeated twice in place (``repeat_interleave_real``:
    the pairs are adjacent, ``[a0, a0, a1, a1, ...]``), the axes' bands concatenated; returns float32 ``(cos,
    sin)``, each ``(seq, sum(axes_dims))``. The frequencies are float64 rounded to float32; the angles float32
    (diffusers: float64)."""
    if ids.ndim != 2 or ids.shape[-1] != len(axes_dims):
        raise ValueError(f"position ids must be (seq, {len(axes_dims)}), got shape {ids.shape}")
    positions = ids.astype(jnp.float32)
    cos, sin = [], []
    for axis, dim in enumerate(axes_dims):
        freqs = (1.0 / theta ** (np.arange(0, dim, 2, dtype=np.float64) / dim)).astype(np.float32)
        angles = positions[:, axis:axis + 1] * jnp.asarray(freqs)[None, :]
        cos.append(jnp.repeat(jnp.cos(angles), 2, axis=-1))
        sin.append(jnp.repeat(jnp.sin(angles), 2, axis=-1))
    return jnp.concatenate(cos, axis=-1), jnp.concatenate(sin, axis=-1)


def apply_rope(x: jax.Array, cos: jax.Array, sin: jax.Array) -> jax.Array:
    """diffusers' ``apply_rotary_emb(x, (cos, sin), use_real=True, use_real_unbind_dim=-1, sequence_dim=1)``:
    ``x`` is ``(batch, seq, heads, head_dim)``; each adjacent pair ``(x[2k], x[2k+1])`` is rotated by its angle:
    ``x * cos + [-x[2k+1], x[2k]] * sin``, in float32, cast back to ``x``'s dtype."""
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    rotated = jnp.stack([-pairs[..., 1], pairs[..., 0]], axis=-1).reshape(x.shape)
    cos, sin = cos[None, :, None, :], sin[None, :, None, :]
    return (x.astype(jnp.float32) * cos + rotated.astype(jnp.float32) * sin).astype(x.dtype)


class SiLUProjection(layers.Module):
    """``linear_1 -> SiLU -> linear_2``: diffusers' ``TimestepEmbedding(in, dim)`` (the timestep and guidance
    embedders) and ``PixArtAlphaTextProjection(in, dim, act_fn="silu")`` (the pooled-text embedder) -- the same
    layers under the same names."""

    features: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = layers.Dense(self.features, dtype=self.dtype, param_dtype=self.param_dtype, name="linear_1")(x)
        return layers.Dense(self.features, dtype=self.dtype, param_dtype=self.param_dtype, name="linear_2")(nn.silu(x))


class TimeTextEmbedding(layers.Module):
    """diffusers' ``CombinedTimestepTextProjEmbeddings`` (FLUX.1-schnell) or, with ``guidance_embeds``,
    ``CombinedTimestepGuidanceTextProjEmbeddings`` (FLUX.1-dev): ``timestep_embedder(sinusoid(t)) [+
    guidance_embedder(sinusoid(g))] + text_embedder(pooled)``; the sinusoids (float32) are cast to ``dtype``
    first (diffusers: to the pooled projections' dtype). ``timestep`` and ``guidance`` arrive already x1000."""

    dim: int
    guidance_embeds: bool
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, timestep: jax.Array, pooled: jax.Array, guidance: Optional[jax.Array] = None) -> jax.Array:
        def embedder(name: str) -> SiLUProjection:
            return SiLUProjection(self.dim, dtype=self.dtype, param_dtype=self.param_dtype, name=name)

        conditioning = embedder("timestep_embedder")(timestep_embedding(timestep).astype(self.dtype))
        if self.guidance_embeds:
            if guidance is None:
                raise ValueError("this FLUX transformer has guidance embeddings (guidance_embeds, FLUX.1-dev): "
                                 "pass guidance")
            conditioning = conditioning + embedder("guidance_embedder")(timestep_embedding(guidance).astype(self.dtype))
        elif guidance is not None:
            raise ValueError("this FLUX transformer has no guidance embeddings (guidance_embeds is false, "
                             "FLUX.1-schnell): guidance must be None")
        return conditioning + embedder("text_embedder")(pooled.astype(self.dtype))


# -- norms (diffusers/models/normalization.py) -------------------------------------------------------------------


def layer_norm(x: jax.Array, eps: float = 1e-6) -> jax.Array:
    """``torch.layers.LayerNorm(dim, elementwise_affine=False, eps)``: over the last axis, in float32 (two-pass
    variance, as torch), cast back."""
    x32 = x.astype(jnp.float32)
    mean = x32.mean(axis=-1, keepdims=True)
    centred = x32 - mean
    var = jnp.square(centred).mean(axis=-1, keepdims=True)
    return (centred * jax.lax.rsqrt(var + eps)).astype(x.dtype)


class RMSNorm(layers.Module):
    """``torch.layers.RMSNorm(dim, eps, elementwise_affine=True)`` (FluxAttention's q/k norms): ``x / sqrt(mean(x^2) +
    eps) * scale`` over the last axis, in float32, cast to ``dtype``. Parameter ``scale`` (torch: ``weight``)."""

    eps: float = 1e-6
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        scale = self.param("scale", nn.initializers.ones, (x.shape[-1],), self.param_dtype)
        x32 = x.astype(jnp.float32)
        normed = x32 * jax.lax.rsqrt(jnp.square(x32).mean(axis=-1, keepdims=True) + self.eps)
        return (normed * scale.astype(jnp.float32)).astype(self.dtype)


class AdaLayerNormZero(layers.Module):
    """diffusers' ``AdaLayerNormZero(dim)`` (the double-stream blocks' ``norm1`` / ``norm1_context``):
    ``linear(silu(temb))`` split in six -- shift, scale, gate for the attention, shift, scale, gate for the MLP --
    and ``LayerNorm(x) * (1 + scale) + shift``. Returns ``(x, gate_msa, shift_mlp, scale_mlp, gate_mlp)``, the
    last four ``(batch, dim)``."""

    dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array) -> tuple[jax.Array, ...]:
        emb = layers.Dense(6 * self.dim, dtype=self.dtype, param_dtype=self.param_dtype, name="linear")(nn.silu(temb))
        shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = jnp.split(emb, 6, axis=-1)
        x = layer_norm(x) * (1 + scale_msa[:, None]) + shift_msa[:, None]
        return x, gate_msa, shift_mlp, scale_mlp, gate_mlp


class AdaLayerNormZeroSingle(layers.Module):
    """diffusers' ``AdaLayerNormZeroSingle(dim)`` (the single-stream blocks' ``norm``): ``linear(silu(temb))``
    split in three -- shift, scale, gate -- and ``LayerNorm(x) * (1 + scale) + shift``. Returns ``(x, gate)``."""

    dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array) -> tuple[jax.Array, jax.Array]:
        emb = layers.Dense(3 * self.dim, dtype=self.dtype, param_dtype=self.param_dtype, name="linear")(nn.silu(temb))
        shift, scale, gate = jnp.split(emb, 3, axis=-1)
        return layer_norm(x) * (1 + scale[:, None]) + shift[:, None], gate


class AdaLayerNormContinuous(layers.Module):
    """diffusers' ``AdaLayerNormContinuous(dim, dim, elementwise_affine=False, eps=1e-6)`` (the final ``norm_out``):
    ``linear(silu(temb))`` split in two -- *scale first, then shift* (the reverse of AdaLayerNormZero's order) --
    and ``LayerNorm(x) * (1 + scale) + shift``."""

    dim: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array) -> jax.Array:
        emb = layers.Dense(2 * self.dim, dtype=self.dtype, param_dtype=self.param_dtype, name="linear")(nn.silu(temb))
        scale, shift = jnp.split(emb, 2, axis=-1)
        return layer_norm(x) * (1 + scale[:, None]) + shift[:, None]


# -- attention and feed-forward -----------------------------------------------------------------------------------


class FeedForward(layers.Module):
    """diffusers' ``FeedForward(dim, dim_out=dim, activation_fn="gelu-approximate")``: ``net.0.proj`` (dim -> 4 dim),
    tanh-approximate GELU, ``net.2`` (4 dim -> dim); the Flax names are ``net_0/proj`` and ``net_2``."""

    dim: int
    mult: int = 4
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _GELUProjection(self.dim * self.mult, dtype=self.dtype, param_dtype=self.param_dtype, name="net_0")(x)
        return layers.Dense(self.dim, dtype=self.dtype, param_dtype=self.param_dtype, name="net_2")(x)


class _GELUProjection(layers.Module):
    """diffusers' ``GELU(dim_in, dim_out, approximate="tanh")``: a Linear ``proj``, then GELU (tanh form)."""

    features: int
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = layers.Dense(self.features, dtype=self.dtype, param_dtype=self.param_dtype, name="proj")(x)
        return nn.gelu(x, approximate=True)


class FluxAttention(layers.Module):
    """diffusers' ``FluxAttention`` with ``FluxAttnProcessor``. ``to_q/k/v`` (with bias), per-head RMS norms
    ``norm_q``/``norm_k`` (eps 1e-6), rotary embeddings on queries and keys, scaled dot-product attention
    (``softmax(q k^T / sqrt(head_dim)) v``, logits and softmax in float32).

    ``joint`` (the double-stream blocks): the text ``context`` has its own ``add_q/k/v_proj`` and
    ``norm_added_q/k``; the sequences are attended as ``[context; x]`` and split again, the image part through
    ``to_out_0`` (torch: ``to_out.0``), the text part through ``to_add_out``; returns ``(x, context)``.
    Otherwise (single-stream, diffusers' ``pre_only``): no output projection; returns the heads concatenated.

    ``implementation``: models/nn/attention.py's (``dot_product``: XLA's ``jax.nn.dot_product_attention``,
    ``cudnn_flash``: cuDNN's fused kernel)."""

    heads: int
    head_dim: int
    joint: bool
    implementation: str = "dot_product"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    def _dense(self, features: int, name: str) -> layers.Dense:
        return layers.Dense(features, dtype=self.dtype, param_dtype=self.param_dtype, name=name)

    def _norm(self, name: str) -> RMSNorm:
        return RMSNorm(eps=1e-6, dtype=self.dtype, param_dtype=self.param_dtype, name=name)

    def _heads(self, x: jax.Array) -> jax.Array:
        return x.reshape(*x.shape[:-1], self.heads, self.head_dim)

    @nn.compact
    def __call__(self, x: jax.Array, rope: tuple[jax.Array, jax.Array],
                 context: Optional[jax.Array] = None) -> Any:
        inner = self.heads * self.head_dim
        query = self._norm("norm_q")(self._heads(self._dense(inner, "to_q")(x)))
        key = self._norm("norm_k")(self._heads(self._dense(inner, "to_k")(x)))
        value = self._heads(self._dense(inner, "to_v")(x))
        if self.joint:
            if context is None:
                raise ValueError("joint attention needs the text context")
            query = jnp.concatenate([self._norm("norm_added_q")(self._heads(self._dense(inner, "add_q_proj")(context))),
                                     query], axis=1)
            key = jnp.concatenate([self._norm("norm_added_k")(self._heads(self._dense(inner, "add_k_proj")(context))),
                                   key], axis=1)
            value = jnp.concatenate([self._heads(self._dense(inner, "add_v_proj")(context)), value], axis=1)
        cos, sin = rope
        query, key = apply_rope(query, cos, sin), apply_rope(key, cos, sin)
        out = attend(query, key, value, self.implementation)
        out = out.reshape(*out.shape[:2], inner).astype(query.dtype)
        if not self.joint:
            return out
        assert context is not None
        text = context.shape[1]
        x_out = self._dense(x.shape[-1], "to_out_0")(out[:, text:])
        context_out = self._dense(context.shape[-1], "to_add_out")(out[:, :text])
        return x_out, context_out


# -- blocks (diffusers/models/transformers/transformer_flux.py) ----------------------------------------------------


class FluxTransformerBlock(layers.Module):
    """diffusers' ``FluxTransformerBlock`` (double stream): image ``x`` and text ``context`` each get an
    AdaLayerNormZero (``norm1``, ``norm1_context``), attend jointly (``attn``), and each adds its gated attention
    output and its gated feed-forward (``ff``, ``ff_context``) of ``LayerNorm(.) * (1 + scale_mlp) + shift_mlp``.
    Returns ``(context, x)``, as diffusers does."""

    dim: int
    heads: int
    head_dim: int
    implementation: str = "dot_product"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, context: jax.Array, temb: jax.Array,
                 rope: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        norm_x, gate_msa, shift_mlp, scale_mlp, gate_mlp = AdaLayerNormZero(self.dim, name="norm1", **kw)(x, temb)
        norm_c, c_gate_msa, c_shift_mlp, c_scale_mlp, c_gate_mlp = AdaLayerNormZero(
            self.dim, name="norm1_context", **kw)(context, temb)
        attn_x, attn_c = FluxAttention(self.heads, self.head_dim, joint=True, implementation=self.implementation,
                                       name="attn", **kw)(norm_x, rope, norm_c)

        x = x + gate_msa[:, None] * attn_x
        norm_x = layer_norm(x) * (1 + scale_mlp[:, None]) + shift_mlp[:, None]
        x = x + gate_mlp[:, None] * FeedForward(self.dim, name="ff", **kw)(norm_x)

        context = context + c_gate_msa[:, None] * attn_c
        norm_c = layer_norm(context) * (1 + c_scale_mlp[:, None]) + c_shift_mlp[:, None]
        context = context + c_gate_mlp[:, None] * FeedForward(self.dim, name="ff_context", **kw)(norm_c)
        if context.dtype == jnp.float16:
            context = jnp.clip(context, -65504, 65504)
        return context, x


class FluxSingleTransformerBlock(layers.Module):
    """diffusers' ``FluxSingleTransformerBlock`` (single stream) over ``[context; x]``: AdaLayerNormZeroSingle
    (``norm``), then in parallel attention (``attn``, no output projection) and ``proj_mlp`` (dim -> 4 dim) + tanh
    GELU; the two concatenated go through ``proj_out`` (5 dim -> dim), gated, added to the input. Returns
    ``(context, x)`` split back at the text length, as diffusers does."""

    dim: int
    heads: int
    head_dim: int
    mlp_ratio: float = 4.0
    implementation: str = "dot_product"
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, context: jax.Array, temb: jax.Array,
                 rope: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        text = context.shape[1]
        hidden = jnp.concatenate([context, x], axis=1)
        norm, gate = AdaLayerNormZeroSingle(self.dim, name="norm", **kw)(hidden, temb)
        mlp = nn.gelu(layers.Dense(int(self.dim * self.mlp_ratio), name="proj_mlp", **kw)(norm), approximate=True)
        attn = FluxAttention(self.heads, self.head_dim, joint=False, implementation=self.implementation,
                             name="attn", **kw)(norm, rope)
        out = layers.Dense(self.dim, name="proj_out", **kw)(jnp.concatenate([attn, mlp], axis=-1))
        hidden = hidden + gate[:, None] * out
        if hidden.dtype == jnp.float16:
            hidden = jnp.clip(hidden, -65504, 65504)
        return hidden[:, :text], hidden[:, text:]


# -- the model ------------------------------------------------------------------------------------------------------


# -- what the transformer and its ControlNet (controlnet.py) share ------------------------------------------------


def check_rope(axes_dims_rope: Any, attention_head_dim: int) -> None:
    """ValueError where the rotary bands do not fill the head exactly or are odd (diffusers asserts the same when it
    first runs)."""
    if sum(axes_dims_rope) != attention_head_dim or any(d % 2 for d in axes_dims_rope):
        raise ValueError(f"axes_dims_rope {tuple(axes_dims_rope)} must be even and sum to "
                         f"attention_head_dim {attention_head_dim}")


def stack_modules(module: Any) -> tuple[Any, Any, Any, list, list]:
    """(time_text_embed, context_embedder, x_embedder, the double blocks, the single blocks) of ``module`` (its
    ``setup`` calls this and keeps them under those names): FLUX.1's embedders and blocks at its config's widths."""
    kw = dict(dtype=module.dtype, param_dtype=module.param_dtype)
    dim, heads, head_dim = module.inner_dim, module.num_attention_heads, module.attention_head_dim
    return (TimeTextEmbedding(dim, module.guidance_embeds, **kw), layers.Dense(dim, **kw), layers.Dense(dim, **kw),
            [FluxTransformerBlock(dim, heads, head_dim, implementation=module.attention_implementation, **kw)
             for _ in range(module.num_layers)],
            [FluxSingleTransformerBlock(dim, heads, head_dim, implementation=module.attention_implementation, **kw)
             for _ in range(module.num_single_layers)])


def conditioning(module: Any, encoder_hidden_states: jax.Array, pooled_projections: jax.Array, timestep: jax.Array,
                 guidance: Optional[jax.Array]) -> tuple[jax.Array, jax.Array]:
    """(temb, the embedded text) of a call of ``module``: the timestep and guidance, in [0, 1], times 1000 as diffusers
    does, with the pooled text, and the text through the context embedder."""
    timestep = jnp.asarray(timestep).astype(module.dtype) * 1000
    if guidance is not None:
        guidance = jnp.asarray(guidance).astype(module.dtype) * 1000
    return (module.time_text_embed(timestep, pooled_projections, guidance),
            module.context_embedder(encoder_hidden_states))


def stack_inputs(module: Any) -> dict[str, Any]:
    """The smallest inputs of the right widths that ``module``'s call shares (one image token, one text token)."""
    inputs: dict[str, Any] = {
        "hidden_states": jnp.zeros((1, 1, module.in_channels), module.dtype),
        "encoder_hidden_states": jnp.zeros((1, 1, module.joint_attention_dim), module.dtype),
        "pooled_projections": jnp.zeros((1, module.pooled_projection_dim), module.dtype),
        "timestep": jnp.zeros((1,), jnp.float32),
        "img_ids": jnp.zeros((1, len(module.axes_dims_rope)), jnp.float32),
        "txt_ids": jnp.zeros((1, len(module.axes_dims_rope)), jnp.float32),
    }
    if module.guidance_embeds:
        inputs["guidance"] = jnp.zeros((1,), jnp.float32)
    return inputs


class FlaxFluxTransformer(FromDiffusersConfig, layers.Module):
    """FLUX.1's transformer: diffusers' ``FluxTransformer2DModel`` (dev: ``guidance_embeds=True``; schnell:
    ``False``) in flax.linen. The fields up to ``axes_dims_rope`` are diffusers' config.json keys (build it from a
    config with :meth:`from_config`); ``dtype`` is the activations' dtype, ``param_dtype`` the parameters' at
    initialisation; ``attention_implementation``: models/nn/attention.py's (:func:`attend`).

    ``__call__(hidden_states, encoder_hidden_states, pooled_projections, timestep, img_ids, txt_ids, guidance)``
    is diffusers' ``forward`` (``return_dict=False``, no ControlNet residuals, no IP-Adapter): ``hidden_states``
    ``(B, S, in_channels)`` packed latents, ``encoder_hidden_states`` ``(B, T, joint_attention_dim)``,
    ``pooled_projections`` ``(B, pooled_projection_dim)``, ``timestep`` ``(B,)`` in [0, 1] and ``guidance``
    ``(B,)`` (dev only) -- both multiplied by 1000 inside, as diffusers does --, ``img_ids`` ``(S, 3)`` and
    ``txt_ids`` ``(T, 3)``. Returns ``(B, S, patch_size**2 * out_channels)``."""

    patch_size: int = 1
    in_channels: int = 64
    out_channels: Optional[int] = None
    num_layers: int = 19
    num_single_layers: int = 38
    attention_head_dim: int = 128
    num_attention_heads: int = 24
    joint_attention_dim: int = 4096
    pooled_projection_dim: int = 768
    guidance_embeds: bool = False
    axes_dims_rope: tuple[int, ...] = (16, 56, 56)
    dtype: Any = jnp.float32
    param_dtype: Any = jnp.float32
    attention_implementation: str = "dot_product"
    # Weights split across devices (parallelism.params=sharded, engine/sharded.py): (block list name, a block's
    # params as this device holds them) -> the block's whole params. None: the weights arrive whole. Either way
    # each block's params pass an optimization barrier with the previous block's output before use, so a
    # block's shards are gathered only once the block before it has run -- one block's weights are whole at a
    # time -- and both placements compute the same numbers.
    gather_blocks: Optional[Callable[[str, Any], Any]] = None

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "FLUX transformer"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = ("axes_dims_rope",)

    @property
    def inner_dim(self) -> int:
        return self.num_attention_heads * self.attention_head_dim

    def check(self) -> None:
        """ValueError for a config this module cannot run (:func:`check_rope`)."""
        check_rope(self.axes_dims_rope, self.attention_head_dim)

    def setup(self) -> None:
        self.check()
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype)
        (self.time_text_embed, self.context_embedder, self.x_embedder, self.transformer_blocks,
         self.single_transformer_blocks) = stack_modules(self)
        self.norm_out = AdaLayerNormContinuous(self.inner_dim, **kw)
        self.proj_out = layers.Dense(self.patch_size * self.patch_size * (self.out_channels or self.in_channels), **kw)

    def __call__(self, hidden_states: jax.Array, encoder_hidden_states: jax.Array, pooled_projections: jax.Array,
                 timestep: jax.Array, img_ids: jax.Array, txt_ids: jax.Array,
                 guidance: Optional[jax.Array] = None, around_blocks: Optional[Callable] = None,
                 controlnet: Any = None) -> Any:
        """The prediction; with ``around_blocks`` -- a step cache (models/nn/step_cache.py): ``(head, rest, x,
        context) -> (context, x, what the cache returns)``, ``head`` and ``rest`` running the first block and the
        others -- ``(prediction, what the cache returned)``; ``controlnet``: a ControlNet's residuals
        (families/flux/models/controlnet.ControlNetResiduals), added after the blocks as diffusers adds them."""
        if img_ids.ndim != 2 or txt_ids.ndim != 2:
            raise ValueError(f"img_ids and txt_ids must be 2-D (seq, 3), got {img_ids.shape} and {txt_ids.shape}")
        x = self.x_embedder(hidden_states)
        temb, context = conditioning(self, encoder_hidden_states, pooled_projections, timestep, guidance)
        rope = rope_tables(jnp.concatenate([txt_ids, img_ids], axis=0), tuple(self.axes_dims_rope))
        if self.is_initializing():  # the blocks' params are made here
            for block in self.transformer_blocks:
                context, x = block(x, context, temb, rope)
            for single in self.single_transformer_blocks:
                context, x = single(x, context, temb, rope)
        elif around_blocks is not None:
            blocks = self._block_list()
            context, x, cached = around_blocks(lambda x, context: self._blocks(x, context, temb, rope, blocks[:1]),
                                               lambda x, context: self._blocks(x, context, temb, rope, blocks[1:]),
                                               x, context)
            return self.proj_out(self.norm_out(x, temb)), cached
        else:
            context, x = self._blocks(x, context, temb, rope, self._block_list(), controlnet)
        return self.proj_out(self.norm_out(x, temb))

    def _block_list(self) -> list[tuple[str, int, Any]]:
        """Every block in the order it runs: (its list's name, its index there, its class)."""
        return [(kind, i, cls) for kind, count, cls in (
            ("transformer_blocks", self.num_layers, FluxTransformerBlock),
            ("single_transformer_blocks", self.num_single_layers, FluxSingleTransformerBlock)) for i in range(count)]

    def _blocks(self, x: jax.Array, context: jax.Array, temb: jax.Array, rope: Any,
                blocks: list[tuple[str, int, Any]], controlnet: Any = None) -> tuple[Any, Any]:
        """``blocks`` (of :meth:`_block_list`) in order, each a pure function of its params: block i's params pass
        an optimization barrier with block i - 1's output, then ``gather_blocks`` (weights split across devices)
        makes them whole -- so XLA cannot gather every block's weights at once. A ControlNet's residual (``controlnet``)
        is added to a block's image output: block ``i`` of a kind reads residual ``i // ceil(blocks of the kind /
        residuals of the kind)`` (diffusers' ``interval_control``), or with ``controlnet.repeat`` (XLabs') double block
        ``i`` residual ``i % residuals``."""
        params = self.variables["params"]
        gather = self.gather_blocks or (lambda kind, block: block)
        kw = dict(dtype=self.dtype, param_dtype=self.param_dtype, implementation=self.attention_implementation)
        dim, heads, head_dim = self.inner_dim, self.num_attention_heads, self.attention_head_dim
        for kind, i, cls in blocks:
            shards, x, context = jax.lax.optimization_barrier((params[f"{kind}_{i}"], x, context))
            block = cls(dim, heads, head_dim, **kw, parent=None)  # detached: a pure function of its params
            out: Any = block.apply({"params": gather(kind, shards)}, x, context, temb, rope)
            context, x = out
            residuals = None if controlnet is None else \
                controlnet.double if kind == "transformer_blocks" else controlnet.single
            if residuals:
                count = self.num_layers if kind == "transformer_blocks" else self.num_single_layers
                repeated = controlnet.repeat and kind == "transformer_blocks"  # XLabs' kind
                x = x + residuals[i % len(residuals) if repeated else i // math.ceil(count / len(residuals))]
        return context, x

    def dummy_inputs(self) -> dict[str, Any]:
        """The smallest inputs of the right widths (one image token, one text token): for initialisation."""
        return stack_inputs(self)

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (the tree without the ``params`` collection key), as diffusers' Flax models'
        ``init_weights``; ``jax.eval_shape(module.init_weights, key)`` gives the shapes for nothing."""
        return self.init(rng, **self.dummy_inputs())["params"]
