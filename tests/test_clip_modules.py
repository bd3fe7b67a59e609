"""The runner's own CLIP (sdjax_runner/models/nn/clip.py) against transformers 4.57's Flax CLIP
(models/clip/modeling_flax_clip.py) and its CLIPImageProcessor, kept as the test reference only.

* Parameter trees: for the published SD 1.5 (CLIP-L), SD 2.1 (OpenCLIP-H), SDXL (CLIP-L, and OpenCLIP-bigG with
  projection) text encoder configs and a ViT-L/14 CLIPConfig (SD 1.5's safety checker's: CLIP-L text, ViT-L/14
  vision), the paths, shapes and dtypes of ``jax.eval_shape(init_weights)`` are transformers' (full size: tracing
  only); the same key gives transformers' random parameters, value for value.
* Outputs on the same weights (transformers' random ones), CPU, under ``jax.jit``: shrunk versions of each text
  encoder (both activations, both ways of finding the end token, the end token at different positions, attention
  masks with zeros), the vision tower, and CLIPModel's text and image features and logits. The same flax layers run
  in the same order, so every output is bit-for-bit equal (``np.array_equal``), bfloat16 activations too; the
  looser bound, max |ours - transformers| <= 1e-6 * max |transformers|, is asserted first.
* Configs: published config.json files load with ``from_config`` (CLIPConfig's old ``*_config_dict`` keys merged
  as transformers merges them); what the modules cannot compute is refused (ValueError).
* Image preprocessing: equal to CLIPImageProcessor's ``pixel_values`` for uint8 arrays and PIL images of odd
  sizes, under the published and transformers' default preprocessor configs and some that pad, squash or skip.
"""

from __future__ import annotations

import copy
import json
import pickle
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict
from PIL import Image
from transformers import (
    CLIPConfig,
    CLIPImageProcessor,
    CLIPTextConfig,
    CLIPVisionConfig,
    FlaxCLIPModel,
    FlaxCLIPTextModel,
    FlaxCLIPTextModelWithProjection,
    FlaxCLIPVisionModel,
)

from sdjax_runner.models.nn.clip import (
    CLIPImagePreprocessor,
    CLIPModel,
    CLIPTextModel,
    CLIPTextOutput,
    CLIPVisionModel,
    FrozenConfig,
    clip_tower_configs,
    preprocess_images,
)

TESTS = Path(__file__).resolve().parent
PUBLISHED = json.loads((TESTS / "helpers" / "published_configs.json").read_text())
TEXT_CONFIGS = {
    "sd15": PUBLISHED["sd15"]["text_encoder/config.json"],  # CLIP-L, quick_gelu
    "sd21": PUBLISHED["sd21"]["text_encoder/config.json"],  # OpenCLIP-H, gelu
    "sdxl": PUBLISHED["sdxl"]["text_encoder/config.json"],  # CLIP-L
    "sdxl-2": PUBLISHED["sdxl"]["text_encoder_2/config.json"],  # OpenCLIP-bigG, CLIPTextModelWithProjection
}
FIXTURE_TEXT_CONFIGS = sorted(str(p.relative_to(TESTS / "fixtures")) for p in (TESTS / "fixtures").rglob("config.json")
                              if "CLIPText" in p.read_text())
# SD 1.5's safety checker's CLIPConfig (a ViT-L/14 CLIP: CLIP-L text, ViT-L/14 vision, projection 768); its
# architectures name the safety checker, whose tree is not CLIPModel's.
VIT_L_14 = {k: v for k, v in PUBLISHED["sd15"]["safety_checker/config.json"].items() if k != "architectures"}
# openai/clip-vit-large-patch14's config.json, abridged: its text_config / vision_config are transformers' whole
# dumps (generic keys kept here: a few), with eos_token_id 2; the *_config_dict keys win, with their defaults.
OPENAI_VIT_L_14 = {
    "architectures": ["CLIPModel"], "initializer_factor": 1.0, "logit_scale_init_value": 2.6592, "model_type": "clip",
    "projection_dim": 768, "torch_dtype": "float32", "transformers_version": None,
    "text_config": {"architectures": None, "bos_token_id": 0, "eos_token_id": 2, "pad_token_id": 1,
                    "hidden_act": "quick_gelu", "hidden_size": 768, "intermediate_size": 3072,
                    "max_position_embeddings": 77, "model_type": "clip_text_model", "num_attention_heads": 12,
                    "num_hidden_layers": 12, "projection_dim": 768, "vocab_size": 49408, "dropout": 0.0,
                    "do_sample": False, "id2label": {"0": "LABEL_0"}, "return_dict": True, "top_k": 50},
    "text_config_dict": {"hidden_size": 768, "intermediate_size": 3072, "num_attention_heads": 12,
                         "num_hidden_layers": 12, "projection_dim": 768},
    "vision_config": {"hidden_size": 1024, "image_size": 224, "intermediate_size": 4096,
                      "model_type": "clip_vision_model", "num_attention_heads": 16, "num_hidden_layers": 24,
                      "patch_size": 14, "projection_dim": 768, "eos_token_id": None, "chunk_size_feed_forward": 0},
    "vision_config_dict": {"hidden_size": 1024, "intermediate_size": 4096, "num_attention_heads": 16,
                           "num_hidden_layers": 24, "patch_size": 14, "projection_dim": 768},
}

# The published text encoders shrunk (their activation and end-token id kept), and a modern end token (the
# fixtures' configs: eos_token_id the vocabulary's last id, not 2).
SHRUNK = dict(vocab_size=1000, intermediate_size=64, max_position_embeddings=20)
SMALL_TEXT = {
    "sd15": dict(TEXT_CONFIGS["sd15"], **SHRUNK, hidden_size=32, num_hidden_layers=2, num_attention_heads=4),
    "sd21": dict(TEXT_CONFIGS["sd21"], **SHRUNK, hidden_size=48, num_hidden_layers=3, num_attention_heads=4),
    "sdxl-2": dict(TEXT_CONFIGS["sdxl-2"], **SHRUNK, hidden_size=64, num_hidden_layers=2, num_attention_heads=8,
                   projection_dim=40),
    "eos-999": dict(TEXT_CONFIGS["sdxl-2"], **dict(SHRUNK, vocab_size=1010), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                    projection_dim=16, hidden_act="quick_gelu", bos_token_id=998, eos_token_id=999,
                    pad_token_id=999),
}
END = 999  # the largest id: where eos_token_id 2 configs pool
SMALL_CLIP: dict[str, Any] = {"text_config": dict(SMALL_TEXT["sd15"], eos_token_id=END),
              "vision_config": {"hidden_size": 48, "intermediate_size": 96, "num_hidden_layers": 2,
                                "num_attention_heads": 4, "image_size": 24, "patch_size": 8, "hidden_act": "gelu"},
              "projection_dim": 24, "architectures": ["CLIPModel"], "model_type": "clip"}


def _shapes(tree) -> dict:
    return {path: (leaf.shape, leaf.dtype) for path, leaf in flatten_dict(tree).items()}


def _assert_same(ours, theirs) -> None:
    """Equal to transformers bit for bit (and so within the 1e-6 relative bound, asserted first for the message)."""
    ours, theirs = np.asarray(ours), np.asarray(theirs)
    assert ours.shape == theirs.shape and ours.dtype == theirs.dtype
    ours, theirs = ours.astype(np.float32), theirs.astype(np.float32)
    assert np.abs(ours - theirs).max() <= 1e-6 * np.abs(theirs).max()
    assert np.array_equal(ours, theirs)


def _reference_text(config: dict, **kwargs):
    """transformers' module for a text config.json, the class its architectures name."""
    cls = FlaxCLIPTextModelWithProjection if "CLIPTextModelWithProjection" in config["architectures"] \
        else FlaxCLIPTextModel
    return cls(CLIPTextConfig(**config), **kwargs)


def _ids(end: int, length: int = 9) -> tuple[np.ndarray, np.ndarray]:
    """Token ids (the end token early, late, last, twice, padded with itself as SD's tokenizers pad, and absent)
    and an attention mask with zeros after some rows' end tokens."""
    rng = np.random.RandomState(0)
    ids = rng.randint(3, 990, size=(6, length))
    ids[:, 0] = 998  # a start token
    ids[0, 2] = end
    ids[1, 5] = end
    ids[2, -1] = end
    ids[3, [3, 6]] = end
    ids[4, 4:] = end
    mask = np.ones_like(ids)
    mask[0, 3:] = 0
    mask[4, 5:] = 0
    mask[5, 7:] = 0
    return ids, mask


# -- parameter trees -----------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["sd15", "sd21", "sdxl-2"])  # SDXL's first encoder is SD 1.5's CLIP-L
def test_published_text_encoders_have_transformers_parameter_tree(name):
    config = TEXT_CONFIGS[name]
    key = jax.random.PRNGKey(0)
    theirs = _reference_text(config, _do_init=False)
    ours = CLIPTextModel.from_config(config)
    assert ours.with_projection == (name == "sdxl-2")
    want = _shapes(jax.eval_shape(lambda k: theirs.init_weights(k, (1, 1)), key))
    assert _shapes(jax.eval_shape(ours.init_weights, key)) == want
    assert (("text_projection", "kernel") in want) == ours.with_projection
    assert ("text_model", "encoder", "layers", str(config["num_hidden_layers"] - 1), "self_attn", "q_proj",
            "kernel") in want


@pytest.mark.parametrize("name", FIXTURE_TEXT_CONFIGS)
def test_fixture_text_encoders_have_transformers_parameter_tree(name):
    """The repository's tiny text encoders (FLUX.1, SD 3, SDXL), transformers 4.57's files."""
    config = json.loads((TESTS / "fixtures" / name).read_text())
    key = jax.random.PRNGKey(5)
    theirs = _reference_text(config, _do_init=False)
    ours = CLIPTextModel.from_config(config)
    assert _shapes(jax.eval_shape(ours.init_weights, key)) == _shapes(
        jax.eval_shape(lambda k: theirs.init_weights(k, (1, 1)), key))


@pytest.mark.slow
def test_vit_l_14_clip_has_transformers_parameter_tree():
    key = jax.random.PRNGKey(0)
    theirs = FlaxCLIPModel(CLIPConfig(**VIT_L_14), _do_init=False)
    ours = CLIPModel.from_config(VIT_L_14)
    want = _shapes(jax.eval_shape(lambda k: theirs.init_weights(k, theirs.input_shape), key))
    assert _shapes(jax.eval_shape(ours.init_weights, key)) == want
    assert want[("vision_model", "embeddings", "patch_embedding", "kernel")][0] == (14, 14, 3, 1024)
    assert want[("logit_scale",)][0] == ()


@pytest.mark.slow  # transformers' init runs op by op: ~8 s
def test_random_initialisation_is_transformers_own():
    """The same key gives transformers' random parameters, value for value: CLIPModel, and a text encoder with
    projection (its text_projection has another initialiser)."""
    key = jax.random.PRNGKey(3)
    theirs = FlaxCLIPModel(CLIPConfig(**SMALL_CLIP), _do_init=False)
    pairs = [(CLIPModel.from_config(SMALL_CLIP).init_weights(key), theirs.init_weights(key, theirs.input_shape)),
             (CLIPTextModel.from_config(SMALL_TEXT["sdxl-2"]).init_weights(key),
              _reference_text(SMALL_TEXT["sdxl-2"], _do_init=False).init_weights(key, (1, 1)))]
    for got, want in pairs:
        assert _shapes(got) == _shapes(want)
        for path, leaf in flatten_dict(want).items():
            assert np.array_equal(flatten_dict(got)[path], leaf), path


# -- outputs -------------------------------------------------------------------------------------------------------

@pytest.mark.slow
@pytest.mark.parametrize("name", ["sd15", "sd21", "sdxl-2"])
def test_text_encoder_outputs_match_transformers(name):
    """Every output, with a mask and given positions, and with the wrapper's defaults (mask all ones, positions
    arange); the pooled state, which FlaxCLIPTextModelWithProjection does not give, against FlaxCLIPTextModel's
    on the same tower."""
    config = SMALL_TEXT[name]
    theirs = _reference_text(config, seed=1)
    tower = FlaxCLIPTextModel(CLIPTextConfig(**config), _do_init=False)
    ours = CLIPTextModel.from_config(config)
    ids, mask = _ids(END)
    positions = np.broadcast_to(np.arange(9)[::-1] + 2, ids.shape)

    @jax.jit
    def run(params, ids, mask, positions):
        outputs = [ours.apply({"params": params}, ids, mask, positions, output_hidden_states=True),
                   ours.apply({"params": params}, ids)]
        for out in outputs:
            assert isinstance(out, CLIPTextOutput)
            assert (out.text_embeds is not None) == ours.with_projection
        assert outputs[1].hidden_states is None
        return outputs

    @jax.jit
    def reference(params, ids, mask, positions):
        pooled = [tower(ids, mask, positions, params={"text_model": params["text_model"]}).pooler_output,
                  tower(ids, params={"text_model": params["text_model"]}).pooler_output]
        return [theirs(ids, mask, positions, params=params, output_hidden_states=True),
                theirs(ids, params=params)], pooled

    got = run(theirs.params, ids, mask, positions)
    want, pooled = reference(theirs.params, ids, mask, positions)
    assert len(got[0].hidden_states) == config["num_hidden_layers"] + 1 == len(want[0].hidden_states)
    for ours_hidden, theirs_hidden in zip(got[0].hidden_states, want[0].hidden_states, strict=True):
        _assert_same(ours_hidden, theirs_hidden)
    for ours_out, theirs_out, theirs_pooled in zip(got, want, pooled, strict=True):
        _assert_same(ours_out.last_hidden_state, theirs_out.last_hidden_state)
        _assert_same(ours_out.pooler_output, theirs_pooled)
        if ours.with_projection:
            _assert_same(ours_out.text_embeds, theirs_out.text_embeds)
    # eos_token_id 2 (all published SD text encoders'): the position of the largest id, the end token's first.
    first_end = ids.argmax(-1)
    assert list(first_end) == [2, 5, 8, 3, 4, 0]  # no end token in the last row: its start token, the largest
    np.testing.assert_array_equal(np.asarray(got[0].pooler_output),
                                  np.asarray(got[0].last_hidden_state)[np.arange(len(ids)), first_end])


@pytest.mark.slow
def test_bfloat16_text_encoder_with_modern_end_token_matches_transformers():
    """bfloat16 activations, and a transformers 4.57 config's end token (the last id, FLUX.1's and SD 3's
    encoders'): the pooled state is at its first occurrence, not at the largest id."""
    config = SMALL_TEXT["eos-999"]
    theirs = _reference_text(config, seed=2, dtype=jnp.bfloat16)
    ours = CLIPTextModel.from_config(config, dtype=jnp.bfloat16)
    ids, mask = _ids(999)
    ids[1, 2] = 1005  # an added token (a textual inversion's) past the end token's id, before it
    got = jax.jit(lambda p, i, m: ours.apply({"params": p}, i, m, output_hidden_states=True))(theirs.params, ids,
                                                                                              mask)
    want = jax.jit(lambda p, i, m: theirs(i, m, params=p, output_hidden_states=True))(theirs.params, ids, mask)
    assert got.last_hidden_state.dtype == jnp.bfloat16
    _assert_same(got.last_hidden_state, want.last_hidden_state)
    _assert_same(got.text_embeds, want.text_embeds)
    for ours_hidden, theirs_hidden in zip(got.hidden_states, want.hidden_states, strict=True):
        _assert_same(ours_hidden, theirs_hidden)
    ends = (ids == 999).argmax(-1)
    assert list(ends) == [2, 5, 8, 3, 4, 0]
    np.testing.assert_array_equal(np.asarray(got.pooler_output, np.float32),
                                  np.asarray(got.last_hidden_state, np.float32)[np.arange(len(ids)), ends])


@pytest.mark.slow
def test_clip_model_matches_transformers():
    """Text and image features (the CLIP score's inputs), the logits, and the vision tower on its own."""
    theirs = FlaxCLIPModel(CLIPConfig(**SMALL_CLIP), seed=4)
    ours = CLIPModel.from_config(SMALL_CLIP)
    ids, mask = _ids(END)
    pixels = jax.random.normal(jax.random.PRNGKey(6), (3, 3, 24, 24))

    @jax.jit
    def run(params, ids, mask, pixels):
        apply = lambda *args, **kwargs: ours.apply({"params": params}, *args, **kwargs)  # noqa: E731
        return (apply(ids, mask, method="text_features"), apply(ids, method="text_features"),
                apply(pixels, method="image_features"), *apply(ids[:3], pixels, mask[:3]))

    @jax.jit
    def reference(params, ids, mask, pixels):
        out = theirs(ids[:3], pixels, mask[:3], params=params)
        return (theirs.get_text_features(ids, mask, params=params), theirs.get_text_features(ids, params=params),
                theirs.get_image_features(pixels, params=params), out.logits_per_image, out.logits_per_text,
                out.text_embeds, out.image_embeds)

    got, want = run(theirs.params, ids, mask, pixels), reference(theirs.params, ids, mask, pixels)
    assert got[0].shape == (6, 24) and got[2].shape == (3, 24) and got[3].shape == (3, 3)
    for ours_out, theirs_out in zip(got, want, strict=True):
        _assert_same(ours_out, theirs_out)

    vision = FlaxCLIPVisionModel(CLIPVisionConfig(**SMALL_CLIP["vision_config"]), _do_init=False)
    ours_vision = CLIPVisionModel.from_config(SMALL_CLIP["vision_config"])
    params = {"vision_model": theirs.params["vision_model"]}
    got_vision = jax.jit(lambda p, x: ours_vision.apply({"params": p}, x, output_hidden_states=True))(params, pixels)
    want_vision = jax.jit(lambda p, x: vision(x, params=p, output_hidden_states=True))(params, pixels)
    assert got_vision.last_hidden_state.shape == (3, 10, 48)
    _assert_same(got_vision.last_hidden_state, want_vision.last_hidden_state)
    _assert_same(got_vision.pooler_output, want_vision.pooler_output)
    for ours_hidden, theirs_hidden in zip(got_vision.hidden_states, want_vision.hidden_states, strict=True):
        _assert_same(ours_hidden, theirs_hidden)


def test_modules_hash_and_jit_as_bound_methods():
    """Flax modules are hashed (jax.jit of ``module.apply``): the towers' configs are frozen."""
    module = CLIPModel.from_config(SMALL_CLIP)
    assert hash(module) == hash(CLIPModel.from_config(SMALL_CLIP))
    with pytest.raises(TypeError):
        module.text_config["hidden_size"] = 8
    assert module.text_config.hidden_size == 32 and module.config.projection_dim == 24
    assert copy.deepcopy(module.text_config) == pickle.loads(pickle.dumps(module.text_config)) == module.text_config
    given = CLIPModel(text_config=FrozenConfig(hidden_size=16), vision_config=FrozenConfig(image_size=64))  # completed
    assert given.text_config.eos_token_id == 49407 and given.vision_config.patch_size == 32
    assert hash(given) == hash(given.clone())
    text = CLIPTextModel.from_config(SMALL_TEXT["sd15"])
    params = jax.eval_shape(text.init_weights, jax.random.PRNGKey(0))
    out = jax.eval_shape(jax.jit(text.apply), {"params": params}, jnp.zeros((2, 5), jnp.int32))
    assert out.last_hidden_state.shape == (2, 5, 32) and out.text_embeds is None


# -- configs -------------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", sorted(TEXT_CONFIGS))
def test_published_text_configs_load(name):
    config = TEXT_CONFIGS[name]
    module = CLIPTextModel.from_config(config)
    reference = CLIPTextConfig(**config)
    for key, value in module.config.items():
        assert getattr(reference, key) == value, key
    assert module.eos_token_id == 2 and module.dtype == jnp.float32
    again = CLIPTextModel.from_config(module.config, with_projection=module.with_projection, dtype=jnp.bfloat16)
    assert again.config == module.config and again.dtype == jnp.bfloat16
    assert not CLIPTextModel.from_config(config, with_projection=False).with_projection


@pytest.mark.parametrize("name", FIXTURE_TEXT_CONFIGS)
def test_fixture_text_configs_load(name):
    """transformers 4.57's files: a ``dtype`` key (not the module's dtype), eos_token_id the last id."""
    config = json.loads((TESTS / "fixtures" / name).read_text())
    module = CLIPTextModel.from_config(config)
    assert config["dtype"] == "float32" and module.dtype == jnp.float32
    assert module.eos_token_id == config["eos_token_id"] == config["vocab_size"] - 1
    assert module.with_projection == (config["architectures"] == ["CLIPTextModelWithProjection"])


@pytest.mark.parametrize("config", [VIT_L_14, OPENAI_VIT_L_14], ids=["safety-checker", "openai"])
def test_clip_configs_merge_as_transformers_does(config):
    reference = CLIPConfig(**config)
    module = CLIPModel.from_config(config)
    for key, value in module.text_config.items():
        assert getattr(reference.text_config, key) == value, key
    for key, value in module.vision_config.items():
        assert getattr(reference.vision_config, key) == value, key
    assert module.projection_dim == reference.projection_dim == 768
    assert module.text_config.eos_token_id == 49407  # the *_config_dict's defaults win over text_config's 2
    text, vision = clip_tower_configs(config)
    assert text["eos_token_id"] == 49407 and text["pad_token_id"] == 1 and vision["image_size"] == 224
    assert module.vision_config.patch_size == 14 and module.vision_config.hidden_size == 1024


def test_clip_config_transformers_writes_loads(tmp_path):
    CLIPConfig(**SMALL_CLIP).save_pretrained(tmp_path)
    config = json.loads((tmp_path / "config.json").read_text())
    module = CLIPModel.from_config(config)
    assert module.text_config.hidden_act == "quick_gelu" and module.vision_config.hidden_act == "gelu"
    assert module.vision_config.image_size == 24 and module.projection_dim == 24


@pytest.mark.parametrize(("change", "message"), [
    ({"rope_theta": 10000.0}, "unknown key"),
    ({"hidden_act": "mish"}, "hidden_act"),
    ({"num_attention_heads": 5}, "no multiple of num_attention_heads"),
    ({"eos_token_id": [2, 3]}, "no single token id"),
    ({"eos_token_id": None}, "no single token id"),
    ({"architectures": ["T5EncoderModel"]}, "architectures"),
    ({"architectures": ["CLIPTextModel", "CLIPTextModelWithProjection"]}, "architectures"),
    ({"model_type": "t5"}, "model_type"),
    ({"pruned_heads": {"0": [1]}}, "pruned_heads"),
])
def test_text_configs_refused(change, message):
    with pytest.raises(ValueError, match=message):
        CLIPTextModel.from_config(dict(TEXT_CONFIGS["sd15"], **change))


@pytest.mark.parametrize(("change", "message"), [
    ({"architectures": ["StableDiffusionSafetyChecker"]}, "architectures"),
    ({"model_type": "siglip"}, "model_type"),
    ({"logit_bias_init_value": -10.0}, "unknown key"),
    ({"vision_config_dict": {"patch_size": 15}}, "no multiple of patch_size"),
    ({"vision_config": {"hidden_act": "mish"}}, "hidden_act"),
    ({"vision_config": {"vocab_size": 10}}, "unknown key"),
    ({"text_config": {"num_attention_heads": 7}}, "no multiple of num_attention_heads"),
])
def test_clip_configs_refused(change, message):
    with pytest.raises(ValueError, match=message):
        CLIPModel.from_config(dict(SMALL_CLIP, **change))


def test_vision_configs_refused():
    with pytest.raises(ValueError, match="architectures"):
        CLIPVisionModel.from_config({"architectures": ["CLIPVisionModelWithProjection"]})
    with pytest.raises(ValueError, match="model_type"):
        CLIPVisionModel.from_config({"model_type": "clip_text_model"})


# -- image preprocessing -------------------------------------------------------------------------------------------

def _images() -> list[np.ndarray]:
    rng = np.random.RandomState(0)
    sizes = [(37, 53), (53, 37), (300, 224), (10, 15), (224, 224), (31, 31), (7, 200)]
    return [rng.randint(0, 256, (h, w, 3), dtype=np.uint8) for h, w in sizes]


def _default_config(tmp_path: Path) -> dict:
    CLIPImageProcessor().save_pretrained(tmp_path)
    return json.loads((tmp_path / "preprocessor_config.json").read_text())


PREPROCESSOR_CONFIGS = {
    "sd15": PUBLISHED["sd15"]["feature_extractor/preprocessor_config.json"],  # old: int sizes
    "sd21": PUBLISHED["sd21"]["feature_extractor/preprocessor_config.json"],
    "tiny-random-clip": {"size": {"shortest_edge": 32}, "crop_size": {"height": 32, "width": 32}},
    "pads": {"size": {"shortest_edge": 20}, "crop_size": {"height": 24, "width": 30}, "resample": 2},
    "squashes": {"size": {"height": 17, "width": 31}, "crop_size": 16, "do_rescale": False, "image_mean": 0.5,
                 "image_std": [0.2, 0.3, 0.4]},
    "no-crop": {"size": [19, 23], "do_center_crop": False, "do_normalize": False, "resample": 1,
                "rescale_factor": 0.5},
}


@pytest.mark.parametrize("name", [*sorted(PREPROCESSOR_CONFIGS), "default"])
def test_preprocessing_matches_clip_image_processor(name, tmp_path):
    config = PREPROCESSOR_CONFIGS[name] if name != "default" else _default_config(tmp_path)
    processor = CLIPImageProcessor(**{k: v for k, v in config.items() if k != "feature_extractor_type"})
    images = _images()
    got = preprocess_images(images, config)
    want = processor(images=images, return_tensors="np")["pixel_values"]
    assert got.dtype == want.dtype == np.float32 and got.shape == want.shape
    assert np.array_equal(got, want)
    pil = [Image.fromarray(image) for image in images]
    assert np.array_equal(CLIPImagePreprocessor.from_config(config)(pil), want)


def test_preprocessing_converts_pil_modes_as_clip_image_processor():
    """The CLIP score hands PIL images; other modes are made RGB first (transformers' convert_to_rgb)."""
    rng = np.random.RandomState(1)
    images = [Image.fromarray(rng.randint(0, 256, (33, 47, 4), dtype=np.uint8), "RGBA"),
              Image.fromarray(rng.randint(0, 256, (41, 29), dtype=np.uint8), "L"),
              Image.fromarray(rng.randint(0, 256, (30, 30, 3), dtype=np.uint8)).convert("P")]
    config = PREPROCESSOR_CONFIGS["tiny-random-clip"]
    want = CLIPImageProcessor(**config)(images=images, return_tensors="np")["pixel_values"]
    assert np.array_equal(preprocess_images(images, config), want)


def test_preprocessing_refusals():
    with pytest.raises(ValueError, match="unknown key"):
        CLIPImagePreprocessor.from_config({"do_pad": True})
    with pytest.raises(ValueError, match="size"):
        CLIPImagePreprocessor.from_config({"size": {"longest_edge": 224}})
    with pytest.raises(ValueError, match="RGB channel"):
        CLIPImagePreprocessor.from_config({"image_mean": [0.5, 0.5]})
    preprocess = CLIPImagePreprocessor.from_config({})
    with pytest.raises(ValueError, match="uint8"):
        preprocess([np.zeros((8, 8, 3), np.float32)])
    with pytest.raises(ValueError, match="RGB images"):
        preprocess([np.zeros((8, 8), np.uint8)])
    with pytest.raises(ValueError, match="differ in size"):
        CLIPImagePreprocessor.from_config({"do_center_crop": False})([np.zeros((8, 9, 3), np.uint8),
                                                                       np.zeros((8, 8, 3), np.uint8)])
