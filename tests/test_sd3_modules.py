"""SD 3 / 3.5's Flax transformer (sdjax_runner/families/sd3/models/transformer.py) against diffusers 0.39's PyTorch
``SD3Transformer2DModel``, without torch.

The references are committed under tests/fixtures/sd3/, made with diffusers' PyTorch classes by
tests/helpers/make_sd3_reference.py: a tiny random transformer in each published shape of the family (``sd3``:
SD 3.0, no q/k norm; ``large``: SD 3.5 Large, RMS q/k norm; ``medium``: SD 3.5 Medium, RMS q/k norm and dual
attention in blocks 0 and 1) in save_pretrained's layout, and ``transformers.npz`` with the inputs and each one's
outputs -- every block, and block 1 skipped (skip-layer guidance). Here the weights are converted from those
safetensors by FLUX.1's converter, the Flax module runs on the same inputs, and the outputs must agree to 1e-4.
"""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdjax_runner.families.flux.models.convert import convert_state_dict, read_safetensors
from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer, sincos_table

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sd3"
VARIANTS = ("sd3", "large", "medium")
TOLERANCE = 1e-4  # max abs difference, float32


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "transformers.npz") as data:
        return {key: data[key] for key in data.files}


def transformer(variant: str) -> tuple[FlaxSD3Transformer, dict, dict]:
    folder = FIXTURES / f"transformer-{variant}"
    module = FlaxSD3Transformer.from_config(json.loads((folder / "config.json").read_text(encoding="utf-8")))
    state = read_safetensors(folder)
    return module, convert_state_dict(state, module, source="the SD3 transformer's weights"), state


@pytest.mark.parametrize("variant", VARIANTS)
def test_the_transformer_matches_diffusers_with_every_block_and_with_a_block_skipped(variant, reference):
    module, params, _ = transformer(variant)
    assert (module.qk_norm is None) == (variant == "sd3")
    assert tuple(module.dual_attention_layers) == ((0, 1) if variant == "medium" else ())
    nhwc = jnp.asarray(reference["hidden_states"].transpose(0, 2, 3, 1))
    inputs = (nhwc, jnp.asarray(reference["encoder_hidden_states"]), jnp.asarray(reference["pooled_projections"]),
              jnp.asarray(reference["timestep"]))
    for name, skip in (("all", ()), ("skip", (1,))):
        out = jax.jit(lambda p, *a, s=skip: module.apply({"params": p}, *a, skip_layers=s))(params, *inputs)
        expected = reference[f"{variant}_{name}"].transpose(0, 2, 3, 1)
        assert out.shape == expected.shape
        assert float(np.abs(np.asarray(out) - expected).max()) < TOLERANCE, (variant, name)
    assert not np.allclose(reference[f"{variant}_all"], reference[f"{variant}_skip"], atol=1e-3)  # skipping matters


@pytest.mark.parametrize("variant", VARIANTS)
def test_random_initialisation_has_diffusers_parameter_shapes_and_its_position_table(variant):
    module, params, state = transformer(variant)
    from flax.traverse_util import flatten_dict

    initial = flatten_dict(jax.eval_shape(module.init_weights, jax.random.key(0)))
    assert {k: tuple(v.shape) for k, v in initial.items()} == {k: tuple(v.shape) for k, v in flatten_dict(params).items()}
    table = sincos_table(module.inner_dim, module.pos_embed_max_size, module.sample_size // module.patch_size)
    np.testing.assert_allclose(table[None], state["pos_embed.pos_embed"], rtol=0, atol=1e-6)  # diffusers' buffer


def test_configs_sd3_does_not_use_are_refused():
    with pytest.raises(ValueError, match="qk_norm 'layer_norm' is not one SD 3 uses"):
        FlaxSD3Transformer.from_config({"qk_norm": "layer_norm"})
    with pytest.raises(ValueError, match="dual_attention_layers"):
        FlaxSD3Transformer.from_config({"num_layers": 2, "dual_attention_layers": [2]})
    with pytest.raises(ValueError, match="unknown key"):
        FlaxSD3Transformer.from_config({"num_single_layers": 2})


@pytest.mark.slow
def test_the_sd35_large_architecture_has_diffusers_parameter_counts():
    """The built-in sd3.5-large-arch (full-size benchmarks) against diffusers' and transformers' own PyTorch classes
    built from stabilityai/stable-diffusion-3.5-large's configs on the meta device (counted in the reference
    environment of tests/helpers/make_flux_reference.py): SD3Transformer2DModel 8,056,627,520 parameters plus its
    89,653,248-value pos_embed buffer (a parameter here), CLIPTextModelWithProjection 123,650,304 (CLIP-L) and
    694,659,840 (bigG), AutoencoderKL 83,819,683."""
    import jax.numpy as jnp

    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.sd3.models.builtin import SD3_SPECS
    from sdjax_runner.models import published_layout
    from sdjax_runner.models.checkpoints import param_shapes
    from sdjax_runner.models.loading import MODULE_KINDS

    def count(tree) -> int:
        return sum(int(np.prod(leaf.shape)) for leaf in jax.tree_util.tree_leaves(tree))

    spec = SD3_SPECS["sd3.5-large-arch"]
    assert count(param_shapes(FlaxSD3Transformer.from_config(spec["transformer"]), "diffusers")) == \
        8_056_627_520 + 89_653_248
    for clip, expected in ((spec["clip"], 123_650_304), (spec["clip_2"], 694_659_840)):
        # as the built-in's config.json describes the encoder, built as the loader builds it
        model = MODULE_KINDS["CLIPTextModelWithProjection"].build(published_layout.clip_text_config(clip), jnp.float32)
        assert count(param_shapes(model, "transformers")) == expected
    assert count(param_shapes(FlaxFluxAutoencoderKL.from_config(spec["vae"]), "diffusers")) == 83_819_683
