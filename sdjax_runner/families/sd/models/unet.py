"""Stable Diffusion's UNet in flax.linen -- SD 1.x, 2.x, XL base and refiner, 9-channel inpainting -- equal, op
for op, to diffusers 0.39's ``FlaxUNet2DConditionModel`` (the last diffusers with Flax classes).

The parameter tree is diffusers' Flax one, name for name and shape for shape (``conv_in``, ``time_embedding/
linear_1``, ``add_embedding``, ``down_blocks_0/resnets_0/conv1``, ``down_blocks_1/attentions_0/
transformer_blocks_0/attn1/to_q``, ``.../ff/net_0/proj``, ``up_blocks_0/upsamplers_0/conv``, ...), so diffusers'
``diffusion_flax_model.msgpack`` folders and PyTorch weights converted to those names load unchanged. The same
layers (linen's ``Conv``, ``Dense``, ``GroupNorm``, ``LayerNorm``: :mod:`..nn.layers`) are built with the same
arguments and run in the same order with the same casts: on the same weights and inputs the outputs are diffusers' bit for bit.

The blocks (used by the ControlNet too, :mod:`.controlnet`):

* :func:`sinusoidal_embedding` and :class:`TimestepEmbedding`: the timestep's sinusoids and their MLP (and SDXL's
  ``text_time`` added embedding of the pooled text and the micro-conditioning ``time_ids``).
* :class:`ResnetBlock2D`: GroupNorm-SiLU-conv twice, the time embedding added in between.
* :class:`Downsample2D` / :class:`Upsample2D`: a strided 3x3 convolution / nearest 2x then a 3x3 convolution.
* :class:`Transformer2D`: GroupNorm, an input projection (1x1 convolution, or a Dense for SD 2.x / XL's
  ``use_linear_projection``), :class:`BasicTransformerBlock` s (self-attention, cross-attention on the text, a
  GEGLU feed-forward, each pre-LayerNorm and residual), the output projection, the residual.
* :class:`DownBlock` / :class:`UpBlock` / :class:`MidBlock`: diffusers' ``(CrossAttn)DownBlock2D``,
  ``(CrossAttn)UpBlock2D`` and ``UNetMidBlock2DCrossAttn``.

GroupNorms have 32 groups (diffusers' Flax blocks fix it), so every level's channels must be a multiple of 32.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, NamedTuple, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.attention import IMPLEMENTATIONS
from sdjax_runner.models.nn.attention import attention as multihead_attention
from sdjax_runner.models.nn.config import FromDiffusersConfig
from sdjax_runner.models.nn.perturbed import Perturbed, blurred_queries, perturbs, torch_name

# What a UNet's config.json may ask that this UNet (diffusers' Flax UNet's arithmetic) does not compute: the keys of
# diffusers' PyTorch UNet2DConditionModel, each with the values at which PyTorch computes what this UNet computes
# (its default, or what the Flax class hard-codes), and what the key is. Another value is refused in one line
# (from_config): loaded and run, such a model would drop the weights of what it turns on -- an LCM model's guidance
# embedding, class embeddings, other normalisation -- and make wrong images, silently. Keys that change only
# precision (``upcast_attention``, SD 2.1's) are not listed (UNET_FREE).
NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    "time_cond_proj_dim": ((None,), "an LCM model's guidance embedding (w, added to the time embedding)"),
    "class_embed_type": ((None,), "class embeddings (an upscaler's noise level, unCLIP's image embedding)"),
    "num_class_embeds": ((None,), "class embeddings"),
    "encoder_hid_dim": ((None,), "a projection of the text encoder's states (DeepFloyd IF, Kandinsky)"),
    "encoder_hid_dim_type": ((None,), "a projection of the text encoder's states"),
    "addition_embed_type": ((None, "text_time"), "added embeddings other than SDXL's text_time"),
    "center_input_sample": ((False,), "centring the input sample"),
    "conv_in_kernel": ((3,), "the input convolution's window"),
    "conv_out_kernel": ((3,), "the output convolution's window"),
    "resnet_time_scale_shift": (("default",), "scale-shift time conditioning in the resnets"),
    "time_embedding_type": (("positional",), "Fourier time embeddings"),
    "time_embedding_dim": ((None,), "another time embedding width"),
    "time_embedding_act_fn": ((None,), "an activation on the time embedding"),
    "timestep_post_act": ((None,), "an activation after the time embedding"),
    "act_fn": (("silu",), "another activation"),
    "norm_num_groups": ((32,), "another group-norm group count"),
    "norm_eps": ((1e-5,), "another group-norm epsilon"),
    "attention_type": (("default",), "gated attention (GLIGEN)"),
    "class_embeddings_concat": ((False,), "class embeddings concatenated"),
    "dual_cross_attention": ((False,), "dual cross-attention"),
    "resnet_skip_time_act": ((False,), "the resnets' skipped time activation"),
    "resnet_out_scale_factor": ((1, 1.0), "scaled resnet outputs"),
    "cross_attention_norm": ((None,), "normalised cross-attention inputs"),
    "mid_block_type": (("UNetMidBlock2DCrossAttn",), "another middle block"),
    "reverse_transformer_layers_per_block": ((None,), "per-block transformer depths in the up blocks"),
    "downsample_padding": ((1,), "another downsampling padding"),
    "mid_block_scale_factor": ((1, 1.0), "a scaled middle block"),
}

# The keys of diffusers' FlaxUNet2DConditionModel config.json and their defaults there.
CONFIG_DEFAULTS: dict[str, Any] = {
    "sample_size": 32,
    "in_channels": 4,
    "out_channels": 4,
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    "up_block_types": ("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
    "mid_block_type": "UNetMidBlock2DCrossAttn",
    "only_cross_attention": False,
    "block_out_channels": (320, 640, 1280, 1280),
    "layers_per_block": 2,
    "attention_head_dim": 8,
    "num_attention_heads": None,
    "cross_attention_dim": 1280,
    "dropout": 0.0,
    "use_linear_projection": False,
    "flip_sin_to_cos": True,
    "freq_shift": 0,
    "use_memory_efficient_attention": False,
    "split_head_dim": False,
    "transformer_layers_per_block": 1,
    "addition_embed_type": None,
    "addition_time_embed_dim": None,
    "addition_embed_type_num_heads": 64,
    "projection_class_embeddings_input_dim": None,
}
PER_LEVEL = ("only_cross_attention", "attention_head_dim", "num_attention_heads", "transformer_layers_per_block")
CONFIG_TUPLES = ("down_block_types", "up_block_types", "block_out_channels", *PER_LEVEL)
# Keys of published (PyTorch) UNet configs that are no Flax UNet keys, with the values at which PyTorch computes
# what this UNet computes (NEUTRAL); any other value is refused by from_config.
UNET_NEUTRAL = {key: value for key, value in NEUTRAL.items() if key not in CONFIG_DEFAULTS}
# Published keys that change nothing here whatever their value: attention upcasting (precision only; diffusers'
# Flax UNet has none), the cross-attention-only flag of a mid block type this UNet does not build.
UNET_FREE = ("upcast_attention", "mid_block_only_cross_attention")
GROUPS = 32  # every GroupNorm's group count, fixed in diffusers' Flax blocks
DOWN_BLOCKS = ("CrossAttnDownBlock2D", "DownBlock2D")
UP_BLOCKS = ("CrossAttnUpBlock2D", "UpBlock2D")


def saved_sample_size(config: Mapping[str, Any]) -> Any:
    """A saved config.json's ``sample_size`` as diffusers' Flax SD pipeline reads it: one saved before diffusers
    0.9 with a ``sample_size`` under 64 (CompVis' SD 1.x configs say 32; their images are 512 px) reads as 64, as
    its PyTorch pipeline does too (it sets only the native size); any other as saved (the default where absent)."""
    import re

    size = config.get("sample_size", CONFIG_DEFAULTS["sample_size"])
    saved = str(config.get("_diffusers_version") or "")
    parts = tuple(int(p) for p in re.findall(r"\d+", saved)[:2])
    return 64 if saved and parts < (0, 9) and isinstance(size, int) and size < 64 else size


def self_attention_names(params: Mapping[str, Any], path: tuple[str, ...] = ()) -> list[str]:
    """The PyTorch names of the self-attention modules (``attn1``) of a UNet's parameter tree."""
    names = []
    for key, value in params.items():
        if key == "attn1":
            names.append(torch_name((*path, key)))
        elif isinstance(value, Mapping):
            names.extend(self_attention_names(value, (*path, key)))
    return names


class FreeU(NamedTuple):
    """FreeU's factors (Si et al. 2024; diffusers' ``enable_freeu``, ``guider=freeu``): in the first two up blocks
    (by index: ``b[0]``, ``s[0]`` in up block 0, the deepest; ``b[1]``, ``s[1]`` in up block 1), before each resnet,
    the first half of the backbone features' channels is scaled by ``b`` and the skip features' lowest frequencies
    (the centre 2 x 2 of their shifted 2-D spectrum) by ``s`` -- diffusers' ``apply_freeu`` and ``fourier_filter``.
    Traced scalars; at b 1 and s 1 the features pass unchanged, bit for bit."""

    b: tuple[Any, Any]
    s: tuple[Any, Any]


def fourier_filter(x: jax.Array, scale: Any) -> jax.Array:
    """diffusers' ``fourier_filter`` (threshold 1) on NHWC features: the 2-D FFT over H and W in float32, shifted,
    its centre 2 x 2 (rows and columns ``H // 2 - 1`` and ``H // 2``) times ``scale``, shifted back, inverse FFT, real
    part, in ``x``'s dtype. ``scale`` 1: ``x`` itself."""
    height, width = x.shape[1], x.shape[2]
    spectrum = jnp.fft.fftshift(jnp.fft.fft2(x.astype(jnp.float32), axes=(1, 2)), axes=(1, 2))
    rows = (jnp.arange(height) >= height // 2 - 1) & (jnp.arange(height) < height // 2 + 1)
    cols = (jnp.arange(width) >= width // 2 - 1) & (jnp.arange(width) < width // 2 + 1)
    mask = jnp.where(rows[:, None] & cols[None, :], jnp.asarray(scale, jnp.float32), 1.0)[None, :, :, None]
    filtered = jnp.fft.ifft2(jnp.fft.ifftshift(spectrum * mask, axes=(1, 2)), axes=(1, 2)).real.astype(x.dtype)
    return jnp.where(scale == 1, x, filtered)


def freeu_applied(x: jax.Array, skip: jax.Array, b: Any, s: Any) -> tuple[jax.Array, jax.Array]:
    """diffusers' ``apply_freeu`` for one up block's factors on NHWC features: the backbone ``x``'s first half of
    channels times ``b``, the ``skip`` Fourier-filtered by ``s``."""
    half = x.shape[-1] // 2
    scaled = jnp.concatenate([x[..., :half] * jnp.asarray(b, x.dtype), x[..., half:]], axis=-1)
    return jnp.where(b == 1, x, scaled), fourier_filter(skip, s)


class UNetOutput(NamedTuple):
    """What :class:`UNet2DConditionModel` returns: ``sample``, NCHW (diffusers' ``FlaxUNet2DConditionOutput``)."""

    sample: jax.Array


class DeepCache(NamedTuple):
    """DeepCache's branch for one UNet call (horseee/DeepCache's ``DeepCacheSDHelper``: its ``cache_block_id`` and
    ``cache_layer_id``, ``branch // 3`` and ``branch % 3``). Layers are numbered per level as DeepCache numbers them:
    a down block's resnets (each with its transformer) 0, 1, ... and its downsampler after them; an up block's
    layers from its last (0) back to its first. On a call that reuses the cache (``cached`` given) every down
    layer at or past the branch (``block`` > the branch's block, or the same block and ``layer`` >= its layer) is
    skipped, the middle block too, and so is every up layer past it (a deeper block, or the same block and a
    higher layer); the first up layer that runs starts from ``cached``, the input that layer had at the last call
    that ran the whole UNet (which sows it: ``intermediates``' ``deep_cache``). The skips the remaining up layers
    read all come from down layers that ran."""

    block: int
    layer: int
    cached: Optional[jax.Array] = None

    def down_runs(self, level: int) -> Optional[int]:
        """How many layers the down block of ``level`` runs on a reusing call (:meth:`DownBlock.__call__`'s
        ``runs``); None: all."""
        return None if level < self.block else self.layer if level == self.block else 0

    def first_up(self, level: int, per_block: int) -> Optional[int]:
        """The first layer (in running order) the up block of ``level`` runs on a reusing call -- None: none of
        them, 0: all; :meth:`entry` is where the cached input goes in."""
        if level > self.block:
            return None
        return 0 if level < self.block else max(0, per_block - 1 - self.layer)

    def entry(self, level: int, per_block: int) -> Optional[int]:
        """The up block layer (running order) whose input is the cache, in the up block of ``level``; else None."""
        return self.first_up(level, per_block) if level == self.block else None


def refuse_unsupported(config: Mapping[str, Any], neutral: Mapping[str, tuple[tuple[Any, ...], str]],
                       what: str) -> None:
    """ValueError naming each key of ``config`` in ``neutral`` (key -> (the values that compute as this module
    does, what the key is)) set to another value; a list counts as neutral when all its items are."""
    def is_neutral(value: Any, allowed: tuple[Any, ...]) -> bool:
        if isinstance(value, (list, tuple)):
            return all(item in allowed for item in value)
        return value in allowed

    found = [f"{key}={config[key]!r} ({description})" for key, (allowed, description) in neutral.items()
             if key in config and not is_neutral(config[key], allowed)]
    if found:
        raise ValueError(f"{what} config sets {'; '.join(found)}, which this {what} does not compute")


def per_level(value: Any, levels: int) -> tuple[Any, ...]:
    """A per-level setting as a tuple: a single value repeated ``levels`` times, a sequence as it is."""
    return tuple(value) if isinstance(value, (list, tuple)) else (value,) * levels


# -- embeddings ------------------------------------------------------------------------------------------------


def as_timesteps(timesteps: Any) -> jax.Array:
    """The timesteps as diffusers' Flax UNet takes them: a JAX array of shape ``(B,)`` as it is, a 0-d one as
    ``float32`` ``(1,)``; a number (Python or NumPy) as ``int32`` ``(1,)`` (a fraction truncated, as there); a
    NumPy array ``(B,)`` as a JAX one (diffusers fails on it)."""
    if isinstance(timesteps, jax.Array):
        return timesteps.astype(jnp.float32)[None] if timesteps.ndim == 0 else timesteps
    if np.ndim(timesteps) == 0:
        return jnp.array([timesteps], dtype=jnp.int32)
    return jnp.asarray(timesteps)


def sinusoidal_embedding(timesteps: jax.Array, dim: int, flip_sin_to_cos: bool, freq_shift: float,
                         min_timescale: float = 1.0, max_timescale: float = 1.0e4, scale: float = 1.0) -> jax.Array:
    """``(N,)`` -> ``(N, dim)`` float32: ``[sin(a), cos(a)]`` (``[cos, sin]`` with ``flip_sin_to_cos``) of the
    angles ``a = scale * t * f_k`` at the ``dim // 2`` frequencies ``f_k = min_timescale * exp(-k ln(max_timescale /
    min_timescale) / (dim // 2 - freq_shift))`` -- diffusers' Flax ``get_sinusoidal_embeddings``
    (``FlaxTimesteps``), its multiplications by the default ``min_timescale`` and ``scale`` of 1 kept, so the
    program is diffusers' own."""
    if timesteps.ndim != 1:
        raise ValueError(f"timesteps must be 1-d, got shape {timesteps.shape}")
    half = float(dim // 2)
    increment = math.log(max_timescale / min_timescale) / (half - freq_shift)
    frequencies = min_timescale * jnp.exp(jnp.arange(half, dtype=jnp.float32) * -increment)
    angles = scale * (timesteps[:, None] * frequencies[None, :])
    parts = (jnp.cos(angles), jnp.sin(angles)) if flip_sin_to_cos else (jnp.sin(angles), jnp.cos(angles))
    return jnp.concatenate(parts, axis=1)


class TimestepEmbedding(layers.Module):
    """``linear_1 -> SiLU -> linear_2`` to ``features`` (diffusers' ``FlaxTimestepEmbedding``): the time embedding
    and SDXL's ``add_embedding``."""

    features: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = layers.Dense(self.features, dtype=self.dtype, name="linear_1")(x)
        return layers.Dense(self.features, dtype=self.dtype, name="linear_2")(nn.silu(x))


# -- convolutional blocks ----------------------------------------------------------------------------------------


def group_norm(name: str) -> layers.GroupNorm:
    """diffusers' Flax GroupNorm: 32 groups, epsilon 1e-5, no dtype (it computes in float32, its parameters')."""
    return layers.GroupNorm(num_groups=GROUPS, epsilon=1e-5, name=name)


def conv3x3(features: int, name: str, dtype: Any, stride: int = 1) -> layers.Conv:
    """A 3x3 convolution padded by one pixel on each side."""
    return layers.Conv(features, kernel_size=(3, 3), strides=(stride, stride), padding=((1, 1), (1, 1)), dtype=dtype,
                   name=name)


def conv1x1(features: int, name: str, dtype: Any, zero: bool = False) -> layers.Conv:
    """A 1x1 convolution; ``zero``: kernel and bias initialised to zeros (the ControlNet's zero convolutions)."""
    if zero:
        return layers.Conv(features, kernel_size=(1, 1), strides=(1, 1), padding="VALID", dtype=dtype, name=name,
                       kernel_init=nn.initializers.zeros_init(), bias_init=nn.initializers.zeros_init())
    return layers.Conv(features, kernel_size=(1, 1), strides=(1, 1), padding="VALID", dtype=dtype, name=name)


class ResnetBlock2D(layers.Module):
    """diffusers' ``FlaxResnetBlock2D``: ``x + conv2(dropout(SiLU(norm2(conv1(SiLU(norm1(x))) + proj(SiLU(temb))))))``,
    the residual through a 1x1 ``conv_shortcut`` where the channel count changes. NHWC."""

    out_channels: int
    dropout: float = 0.0
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array, deterministic: bool = True) -> jax.Array:
        h = conv3x3(self.out_channels, "conv1", self.dtype)(nn.silu(group_norm("norm1")(x)))
        temb = layers.Dense(self.out_channels, dtype=self.dtype, name="time_emb_proj")(nn.silu(temb))
        h = h + jnp.expand_dims(jnp.expand_dims(temb, 1), 1)
        h = nn.Dropout(self.dropout, name="dropout")(nn.silu(group_norm("norm2")(h)), deterministic)
        h = conv3x3(self.out_channels, "conv2", self.dtype)(h)
        if x.shape[-1] != self.out_channels:
            x = conv1x1(self.out_channels, "conv_shortcut", self.dtype)(x)
        return h + x


class Downsample2D(layers.Module):
    """A 3x3 convolution of stride 2 (``downsamplers_0/conv``)."""

    out_channels: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return conv3x3(self.out_channels, "conv", self.dtype, stride=2)(x)


class Upsample2D(layers.Module):
    """Nearest-neighbour 2x upsampling, then a 3x3 convolution (``upsamplers_0/conv``)."""

    out_channels: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        batch, height, width, channels = x.shape
        x = jax.image.resize(x, shape=(batch, height * 2, width * 2, channels), method="nearest")
        return conv3x3(self.out_channels, "conv", self.dtype)(x)


# -- transformer -------------------------------------------------------------------------------------------------


class Attention(layers.Module):
    """Multi-head attention with diffusers' Flax parameter names: ``to_q`` / ``to_k`` / ``to_v`` (no bias) project
    the tokens (queries) and the context (keys and values; the tokens themselves without one), :func:`.attention`
    combines them (``implementation``), ``to_out_0`` projects back to the tokens' width."""

    heads: int
    head_dim: int
    implementation: str = "default"
    dtype: Any = jnp.float32
    # A perturbing guider's self-attention (0: none, the default): the batch's last 1/perturbed_chunks runs perturbed --
    # with query_blur None by the identity, to_out(to_v(x)) (PAG), else with its queries blurred over the tokens'
    # grid (height, width) by the traced sigma query_blur (SEG: models/nn/perturbed.py)
    perturbed_chunks: int = 0
    query_blur: Any = None
    grid: tuple[int, ...] = ()

    @nn.compact
    def __call__(self, x: jax.Array, context: Optional[jax.Array] = None) -> jax.Array:
        inner, width = self.heads * self.head_dim, x.shape[-1]
        to_q, to_k, to_v = (layers.Dense(inner, use_bias=False, dtype=self.dtype, name=name)
                            for name in ("to_q", "to_k", "to_v"))
        to_out = layers.Dense(width, dtype=self.dtype, name="to_out_0")
        rows = x.shape[0] // self.perturbed_chunks if self.perturbed_chunks else 0
        assert not rows or context is None  # (self-attention)
        if rows and self.query_blur is not None:  # SEG: the perturbed rows' queries blurred, then attention as usual
            queries = to_q(x)
            queries = jnp.concatenate([queries[:-rows], blurred_queries(queries[-rows:], self.grid[0], self.grid[1], self.query_blur)])
            return to_out(multihead_attention(queries, to_k(x), to_v(x), self.heads, self.implementation))
        perturbed = None
        if rows:  # PAG
            x, perturbed = x[:-rows], x[-rows:]
        context = x if context is None else context
        out = to_out(multihead_attention(to_q(x), to_k(context), to_v(context), self.heads, self.implementation))
        if perturbed is None:
            return out
        return jnp.concatenate([out, to_out(to_v(perturbed))])


class GEGLU(layers.Module):
    """``proj`` to ``2 * 4 * dim``, halves ``(a, b)``, ``a * gelu(b)`` (tanh-approximated GELU, Flax's default)."""

    dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        linear, gate = jnp.split(layers.Dense(self.dim * 4 * 2, dtype=self.dtype, name="proj")(x), 2, axis=2)
        return linear * nn.gelu(gate)


class FeedForward(layers.Module):
    """``net_0`` (:class:`GEGLU`) then ``net_2`` (a Dense back to ``dim``)."""

    dim: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        return layers.Dense(self.dim, dtype=self.dtype, name="net_2")(GEGLU(self.dim, self.dtype, name="net_0")(x))


class BasicTransformerBlock(layers.Module):
    """Self-attention (on the context instead with ``only_cross_attention``), cross-attention on the context, the
    feed-forward: each on a LayerNorm (epsilon 1e-5) of the tokens, each added to them."""

    heads: int
    head_dim: int
    only_cross_attention: bool = False
    implementation: str = "default"
    dtype: Any = jnp.float32
    perturbed: Optional[Perturbed] = None  # a perturbing guider's (PAG, SEG), where it picks this block's attn1
    grid: tuple[int, ...] = ()  # the tokens' (height, width) (SEG blurs over it)

    @nn.compact
    def __call__(self, x: jax.Array, context: jax.Array) -> jax.Array:
        def norm(name: str) -> layers.LayerNorm:
            return layers.LayerNorm(epsilon=1e-5, dtype=self.dtype, name=name)

        def attend(name: str, perturbed: Optional[Perturbed] = None) -> Attention:
            return Attention(self.heads, self.head_dim, self.implementation, self.dtype,
                             perturbed.chunks if perturbed else 0, perturbed.blur_sigma if perturbed else None,
                             self.grid, name=name)

        picked = None
        if (self.perturbed is not None and not self.only_cross_attention  # (attn1 attends to the text then)
                and perturbs(self.perturbed.layers, torch_name((*self.path, "attn1")))):
            picked = self.perturbed
        x = attend("attn1", picked)(norm("norm1")(x), context if self.only_cross_attention else None) + x
        x = attend("attn2")(norm("norm2")(x), context) + x
        return FeedForward(x.shape[-1], self.dtype, name="ff")(norm("norm3")(x)) + x


class Transformer2D(layers.Module):
    """diffusers' ``FlaxTransformer2DModel`` on NHWC features: GroupNorm, ``proj_in`` (1x1 convolution, or Dense on
    the flattened tokens with ``use_linear_projection``), ``depth`` :class:`BasicTransformerBlock` s with ``heads``
    heads of ``channels // heads`` features, ``proj_out``, plus the input."""

    heads: int
    depth: int = 1
    use_linear_projection: bool = False
    only_cross_attention: bool = False
    implementation: str = "default"
    dtype: Any = jnp.float32
    perturbed: Optional[Perturbed] = None

    @nn.compact
    def __call__(self, x: jax.Array, context: jax.Array) -> jax.Array:
        batch, height, width, channels = x.shape
        head_dim = channels // self.heads
        inner = self.heads * head_dim

        def projection(name: str) -> Union[layers.Dense, layers.Conv]:
            if self.use_linear_projection:
                return layers.Dense(inner, dtype=self.dtype, name=name)
            return conv1x1(inner, name, self.dtype)

        h = group_norm("norm")(x)
        if self.use_linear_projection:
            h = projection("proj_in")(h.reshape(batch, height * width, channels))
        else:
            h = projection("proj_in")(h).reshape(batch, height * width, channels)
        for i in range(self.depth):
            h = BasicTransformerBlock(self.heads, head_dim, self.only_cross_attention, self.implementation, self.dtype,
                                      self.perturbed, (height, width), name=f"transformer_blocks_{i}")(h, context)
        if self.use_linear_projection:
            h = projection("proj_out")(h).reshape(batch, height, width, channels)
        else:
            h = projection("proj_out")(h.reshape(batch, height, width, channels))
        return h + x


# -- UNet blocks -------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Level:
    """One resolution level of a UNet's (or ControlNet's) down path: ``channels``, whether it has transformers
    (``CrossAttnDownBlock2D``) and theirs ``heads``, ``depth`` and ``only_cross_attention``."""

    channels: int
    cross_attention: bool
    heads: int
    depth: int
    only_cross_attention: bool


def down_levels(block_types: Sequence[str], channels: Sequence[int], heads: Any, depth: Any,
                only_cross_attention: Any) -> tuple[Level, ...]:
    """The down path's levels from the config's per-level settings (a single value meaning every level)."""
    count = len(block_types)
    return tuple(Level(c, block == "CrossAttnDownBlock2D", h, d, o) for block, c, h, d, o in zip(
        block_types, channels, per_level(heads, count), per_level(depth, count),
        per_level(only_cross_attention, count), strict=True))


class DownBlock(layers.Module):
    """diffusers' ``FlaxCrossAttnDownBlock2D`` (``level.cross_attention``) or ``FlaxDownBlock2D``: ``num_layers``
    resnets (``resnets_i``), each followed by a transformer (``attentions_i``) in the first, then
    ``downsamplers_0`` unless ``add_downsample`` is false. Returns the output and each step's (the skips)."""

    level: Level
    num_layers: int
    add_downsample: bool
    use_linear_projection: bool = False
    dropout: float = 0.0
    implementation: str = "default"
    dtype: Any = jnp.float32
    perturbed: Optional[Perturbed] = None

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array, context: jax.Array, deterministic: bool = True,
                 runs: Optional[int] = None) -> tuple[jax.Array, tuple[Optional[jax.Array], ...]]:
        """``runs``: only the layers before this one (DeepCache's numbering: :class:`DeepCache`), the skips of the
        others None; None: every layer."""
        level = self.level
        skips: tuple[Optional[jax.Array], ...] = ()
        for i in range(self.num_layers):
            if runs is not None and i >= runs:
                skips += (None,)
                continue
            x = ResnetBlock2D(level.channels, self.dropout, self.dtype, name=f"resnets_{i}")(x, temb, deterministic)
            if level.cross_attention:
                x = Transformer2D(level.heads, level.depth, self.use_linear_projection, level.only_cross_attention,
                                  self.implementation, self.dtype, self.perturbed, name=f"attentions_{i}")(x, context)
            skips += (x,)
        if self.add_downsample:
            if runs is not None and self.num_layers >= runs:
                return x, skips + (None,)
            x = Downsample2D(level.channels, self.dtype, name="downsamplers_0")(x)
            skips += (x,)
        return x, skips


class UpBlock(layers.Module):
    """diffusers' ``FlaxCrossAttnUpBlock2D`` (``level.cross_attention``) or ``FlaxUpBlock2D``: for each of
    ``num_layers`` resnets, the last remaining skip concatenated to the features (channels last), the resnet, the
    transformer in the first; then ``upsamplers_0`` unless ``add_upsample`` is false."""

    level: Level
    num_layers: int
    add_upsample: bool
    use_linear_projection: bool = False
    dropout: float = 0.0
    implementation: str = "default"
    dtype: Any = jnp.float32
    perturbed: Optional[Perturbed] = None

    @nn.compact
    def __call__(self, x: jax.Array, skips: tuple[Optional[jax.Array], ...], temb: jax.Array, context: jax.Array,
                 deterministic: bool = True, freeu: Optional[tuple[Any, Any]] = None, first: int = 0,
                 sown: Optional[int] = None) -> jax.Array:
        """``first``: the layer to start at, ``x`` its input (DeepCache's reusing call); ``sown``: the layer whose
        input is sown (``intermediates``' ``deep_cache``: DeepCache's call that runs the whole UNet)."""
        level = self.level
        for i in range(first, self.num_layers):
            if i == sown:
                self.sow("intermediates", "deep_cache", x)
            skip = skips[-1 - i]
            assert skip is not None  # (a layer that runs reads a skip that ran: DeepCache's branches)
            if freeu is not None:  # FreeU's (b, s) for this block (:class:`FreeU`)
                x, skip = freeu_applied(x, skip, *freeu)
            x = jnp.concatenate((x, skip), axis=-1)
            x = ResnetBlock2D(level.channels, self.dropout, self.dtype, name=f"resnets_{i}")(x, temb, deterministic)
            if level.cross_attention:
                x = Transformer2D(level.heads, level.depth, self.use_linear_projection, level.only_cross_attention,
                                  self.implementation, self.dtype, self.perturbed, name=f"attentions_{i}")(x, context)
        if self.add_upsample:
            x = Upsample2D(level.channels, self.dtype, name="upsamplers_0")(x)
        return x


class MidBlock(layers.Module):
    """diffusers' ``FlaxUNetMidBlock2DCrossAttn``: ``resnets_0``, ``attentions_0``, ``resnets_1``. As there, the
    first resnet never drops out (it is called without ``deterministic``), the second does when training."""

    heads: int
    depth: int = 1
    use_linear_projection: bool = False
    dropout: float = 0.0
    implementation: str = "default"
    dtype: Any = jnp.float32
    perturbed: Optional[Perturbed] = None

    @nn.compact
    def __call__(self, x: jax.Array, temb: jax.Array, context: jax.Array, deterministic: bool = True) -> jax.Array:
        channels = x.shape[-1]
        x = ResnetBlock2D(channels, self.dropout, self.dtype, name="resnets_0")(x, temb)
        x = Transformer2D(self.heads, self.depth, self.use_linear_projection, False, self.implementation, self.dtype,
                          self.perturbed,
                          name="attentions_0")(x, context)
        return ResnetBlock2D(channels, self.dropout, self.dtype, name="resnets_1")(x, temb, deterministic)


def level_problems(levels: Sequence[Level], with_mid_block: bool) -> list[str]:
    """What in a down path cannot be computed: channels that are no multiple of the GroupNorms' 32 groups,
    transformer heads that do not divide their level's channels (the middle block's: the last level's)."""
    problems = []
    for i, level in enumerate(levels):
        if level.channels % GROUPS:
            problems.append(f"block_out_channels[{i}] = {level.channels} is no multiple of {GROUPS} (the group "
                            "norms' group count)")
        attends = level.cross_attention or (with_mid_block and i == len(levels) - 1)
        if attends and (not isinstance(level.heads, int) or level.heads < 1 or level.channels % level.heads):
            problems.append(f"{level.heads!r} attention heads do not divide block_out_channels[{i}] = "
                            f"{level.channels}")
    return problems


# -- the UNet ----------------------------------------------------------------------------------------------------


class UNet2DConditionModel(FromDiffusersConfig, layers.Module):
    """Stable Diffusion's conditional UNet: diffusers 0.39's ``FlaxUNet2DConditionModel``, op for op.

    The fields up to ``projection_class_embeddings_input_dim`` are that class's config.json keys with its defaults
    (build one from a published config with :meth:`from_config`); ``dtype`` is the activations' dtype (parameters
    are float32; the GroupNorms compute in float32, as diffusers'); ``attention`` picks the attention
    (:data:`..nn.attention.IMPLEMENTATIONS`) -- with ``"default"``, the config's ``use_memory_efficient_attention``
    and ``split_head_dim`` keep diffusers' meaning (where both are set, diffusers fails; here the first wins).

    ``attention_head_dim`` is, as in diffusers, the number of heads per level (a published naming slip);
    ``num_attention_heads`` must be None (diffusers refuses it too). ``addition_embed_type="text_time"`` (SDXL)
    adds ``add_embedding(concat(text_embeds, sinusoids(time_ids)))`` to the time embedding.

    ``__call__(sample, timesteps, encoder_hidden_states, added_cond_kwargs=None,
    down_block_additional_residuals=None, mid_block_additional_residual=None, train=False, perturbed=None,
    freeu=None, deep_cache=None)``:
    ``sample`` NCHW
    ``(B, in_channels, H, W)`` (H and W divisible by ``2 ** (levels - 1)``), ``timesteps`` (:func:`as_timesteps`),
    ``encoder_hidden_states`` ``(B, T, cross_attention_dim)``, ``added_cond_kwargs`` SDXL's ``{"text_embeds":
    (B, D), "time_ids": (B, n)}``, the ControlNet residuals NHWC (added to the skips -- as many as there are
    skips -- and to the middle block's output), ``train`` turns dropout on (rng ``dropout``), ``perturbed``
    (:class:`Perturbed`) perturbs self-attention for perturbed-attention guidance, ``freeu`` (:class:`FreeU`)
    reweighs the first up blocks' features, ``deep_cache`` (:class:`DeepCache`) runs DeepCache's branch (with its
    ``cached`` input: the shallow layers alone; without: every layer, the branch's input sown). Returns
    :class:`UNetOutput` with ``sample`` NCHW ``(B, out_channels, H, W)``.

    Under ``jax.jit`` it lowers to diffusers' own program (tests/test_sd_modules.py compares the StableHLO
    texts), so its outputs are diffusers' bit for bit."""

    sample_size: int = 32
    in_channels: int = 4
    out_channels: int = 4
    down_block_types: tuple[str, ...] = CONFIG_DEFAULTS["down_block_types"]
    up_block_types: tuple[str, ...] = CONFIG_DEFAULTS["up_block_types"]
    mid_block_type: Optional[str] = "UNetMidBlock2DCrossAttn"
    only_cross_attention: Union[bool, tuple[bool, ...]] = False
    block_out_channels: tuple[int, ...] = CONFIG_DEFAULTS["block_out_channels"]
    layers_per_block: int = 2
    attention_head_dim: Union[int, tuple[int, ...]] = 8
    num_attention_heads: Optional[Union[int, tuple[int, ...]]] = None
    cross_attention_dim: int = 1280
    dropout: float = 0.0
    use_linear_projection: bool = False
    flip_sin_to_cos: bool = True
    freq_shift: int = 0
    use_memory_efficient_attention: bool = False
    split_head_dim: bool = False
    transformer_layers_per_block: Union[int, tuple[int, ...]] = 1
    addition_embed_type: Optional[str] = None
    addition_time_embed_dim: Optional[int] = None
    addition_embed_type_num_heads: int = 64
    projection_class_embeddings_input_dim: Optional[int] = None
    dtype: Any = jnp.float32
    attention: str = "default"

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "UNet"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = CONFIG_TUPLES
    CONFIG_IGNORED: ClassVar[tuple[str, ...]] = (*UNET_NEUTRAL, *UNET_FREE)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The UNet for a config.json (diffusers' Flax or PyTorch ``UNet2DConditionModel``'s): the PyTorch-only
        keys (``act_fn``, ``norm_num_groups``, ``class_embed_type``, ``time_cond_proj_dim``, ...) are accepted at
        the values where PyTorch computes what this UNet computes, refused (ValueError) at any other; ``kwargs``
        set ``dtype`` and ``attention``. ValueError for a config it cannot compute (:meth:`check`)."""
        refuse_unsupported(config, UNET_NEUTRAL, cls.CONFIG_WHAT)
        return super().from_config(config, **kwargs)

    @property
    def attention_implementation(self) -> str:
        """The attention the transformers run (``attention``, or with ``"default"`` the config's flags')."""
        if self.attention != "default":
            return self.attention
        if self.use_memory_efficient_attention:
            return "memory_efficient"
        return "split_head_dim" if self.split_head_dim else "default"

    def levels(self) -> tuple[Level, ...]:
        """The down path's levels."""
        return down_levels(self.down_block_types, self.block_out_channels, self.attention_head_dim,
                           self.transformer_layers_per_block, self.only_cross_attention)

    def check(self) -> None:
        """ValueError for a config this UNet cannot compute: ``num_attention_heads`` set, block types other than
        diffusers' Flax ones, per-level settings of the wrong length, channels no multiple of 32 or not divided
        by their heads, another added embedding than ``text_time`` (or it without its sizes), an unknown
        ``attention``."""
        problems = []
        count = len(self.block_out_channels)
        if self.num_attention_heads is not None:
            problems.append("num_attention_heads is set (diffusers' UNet refuses it: attention_head_dim holds the "
                            "head counts)")
        if len(self.down_block_types) != count or len(self.up_block_types) != count:
            problems.append("down_block_types, up_block_types and block_out_channels differ in length")
        problems += [f"down block {block!r} (this UNet builds {' and '.join(DOWN_BLOCKS)})"
                     for block in self.down_block_types if block not in DOWN_BLOCKS]
        problems += [f"up block {block!r} (this UNet builds {' and '.join(UP_BLOCKS)})"
                     for block in self.up_block_types if block not in UP_BLOCKS]
        problems += [f"{key} has {len(getattr(self, key))} entries for {count} levels" for key in PER_LEVEL
                     if isinstance(getattr(self, key), tuple) and len(getattr(self, key)) != count]
        if self.mid_block_type not in (None, "UNetMidBlock2DCrossAttn"):
            problems.append(f"mid_block_type {self.mid_block_type!r} (UNetMidBlock2DCrossAttn or None)")
        if self.addition_embed_type not in (None, "text_time"):
            problems.append(f"addition_embed_type {self.addition_embed_type!r} (None or 'text_time')")
        elif self.addition_embed_type and not (self.addition_time_embed_dim and
                                                self.projection_class_embeddings_input_dim):
            problems.append("addition_embed_type 'text_time' without addition_time_embed_dim and "
                            "projection_class_embeddings_input_dim")
        if self.attention not in IMPLEMENTATIONS:
            problems.append(f"attention {self.attention!r} (one of {', '.join(IMPLEMENTATIONS)})")
        if not problems:
            problems = level_problems(self.levels(), self.mid_block_type is not None)
        if problems:
            raise ValueError(f"UNet config: {'; '.join(problems)}")

    def embed_time(self, timesteps: Any, added_cond_kwargs: Optional[Mapping[str, Any]]) -> jax.Array:
        """The time embedding (plus SDXL's added embedding); called inside ``__call__``."""
        channels = self.block_out_channels[0]
        temb = sinusoidal_embedding(as_timesteps(timesteps), channels, self.flip_sin_to_cos, self.freq_shift)
        temb = TimestepEmbedding(channels * 4, self.dtype, name="time_embedding")(temb)
        if self.addition_embed_type != "text_time":
            return temb
        text_embeds = (added_cond_kwargs or {}).get("text_embeds")
        time_ids = (added_cond_kwargs or {}).get("time_ids")
        if text_embeds is None or time_ids is None:
            raise ValueError("this UNet has SDXL's text_time embedding: pass added_cond_kwargs with text_embeds "
                             "and time_ids")
        assert self.addition_time_embed_dim is not None  # check()
        time_embeds = sinusoidal_embedding(jnp.ravel(time_ids), self.addition_time_embed_dim, self.flip_sin_to_cos,
                                           self.freq_shift).reshape(text_embeds.shape[0], -1)
        added = jnp.concatenate([text_embeds, time_embeds], axis=-1)
        return temb + TimestepEmbedding(channels * 4, self.dtype, name="add_embedding")(added)

    @nn.compact
    def __call__(self, sample: jax.Array, timesteps: Any, encoder_hidden_states: jax.Array,
                 added_cond_kwargs: Optional[Mapping[str, Any]] = None,
                 down_block_additional_residuals: Optional[Sequence[jax.Array]] = None,
                 mid_block_additional_residual: Optional[jax.Array] = None, train: bool = False,
                 perturbed: Optional[Perturbed] = None, freeu: Optional[FreeU] = None,
                 deep_cache: Optional[DeepCache] = None) -> UNetOutput:
        self.check()
        deterministic, context = not train, encoder_hidden_states
        common = dict(use_linear_projection=self.use_linear_projection, dropout=self.dropout,
                      implementation=self.attention_implementation, dtype=self.dtype, perturbed=perturbed)
        levels = self.levels()
        temb = self.embed_time(timesteps, added_cond_kwargs)
        reusing = deep_cache if deep_cache is not None and deep_cache.cached is not None else None

        x = conv3x3(self.block_out_channels[0], "conv_in", self.dtype)(jnp.transpose(sample, (0, 2, 3, 1)))
        skips: tuple[Optional[jax.Array], ...] = (x,)
        for i, level in enumerate(levels):
            runs = reusing.down_runs(i) if reusing else None
            x, level_skips = DownBlock(level, self.layers_per_block, i < len(levels) - 1, **common,
                                       name=f"down_blocks_{i}")(x, temb, context, deterministic, runs)
            skips += level_skips
        if down_block_additional_residuals is not None:
            skips = tuple(None if skip is None else skip + extra
                          for skip, extra in zip(skips, down_block_additional_residuals, strict=True))

        if self.mid_block_type is not None and not reusing:
            x = MidBlock(levels[-1].heads, levels[-1].depth, **common, name="mid_block")(x, temb, context,
                                                                                        deterministic)
        if mid_block_additional_residual is not None and not reusing:
            x = x + mid_block_additional_residual

        per_block = self.layers_per_block + 1
        for i, (block, level) in enumerate(zip(self.up_block_types, reversed(levels), strict=True)):
            up_level = Level(level.channels, block == "CrossAttnUpBlock2D", level.heads, level.depth,
                             level.only_cross_attention)
            level_skips, skips = skips[-per_block:], skips[:-per_block]
            block_freeu = None if freeu is None or i > 1 else (freeu.b[i], freeu.s[i])
            depth = len(levels) - 1 - i  # DeepCache's numbering of this up block
            first = reusing.first_up(depth, per_block) if reusing else 0
            if first is None:
                continue
            if reusing and depth == reusing.block:
                x = reusing.cached
            sown = deep_cache.entry(depth, per_block) if deep_cache is not None and not reusing else None
            x = UpBlock(up_level, per_block, i < len(levels) - 1, **common, name=f"up_blocks_{i}")(
                x, level_skips, temb, context, deterministic, block_freeu, first, sown)

        x = conv3x3(self.out_channels, "conv_out", self.dtype)(nn.silu(group_norm("conv_norm_out")(x)))
        return UNetOutput(sample=jnp.transpose(x, (0, 3, 1, 2)))

    def dummy_inputs(self) -> dict[str, Any]:
        """The smallest inputs of the right widths (one text token, the least spatial size): for initialisation."""
        size = 2 ** (len(self.block_out_channels) - 1)
        inputs: dict[str, Any] = {
            "sample": jnp.zeros((1, self.in_channels, size, size), jnp.float32),
            "timesteps": jnp.ones((1,), jnp.int32),
            "encoder_hidden_states": jnp.zeros((1, 1, self.cross_attention_dim), jnp.float32),
        }
        if self.addition_embed_type == "text_time":
            inputs["added_cond_kwargs"] = {"text_embeds": jnp.zeros((1, self.text_embeds_dim()), jnp.float32),
                                           "time_ids": jnp.zeros((1, self.micro_conditions()), jnp.float32)}
        return inputs

    def micro_conditions(self) -> int:
        """How many ``time_ids`` SDXL's added embedding takes, as diffusers reads the config: 5 for the refiner
        (its pooled text is as wide as its cross-attention: original size, crop, aesthetic score), else 6
        (original size, crop, target size)."""
        assert self.addition_time_embed_dim is not None  # check()
        refiner = 5 * self.addition_time_embed_dim + self.cross_attention_dim == \
            self.projection_class_embeddings_input_dim
        return 5 if refiner else 6

    def text_embeds_dim(self) -> int:
        """The width of SDXL's pooled ``text_embeds``: what the added embedding takes beyond the time ids'."""
        assert self.projection_class_embeddings_input_dim and self.addition_time_embed_dim  # check()
        return self.projection_class_embeddings_input_dim - self.micro_conditions() * self.addition_time_embed_dim

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (the tree without the ``params`` key): diffusers' ``init_weights``'s, value for
        value for the same ``rng`` (the same initialisers at the same names); ``jax.eval_shape(unet.init_weights,
        key)`` gives the shapes for nothing."""
        params_rng, dropout_rng = jax.random.split(rng)
        return self.init({"params": params_rng, "dropout": dropout_rng}, **self.dummy_inputs())["params"]
