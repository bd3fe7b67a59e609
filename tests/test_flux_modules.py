"""FLUX.1's Flax modules (sdjax_runner/families/flux/models/) against diffusers 0.39's PyTorch ones, without torch.

The reference numbers are committed under tests/fixtures/flux/, made with diffusers' PyTorch classes by
tests/helpers/make_flux_reference.py: two tiny pipelines in FluxPipeline.save_pretrained's layout
(``tiny-flux-dev/``, guidance-distilled; ``tiny-flux-schnell/``), each with a sharded transformer and a
16-channel VAE without quant convolutions, and ``modules_{dev,schnell}.npz`` with the modules' inputs and
outputs. Here the weights are converted from those safetensors (convert.py), the Flax modules run on the same
inputs, and the outputs must agree to 1e-4 (float32).

The tests that need no fixture check the conversion's names against diffusers' state-dict names (listed below,
as diffusers' FluxTransformer2DModel writes them), its refusals, the configs it refuses, the rotary tables
against float64, and that bfloat16 runs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
from sdjax_runner.families.flux.models.convert import (
    convert_transformer,
    convert_vae,
    load_safetensors,
    read_safetensors,
)
from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer, rope_tables
from sdjax_runner.models.checkpoints import WeightsMismatch

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "flux"
VARIANTS = ("dev", "schnell")
TOLERANCE = 1e-4  # max abs difference, float32

# -- the fixtures: diffusers' PyTorch outputs ------------------------------------------------------------------------


def _reference(variant: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"modules_{variant}.npz") as data:
        return {key: data[key] for key in data.files}


def _transformer(variant: str) -> tuple[FlaxFluxTransformer, dict]:
    folder = FIXTURES / f"tiny-flux-{variant}" / "transformer"
    module = FlaxFluxTransformer.from_config(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    return module, convert_transformer(read_safetensors(folder), module)


def _vae(variant: str) -> tuple[FlaxFluxAutoencoderKL, dict]:
    folder = FIXTURES / f"tiny-flux-{variant}" / "vae"
    module = FlaxFluxAutoencoderKL.from_config(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    return module, convert_vae(read_safetensors(folder), module)


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformer_matches_diffusers(variant):
    ref = _reference(variant)
    module, params = _transformer(variant)
    assert module.guidance_embeds == (variant == "dev")
    index = json.loads((FIXTURES / f"tiny-flux-{variant}" / "transformer" /
                        "diffusion_pytorch_model.safetensors.index.json").read_text(encoding="utf-8"))
    assert len(set(index["weight_map"].values())) > 1  # the sharded layout is what is read
    out = jax.jit(module.apply)(
        {"params": params}, ref["transformer.hidden_states"], ref["transformer.encoder_hidden_states"],
        ref["transformer.pooled_projections"], ref["transformer.timestep"], ref["transformer.img_ids"],
        ref["transformer.txt_ids"], ref.get("transformer.guidance"))
    assert out.shape == ref["transformer.out"].shape
    assert np.abs(np.asarray(out) - ref["transformer.out"]).max() <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("variant", VARIANTS)
def test_vae_decode_and_encode_match_diffusers(variant):
    ref = _reference(variant)
    module, params = _vae(variant)
    assert (module.latent_channels, module.use_quant_conv, module.use_post_quant_conv) == (16, False, False)
    decoded = module.apply({"params": params}, ref["vae.latents"], method=module.decode)
    assert decoded.shape == ref["vae.decoded"].shape
    assert np.abs(np.asarray(decoded) - ref["vae.decoded"]).max() <= TOLERANCE
    posterior = module.apply({"params": params}, ref["vae.image"], method=module.encode)
    mean = np.transpose(np.asarray(posterior.mean), (0, 3, 1, 2))  # the distribution is channels-last
    assert mean.shape == ref["vae.encode_mean"].shape
    assert np.abs(mean - ref["vae.encode_mean"]).max() <= TOLERANCE
    if "vae.encode_logvar" in ref:
        logvar = np.transpose(np.asarray(posterior.logvar), (0, 3, 1, 2))
        assert np.abs(logvar - ref["vae.encode_logvar"]).max() <= TOLERANCE


# -- no fixture: the names, the refusals -------------------------------------------------------------------------------

# diffusers 0.39's FluxTransformer2DModel(patch_size=1, in_channels=8, num_layers=1, num_single_layers=1,
# attention_head_dim=8, num_attention_heads=2, joint_attention_dim=12, pooled_projection_dim=10,
# guidance_embeds=True, axes_dims_rope=(2, 2, 4)).state_dict(): names and shapes, as torch lists them.
SMALL_CONFIG = {"_class_name": "FluxTransformer2DModel", "_diffusers_version": "0.39.0", "patch_size": 1,
                "in_channels": 8, "out_channels": None, "num_layers": 1, "num_single_layers": 1,
                "attention_head_dim": 8, "num_attention_heads": 2, "joint_attention_dim": 12,
                "pooled_projection_dim": 10, "guidance_embeds": True, "axes_dims_rope": [2, 2, 4]}
SMALL_STATE_DICT = {
    "time_text_embed.timestep_embedder.linear_1.weight": (16, 256),
    "time_text_embed.timestep_embedder.linear_1.bias": (16,),
    "time_text_embed.timestep_embedder.linear_2.weight": (16, 16),
    "time_text_embed.timestep_embedder.linear_2.bias": (16,),
    "time_text_embed.guidance_embedder.linear_1.weight": (16, 256),
    "time_text_embed.guidance_embedder.linear_1.bias": (16,),
    "time_text_embed.guidance_embedder.linear_2.weight": (16, 16),
    "time_text_embed.guidance_embedder.linear_2.bias": (16,),
    "time_text_embed.text_embedder.linear_1.weight": (16, 10),
    "time_text_embed.text_embedder.linear_1.bias": (16,),
    "time_text_embed.text_embedder.linear_2.weight": (16, 16),
    "time_text_embed.text_embedder.linear_2.bias": (16,),
    "context_embedder.weight": (16, 12),
    "context_embedder.bias": (16,),
    "x_embedder.weight": (16, 8),
    "x_embedder.bias": (16,),
    "transformer_blocks.0.norm1.linear.weight": (96, 16),
    "transformer_blocks.0.norm1.linear.bias": (96,),
    "transformer_blocks.0.norm1_context.linear.weight": (96, 16),
    "transformer_blocks.0.norm1_context.linear.bias": (96,),
    "transformer_blocks.0.attn.norm_q.weight": (8,),
    "transformer_blocks.0.attn.norm_k.weight": (8,),
    "transformer_blocks.0.attn.to_q.weight": (16, 16),
    "transformer_blocks.0.attn.to_q.bias": (16,),
    "transformer_blocks.0.attn.to_k.weight": (16, 16),
    "transformer_blocks.0.attn.to_k.bias": (16,),
    "transformer_blocks.0.attn.to_v.weight": (16, 16),
    "transformer_blocks.0.attn.to_v.bias": (16,),
    "transformer_blocks.0.attn.to_out.0.weight": (16, 16),
    "transformer_blocks.0.attn.to_out.0.bias": (16,),
    "transformer_blocks.0.attn.norm_added_q.weight": (8,),
    "transformer_blocks.0.attn.norm_added_k.weight": (8,),
    "transformer_blocks.0.attn.add_q_proj.weight": (16, 16),
    "transformer_blocks.0.attn.add_q_proj.bias": (16,),
    "transformer_blocks.0.attn.add_k_proj.weight": (16, 16),
    "transformer_blocks.0.attn.add_k_proj.bias": (16,),
    "transformer_blocks.0.attn.add_v_proj.weight": (16, 16),
    "transformer_blocks.0.attn.add_v_proj.bias": (16,),
    "transformer_blocks.0.attn.to_add_out.weight": (16, 16),
    "transformer_blocks.0.attn.to_add_out.bias": (16,),
    "transformer_blocks.0.ff.net.0.proj.weight": (64, 16),
    "transformer_blocks.0.ff.net.0.proj.bias": (64,),
    "transformer_blocks.0.ff.net.2.weight": (16, 64),
    "transformer_blocks.0.ff.net.2.bias": (16,),
    "transformer_blocks.0.ff_context.net.0.proj.weight": (64, 16),
    "transformer_blocks.0.ff_context.net.0.proj.bias": (64,),
    "transformer_blocks.0.ff_context.net.2.weight": (16, 64),
    "transformer_blocks.0.ff_context.net.2.bias": (16,),
    "single_transformer_blocks.0.norm.linear.weight": (48, 16),
    "single_transformer_blocks.0.norm.linear.bias": (48,),
    "single_transformer_blocks.0.proj_mlp.weight": (64, 16),
    "single_transformer_blocks.0.proj_mlp.bias": (64,),
    "single_transformer_blocks.0.proj_out.weight": (16, 80),
    "single_transformer_blocks.0.proj_out.bias": (16,),
    "single_transformer_blocks.0.attn.norm_q.weight": (8,),
    "single_transformer_blocks.0.attn.norm_k.weight": (8,),
    "single_transformer_blocks.0.attn.to_q.weight": (16, 16),
    "single_transformer_blocks.0.attn.to_q.bias": (16,),
    "single_transformer_blocks.0.attn.to_k.weight": (16, 16),
    "single_transformer_blocks.0.attn.to_k.bias": (16,),
    "single_transformer_blocks.0.attn.to_v.weight": (16, 16),
    "single_transformer_blocks.0.attn.to_v.bias": (16,),
    "norm_out.linear.weight": (32, 16),
    "norm_out.linear.bias": (32,),
    "proj_out.weight": (8, 16),
    "proj_out.bias": (8,),
}


def _small_state_dict(seed: int = 0) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {name: rng.normal(0, 0.2, shape).astype(np.float32) for name, shape in SMALL_STATE_DICT.items()}


def _small_inputs(seed: int = 1) -> dict:
    rng = np.random.default_rng(seed)
    h, w, text = 3, 4, 5
    img_ids = np.zeros((h, w, 3), np.float32)
    img_ids[..., 1], img_ids[..., 2] = np.arange(h)[:, None], np.arange(w)[None, :]
    return {"hidden_states": rng.normal(size=(2, h * w, 8)).astype(np.float32),
            "encoder_hidden_states": rng.normal(size=(2, text, 12)).astype(np.float32),
            "pooled_projections": rng.normal(size=(2, 10)).astype(np.float32),
            # 1000 x each is exact in bfloat16 (diffusers casts them to the model's dtype before the x1000)
            "timestep": np.array([0.5, 0.25], np.float32), "img_ids": img_ids.reshape(-1, 3),
            "txt_ids": np.zeros((text, 3), np.float32), "guidance": np.array([4.0, 1.0], np.float32)}


def test_conversion_takes_exactly_diffusers_names():
    module = FlaxFluxTransformer.from_config(SMALL_CONFIG)
    state = _small_state_dict()
    params = flatten_dict(convert_transformer(state, module), sep=".")
    assert len(params) == len(state)
    for name, array in state.items():
        stem, leaf = name.rsplit(".", 1)
        stem = re.sub(r"\.(\d+)", r"_\1", stem)  # torch's ModuleList indices: blocks.0 -> blocks_0
        if leaf == "bias":
            np.testing.assert_array_equal(params[f"{stem}.bias"], array)
        elif array.ndim == 2:  # a Linear: (out, in) -> kernel (in, out)
            np.testing.assert_array_equal(params[f"{stem}.kernel"], array.T)
        else:  # an RMSNorm
            np.testing.assert_array_equal(params[f"{stem}.scale"], array)


@pytest.mark.parametrize("change", ["unexpected", "missing", "shape", "guidance weights for schnell"])
def test_conversion_refuses_weights_that_do_not_fit(change):
    config, state = dict(SMALL_CONFIG), _small_state_dict()
    if change == "unexpected":
        state["transformer_blocks.0.attn.to_out.1.weight"] = np.zeros((16, 16), np.float32)
        expected = "to_out.1.weight"
    elif change == "missing":
        del state["single_transformer_blocks.0.attn.norm_k.weight"]
        expected = "single_transformer_blocks_0/attn/norm_k/scale"
    elif change == "shape":
        state["proj_out.weight"] = np.zeros((8, 15), np.float32)
        expected = "proj_out.weight has shape (8, 15)"
    else:
        config["guidance_embeds"] = False
        expected = "guidance_embedder"
    with pytest.raises(WeightsMismatch, match=re.escape(expected)):
        convert_transformer(state, FlaxFluxTransformer.from_config(config))


def test_configs_that_are_not_flux_are_refused():
    with pytest.raises(ValueError, match="unknown key"):
        FlaxFluxTransformer.from_config({**SMALL_CONFIG, "qk_norm": "layer_norm"})
    with pytest.raises(ValueError, match="axes_dims_rope"):
        FlaxFluxTransformer.from_config({**SMALL_CONFIG, "axes_dims_rope": [2, 2, 2]})
    with pytest.raises(ValueError, match="quant_conv"):
        FlaxFluxAutoencoderKL.from_config({"latent_channels": 4, "use_quant_conv": True})


def test_guidance_is_required_exactly_when_the_model_embeds_it():
    module = FlaxFluxTransformer.from_config(SMALL_CONFIG)
    params = convert_transformer(_small_state_dict(), module)
    inputs = _small_inputs()
    guidance = inputs.pop("guidance")
    with pytest.raises(ValueError, match="pass guidance"):
        module.apply({"params": params}, **inputs)
    state = {k: v for k, v in _small_state_dict().items() if "guidance_embedder" not in k}
    schnell = FlaxFluxTransformer.from_config({**SMALL_CONFIG, "guidance_embeds": False})
    with pytest.raises(ValueError, match="guidance must be None"):
        schnell.apply({"params": convert_transformer(state, schnell)}, **inputs, guidance=guidance)


def test_rotary_tables_match_float64():
    """diffusers computes the rotary angles in float64; these are float32: within 1e-5 at FLUX's 128 positions."""
    h = w = 128
    ids = np.zeros((h, w, 3), np.float32)
    ids[..., 1], ids[..., 2] = np.arange(h)[:, None], np.arange(w)[None, :]
    ids = np.concatenate([np.zeros((4, 3), np.float32), ids.reshape(-1, 3)])
    cos, sin = rope_tables(jnp.asarray(ids), (16, 56, 56))
    for table, fn in ((cos, np.cos), (sin, np.sin)):
        bands = []
        for axis, dim in enumerate((16, 56, 56)):
            freqs = 1.0 / 10000 ** (np.arange(0, dim, 2, dtype=np.float64) / dim)
            bands.append(np.repeat(fn(np.outer(ids[:, axis].astype(np.float64), freqs)), 2, axis=-1))
        assert np.abs(np.asarray(table) - np.concatenate(bands, axis=-1)).max() < 1e-5


@pytest.mark.slow
def test_bfloat16_runs_close_to_float32():
    inputs = _small_inputs()
    outputs = {}
    for dtype in (jnp.float32, jnp.bfloat16):
        module = FlaxFluxTransformer.from_config(SMALL_CONFIG, dtype=dtype, param_dtype=dtype)
        params = convert_transformer(_small_state_dict(), module)
        assert flatten_dict(params)[("x_embedder", "kernel")].dtype == dtype
        outputs[dtype] = module.apply({"params": params}, **inputs)
    assert outputs[jnp.bfloat16].dtype == jnp.bfloat16
    full, half = np.asarray(outputs[jnp.float32]), np.asarray(outputs[jnp.bfloat16], np.float32)
    assert np.isfinite(half).all()
    assert np.abs(half - full).max() <= 0.05 * np.abs(full).max()


def test_safetensors_are_read_with_bfloat16(tmp_path):
    """Published FLUX.1 weights are bfloat16, which safetensors' NumPy reader refuses; ours reads them (the
    file is written here by hand, in the format's layout: header length, JSON header, little-endian data)."""
    import ml_dtypes

    arrays = {"a.weight": np.arange(6, dtype=np.float32).reshape(2, 3).astype(ml_dtypes.bfloat16) / 4,
              "b.bias": np.array([1.5, -2.0], np.float32), "c.scalar": np.array(7, np.int64)}
    header, data, offset = {"__metadata__": {"format": "pt"}}, b"", 0
    names = {"a.weight": "BF16", "b.bias": "F32", "c.scalar": "I64"}
    for name, array in arrays.items():
        raw = array.tobytes()
        header[name] = {"dtype": names[name], "shape": list(array.shape), "data_offsets": [offset, offset + len(raw)]}
        data, offset = data + raw, offset + len(raw)
    encoded = json.dumps(header).encode()
    (tmp_path / "model.safetensors").write_bytes(len(encoded).to_bytes(8, "little") + encoded + data)
    read = load_safetensors(tmp_path / "model.safetensors")
    assert read.keys() == arrays.keys()
    for name, array in arrays.items():
        assert read[name].dtype == array.dtype and read[name].shape == array.shape
        np.testing.assert_array_equal(read[name], array)
    (tmp_path / "short.safetensors").write_bytes(len(encoded).to_bytes(8, "little") + encoded + data[:-4])
    with pytest.raises(WeightsMismatch, match="does not fit its bytes"):
        load_safetensors(tmp_path / "short.safetensors")


@pytest.mark.slow
def test_the_full_size_architecture_has_flux1_devs_published_parameter_counts():
    """model=flux-dev-arch (benchmarks' FLUX.1 with random weights) is FLUX.1 [dev]'s shape: the parameter counts
    of black-forest-labs/FLUX.1-dev's components as diffusers / transformers count them (num_parameters()):
    transformer 11,901,408,320; T5-XXL encoder 4,762,310,656; CLIP-L text model 123,060,480; VAE 83,819,683."""
    import jax
    import jax.numpy as jnp

    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.flux.models.builtin import FLUX_SPECS
    from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer
    from sdjax_runner.models import published_layout
    from sdjax_runner.models.checkpoints import param_shapes
    from sdjax_runner.models.loading import MODULE_KINDS

    def count(tree) -> int:
        return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(tree))

    spec = FLUX_SPECS["flux-dev-arch"]
    # the text encoders as the built-in's config.json files describe them, built as the loader builds them
    t5 = MODULE_KINDS["T5EncoderModel"].build(published_layout.t5_config(spec["t5"]), jnp.float32)
    clip = MODULE_KINDS["CLIPTextModel"].build(published_layout.clip_text_config(spec["clip"]), jnp.float32)
    assert count(param_shapes(FlaxFluxTransformer.from_config(spec["transformer"]), "diffusers")) == 11_901_408_320
    assert count(param_shapes(t5, "transformers")) == 4_762_310_656
    assert count(param_shapes(clip, "transformers")) == 123_060_480
    assert count(param_shapes(FlaxFluxAutoencoderKL.from_config(spec["vae"]), "diffusers")) == 83_819_683
