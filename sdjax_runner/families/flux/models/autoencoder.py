"""FLUX.1's VAE (and SD 3's, which has the same architecture): the runner's :class:`AutoencoderKL`
(:mod:`sdjax_runner.models.nn.vae`) as FLUX configures it -- 16 latent channels, ``use_quant_conv`` and
``use_post_quant_conv`` false (no 1x1 convolutions around the latents). Its parameter tree is ``encoder/...``
and ``decoder/...`` with diffusers' Flax names, so the PyTorch weights convert with the generic renaming
(:func:`.convert.convert_vae`).

``decode`` takes the VAE's own latents: the FLUX pipeline first undoes its latent normalisation,
``latents / scaling_factor + shift_factor`` (:func:`to_vae_latents`), and normalises what ``encode`` gives
with ``(z - shift_factor) * scaling_factor`` (:func:`from_vae_latents`).
"""

from __future__ import annotations

from typing import Any, ClassVar, Optional

import jax

from sdjax_runner.models.nn.vae import AutoencoderKL, DiagonalGaussian

__all__ = ["CONFIG_DEFAULTS", "DiagonalGaussian", "FlaxFluxAutoencoderKL", "from_vae_latents", "to_vae_latents"]

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


def to_vae_latents(latents: jax.Array, scaling_factor: float, shift_factor: float) -> jax.Array:
    """The transformer's latents as the VAE decodes them: ``latents / scaling_factor + shift_factor`` (what
    diffusers' ``FluxPipeline`` does before ``vae.decode``)."""
    return latents / scaling_factor + shift_factor


def from_vae_latents(z: jax.Array, scaling_factor: float, shift_factor: float) -> jax.Array:
    """The VAE's latents (an encoding) as the transformer takes them: ``(z - shift_factor) * scaling_factor``
    (what diffusers' FLUX image-to-image pipelines do after ``vae.encode``)."""
    return (z - shift_factor) * scaling_factor


class FlaxFluxAutoencoderKL(AutoencoderKL):
    """FLUX.1's (and SD 3's) VAE: :class:`AutoencoderKL` with FLUX.1's defaults, which :meth:`from_config` fills
    in for keys a config leaves out. ``encode(sample)`` (NCHW) gives a :class:`DiagonalGaussian` (NHWC arrays),
    ``decode(latents)`` (NCHW) the NCHW image. A config with quant convolutions (an SD VAE: use
    :class:`AutoencoderKL`) is refused (ValueError), besides what :class:`AutoencoderKL` refuses."""

    down_block_types: tuple[str, ...] = ("DownEncoderBlock2D",) * 4
    up_block_types: tuple[str, ...] = ("UpDecoderBlock2D",) * 4
    block_out_channels: tuple[int, ...] = (128, 256, 512, 512)
    layers_per_block: int = 2
    latent_channels: int = 16
    sample_size: Any = 1024
    scaling_factor: float = 0.3611
    shift_factor: Optional[float] = 0.1159
    use_quant_conv: bool = False
    use_post_quant_conv: bool = False

    CONFIG_DEFAULTS: ClassVar[dict[str, Any]] = CONFIG_DEFAULTS
    CONFIG_WHAT: ClassVar[str] = "FLUX VAE"

    def check(self) -> None:
        """ValueError for a config with quant convolutions, or one :class:`AutoencoderKL` refuses."""
        if self.use_quant_conv or self.use_post_quant_conv:
            raise ValueError("not a FLUX VAE config: it has quant_conv/post_quant_conv (an SD VAE: "
                             "sdjax_runner.models.nn.vae.AutoencoderKL runs it)")
        super().check()
