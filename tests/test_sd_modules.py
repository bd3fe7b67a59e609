"""The runner's own Stable Diffusion modules (sdjax_runner/families/sd/models/, models/nn/attention.py) against diffusers
0.39's Flax ones -- the last diffusers with Flax classes, kept as the test reference only.

* Parameter trees: for the published SD 1.5, SD 2.1 (768-v: linear projections, per-level heads), SDXL base
  (text_time embedding, per-level transformer depths), SDXL refiner and SD 1.5 inpainting (9 input channels)
  UNet configs, and published ControlNet configs, ``jax.eval_shape(init_weights)`` gives diffusers' paths,
  shapes and dtypes at full size; ``init_weights`` lowers to diffusers' own program (the same random values).
* Programs: under ``jax.jit`` each module lowers to the very StableHLO text diffusers' module lowers to, op for
  op -- shrunk versions of those configs (their published keys, toy sizes), bfloat16 activations, training-mode
  dropout, ControlNet residuals into the UNet, diffusers' attention flags (``split_head_dim``,
  ``use_memory_efficient_attention``) and our attention named instead, the ControlNet in both channel orders.
* Outputs: the same, compiled and run on random parameters (none zero) and inputs on the CPU: bit for bit equal
  to diffusers' (``np.array_equal``; and within 1e-6 of its largest value, as asserted everywhere); the
  attention module and the chunked attention against diffusers' likewise; ``dot_product`` attention against
  ``default`` to 1e-5 relative (another summation order).
* ``from_config`` accepts the published configs, reads them as diffusers does, and refuses (ValueError) what it
  cannot compute.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict, unflatten_dict

from sdjax_runner.families.sd.models.controlnet import ControlNetModel
from sdjax_runner.families.sd.models.unet import Attention, UNet2DConditionModel
from sdjax_runner.models.nn.attention import IMPLEMENTATIONS, attention, chunked_attention

PUBLISHED = json.loads((Path(__file__).parent / "helpers" / "published_configs.json").read_text(encoding="utf-8"))
SD15 = PUBLISHED["sd15"]["unet/config.json"]
SD21 = PUBLISHED["sd21"]["unet/config.json"]
SDXL = PUBLISHED["sdxl"]["unet/config.json"]
# stabilityai/stable-diffusion-xl-refiner-1.0's unet/config.json: SDXL base's keys (the same diffusers version
# wrote both) with the refiner's values -- four levels of 384-1536 channels, transformers (4 deep, 64-wide heads)
# at the middle two, cross-attention on OpenCLIP-G's 1280 features, 5 micro-conditions.
SDXL_REFINER = dict(
    SDXL, attention_head_dim=[6, 12, 24, 24], block_out_channels=[384, 768, 1536, 1536], cross_attention_dim=1280,
    down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"],
    projection_class_embeddings_input_dim=2560, transformer_layers_per_block=4)
# runwayml/stable-diffusion-inpainting's unet/config.json: SD 1.5's with 9 input channels (latents, mask, masked
# image latents).
SD15_INPAINTING = dict(SD15, in_channels=9)
# lllyasviel/sd-controlnet-canny's config.json (a ControlNet for SD 1.5; control_v11 ones add the keys below
# with these neutral values).
CONTROLNET = {
    "_class_name": "ControlNetModel", "_diffusers_version": "0.14.0.dev0", "act_fn": "silu", "attention_head_dim": 8,
    "block_out_channels": [320, 640, 1280, 1280], "class_embed_type": None,
    "conditioning_embedding_out_channels": [16, 32, 96, 256], "controlnet_conditioning_channel_order": "rgb",
    "cross_attention_dim": 768,
    "down_block_types": ["CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
    "downsample_padding": 1, "flip_sin_to_cos": True, "freq_shift": 0, "in_channels": 4, "layers_per_block": 2,
    "mid_block_scale_factor": 1, "norm_eps": 1e-05, "norm_num_groups": 32, "num_class_embeds": None,
    "only_cross_attention": False, "projection_class_embeddings_input_dim": None,
    "resnet_time_scale_shift": "default", "upcast_attention": False, "use_linear_projection": False,
}
CONTROLNET_V11 = dict(CONTROLNET, conditioning_channels=3, global_pool_conditions=False, addition_embed_type=None,
                      addition_embed_type_num_heads=64, addition_time_embed_dim=None, encoder_hid_dim=None,
                      encoder_hid_dim_type=None, num_attention_heads=None, transformer_layers_per_block=1)
UNETS = {"sd15": SD15, "sd21": SD21, "sdxl": SDXL, "sdxl_refiner": SDXL_REFINER, "sd15_inpainting": SD15_INPAINTING}

# The same configs at toy size (their published keys kept; 32-channel multiples: the group norms have 32 groups).
TINY_UNETS = {
    "sd15": dict(SD15, block_out_channels=[32, 64], down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
                 up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"], layers_per_block=1, attention_head_dim=2,
                 cross_attention_dim=16, sample_size=8),
    "sd21": dict(SD21, block_out_channels=[32, 64], down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"],
                 up_block_types=["UpBlock2D", "CrossAttnUpBlock2D"], layers_per_block=1, attention_head_dim=[2, 4],
                 cross_attention_dim=24, sample_size=8),
    "sdxl": dict(SDXL, block_out_channels=[32, 64], down_block_types=["DownBlock2D", "CrossAttnDownBlock2D"],
                 up_block_types=["CrossAttnUpBlock2D", "UpBlock2D"], attention_head_dim=[1, 2], layers_per_block=1,
                 transformer_layers_per_block=[1, 2], cross_attention_dim=32, addition_time_embed_dim=8,
                 projection_class_embeddings_input_dim=16 + 6 * 8, sample_size=8),
    "sdxl_refiner": dict(SDXL_REFINER, block_out_channels=[32, 64, 64],
                         down_block_types=["DownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"],
                         up_block_types=["UpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"], attention_head_dim=[1, 2, 2],
                         layers_per_block=1, transformer_layers_per_block=1, cross_attention_dim=32,
                         addition_time_embed_dim=8, projection_class_embeddings_input_dim=32 + 5 * 8, sample_size=8),
}
TINY_UNETS["sd15_inpainting"] = dict(TINY_UNETS["sd15"], in_channels=9)
TINY_CONTROLNET = dict(CONTROLNET_V11, block_out_channels=[32, 64], attention_head_dim=2, cross_attention_dim=16,
                       down_block_types=["CrossAttnDownBlock2D", "DownBlock2D"], layers_per_block=1,
                       conditioning_embedding_out_channels=[8, 8, 16, 16])
TIME_IDS = {6: [1024.0, 1024.0, 0.0, 0.0, 1024.0, 1024.0], 5: [1024.0, 1024.0, 0.0, 0.0, 6.0]}


def _tiered(cases: Any, slow: Any) -> list[Any]:
    """``cases`` as pytest parameters, those in ``slow`` marked slow (a test over ~5 s on two cores)."""
    return [pytest.param(case, marks=pytest.mark.slow) if case in slow else case for case in cases]


def _reference_unet(config: dict, **kwargs: Any):
    from diffusers import FlaxUNet2DConditionModel

    return FlaxUNet2DConditionModel.from_config(config, **kwargs)


def _reference_controlnet(config: dict, **kwargs: Any):
    from diffusers import FlaxControlNetModel

    return FlaxControlNetModel.from_config(config, **kwargs)


def _shapes(tree: Any) -> dict[str, tuple[tuple[int, ...], Any]]:
    return {path: (leaf.shape, leaf.dtype) for path, leaf in flatten_dict(tree, sep="/").items()}


def _random_params(reference, seed: int = 0) -> dict:
    """Random parameters for diffusers' module ``reference`` (the tree of its ``init_weights``, drawn with numpy:
    compiling a random initialisation costs more than the modules): kernels ~ N(0, 1/fan_in), norm scales
    ~ 1 + N(0, 0.1^2), biases ~ N(0, 0.1^2) -- none zero, as the ControlNet's zero convolutions start."""
    shapes = flatten_dict(jax.eval_shape(reference.init_weights, jax.random.PRNGKey(0)))
    rng = np.random.default_rng(seed)

    def draw(path: tuple[str, ...], shape: tuple[int, ...]) -> jax.Array:
        noise = rng.standard_normal(shape).astype(np.float32)
        if path[-1] == "kernel":
            return jnp.asarray(noise / np.sqrt(np.prod(shape[:-1])))
        return jnp.asarray(1 + 0.1 * noise if path[-1] == "scale" else 0.1 * noise)

    return unflatten_dict({path: draw(path, leaf.shape) for path, leaf in shapes.items()})


def _unet_inputs(config: dict, batch: int = 2) -> dict[str, Any]:
    keys = jax.random.split(jax.random.PRNGKey(7), 3)
    size = config["sample_size"]
    inputs: dict[str, Any] = {
        "sample": jax.random.normal(keys[0], (batch, config["in_channels"], size, size)),
        "timesteps": jnp.array([3, 741][:batch], jnp.int32),
        "encoder_hidden_states": jax.random.normal(keys[1], (batch, 7, config["cross_attention_dim"])),
    }
    if config.get("addition_embed_type") == "text_time":
        time_embed = config["addition_time_embed_dim"]
        micro = 5 if 5 * time_embed + config["cross_attention_dim"] == config["projection_class_embeddings_input_dim"] \
            else 6
        text = config["projection_class_embeddings_input_dim"] - micro * time_embed
        inputs["added_cond_kwargs"] = {"text_embeds": jax.random.normal(keys[2], (batch, text)),
                                       "time_ids": jnp.array([TIME_IDS[micro]] * batch, jnp.float32)}
    return inputs


def _residuals(config: dict, batch: int = 2) -> dict[str, Any]:
    """ControlNet-like residuals (random: the UNet only adds them): NHWC, one per skip -- ``conv_in``'s, each
    resnet's, each downsampler's -- and one for the middle block's output."""
    size, channels = config["sample_size"], config["block_out_channels"]
    shapes = [(size, channels[0])]
    for i, width in enumerate(channels):
        shapes += [(size, width)] * config["layers_per_block"]
        if i < len(channels) - 1:
            size //= 2
            shapes.append((size, width))
    shapes.append((size, channels[-1]))
    keys = iter(jax.random.split(jax.random.PRNGKey(11), len(shapes)))
    arrays = [jax.random.normal(next(keys), (batch, side, side, width)) for side, width in shapes]
    return {"down_block_additional_residuals": tuple(arrays[:-1]), "mid_block_additional_residual": arrays[-1]}


def assert_same(ours: Any, theirs: Any, exact: bool = True, relative: float = 1e-6) -> float:
    """Every array of ``ours`` within ``relative`` times ``theirs``' largest magnitude of it, and (``exact``) bit
    for bit equal. Returns the largest difference."""
    leaves_ours, leaves_theirs = jax.tree_util.tree_leaves(ours), jax.tree_util.tree_leaves(theirs)
    assert len(leaves_ours) == len(leaves_theirs)
    worst = 0.0
    for a, b in zip(leaves_ours, leaves_theirs, strict=True):
        a, b = np.asarray(a, np.float32), np.asarray(b, np.float32)
        assert a.shape == b.shape
        difference = float(np.abs(a - b).max())
        assert difference <= relative * float(np.abs(b).max()), difference
        if exact:
            assert np.array_equal(a, b), difference
        worst = max(worst, difference)
    return worst


# -- parameter trees ---------------------------------------------------------------------------------------------


@pytest.mark.slow
@pytest.mark.parametrize("name", _tiered(UNETS, ("sdxl", "sdxl_refiner", "sd15_inpainting")))
def test_unet_parameter_tree_is_diffusers(name):
    """At full size (tracing only; SDXL's 70 transformer blocks take seconds to trace, so it and the refiner are in
    the slow tier, with the inpainting UNet: SD 1.5's but for conv_in's 9 input channels)."""
    config = UNETS[name]
    key = jax.random.PRNGKey(0)
    ours = jax.eval_shape(UNet2DConditionModel.from_config(config).init_weights, key)
    theirs = jax.eval_shape(_reference_unet(config).init_weights, key)
    assert _shapes(ours) == _shapes(theirs)


@pytest.mark.parametrize("config", [CONTROLNET, CONTROLNET_V11], ids=["sd-controlnet", "control_v11"])
def test_controlnet_parameter_tree_is_diffusers(config):
    key = jax.random.PRNGKey(0)
    ours = jax.eval_shape(ControlNetModel.from_config(config).init_weights, key)
    theirs = jax.eval_shape(_reference_controlnet(config).init_weights, key)
    assert _shapes(ours) == _shapes(theirs)


@pytest.mark.slow
@pytest.mark.parametrize("name", _tiered(["sdxl", "sdxl_refiner", "controlnet"], ("sdxl_refiner",)))
def test_initialisation_is_diffusers_program(name):
    """``init_weights`` lowers to diffusers' own program (same initialisers at the same names, the same dummy
    inputs where ``sample_size`` is the smallest the levels allow): the same random values for the same key."""
    if name == "controlnet":
        config = dict(TINY_CONTROLNET, sample_size=2)
        ours, reference = ControlNetModel.from_config(config), _reference_controlnet(config)
    else:
        config = dict(TINY_UNETS[name], sample_size=2 ** (len(TINY_UNETS[name]["block_out_channels"]) - 1))
        ours, reference = UNet2DConditionModel.from_config(config), _reference_unet(config)
    key = jax.random.PRNGKey(3)
    assert jax.jit(ours.init_weights).lower(key).as_text() == jax.jit(reference.init_weights).lower(key).as_text()


# -- outputs -----------------------------------------------------------------------------------------------------


def _programs(ours, reference, run, params: dict, inputs: dict) -> tuple[Any, Any]:
    """``run(module, params, inputs)`` for both modules, lowered by ``jax.jit``."""
    return (jax.jit(lambda p, i: run(ours, p, i)).lower(params, inputs),
            jax.jit(lambda p, i: run(reference, p, i)).lower(params, inputs))


def _compare(ours, reference, run, params: dict, inputs: dict, outputs: bool = True, same_program: bool = True,
             exact: bool = True, relative: float = 1e-6) -> Any:
    """Our module against diffusers': the same program (``same_program``: their jitted StableHLO texts equal), and
    (``outputs``) the two compiled and run -- equal outputs (:func:`assert_same`). Returns our outputs (or None)."""
    mine, theirs = _programs(ours, reference, run, params, inputs)
    if same_program:
        assert mine.as_text() == theirs.as_text()
    if not outputs:
        return None
    result = mine.compile()(params, inputs)
    assert_same(result, theirs.compile()(params, inputs), exact, relative)
    return result


def _run_unet(train: bool = False):
    rngs = {"dropout": jax.random.PRNGKey(5)} if train else {}

    def run(module, params, inputs):
        return module.apply({"params": params}, **inputs, train=train, rngs=rngs).sample

    return run


# case -> (config, our module's extra fields, diffusers' extra fields, ControlNet residuals, training)
UNET_CASES: dict[str, tuple[dict, dict, dict, bool, bool]] = {
    "sd15": (TINY_UNETS["sd15"], {}, {}, False, False),
    "sd21": (TINY_UNETS["sd21"], {}, {}, False, False),
    "sdxl": (TINY_UNETS["sdxl"], {}, {}, False, False),
    "sdxl_refiner": (TINY_UNETS["sdxl_refiner"], {}, {}, False, False),
    "sd15_inpainting_with_controlnet_residuals": (TINY_UNETS["sd15_inpainting"], {}, {}, True, False),
    # bfloat16 activations (float32 parameters and group norms), cast where diffusers casts
    "sdxl_bfloat16": (TINY_UNETS["sdxl"], {"dtype": jnp.bfloat16}, {"dtype": jnp.bfloat16}, False, False),
    # train=True with dropout: the same masks (the same rng stream names); the middle block's first resnet never
    # drops out, as diffusers'
    "sd15_training_dropout": (dict(TINY_UNETS["sd15"], dropout=0.3), {}, {}, False, True),
    # diffusers' attention flags in the config (attention="default")
    "sd21_split_head_dim": (dict(TINY_UNETS["sd21"], split_head_dim=True), {}, {}, False, False),
    "sd21_memory_efficient": (dict(TINY_UNETS["sd21"], use_memory_efficient_attention=True), {}, {}, False, False),
    # the attention named instead, against diffusers' flags
    "sd21_named_split_head_dim": (TINY_UNETS["sd21"], {"attention": "split_head_dim"}, {"split_head_dim": True},
                                  False, False),
    "sd21_named_memory_efficient": (TINY_UNETS["sd21"], {"attention": "memory_efficient"},
                                    {"use_memory_efficient_attention": True}, False, False),
}
PUBLISHED_CASES = ("sd15", "sd21", "sdxl", "sdxl_refiner", "sd15_inpainting_with_controlnet_residuals")
# The fast tier's share (each UNet compiled costs seconds): the inpainting case runs SD 1.5's structure; the
# named attentions are compared with diffusers' flags on the attention module itself, below.
SLOW_OUTPUTS = ("sd15",)
SLOW_PROGRAMS = ("sd21_named_split_head_dim", "sd21_named_memory_efficient")



def _unet_pair(case: str) -> tuple[Any, Any, Any, dict, dict]:
    config, ours_fields, reference_fields, residuals, train = UNET_CASES[case]
    reference = _reference_unet(config, **reference_fields)
    ours = UNet2DConditionModel.from_config(config, **ours_fields)
    inputs = _unet_inputs(config)
    if residuals:
        inputs.update(_residuals(config))
    return ours, reference, _run_unet(train), _random_params(reference), inputs


@pytest.mark.slow
@pytest.mark.parametrize("case", _tiered([case for case in UNET_CASES if case not in PUBLISHED_CASES], SLOW_PROGRAMS))
def test_unet_is_diffusers_program(case):
    """Under ``jax.jit`` our UNet lowers to diffusers' own program, op for op: the same program, compiled alike,
    computes the same numbers on any backend. (The published configs' cases are checked so by the next test too;
    these variants' outputs are compared there in the slow tier.)"""
    _compare(*_unet_pair(case), outputs=False)


@pytest.mark.parametrize("case", _tiered(UNET_CASES, [*SLOW_OUTPUTS, *(c for c in UNET_CASES
                                                                        if c not in PUBLISHED_CASES)]))
@pytest.mark.slow
def test_unet_outputs_equal_diffusers(case):
    """Diffusers' program, compiled and run (CPU, float32 unless said): bit for bit diffusers' outputs."""
    ours, reference, run, params, inputs = _unet_pair(case)
    sample = _compare(ours, reference, run, params, inputs)
    assert sample.shape == (2, 4, 8, 8)


@pytest.mark.slow
def test_dot_product_unet_is_default_to_rounding():
    """XLA's fused attention sums in another order: equal to diffusers' default to 1e-5 of the largest value."""
    config = TINY_UNETS["sd21"]
    reference = _reference_unet(config)
    ours = UNet2DConditionModel.from_config(config, attention="dot_product")
    _compare(ours, reference, _run_unet(), _random_params(reference), _unet_inputs(config), same_program=False,
             exact=False, relative=1e-5)


def test_timesteps_are_taken_as_diffusers_takes_them():
    from sdjax_runner.families.sd.models.unet import as_timesteps

    def taken(value: Any) -> tuple[Any, list[float]]:
        out = as_timesteps(value)
        return out.dtype, out.tolist()

    assert taken(999.7) == (jnp.int32, [999])  # a number: int32, truncated, as diffusers
    assert taken(np.float32(3.5)) == (jnp.int32, [3])
    assert taken(jnp.asarray(3.5)) == (jnp.float32, [3.5])  # a 0-d array: float32
    assert taken(jnp.array([1, 2], jnp.int32)) == (jnp.int32, [1, 2])
    assert taken(np.array([1.5, 2.0], np.float32)) == (jnp.float32, [1.5, 2.0])


def test_controlnet_residuals_must_match_the_skips():
    config = TINY_UNETS["sd15"]
    unet = UNet2DConditionModel.from_config(config)
    inputs = dict(_unet_inputs(config), **_residuals(config))
    inputs["down_block_additional_residuals"] = inputs["down_block_additional_residuals"][:-1]
    params = _random_params(unet)
    with pytest.raises(ValueError, match="zip"):
        jax.eval_shape(lambda: unet.apply({"params": params}, **inputs))


def test_attention_flags_pick_the_implementation():
    """With ``attention="default"`` the config's flags pick diffusers' paths (memory-efficient first); a named
    attention overrides them."""
    def picked(**fields: Any) -> str:
        return UNet2DConditionModel(**fields).attention_implementation

    assert picked() == "default"
    assert picked(split_head_dim=True) == "split_head_dim"
    assert picked(use_memory_efficient_attention=True) == "memory_efficient"
    assert picked(use_memory_efficient_attention=True, split_head_dim=True) == "memory_efficient"
    assert picked(split_head_dim=True, attention="dot_product") == "dot_product"


# -- the attention function --------------------------------------------------------------------------------------


def _reference_attention(query_dim: int, heads: int, head_dim: int, flag: str | None):
    from diffusers.models.attention_flax import FlaxAttention

    flags = {flag: True} if flag else {}
    return FlaxAttention(query_dim, heads, head_dim, **flags)


@pytest.mark.parametrize(("implementation", "flag"), [("default", None), ("split_head_dim", "split_head_dim"),
                                                       ("memory_efficient", "use_memory_efficient_attention")])
def test_attention_equals_diffusers_flax_attention(implementation, flag):
    """Self- and cross-attention (64 tokens, so the memory-efficient path runs 64 query chunks)."""
    reference = _reference_attention(32, 4, 8, flag)
    ours = Attention(4, 8, implementation)
    keys = jax.random.split(jax.random.PRNGKey(0), 3)
    x = jax.random.normal(keys[0], (2, 64, 32))
    context = jax.random.normal(keys[1], (2, 7, 24))
    for args in ((x,), (x, context)):
        params = _random_params_of(reference, keys[2], *args)
        theirs = jax.jit(lambda p, a: reference.apply({"params": p}, *a))(params, args)
        mine = jax.jit(lambda p, a: ours.apply({"params": p}, *a))(params, args)
        assert_same(mine, theirs)


def _random_params_of(module, key, *args):
    """``module``'s initial parameters plus noise (the biases non-zero)."""
    params = flatten_dict(module.init(key, *args)["params"])
    keys = iter(jax.random.split(key, len(params)))
    return unflatten_dict({path: leaf + 0.1 * jax.random.normal(next(keys), leaf.shape)
                           for path, leaf in params.items()})


def test_chunked_attention_equals_diffusers_in_several_key_chunks():
    from diffusers.models.attention_flax import jax_memory_efficient_attention

    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    query = jax.random.normal(keys[0], (48, 6, 8))
    key = jax.random.normal(keys[1], (40, 6, 8)) * 3
    value = jax.random.normal(keys[2], (40, 6, 8))
    theirs = jax.jit(lambda q, k, v: jax_memory_efficient_attention(q, k, v, query_chunk_size=12,
                                                                    key_chunk_size=10))(query, key, value)
    mine = jax.jit(lambda q, k, v: chunked_attention(q, k, v, 12, 10))(query, key, value)
    assert_same(mine, theirs)
    # A key chunk that does not divide the keys: chunks of gcd(40, 16) = 8 keys, the plain softmax's result.
    uneven = jax.jit(lambda q, k, v: chunked_attention(q, k, v, 12, 16))(query, key, value)
    np.testing.assert_allclose(uneven, theirs, rtol=0, atol=1e-5)


@pytest.mark.parametrize("implementation", [i for i in IMPLEMENTATIONS if i != "cudnn_flash"])
def test_attention_implementations_agree(implementation):
    keys = jax.random.split(jax.random.PRNGKey(2), 3)
    query = jax.random.normal(keys[0], (2, 20, 32))
    key, value = (jax.random.normal(k, (2, 9, 32)) for k in keys[1:])
    default = attention(query, key, value, 4)
    out = jax.jit(lambda q, k, v: attention(q, k, v, 4, implementation))(query, key, value)
    assert out.shape == default.shape and out.dtype == default.dtype
    np.testing.assert_allclose(out, default, rtol=1e-5, atol=1e-5 * float(jnp.abs(default).max()))


@pytest.mark.parametrize("implementation", [i for i in IMPLEMENTATIONS if i != "cudnn_flash"])
def test_split_head_attention_is_the_same_function_on_the_flow_families_layout(implementation):
    """attend (FLUX.1's and SD 3's blocks: heads split out, (B, T, N, H)) is attention on the same heads; its
    dot_product is jax.nn.dot_product_attention on the inputs as given (what those blocks called before)."""
    from sdjax_runner.models.nn.attention import attend

    keys = jax.random.split(jax.random.PRNGKey(3), 3)
    query = jax.random.normal(keys[0], (2, 20, 4, 8))
    key, value = (jax.random.normal(k, (2, 9, 4, 8)) for k in keys[1:])
    out = jax.jit(lambda q, k, v: attend(q, k, v, implementation))(query, key, value)
    flat = attention(query.reshape(2, 20, 32), key.reshape(2, 9, 32), value.reshape(2, 9, 32), 4)
    assert out.shape == query.shape and out.dtype == query.dtype
    np.testing.assert_allclose(out.reshape(2, 20, 32), flat, rtol=1e-5, atol=1e-5 * float(jnp.abs(flat).max()))
    if implementation == "dot_product":
        direct = jax.jit(lambda q, k, v: jax.nn.dot_product_attention(q, k, v, scale=1 / 8 ** 0.5))(query, key, value)
        assert np.array_equal(out, direct)


def test_cudnn_flash_attention_is_jaxs_cudnn_kernel_on_the_same_layout(monkeypatch):
    """``cudnn_flash`` is jax.nn.dot_product_attention's cuDNN implementation (NVIDIA GPUs only: measured in
    benchmarks/full_size.py on one, docs/benchmarks.md), given the heads as (B, T, N, H) -- checked here on any
    backend by running what it is given through the XLA implementation."""
    calls = []
    original = jax.nn.dot_product_attention

    def recorded(query, key, value, *args, implementation=None, **kwargs):
        calls.append((query.shape, key.shape, implementation))
        return original(query, key, value, *args, **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", recorded)
    keys = jax.random.split(jax.random.PRNGKey(2), 3)
    query = jax.random.normal(keys[0], (2, 20, 32))
    key, value = (jax.random.normal(k, (2, 9, 32)) for k in keys[1:])
    out = attention(query, key, value, 4, "cudnn_flash")
    assert calls == [((2, 20, 4, 8), (2, 9, 4, 8), "cudnn")]
    default = attention(query, key, value, 4)
    np.testing.assert_allclose(out, default, rtol=1e-5, atol=1e-5 * float(jnp.abs(default).max()))


def test_unknown_attention_is_refused():
    x = jnp.zeros((1, 2, 8))
    with pytest.raises(ValueError, match="flash"):
        attention(x, x, x, 2, "flash")
    with pytest.raises(ValueError, match="attention 'flash'"):
        UNet2DConditionModel.from_config(SD15, attention="flash")


# -- the ControlNet ----------------------------------------------------------------------------------------------


def _controlnet_inputs() -> dict[str, jax.Array]:
    keys = jax.random.split(jax.random.PRNGKey(4), 3)
    return {"sample": jax.random.normal(keys[0], (2, 4, 8, 8)), "timesteps": jnp.array([5, 900], jnp.int32),
            "encoder_hidden_states": jax.random.normal(keys[1], (2, 7, 16)),
            "controlnet_cond": jax.random.uniform(keys[2], (2, 3, 64, 64))}


def _run_controlnet(scale: float):
    def run(module, params, inputs):
        out = module.apply({"params": params}, **inputs, conditioning_scale=scale)
        return tuple(out.down_block_res_samples), out.mid_block_res_sample

    return run


@pytest.mark.slow
@pytest.mark.parametrize(("order", "scale"), [("rgb", 1.0), ("bgr", 0.5)])
def test_controlnet_equals_diffusers(order, scale):
    """Both channel orders, a conditioning scale other than 1: diffusers' program, and its outputs bit for bit."""
    config = dict(TINY_CONTROLNET, controlnet_conditioning_channel_order=order)
    reference, ours = _reference_controlnet(config), ControlNetModel.from_config(config)
    down, mid = _compare(ours, reference, _run_controlnet(scale), _random_params(reference), _controlnet_inputs())
    assert [d.shape for d in down] == [(2, 8, 8, 32)] * 2 + [(2, 4, 4, 32), (2, 4, 4, 64)]
    assert mid.shape == (2, 4, 4, 64)


def test_bfloat16_controlnet_is_diffusers_program():
    """bfloat16 activations; the conditioning embedding in float32 (diffusers builds it without a dtype)."""
    reference = _reference_controlnet(TINY_CONTROLNET, dtype=jnp.bfloat16)
    ours = ControlNetModel.from_config(TINY_CONTROLNET, dtype=jnp.bfloat16)
    _compare(ours, reference, _run_controlnet(0.7), _random_params(reference), _controlnet_inputs(), outputs=False)


# -- configs -----------------------------------------------------------------------------------------------------


def _listed(value: Any) -> Any:
    return list(value) if isinstance(value, (list, tuple)) else value


@pytest.mark.parametrize("name", [*UNETS, "controlnet"])
def test_published_configs_are_read_as_diffusers_reads_them(name):
    """The config keys are diffusers' Flax class's fields, with the values diffusers reads from the config."""
    from diffusers import FlaxControlNetModel, FlaxUNet2DConditionModel

    if name == "controlnet":
        ours, reference, cls = ControlNetModel.from_config(CONTROLNET_V11), _reference_controlnet(CONTROLNET_V11), \
            FlaxControlNetModel
    else:
        ours, reference, cls = UNet2DConditionModel.from_config(UNETS[name]), _reference_unet(UNETS[name]), \
            FlaxUNet2DConditionModel
    assert set(ours.config) == set(cls.__dataclass_fields__) - {"dtype", "parent", "name"}
    assert {k: _listed(v) for k, v in ours.config.items()} == {k: _listed(reference.config[k]) for k in ours.config}


@pytest.mark.parametrize(("change", "message"), [
    ({"time_cond_proj_dim": 256}, "time_cond_proj_dim=256"),
    ({"class_embed_type": "timestep"}, "class_embed_type='timestep'"),
    ({"norm_num_groups": 16}, "norm_num_groups=16"),
    ({"act_fn": "gelu"}, "act_fn='gelu'"),
    ({"down_block_types": ["SimpleCrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D",
                           "DownBlock2D"]}, "SimpleCrossAttnDownBlock2D"),
    ({"num_attention_heads": 8}, "num_attention_heads is set"),
    ({"addition_embed_type": "text"}, "addition_embed_type 'text'"),
    ({"mid_block_type": "UNetMidBlock2DSimpleCrossAttn"}, "mid_block_type"),
    ({"block_out_channels": [320, 640, 1280, 1000]}, "1000 is no multiple of 32"),
    ({"attention_head_dim": [5, 10, 20]}, "attention_head_dim has 3 entries for 4 levels"),
    ({"attention_head_dim": 7}, "7 attention heads do not divide"),
    ({"encoder_hid_dim": 1024}, "encoder_hid_dim=1024"),
    ({"a_future_key": 1}, "unknown key"),
])
def test_unet_configs_it_cannot_compute_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        UNet2DConditionModel.from_config(dict(SD15, **change))


@pytest.mark.parametrize(("change", "message"), [
    ({"addition_embed_type": "text_time"}, "addition_embed_type='text_time'"),
    ({"global_pool_conditions": True}, "global_pool_conditions=True"),
    ({"conditioning_channels": 4}, "conditioning_channels=4"),
    ({"controlnet_conditioning_channel_order": "grb"}, "'grb'"),
    ({"down_block_types": ["CrossAttnDownBlock2D"] * 3 + ["UpBlock2D"]}, "down block 'UpBlock2D'"),
])
def test_controlnet_configs_it_cannot_compute_are_refused(change, message):
    with pytest.raises(ValueError, match=message):
        ControlNetModel.from_config(dict(CONTROLNET_V11, **change))
