"""The runner's own VAE (sdjax_runner/models/nn/vae.py) against diffusers 0.39's Flax VAE (models/vae_flax.py),
kept as the test reference only.

* Parameter trees: for the published SD 1.5 / 2.1 / XL VAE configs, the paths, shapes and dtypes of
  ``jax.eval_shape(init_weights)`` are those of diffusers' ``FlaxAutoencoderKL`` (full size: tracing only).
* Outputs on the same weights, CPU, float32, under ``jax.jit``: an SD-like VAE (quant convolutions) against
  ``FlaxAutoencoderKL`` and a 16-channel one without them (FLUX.1 / SD 3) against ``FlaxEncoder`` /
  ``FlaxDecoder``, as the FLUX module used them. The same flax layers run in the same order, so every output is
  bit-for-bit equal (``np.array_equal``); bfloat16 activations too. The looser bound, max |ours - diffusers|
  <= 1e-6 * max |diffusers|, is asserted as well (what is promised if XLA ever fuses the two differently).
* Configs: published PyTorch and Flax folders' config.json load with ``from_config``; what the module does not
  compute is refused (ValueError).
"""

from __future__ import annotations

import functools
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from diffusers.models.vae_flax import FlaxAutoencoderKL, FlaxDecoder, FlaxDiagonalGaussianDistribution, FlaxEncoder
from flax.traverse_util import flatten_dict

from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
from sdjax_runner.models.nn.vae import AutoencoderKL, DiagonalGaussian

PUBLISHED = json.loads((Path(__file__).resolve().parent / "helpers" / "published_configs.json").read_text())
SD_CONFIGS = {
    "sd15": PUBLISHED["sd15"]["vae/config.json"],
    "sd21": PUBLISHED["sd21"]["vae/config.json"],
    "sdxl": PUBLISHED["sdxl"]["vae/config.json"],
    "sdxl-vae_1_0": PUBLISHED["_alternates"]["sdxl/vae_1_0/config.json"],
}
# SD's VAE shrunk: two blocks (the shortcut conv where channels change), one resnet a block in the encoder and
# two in the decoder, 32 groups.
SMALL_SD: dict[str, Any] = {"down_block_types": ["DownEncoderBlock2D"] * 2, "up_block_types": ["UpDecoderBlock2D"] * 2,
            "block_out_channels": [32, 64], "layers_per_block": 1, "latent_channels": 4, "norm_num_groups": 32,
            "sample_size": 16}
SMALL_FLUX = dict(SMALL_SD, latent_channels=16, use_quant_conv=False, use_post_quant_conv=False,
                  scaling_factor=1.5305, shift_factor=0.0609)
IMAGE_SHAPE = (2, 3, 16, 24)  # not square, and the latents' width (12) is no channel count


def _shapes(tree) -> dict:
    return {path: (leaf.shape, leaf.dtype) for path, leaf in flatten_dict(tree).items()}


def _assert_same(ours, theirs) -> None:
    """Equal to diffusers bit for bit (and so within the 1e-6 relative bound, asserted first for the message)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    ours, theirs = ours.astype(np.float32), theirs.astype(np.float32)
    assert np.abs(ours - theirs).max() <= 1e-6 * np.abs(theirs).max()
    assert np.array_equal(ours, theirs)


def _random_params(module) -> dict:
    """Random weights of ``module``'s shapes, drawn by numpy (a jitted flax init compiles for seconds): kernels
    scaled by their fan-in, norm scales around one, biases small."""
    rng = np.random.default_rng(0)

    def draw(path, leaf):
        name = path[-1].key
        scale = 1 / np.sqrt(np.prod(leaf.shape[:-1])) if name == "kernel" else 0.1
        return jnp.asarray((name == "scale") + scale * rng.standard_normal(leaf.shape), leaf.dtype)

    return jax.tree_util.tree_map_with_path(draw, jax.eval_shape(module.init_weights, jax.random.PRNGKey(0)))


def _image(key: int = 1) -> jax.Array:
    return jax.random.uniform(jax.random.PRNGKey(key), IMAGE_SHAPE, minval=-1.0, maxval=1.0)


def _latents(channels: int) -> jax.Array:
    return jax.random.normal(jax.random.PRNGKey(2), (IMAGE_SHAPE[0], channels, 8, 12))


def _posterior_arrays(posterior, key) -> tuple:
    """The distribution's arrays, a sample with ``key`` and the mode."""
    return posterior.mean, posterior.logvar, posterior.std, posterior.var, posterior.sample(key), posterior.mode()


def _ours(module: AutoencoderKL):
    """One jitted program of everything the module gives: decode, encode's distribution and ``__call__`` with a
    sample (with the mode it is decode of encode's mode, both compared already)."""

    def run(params, image, latents, key):
        apply = functools.partial(module.apply, {"params": params})
        posterior = apply(image, method=module.encode)
        assert isinstance(posterior, DiagonalGaussian)
        return (apply(latents, method=module.decode), *_posterior_arrays(posterior, key),
                apply(image, True, rngs={"gaussian": key}))

    return jax.jit(run)


# -- parameter trees -----------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(SD_CONFIGS))
def test_published_sd_configs_have_diffusers_parameter_tree(name):
    config = SD_CONFIGS[name]
    key = jax.random.PRNGKey(0)
    theirs = FlaxAutoencoderKL.from_config({k: v for k, v in config.items()
                                            if k in FlaxAutoencoderKL.__dataclass_fields__})
    ours = AutoencoderKL.from_config(config)
    assert _shapes(jax.eval_shape(ours.init_weights, key)) == _shapes(jax.eval_shape(theirs.init_weights, key))
    assert ours.config.scaling_factor == config.get("scaling_factor", 0.18215)


@pytest.mark.slow
def test_random_initialisation_is_diffusers_own():
    """The same key gives diffusers' random parameters, value for value (one block: an init runs op by op)."""
    key = jax.random.PRNGKey(3)
    config = dict(SMALL_SD, down_block_types=["DownEncoderBlock2D"], up_block_types=["UpDecoderBlock2D"],
                  block_out_channels=[32])
    theirs = FlaxAutoencoderKL.from_config(config).init_weights(key)
    ours = AutoencoderKL.from_config(config).init_weights(key)
    assert _shapes(ours) == _shapes(theirs)
    for path, leaf in flatten_dict(theirs).items():
        assert np.array_equal(flatten_dict(ours)[path], leaf), path


# -- outputs -------------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_sd_vae_matches_flax_autoencoder_kl(dtype):
    theirs = FlaxAutoencoderKL.from_config(SMALL_SD, dtype=dtype)
    ours = AutoencoderKL.from_config(SMALL_SD, dtype=dtype)
    params = _random_params(theirs)

    def reference(params, image, latents, key):
        apply = functools.partial(theirs.apply, {"params": params})
        return (apply(latents, method=theirs.decode).sample,
                *_posterior_arrays(apply(image, method=theirs.encode).latent_dist, key),
                apply(image, True, rngs={"gaussian": key}).sample)

    inputs = (params, _image(), _latents(4), jax.random.PRNGKey(7))
    got, want = _ours(ours)(*inputs), jax.jit(reference)(*inputs)
    assert got[0].shape == IMAGE_SHAPE and got[0].dtype == dtype
    assert bool(jnp.isfinite(got[0].astype(jnp.float32)).all())
    assert got[1].shape == (2, 8, 12, 4)  # NHWC, as diffusers' distribution holds it
    for ours_out, theirs_out in zip(got, want, strict=True):
        _assert_same(ours_out, theirs_out)


@pytest.mark.slow
def test_16_channel_vae_matches_flax_encoder_and_decoder():
    """FLUX.1's / SD 3's VAE (no quant convolutions) against diffusers' blocks as the old FLUX module used them."""
    ours = FlaxFluxAutoencoderKL.from_config(SMALL_FLUX)
    blocks = dict(block_out_channels=tuple(SMALL_FLUX["block_out_channels"]), norm_num_groups=32,
                  layers_per_block=SMALL_FLUX["layers_per_block"])
    encoder = FlaxEncoder(in_channels=3, out_channels=16, down_block_types=tuple(SMALL_FLUX["down_block_types"]),
                          double_z=True, **blocks)
    decoder = FlaxDecoder(in_channels=16, out_channels=3, up_block_types=tuple(SMALL_FLUX["up_block_types"]),
                          **blocks)
    image, latents, key = _image(), _latents(16), jax.random.PRNGKey(7)
    params = _random_params(ours)
    shapes = {"encoder": jax.eval_shape(encoder.init, key, jnp.transpose(image, (0, 2, 3, 1)))["params"],
              "decoder": jax.eval_shape(decoder.init, key, jnp.transpose(latents, (0, 2, 3, 1)))["params"]}
    assert _shapes(params) == _shapes(shapes)

    def reference(params, image, latents, key):
        decoded = decoder.apply({"params": params["decoder"]}, jnp.transpose(latents, (0, 2, 3, 1)))
        moments = encoder.apply({"params": params["encoder"]}, jnp.transpose(image, (0, 2, 3, 1)))
        return jnp.transpose(decoded, (0, 3, 1, 2)), *_posterior_arrays(FlaxDiagonalGaussianDistribution(moments), key)

    got, want = _ours(ours)(params, image, latents, key), jax.jit(reference)(params, image, latents, key)
    assert got[1].shape == (2, 8, 12, 16)
    for ours_out, theirs_out in zip(got[:-1], want, strict=True):  # no reference for __call__ here
        _assert_same(ours_out, theirs_out)


def test_decode_takes_nchw_latents_only():
    module = AutoencoderKL.from_config(SMALL_SD)
    params = jax.eval_shape(module.init_weights, jax.random.PRNGKey(0))
    nhwc = jax.ShapeDtypeStruct((1, 8, 8, 4), jnp.float32)
    with pytest.raises(ValueError, match="NCHW with 4 channels"):
        jax.eval_shape(lambda p, z: module.apply({"params": p}, z, method=module.decode), params, nhwc)


# -- configs -------------------------------------------------------------------------------------------------------

def test_a_flax_folders_config_loads(tmp_path):
    """diffusers' Flax VAE folders' config.json (``FlaxAutoencoderKL``, no dtype key) reads as the PyTorch ones."""
    FlaxAutoencoderKL.from_config(SMALL_SD).save_config(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    assert config["_class_name"] == "FlaxAutoencoderKL"
    module = AutoencoderKL.from_config(config)
    assert module.block_out_channels == (32, 64) and module.use_quant_conv and module.use_post_quant_conv


def test_accepted_configs():
    assert AutoencoderKL.from_config({"act_fn": "swish", "_name_or_path": "x"}).act_fn == "swish"
    mixed = AutoencoderKL.from_config(dict(SMALL_SD, use_post_quant_conv=False, latents_mean=[0.0] * 4,
                                           latents_std=[1.0] * 4, shift_factor=0.0, force_upcast=False))
    assert mixed.latents_mean == (0.0,) * 4
    tops = set(jax.eval_shape(mixed.init_weights, jax.random.PRNGKey(0)))
    assert tops == {"encoder", "decoder", "quant_conv"}
    flux = FlaxFluxAutoencoderKL.from_config({})
    assert (flux.latent_channels, flux.use_quant_conv, flux.scaling_factor, flux.shift_factor) == (16, False, 0.3611,
                                                                                                   0.1159)
    assert AutoencoderKL.from_config({}).config == {k: (tuple(v) if isinstance(v, list) else v) for k, v in
                                                    AutoencoderKL.CONFIG_DEFAULTS.items()}


@pytest.mark.parametrize("change, message", [
    ({"down_block_types": ["AttnDownEncoderBlock2D", "DownEncoderBlock2D"]}, "DownEncoderBlock2D"),
    ({"up_block_types": ["UpDecoderBlock2D"]}, "differ in length"),
    ({"act_fn": "gelu"}, "act_fn"),
    ({"mid_block_add_attention": False}, "mid_block_add_attention"),
    ({"norm_num_groups": 24}, "norm_num_groups"),
    ({"layers_per_block": 0}, "layers_per_block"),
    ({"latent_channels": 0}, "channel count"),
    ({"norm_type": "spatial"}, "unknown key"),
    ({"dtype": "float32"}, "unknown key"),
])
def test_refused_configs(change, message):
    with pytest.raises(ValueError, match=message):
        AutoencoderKL.from_config(dict(SMALL_SD, **change))


def test_the_flux_vae_refuses_quant_convolutions():
    with pytest.raises(ValueError, match="quant_conv"):
        FlaxFluxAutoencoderKL.from_config(dict(SMALL_FLUX, use_quant_conv=True))
    with pytest.raises(ValueError, match="act_fn"):
        FlaxFluxAutoencoderKL.from_config(dict(SMALL_FLUX, act_fn="relu"))
