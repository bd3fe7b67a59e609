"""The KL autoencoder (VAE) of every family the runner runs, in flax.linen: diffusers' ``AutoencoderKL`` as SD
1.x / 2.x / XL configure it (4 latent channels, 1x1 ``quant_conv`` / ``post_quant_conv`` around the latents) and
as FLUX.1 and SD 3 configure it (16 latent channels, no quant convolutions).

The numbers are diffusers 0.39's Flax ``FlaxAutoencoderKL`` / ``FlaxEncoder`` / ``FlaxDecoder``
(``models/vae_flax.py``) operation for operation -- the same flax layers with the same arguments, in the same
order -- so on the same weights the outputs are bit-for-bit equal (tests/test_vae_module.py). In particular, as
there:

* parameters are float32 whatever ``dtype`` is; ``dtype`` is the convolutions' and dense layers' computation
  dtype, while the group norms have no dtype of their own (they compute in the promotion of their input with
  their float32 parameters, so in bfloat16 they hand float32 to the next convolution, which casts it back);
* the mid block's attention has one head over all channels, its query and key each scaled by ``C ** -1/4``;
* downsampling pads one row and one column at the bottom and right, then a stride-2 3x3 convolution;
  upsampling repeats pixels (nearest) before a 3x3 convolution;
* dropout is absent: diffusers' VAE blocks have rate 0.

The parameter tree is diffusers' Flax names (``encoder/down_blocks_0/resnets_0/conv1/kernel``,
``decoder/mid_block/attentions_0/query/kernel``, ``quant_conv/kernel`` ...), so diffusers' Flax ``.msgpack``
VAE folders load as they are and PyTorch state dicts convert with the generic renaming
(:mod:`sdjax_runner.models.nn.pytorch_names`).

Images and latents are NCHW at the module's boundary, as in diffusers' PyTorch API; inside, the blocks are
channels-last (NHWC), and so are the arrays of the :class:`DiagonalGaussian` that ``encode`` returns.
"""

from __future__ import annotations

import math
from typing import Any, ClassVar, Optional

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from sdjax_runner.models.nn import layers
from sdjax_runner.models.nn.config import FromDiffusersConfig

# The keys of diffusers' PyTorch AutoencoderKL config.json (its __init__ arguments) and their defaults there.
CONFIG_DEFAULTS: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",),
    "up_block_types": ("UpDecoderBlock2D",),
    "block_out_channels": (64,),
    "layers_per_block": 1,
    "act_fn": "silu",
    "latent_channels": 4,
    "norm_num_groups": 32,
    "sample_size": 32,
    "scaling_factor": 0.18215,
    "shift_factor": None,
    "latents_mean": None,
    "latents_std": None,
    "force_upcast": True,
    "use_quant_conv": True,
    "use_post_quant_conv": True,
    "mid_block_add_attention": True,
}
CONFIG_TUPLES = ("down_block_types", "up_block_types", "block_out_channels", "sample_size", "latents_mean",
                 "latents_std")
EPSILON = 1e-6  # every group norm of the VAE


# -- layers ------------------------------------------------------------------------------------------------------

def _conv3x3(features: int, dtype: Any, name: str, strides: int = 1) -> layers.Conv:
    """A 3x3 convolution: padded by one pixel on every side (stride 1), or unpadded with stride 2 (the
    downsampler pads first)."""
    padding: Any = ((1, 1), (1, 1)) if strides == 1 else "VALID"
    return layers.Conv(features, kernel_size=(3, 3), strides=(strides, strides), padding=padding, dtype=dtype, name=name)


def _conv1x1(features: int, dtype: Any, name: Optional[str] = None) -> layers.Conv:
    """A 1x1 convolution (a per-pixel linear map): the residual shortcut and the quant convolutions."""
    return layers.Conv(features, kernel_size=(1, 1), strides=(1, 1), padding="VALID", dtype=dtype, name=name)


def _group_norm(groups: int, name: str) -> layers.GroupNorm:
    """The VAE's group norm: float32 parameters and no dtype of its own (see the module docstring)."""
    return layers.GroupNorm(num_groups=groups, epsilon=EPSILON, name=name)


class ResnetBlock(layers.Module):
    """diffusers' ``ResnetBlock2D`` without a time embedding: norm, SiLU, conv, twice, plus the input (through
    a 1x1 ``conv_shortcut`` where the channel count changes)."""

    out_channels: int
    groups: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        h = _conv3x3(self.out_channels, self.dtype, "conv1")(nn.swish(_group_norm(self.groups, "norm1")(x)))
        h = _conv3x3(self.out_channels, self.dtype, "conv2")(nn.swish(_group_norm(self.groups, "norm2")(h)))
        if x.shape[-1] != self.out_channels:
            x = _conv1x1(self.out_channels, self.dtype, "conv_shortcut")(x)
        return h + x


class Resample(layers.Module):
    """Halve (``down``: pad bottom/right by one, stride-2 conv) or double (``up``: nearest, then conv) the
    spatial size; the convolution keeps the channel count."""

    channels: int
    down: bool
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        if self.down:
            x = jnp.pad(x, pad_width=((0, 0), (0, 1), (0, 1), (0, 0)))
            return _conv3x3(self.channels, self.dtype, "conv", strides=2)(x)
        batch, height, width, channels = x.shape
        x = jax.image.resize(x, shape=(batch, height * 2, width * 2, channels), method="nearest")
        return _conv3x3(self.channels, self.dtype, "conv")(x)


class AttentionBlock(layers.Module):
    """The VAE's self-attention over all pixels (diffusers' Flax ``FlaxAttentionBlock`` with one head): group
    norm, query/key/value dense layers, softmax of the scaled dot products, ``proj_attn``, plus the input."""

    channels: int
    groups: int
    dtype: Any = jnp.float32
    heads: ClassVar[int] = 1  # diffusers' VAE mid block: one head of all channels

    def _split_heads(self, x: jax.Array) -> jax.Array:
        """(B, T, heads * D) -> (B, heads, T, D)."""
        return jnp.transpose(x.reshape(x.shape[:-1] + (self.heads, -1)), (0, 2, 1, 3))

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        batch, height, width, channels = x.shape
        h = _group_norm(self.groups, "group_norm")(x).reshape((batch, height * width, channels))
        query, key, value = (self._split_heads(layers.Dense(self.channels, dtype=self.dtype, name=name)(h))
                             for name in ("query", "key", "value"))
        scale = 1 / math.sqrt(math.sqrt(self.channels / self.heads))  # on q and k each: 1/sqrt(D) in all
        weights = nn.softmax(jnp.einsum("...qc,...kc->...qk", query * scale, key * scale), axis=-1)
        h = jnp.transpose(jnp.einsum("...kc,...qk->...qc", value, weights), (0, 2, 1, 3))
        h = layers.Dense(self.channels, dtype=self.dtype, name="proj_attn")(h.reshape(h.shape[:-2] + (self.channels,)))
        return h.reshape((batch, height, width, channels)) + x


class ResnetStack(layers.Module):
    """A ``DownEncoderBlock2D`` / ``UpDecoderBlock2D``: ``layers`` resnets (``resnets_0`` ...), then the
    optional ``downsamplers_0`` / ``upsamplers_0``."""

    out_channels: int
    layers: int
    groups: int
    resample: Optional[str] = None  # "down", "up" or None
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for i in range(self.layers):
            x = ResnetBlock(self.out_channels, self.groups, self.dtype, name=f"resnets_{i}")(x)
        if self.resample is not None:
            x = Resample(self.out_channels, self.resample == "down", self.dtype, name=f"{self.resample}samplers_0")(x)
        return x


class MidBlock(layers.Module):
    """``UNetMidBlock2D`` as the VAE has it: resnet, attention, resnet at constant channel count."""

    channels: int
    groups: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = ResnetBlock(self.channels, self.groups, self.dtype, name="resnets_0")(x)
        x = AttentionBlock(self.channels, self.groups, self.dtype, name="attentions_0")(x)
        return ResnetBlock(self.channels, self.groups, self.dtype, name="resnets_1")(x)


class Encoder(layers.Module):
    """Image (NHWC) -> the Gaussian's moments (NHWC, ``2 * latent_channels``: mean then log-variance):
    ``conv_in``, one down block per ``block_out_channels`` entry (all but the last downsample), mid block,
    norm, SiLU, ``conv_out``."""

    block_out_channels: tuple[int, ...]
    layers_per_block: int
    groups: int
    latent_channels: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _conv3x3(self.block_out_channels[0], self.dtype, "conv_in")(x)
        last = len(self.block_out_channels) - 1
        for i, channels in enumerate(self.block_out_channels):
            x = ResnetStack(channels, self.layers_per_block, self.groups, None if i == last else "down", self.dtype,
                            name=f"down_blocks_{i}")(x)
        x = MidBlock(self.block_out_channels[-1], self.groups, self.dtype, name="mid_block")(x)
        x = nn.swish(_group_norm(self.groups, "conv_norm_out")(x))
        return _conv3x3(2 * self.latent_channels, self.dtype, "conv_out")(x)


class Decoder(layers.Module):
    """Latents (NHWC) -> image (NHWC): ``conv_in``, mid block, one up block of ``layers_per_block + 1``
    resnets per ``block_out_channels`` entry in reverse (all but the last upsample), norm, SiLU, ``conv_out``."""

    block_out_channels: tuple[int, ...]
    layers_per_block: int
    groups: int
    out_channels: int
    dtype: Any = jnp.float32

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = _conv3x3(self.block_out_channels[-1], self.dtype, "conv_in")(x)
        x = MidBlock(self.block_out_channels[-1], self.groups, self.dtype, name="mid_block")(x)
        last = len(self.block_out_channels) - 1
        for i, channels in enumerate(reversed(self.block_out_channels)):
            x = ResnetStack(channels, self.layers_per_block + 1, self.groups, None if i == last else "up", self.dtype,
                            name=f"up_blocks_{i}")(x)
        x = nn.swish(_group_norm(self.groups, "conv_norm_out")(x))
        return _conv3x3(self.out_channels, self.dtype, "conv_out")(x)


# -- the posterior -----------------------------------------------------------------------------------------------

@flax.struct.dataclass
class DiagonalGaussian:
    """The encoder's posterior, a Gaussian with diagonal covariance (diffusers' Flax
    ``FlaxDiagonalGaussianDistribution``, same arithmetic): arrays NHWC, ``latent_channels`` wide. A pytree, so
    it can leave ``jax.jit`` / ``module.apply``."""

    mean: jax.Array
    logvar: jax.Array  # clipped to [-30, 20]
    std: jax.Array
    var: jax.Array

    @classmethod
    def from_moments(cls, moments: jax.Array) -> DiagonalGaussian:
        """The distribution of the encoder's moments: the first half of the last axis the mean, the second the
        log-variance."""
        mean, logvar = jnp.split(moments, 2, axis=-1)
        logvar = jnp.clip(logvar, -30.0, 20.0)
        return cls(mean=mean, logvar=logvar, std=jnp.exp(0.5 * logvar), var=jnp.exp(logvar))

    def sample(self, key: jax.Array) -> jax.Array:
        """``mean + std * N(0, 1)``, the normal draw float32 from ``key`` (as diffusers draws it)."""
        return self.mean + self.std * jax.random.normal(key, self.mean.shape)

    def mode(self) -> jax.Array:
        """The most likely latents: the mean."""
        return self.mean


# -- the autoencoder ---------------------------------------------------------------------------------------------

class AutoencoderKL(FromDiffusersConfig, layers.Module):
    """diffusers' ``AutoencoderKL``: the fields up to ``mid_block_add_attention`` are its config.json keys with
    its defaults (build it with :meth:`from_config`, which reads PyTorch and Flax folders' configs alike);
    ``sample_size``, ``scaling_factor``, ``shift_factor``, ``latents_mean/std`` and ``force_upcast`` are the
    pipeline's and change nothing here. ``dtype`` is the activations' dtype (parameters stay float32).

    * ``encode(sample)``: NCHW image -> :class:`DiagonalGaussian` (NHWC arrays), after ``quant_conv`` where
      ``use_quant_conv``;
    * ``decode(latents)``: NCHW latents -> NCHW image, through ``post_quant_conv`` where ``use_post_quant_conv``;
    * ``__call__(sample, sample_posterior=False)``: encode, the mode (or a sample, rng ``gaussian``), decode.

    Refused (ValueError): block types other than ``DownEncoderBlock2D`` / ``UpDecoderBlock2D``, an activation
    other than SiLU, no mid-block attention, group counts that do not divide the channels -- what diffusers'
    Flax VAE, the reference these modules are equal to, does not compute."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",)
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",)
    block_out_channels: tuple[int, ...] = (64,)
    layers_per_block: int = 1
    act_fn: str = "silu"
    latent_channels: int = 4
    norm_num_groups: int = 32
    sample_size: Any = 32
    scaling_factor: float = 0.18215
    shift_factor: Optional[float] = None
    latents_mean: Optional[tuple[float, ...]] = None
    latents_std: Optional[tuple[float, ...]] = None
    force_upcast: bool = True
    use_quant_conv: bool = True
    use_post_quant_conv: bool = True
    mid_block_add_attention: bool = True
    dtype: Any = jnp.float32

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "VAE"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = CONFIG_TUPLES

    def check(self) -> None:
        """ValueError for an AutoencoderKL config these modules do not compute (see the class docstring)."""
        problems = []
        if set(self.down_block_types) != {"DownEncoderBlock2D"} or set(self.up_block_types) != {"UpDecoderBlock2D"}:
            problems.append("its blocks are not all DownEncoderBlock2D / UpDecoderBlock2D")
        if not len(self.down_block_types) == len(self.up_block_types) == len(self.block_out_channels):
            problems.append("down_block_types, up_block_types and block_out_channels differ in length")
        if self.act_fn not in ("silu", "swish"):
            problems.append(f"act_fn is {self.act_fn!r}, not 'silu'")
        if not self.mid_block_add_attention:
            problems.append("mid_block_add_attention is false")
        if self.layers_per_block < 1:
            problems.append(f"layers_per_block is {self.layers_per_block}")
        if min((self.in_channels, self.out_channels, self.latent_channels)) < 1:
            problems.append("a channel count is not positive")
        if self.norm_num_groups < 1 or any(c < 1 or c % self.norm_num_groups for c in self.block_out_channels):
            problems.append(f"norm_num_groups {self.norm_num_groups} does not divide block_out_channels "
                            f"{tuple(self.block_out_channels)}")
        if problems:
            raise ValueError(f"{self.CONFIG_WHAT} config not supported: {'; '.join(problems)}")

    def setup(self) -> None:
        self.check()
        blocks = dict(block_out_channels=tuple(self.block_out_channels), layers_per_block=self.layers_per_block,
                      groups=self.norm_num_groups, dtype=self.dtype)
        self.encoder = Encoder(latent_channels=self.latent_channels, **blocks)
        self.decoder = Decoder(out_channels=self.out_channels, **blocks)
        if self.use_quant_conv:
            self.quant_conv = _conv1x1(2 * self.latent_channels, self.dtype)
        if self.use_post_quant_conv:
            self.post_quant_conv = _conv1x1(self.latent_channels, self.dtype)

    def encode(self, sample: jax.Array) -> DiagonalGaussian:
        """``AutoencoderKL.encode(sample).latent_dist``: ``sample`` an NCHW image; the distribution's arrays
        are NHWC."""
        moments = self.encoder(jnp.transpose(sample, (0, 2, 3, 1)))
        if self.use_quant_conv:
            moments = self.quant_conv(moments)
        return DiagonalGaussian.from_moments(moments)

    def decode(self, latents: jax.Array) -> jax.Array:
        """``AutoencoderKL.decode(latents).sample``: ``latents`` NCHW ``(B, latent_channels, h, w)`` -- always
        NCHW, never guessed from the shape -- to an NCHW image."""
        if latents.ndim != 4 or latents.shape[1] != self.latent_channels:
            raise ValueError(f"latents must be NCHW with {self.latent_channels} channels, got shape {latents.shape}")
        hidden = jnp.transpose(latents, (0, 2, 3, 1))
        if self.use_post_quant_conv:
            hidden = self.post_quant_conv(hidden)
        return jnp.transpose(self.decoder(hidden), (0, 3, 1, 2))

    def __call__(self, sample: jax.Array, sample_posterior: bool = False) -> jax.Array:
        """Encode, take the mode (or, with ``sample_posterior``, a sample: rng ``gaussian``), decode: an NCHW
        image."""
        posterior = self.encode(sample)
        latents = posterior.sample(self.make_rng("gaussian")) if sample_posterior else posterior.mode()
        return self.decode(jnp.transpose(latents, (0, 3, 1, 2)))

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (without the ``params`` key) drawn as diffusers' ``FlaxAutoencoderKL.init_weights``
        draws them from the same key (its ``params`` stream is the first of three splits), from the smallest
        image the blocks take; ``jax.eval_shape(module.init_weights, key)`` costs nothing."""
        params_rng, dropout_rng, gaussian_rng = jax.random.split(rng, 3)
        side = 2 ** (len(self.block_out_channels) - 1)
        sample = jnp.zeros((1, self.in_channels, side, side), jnp.float32)
        return self.init({"params": params_rng, "dropout": dropout_rng, "gaussian": gaussian_rng}, sample)["params"]
