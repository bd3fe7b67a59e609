"""FLUX.1's VAE in flax.linen: diffusers 0.39's PyTorch ``AutoencoderKL`` as FLUX configures it -- 16 latent
channels, ``use_quant_conv`` and ``use_post_quant_conv`` false (no 1x1 convolutions around the latents).

The encoder and decoder are diffusers' own Flax ``FlaxEncoder`` / ``FlaxDecoder`` (``models/vae_flax.py``, the
same blocks SD's ``FlaxAutoencoderKL`` uses, which match PyTorch's ``Encoder`` / ``Decoder``); only the
autoencoder around them is ours, because ``FlaxAutoencoderKL`` always has the quant convolutions. Its
parameter tree is ``encoder/...`` and ``decoder/...`` with diffusers' Flax names, so the PyTorch weights convert
with the generic renaming (:func:`.convert.convert_vae`).

``decode`` takes the VAE's own latents: the FLUX pipeline first undoes its latent normalisation,
``latents / scaling_factor + shift_factor`` (:func:`to_vae_latents`), and normalises what ``encode`` gives
with ``(z - shift_factor) * scaling_factor`` (:func:`from_vae_latents`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import flax.linen as nn
import jax
import jax.numpy as jnp
from diffusers.models.vae_flax import FlaxDecoder, FlaxDiagonalGaussianDistribution, FlaxEncoder

from sdjax_runner.models.nn.config import FromDiffusersConfig

# The keys of diffusers' AutoencoderKL config.json; the values are FLUX.1's (black-forest-labs/FLUX.1-dev vae/).
CONFIG_DEFAULTS: dict[str, Any] = {
    "in_channels": 3,
    "out_channels": 3,
    "down_block_types": ("DownEncoderBlock2D",) * 4,
    "up_block_types": ("UpDecoderBlock2D",) * 4,
    "block_out_channels": (128, 256, 512, 512),
    "layers_per_block": 2,
    "act_fn": "silu",
    "latent_channels": 16,
    "norm_num_groups": 32,
    "sample_size": 1024,
    "scaling_factor": 0.3611,
    "shift_factor": 0.1159,
    "latents_mean": None,
    "latents_std": None,
    "force_upcast": True,
    "use_quant_conv": False,
    "use_post_quant_conv": False,
    "mid_block_add_attention": True,
}
_TUPLES = ("down_block_types", "up_block_types", "block_out_channels", "latents_mean", "latents_std")



def to_vae_latents(latents: jax.Array, scaling_factor: float, shift_factor: float) -> jax.Array:
    """The transformer's latents as the VAE decodes them: ``latents / scaling_factor + shift_factor`` (what
    diffusers' ``FluxPipeline`` does before ``vae.decode``)."""
    return latents / scaling_factor + shift_factor


def from_vae_latents(z: jax.Array, scaling_factor: float, shift_factor: float) -> jax.Array:
    """The VAE's latents (an encoding) as the transformer takes them: ``(z - shift_factor) * scaling_factor``
    (what diffusers' FLUX image-to-image pipelines do after ``vae.encode``)."""
    return (z - shift_factor) * scaling_factor


class FlaxFluxAutoencoderKL(FromDiffusersConfig, nn.Module):
    """FLUX.1's VAE: diffusers' ``AutoencoderKL`` with ``use_quant_conv=False, use_post_quant_conv=False`` (16
    latent channels). The fields up to ``mid_block_add_attention`` are diffusers' config.json keys (build it with
    :meth:`from_config`; ``scaling_factor``, ``shift_factor``, ``latents_mean/std``, ``sample_size`` and
    ``force_upcast`` are kept for the pipeline and change nothing here); ``dtype`` is the activations' dtype
    (the encoder/decoder blocks create float32 parameters, as diffusers' Flax VAE does).

    Images and latents are NCHW, as in diffusers' PyTorch API:

    * ``encode(sample)`` -> diffusers' Flax ``FlaxDiagonalGaussianDistribution`` of the encoder's moments
      (channels-last inside: its ``mean`` is NHWC);
    * ``decode(latents)`` -> the image, ``vae.decode(latents).sample``.

    Other AutoencoderKL configs are refused (ValueError): with quant convolutions (SD's VAE: use diffusers'
    ``FlaxAutoencoderKL``), without the mid-block attention, or with other block types or activations, which
    diffusers' Flax blocks do not have."""

    in_channels: int = 3
    out_channels: int = 3
    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    act_fn: str = "silu"
    latent_channels: int = 16
    norm_num_groups: int = 32
    sample_size: int = 1024
    scaling_factor: float = 0.3611
    shift_factor: Optional[float] = 0.1159
    latents_mean: Optional[tuple[float, ...]] = None
    latents_std: Optional[tuple[float, ...]] = None
    force_upcast: bool = True
    use_quant_conv: bool = False
    use_post_quant_conv: bool = False
    mid_block_add_attention: bool = True
    dtype: Any = jnp.float32

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "FLUX VAE"
    CONFIG_TUPLES: ClassVar[tuple[str, ...]] = _TUPLES

    def check(self) -> None:
        """ValueError for an AutoencoderKL config this module does not run (see the class docstring)."""
        problems = []
        if self.use_quant_conv or self.use_post_quant_conv:
            problems.append("it has quant_conv/post_quant_conv (an SD VAE: diffusers' FlaxAutoencoderKL runs it)")
        if not self.mid_block_add_attention:
            problems.append("mid_block_add_attention is false")
        if self.act_fn != "silu":
            problems.append(f"act_fn is {self.act_fn!r}, not 'silu'")
        if set(self.down_block_types) != {"DownEncoderBlock2D"} or set(self.up_block_types) != {"UpDecoderBlock2D"}:
            problems.append("its blocks are not all DownEncoderBlock2D / UpDecoderBlock2D")
        if not len(self.down_block_types) == len(self.up_block_types) == len(self.block_out_channels):
            problems.append("down_block_types, up_block_types and block_out_channels differ in length")
        if problems:
            raise ValueError(f"not a FLUX VAE config: {'; '.join(problems)}")

    def setup(self) -> None:
        self.check()
        self.encoder = FlaxEncoder(
            in_channels=self.in_channels, out_channels=self.latent_channels, down_block_types=self.down_block_types,
            block_out_channels=self.block_out_channels, layers_per_block=self.layers_per_block, act_fn=self.act_fn,
            norm_num_groups=self.norm_num_groups, double_z=True, dtype=self.dtype)
        self.decoder = FlaxDecoder(
            in_channels=self.latent_channels, out_channels=self.out_channels, up_block_types=self.up_block_types,
            block_out_channels=self.block_out_channels, layers_per_block=self.layers_per_block,
            norm_num_groups=self.norm_num_groups, act_fn=self.act_fn, dtype=self.dtype)

    def encode(self, sample: jax.Array, deterministic: bool = True) -> FlaxDiagonalGaussianDistribution:
        """diffusers' ``AutoencoderKL.encode(sample).latent_dist`` (no quant_conv): ``sample`` NCHW; the
        distribution's arrays are NHWC (diffusers' Flax convention)."""
        moments = self.encoder(jnp.transpose(sample, (0, 2, 3, 1)), deterministic=deterministic)
        return FlaxDiagonalGaussianDistribution(moments)

    def decode(self, latents: jax.Array, deterministic: bool = True) -> jax.Array:
        """diffusers' ``AutoencoderKL.decode(latents).sample`` (no post_quant_conv): ``latents`` NCHW
        ``(B, latent_channels, h, w)`` -- always NCHW, never guessed from the shape -- to an NCHW image."""
        if latents.ndim != 4 or latents.shape[1] != self.latent_channels:
            raise ValueError(f"latents must be NCHW with {self.latent_channels} channels, got shape {latents.shape}")
        image = self.decoder(jnp.transpose(latents, (0, 2, 3, 1)), deterministic=deterministic)
        return jnp.transpose(image, (0, 3, 1, 2))

    def __call__(self, sample: jax.Array, sample_posterior: bool = False, deterministic: bool = True) -> jax.Array:
        """Encode, take the mean (or, with ``sample_posterior``, a sample: rng ``gaussian``), decode."""
        posterior = self.encode(sample, deterministic=deterministic)
        latents = posterior.sample(self.make_rng("gaussian")) if sample_posterior else posterior.mode()
        return self.decode(jnp.transpose(latents, (0, 3, 1, 2)), deterministic=deterministic)

    def init_weights(self, rng: jax.Array) -> Any:
        """Random parameters (without the ``params`` collection key), as diffusers' Flax models' ``init_weights``,
        from the smallest image the blocks take; ``jax.eval_shape(module.init_weights, key)`` costs nothing."""
        side = 2 ** (len(self.block_out_channels) - 1)
        sample = jnp.zeros((1, self.in_channels, side, side), jnp.float32)
        return self.init(rng, sample)["params"]
