"""The ControlNet of SD 1.x / 2.x in flax.linen, equal op for op to diffusers 0.39's ``FlaxControlNetModel``.

A copy of the UNet's down path and middle block (the blocks of :mod:`.unet`, under the same names) whose input is
the noisy latents plus an embedding of the control image (``controlnet_cond_embedding``: small convolutions
down to the latents' size), and whose outputs are each skip and the middle block's output through a 1x1
convolution initialised to zero (``controlnet_down_blocks_i``, ``controlnet_mid_block``), times the conditioning
scale: the residuals the UNet adds to its own (``down_block_additional_residuals``,
``mid_block_additional_residual``). The parameter tree is diffusers' Flax one.
"""

from __future__ import annotations

import itertools
from collections.abc import Mapping
from typing import Any, ClassVar, NamedTuple, Optional, Union

import flax.linen as nn
import jax
import jax.numpy as jnp

from sdjax_runner.families.sd.models.unet import (
    DOWN_BLOCKS,
    UNET_NEUTRAL,
    DownBlock,
    Level,
    MidBlock,
    TimestepEmbedding,
    as_timesteps,
    conv1x1,
    conv3x3,
    down_levels,
    level_problems,
    refuse_unsupported,
    sinusoidal_embedding,
)
from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.attention import IMPLEMENTATIONS
from sdjax_runner.models.nn.config import FromDiffusersConfig

# The keys of diffusers' FlaxControlNetModel config.json and their defaults there.
CONFIG_DEFAULTS: dict[str, Any] = {
    "sample_size": 32,
    "in_channels": 4,
    "down_block_types": ("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
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
    "controlnet_conditioning_channel_order": "rgb",
    "conditioning_embedding_out_channels": (16, 32, 96, 256),
}
CONFIG_TUPLES = ("down_block_types", "only_cross_attention", "block_out_channels", "attention_head_dim",
                 "num_attention_heads", "conditioning_embedding_out_channels")
# Keys of published (PyTorch) ControlNet configs that are no Flax ControlNet keys, with the values at which PyTorch
# computes what this ControlNet computes; any other value is refused by from_config.
CONTROLNET_NEUTRAL: dict[str, tuple[tuple[Any, ...], str]] = {
    **{key: value for key, value in UNET_NEUTRAL.items() if key not in CONFIG_DEFAULTS},
    "addition_embed_type": ((None,), "added embeddings (an SDXL ControlNet's text_time)"),
    "global_pool_conditions": ((False,), "globally pooled residuals (a shuffle ControlNet's)"),
    "conditioning_channels": ((3,), "a control image of other than 3 channels"),
    "transformer_layers_per_block": ((1,), "transformers deeper than one block"),
    "mid_block_type": (("UNetMidBlock2DCrossAttn",), "another middle block"),
}
# Published keys that change nothing here whatever their value (used only with added or class embeddings, which
# CONTROLNET_NEUTRAL keeps off; attention upcasting changes precision only).
CONTROLNET_FREE = ("upcast_attention", "projection_class_embeddings_input_dim", "addition_time_embed_dim",
                   "addition_embed_type_num_heads", "mid_block_only_cross_attention")


class ControlNetOutput(NamedTuple):
    """The ControlNet's residuals, NHWC and already times the conditioning scale: one per UNet skip
    (``down_block_res_samples``) and the middle block's (``mid_block_res_sample``)."""

    down_block_res_samples: tuple[jax.Array, ...]
    mid_block_res_sample: jax.Array


class ControlNetConditioningEmbedding(layers.Module):
    """The control image (NHWC) to the latents' size and ``channels``: ``conv_in``, SiLU, then per step of
    ``block_out_channels`` a 3x3 convolution and a stride-2 one (``blocks_2i``, ``blocks_2i+1``), each followed
    by SiLU, then ``conv_out`` (zero-initialised). Float32, as diffusers' Flax ControlNet builds it (it passes no
    dtype); ``dtype``: another (FLUX.1's XLabs ControlNets compute theirs in the model's dtype, as diffusers' PyTorch
    module does)."""

    channels: int
    block_out_channels: tuple[int, ...] = (16, 32, 96, 256)
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        dtype = self.dtype
        x = nn.silu(conv3x3(self.block_out_channels[0], "conv_in", dtype)(x))
        for i, (current, following) in enumerate(itertools.pairwise(self.block_out_channels)):
            x = nn.silu(conv3x3(current, f"blocks_{2 * i}", dtype)(x))
            x = nn.silu(conv3x3(following, f"blocks_{2 * i + 1}", dtype, stride=2)(x))
        return layers.Conv(self.channels, kernel_size=(3, 3), padding=((1, 1), (1, 1)), dtype=dtype, name="conv_out",
                       kernel_init=nn.initializers.zeros_init(), bias_init=nn.initializers.zeros_init())(x)


class ControlNetModel(FromDiffusersConfig, layers.Module):
    """A ControlNet: diffusers 0.39's ``FlaxControlNetModel``, op for op (module docstring).

    The fields up to ``conditioning_embedding_out_channels`` are that class's config.json keys with its defaults
    (build one from a published config with :meth:`from_config`); ``dtype`` is the activations' dtype (the
    conditioning embedding computes in float32, as diffusers'); ``attention`` picks the attention
    (:data:`..nn.attention.IMPLEMENTATIONS`). ``controlnet_conditioning_channel_order="bgr"`` flips the control
    image's channels first.

    ``__call__(sample, timesteps, encoder_hidden_states, controlnet_cond, conditioning_scale=1.0, train=False)``:
    ``sample`` NCHW latents, ``timesteps`` as the UNet takes them, ``encoder_hidden_states`` ``(B, T,
    cross_attention_dim)``, ``controlnet_cond`` the NCHW control image (``2 ** (len(conditioning_embedding_
    out_channels) - 1)`` times the latents' size: 8x for published ControlNets). Returns
    :class:`ControlNetOutput`."""

    sample_size: int = 32
    in_channels: int = 4
    down_block_types: tuple[str, ...] = CONFIG_DEFAULTS["down_block_types"]
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
    controlnet_conditioning_channel_order: str = "rgb"
    conditioning_embedding_out_channels: tuple[int, ...] = (16, 32, 96, 256)
    dtype: Any = jnp.float32
    attention: str = "default"

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "ControlNet"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = CONFIG_TUPLES
    CONFIG_IGNORED: ClassVar[tuple[str, ...]] = (*CONTROLNET_NEUTRAL, *CONTROLNET_FREE)

    @classmethod
    def from_config(cls, config: Mapping[str, Any], **kwargs: Any) -> Any:
        """The ControlNet for a config.json (diffusers' Flax or PyTorch ``ControlNetModel``'s): PyTorch-only keys
        are accepted at the values where PyTorch computes what this ControlNet computes, refused (ValueError) at
        any other (an SDXL ControlNet's ``addition_embed_type``, ``global_pool_conditions``, ...); ``kwargs`` set
        ``dtype`` and ``attention``. ValueError for a config it cannot compute (:meth:`check`)."""
        refuse_unsupported(config, CONTROLNET_NEUTRAL, cls.CONFIG_WHAT)
        return super().from_config(config, **kwargs)

    def levels(self) -> tuple[Level, ...]:
        """The down path's levels (one transformer block each, as diffusers' Flax ControlNet builds them)."""
        heads = self.num_attention_heads or self.attention_head_dim
        return down_levels(self.down_block_types, self.block_out_channels, heads, 1, self.only_cross_attention)

    def check(self) -> None:
        """ValueError for a config this ControlNet cannot compute: other block types, per-level settings of the
        wrong length, channels no multiple of 32 or not divided by their heads, another channel order than
        ``rgb`` / ``bgr``, an unknown ``attention``."""
        problems = []
        count = len(self.block_out_channels)
        if len(self.down_block_types) != count:
            problems.append("down_block_types and block_out_channels differ in length")
        problems += [f"down block {block!r} (this ControlNet builds {' and '.join(DOWN_BLOCKS)})"
                     for block in self.down_block_types if block not in DOWN_BLOCKS]
        for key in ("only_cross_attention", "attention_head_dim", "num_attention_heads"):
            value = getattr(self, key)
            if isinstance(value, tuple) and len(value) != count:
                problems.append(f"{key} has {len(value)} entries for {count} levels")
        if self.controlnet_conditioning_channel_order not in ("rgb", "bgr"):
            problems.append(f"controlnet_conditioning_channel_order {self.controlnet_conditioning_channel_order!r} "
                            "('rgb' or 'bgr')")
        if not self.conditioning_embedding_out_channels:
            problems.append("conditioning_embedding_out_channels is empty")
        if self.attention not in IMPLEMENTATIONS:
            problems.append(f"attention {self.attention!r} (one of {', '.join(IMPLEMENTATIONS)})")
        if not problems:
            problems = level_problems(self.levels(), with_mid_block=True)
        if problems:
            raise ValueError(f"ControlNet config: {'; '.join(problems)}")

    @nn.compact
    def __call__(self, sample: jax.Array, timesteps: Any, encoder_hidden_states: jax.Array,
                 controlnet_cond: jax.Array, conditioning_scale: Union[float, jax.Array] = 1.0,
                 train: bool = False) -> ControlNetOutput:
        self.check()
        deterministic, context = not train, encoder_hidden_states
        common = dict(use_linear_projection=self.use_linear_projection, dropout=self.dropout,
                      implementation=self.attention, dtype=self.dtype)
        levels = self.levels()
        if self.controlnet_conditioning_channel_order == "bgr":
            controlnet_cond = jnp.flip(controlnet_cond, axis=1)
        channels = self.block_out_channels[0]
        temb = sinusoidal_embedding(as_timesteps(timesteps), channels, self.flip_sin_to_cos, self.freq_shift)
        temb = TimestepEmbedding(channels * 4, self.dtype, name="time_embedding")(temb)

        x = conv3x3(channels, "conv_in", self.dtype)(jnp.transpose(sample, (0, 2, 3, 1)))
        x = x + ControlNetConditioningEmbedding(channels, self.conditioning_embedding_out_channels,
                                                name="controlnet_cond_embedding")(
            jnp.transpose(controlnet_cond, (0, 2, 3, 1)))
        skips: tuple[jax.Array, ...] = (x,)
        for i, level in enumerate(levels):
            x, level_skips = DownBlock(level, self.layers_per_block, i < len(levels) - 1, **common,
                                       name=f"down_blocks_{i}")(x, temb, context, deterministic)
            skips += tuple(skip for skip in level_skips if skip is not None)  # (it runs every layer)
        x = MidBlock(levels[-1].heads, 1, **common, name="mid_block")(x, temb, context, deterministic)

        down = tuple(conv1x1(skip.shape[-1], f"controlnet_down_blocks_{i}", self.dtype, zero=True)(skip)
                     for i, skip in enumerate(skips))
        mid = conv1x1(x.shape[-1], "controlnet_mid_block", self.dtype, zero=True)(x)
        return ControlNetOutput(tuple(residual * conditioning_scale for residual in down), mid * conditioning_scale)

    def dummy_inputs(self) -> dict[str, Any]:
        """The smallest inputs of the right widths: for initialisation."""
        size = 2 ** (len(self.block_out_channels) - 1)
        image = size * 2 ** (len(self.conditioning_embedding_out_channels) - 1)
        return {"sample": jnp.zeros((1, self.in_channels, size, size), jnp.float32),
                "timesteps": jnp.ones((1,), jnp.int32),
                "encoder_hidden_states": jnp.zeros((1, 1, self.cross_attention_dim), jnp.float32),
                "controlnet_cond": jnp.zeros((1, 3, image, image), jnp.float32)}

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (the tree without the ``params`` key), diffusers' ``init_weights``'s value for value
        for the same ``rng`` (the zero convolutions zero); ``jax.eval_shape`` of it gives the shapes for
        nothing."""
        params_rng, dropout_rng = jax.random.split(rng)
        return self.init({"params": params_rng, "dropout": dropout_rng}, **self.dummy_inputs())["params"]
