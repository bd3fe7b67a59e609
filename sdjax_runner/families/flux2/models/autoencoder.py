"""FLUX.2's VAE: diffusers' ``AutoencoderKLFlux2`` -- the runner's :class:`~sdjax_runner.models.nn.vae.AutoencoderKL`
(32 latent channels, quant convolutions around the latents) with the decoder's own widths where the config gives
``decoder_block_out_channels``, and the running statistics of a batch norm (``bn``: no affine) over the latents
patchified 2x2, which the pipeline normalises with: ``(patchified - running_mean) / sqrt(running_var + eps)``
after encoding, the inverse before decoding (:meth:`FlaxFlux2AutoencoderKL.normalise` / :meth:`denormalise`).
The statistics are parameters here (``bn/running_mean``, ``bn/running_var``), read from the PyTorch buffers of the
same names (``bn.num_batches_tracked`` is not read)."""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp

from sdjax_runner.models.nn.vae import CONFIG_TUPLES, AutoencoderKL, Decoder, Encoder, _conv1x1

# The keys of diffusers' AutoencoderKLFlux2 config.json and their defaults there.
CONFIG_DEFAULTS: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "decoder_block_out_channels": None,
    "layers_per_block": 2,
    "act_fn": "silu",
    "latent_channels": 32,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "force_upcast": True,
    "use_quant_conv": True,
    "use_post_quant_conv": True,
    "mid_block_add_attention": True,
    "batch_norm_eps": 1e-4,
    "batch_norm_momentum": 0.1,
    "patch_size": (2, 2),
}


def patchify(latents: jax.Array) -> jax.Array:
    """(B, C, H, W) -> (B, 4C, H/2, W/2), each channel's 2x2 patch as four channels (diffusers'
    ``Flux2KleinPipeline._patchify_latents``)."""
    batch, channels, height, width = latents.shape
    patches = latents.reshape(batch, channels, height // 2, 2, width // 2, 2).transpose(0, 1, 3, 5, 2, 4)
    return patches.reshape(batch, channels * 4, height // 2, width // 2)


def unpatchify(latents: jax.Array) -> jax.Array:
    """The inverse of :func:`patchify` (``_unpatchify_latents``)."""
    batch, channels, height, width = latents.shape
    patches = latents.reshape(batch, channels // 4, 2, 2, height, width).transpose(0, 1, 4, 2, 5, 3)
    return patches.reshape(batch, channels // 4, height * 2, width * 2)


class FlaxFlux2AutoencoderKL(AutoencoderKL):
    """``AutoencoderKLFlux2`` (module docstring). ``encode(sample)`` (NCHW) gives a ``DiagonalGaussian`` (NHWC),
    ``decode(latents)`` (NCHW, ``latent_channels``) the NCHW image; ``normalise`` / ``denormalise`` the batch norm's
    statistics on patchified latents (NCHW, ``4 * latent_channels``)."""

    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    decoder_block_out_channels: Optional[tuple[int, ...]] = None
    layers_per_block: int = 2
    latent_channels: int = 32
    sample_size: Any = 1024
    scaling_factor: float = 1.0  # (not an AutoencoderKLFlux2 key: the batch norm normalises)
    batch_norm_eps: float = 1e-4
    batch_norm_momentum: float = 0.1
    patch_size: tuple[int, ...] = (2, 2)

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "FLUX.2 VAE"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = (*CONFIG_TUPLES, "decoder_block_out_channels", "patch_size")

    def check(self) -> None:
        """ValueError for patches other than 2x2 or decoder widths the groups do not divide, besides what
        :class:`AutoencoderKL` refuses."""
        super().check()
        if tuple(self.patch_size) != (2, 2):
            raise ValueError(f"{self.CONFIG_WHAT} config not supported: patch_size {tuple(self.patch_size)} (2, 2 only)")
        decoder = self.decoder_block_out_channels
        if decoder is not None and (len(decoder) != len(self.block_out_channels)
                                    or any(c < 1 or c % self.norm_num_groups for c in decoder)):
            raise ValueError(f"{self.CONFIG_WHAT} config not supported: decoder_block_out_channels {tuple(decoder)}")

    def setup(self) -> None:
        self.check()
        common = dict(layers_per_block=self.layers_per_block, groups=self.norm_num_groups, dtype=self.dtype)
        self.encoder = Encoder(latent_channels=self.latent_channels, block_out_channels=tuple(self.block_out_channels),
                               **common)
        self.decoder = Decoder(out_channels=self.out_channels, block_out_channels=tuple(
            self.decoder_block_out_channels or self.block_out_channels), **common)
        if self.use_quant_conv:
            self.quant_conv = _conv1x1(2 * self.latent_channels, self.dtype)
        if self.use_post_quant_conv:
            self.post_quant_conv = _conv1x1(self.latent_channels, self.dtype)
        self.bn = BatchStatistics(4 * self.latent_channels, self.batch_norm_eps)

    def normalise(self, patchified: jax.Array) -> jax.Array:
        """``(x - running_mean) / sqrt(running_var + eps)`` per channel of NCHW patchified latents, float32."""
        mean, std = self.bn()
        return (patchified.astype(jnp.float32) - mean[None, :, None, None]) / std[None, :, None, None]

    def denormalise(self, patchified: jax.Array) -> jax.Array:
        """The inverse of :meth:`normalise`: ``x * sqrt(running_var + eps) + running_mean``, float32."""
        mean, std = self.bn()
        return patchified.astype(jnp.float32) * std[None, :, None, None] + mean[None, :, None, None]

    def __call__(self, sample: jax.Array, sample_posterior: bool = False) -> jax.Array:
        self.bn()  # (its parameters are made at initialisation too)
        return super().__call__(sample, sample_posterior)


class BatchStatistics(nn.Module):
    """A batch norm's running statistics (no affine), as parameters: ``(mean, sqrt(var + eps))`` in float32."""

    channels: int
    eps: float

    @nn.compact
    def __call__(self) -> tuple[jax.Array, jax.Array]:
        mean = self.param("running_mean", nn.initializers.zeros, (self.channels,), jnp.float32)
        var = self.param("running_var", nn.initializers.ones, (self.channels,), jnp.float32)
        return mean.astype(jnp.float32), jnp.sqrt(var.astype(jnp.float32) + self.eps)
