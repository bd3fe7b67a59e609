"""The torch-free loader of a FLUX.1 folder in diffusers' published layout (sdjax_runner/families/flux/models/pipeline.py),
on the committed fixtures (tests/fixtures/flux/README.md): FluxPipeline.save_pretrained folders of a tiny [dev]
and [schnell] with diffusers' PyTorch outputs of their modules. The loaded modules, run with the loaded weights,
must give those outputs; the tokenizers, loaded offline without sentencepiece, the same ids; a damaged folder is
one line naming model.pretrained_model_name_or_path."""

from __future__ import annotations

import json
import shutil
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

from sdjax_runner.config.schema import Dtype, DtypeConfig, ModelConfig
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.models.pipeline import FluxPipeline, load_flux
from sdjax_runner.models import model_index

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "flux"
VARIANTS = ("dev", "schnell")
KEY = "model.pretrained_model_name_or_path"
PROMPT = "a red cube on a table"
DTYPES = {
    "fp32": DtypeConfig("fp32", Dtype.float32, Dtype.float32),
    "bf16": DtypeConfig("bf16", Dtype.bfloat16, Dtype.bfloat16),
    "fp16": DtypeConfig("fp16", Dtype.float16, Dtype.float16),
}
# The README's scheduler configs (the published FLUX.1 values).
SCHEDULERS = {
    "dev": {"base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
            "num_train_timesteps": 1000, "shift": 3.0, "use_dynamic_shifting": True},
    "schnell": {"base_image_seq_len": 256, "base_shift": 0.5, "max_image_seq_len": 4096, "max_shift": 1.15,
                "num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False},
}


def folder(variant: str) -> Path:
    return FIXTURES / f"tiny-flux-{variant}"


def model_config(directory: Path, **overrides) -> ModelConfig:
    return ModelConfig(name="tiny-flux", pretrained_model_name_or_path=str(directory), **overrides)


def load(directory: Path, dtype: str = "fp32", **overrides):
    return load_flux(directory, model_index.read(directory), model_config(directory, **overrides), DTYPES[dtype],
                     None, None)


def reference(variant: str) -> dict[str, np.ndarray]:
    with np.load(FIXTURES / f"modules_{variant}.npz") as data:
        return {key: data[key] for key in data.files}


_LOADED: dict[tuple[str, str], object] = {}


def loaded(variant: str, dtype: str = "fp32"):
    """The fixture folder loaded once per (variant, dtype) in this process."""
    if (variant, dtype) not in _LOADED:
        _LOADED[variant, dtype] = load(folder(variant), dtype)
    return _LOADED[variant, dtype]


def leaves(tree) -> list[np.ndarray]:
    return jax.tree_util.tree_leaves(tree)


def maps_a_file(array: np.ndarray) -> bool:
    base = array
    while base is not None:
        if isinstance(base, np.memmap):
            return True
        base = getattr(base, "base", None)
    return False


# -- what loads --------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("variant", VARIANTS)
def test_both_variants_load_with_what_the_engine_reads(variant):
    result = loaded(variant)
    pipeline = result.pipeline
    assert isinstance(pipeline, FluxPipeline)
    assert (result.family, result.path, result.safety_weights) == ("flux", str(folder(variant)), None)
    assert result.formats == dict.fromkeys(("transformer", "vae", "text_encoder", "text_encoder_2"), "safetensors")
    assert set(result.host_weights) == set(result.formats) and result.variant_components == ()
    assert pipeline.guidance_embeds is (variant == "dev")
    assert pipeline.transformer.guidance_embeds is (variant == "dev")
    assert pipeline.scheduler_config == SCHEDULERS[variant]
    assert (pipeline.vae_scale_factor, pipeline.scaling_factor, pipeline.shift_factor) == (8, 0.3611, 0.1159)
    assert (pipeline.native_size, pipeline.size_multiple) == (1024, 16)
    assert pipeline.vae.latent_channels == 16 and pipeline.dtype == np.float32
    # the runner's own (models/nn/clip.py, t5.py, models/clip_tokenizer.py, models/nn/t5_tokenizer.py)
    assert type(pipeline.text_encoder).__name__ == "CLIPTextModel" and not pipeline.text_encoder.with_projection
    assert type(pipeline.text_encoder_2).__name__ == "T5EncoderModel"
    assert type(pipeline.tokenizer).__name__ == "ClipTokenizer"
    assert type(pipeline.tokenizer_2).__name__ == "T5Tokenizer"
    assert "torch" not in sys.modules


@pytest.mark.parametrize("dtype", ["fp32", "bf16", "fp16"])
def test_host_weights_follow_the_dtype_config(dtype):
    result = loaded("dev", dtype)
    expected = {"fp32": "float32", "bf16": "bfloat16", "fp16": "float16"}[dtype]
    for component, tree in result.host_weights.items():
        arrays = leaves(tree)
        assert arrays and all(isinstance(a, np.ndarray) for a in arrays), component
        # fp16: the VAE (force_upcast) computes in float32 and keeps its weights float32, as SD's loader upcasts it
        want = "float32" if dtype == "fp16" and component == "vae" else expected
        assert {str(a.dtype) for a in arrays} == {want}, component
        assert not any(maps_a_file(a) for a in arrays), component  # copied into memory, not views of the files
    assert str(np.dtype(result.pipeline.vae.dtype)) == ("float32" if dtype == "fp16" else expected)
    assert str(np.dtype(result.pipeline.dtype)) == expected


def test_the_hub_index_without_image_encoder_slots_loads(tmp_path):
    directory = shutil.copytree(folder("schnell"), tmp_path / "hub")
    index = json.loads((directory / "model_index.json").read_text())
    assert index.pop("image_encoder") == [None, None] and index.pop("feature_extractor") == [None, None]
    (directory / "model_index.json").write_text(json.dumps(index))
    result = load(directory)
    assert result.pipeline.guidance_embeds is False and set(result.host_weights) == set(result.formats)


def test_variant_files_are_read_first(tmp_path):
    directory = shutil.copytree(folder("dev"), tmp_path / "variant")
    (directory / "vae" / "diffusion_pytorch_model.safetensors").rename(
        directory / "vae" / "diffusion_pytorch_model.fp16.safetensors")
    shutil.copy(directory / "text_encoder" / "model.safetensors", directory / "text_encoder" / "model.fp16.safetensors")
    result = load(directory, variant="fp16")
    assert result.variant_components == ("vae", "text_encoder")
    vae = leaves(loaded("dev").host_weights["vae"])
    assert all(np.array_equal(a, b) for a, b in zip(leaves(result.host_weights["vae"]), vae, strict=True))


# -- the loaded modules against diffusers' PyTorch outputs ---------------------------------------------------------


def test_text_encoders_match_diffusers_with_the_loaded_weights():
    ref = reference("dev")
    result = loaded("dev")
    pipeline, weights = result.pipeline, result.host_weights

    @jax.jit
    def encode(params, clip_ids, t5_ids):  # params passed in, as the engine's program does
        clip = pipeline.text_encoder.apply({"params": params["text_encoder"]}, clip_ids)
        t5 = pipeline.text_encoder_2.apply({"params": params["text_encoder_2"]}, t5_ids)
        return clip.pooler_output, clip.last_hidden_state, t5.last_hidden_state

    pooled, clip_states, t5_states = encode(weights, ref["clip.input_ids"], ref["t5.input_ids"])
    assert np.abs(np.asarray(pooled) - ref["clip.pooled"]).max() <= 1e-5
    assert np.abs(np.asarray(clip_states) - ref["clip.last_hidden_state"]).max() <= 1e-5
    assert t5_states.shape == ref["t5.last_hidden_state"].shape
    assert np.abs(np.asarray(t5_states) - ref["t5.last_hidden_state"]).max() <= 1e-5


@pytest.mark.parametrize("variant", VARIANTS)
def test_transformer_matches_diffusers_with_the_loaded_weights(variant):
    ref = reference(variant)
    result = loaded(variant)
    transformer = result.pipeline.transformer
    out = jax.jit(transformer.apply)(
        {"params": result.host_weights["transformer"]}, ref["transformer.hidden_states"],
        ref["transformer.encoder_hidden_states"], ref["transformer.pooled_projections"], ref["transformer.timestep"],
        ref["transformer.img_ids"], ref["transformer.txt_ids"], ref.get("transformer.guidance"))
    assert out.shape == ref["transformer.out"].shape
    assert np.abs(np.asarray(out) - ref["transformer.out"]).max() <= 1e-4


def test_vae_decodes_as_diffusers_with_the_loaded_weights():
    ref = reference("dev")
    result = loaded("dev")
    vae = result.pipeline.vae
    decoded = vae.apply({"params": result.host_weights["vae"]}, ref["vae.latents"], method=vae.decode)
    assert np.abs(np.asarray(decoded) - ref["vae.decoded"]).max() <= 1e-4


def test_tokenizers_give_the_reference_ids_offline(monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    ref = reference("dev")
    pipeline = load(folder("dev")).pipeline
    clip = pipeline.tokenizer(PROMPT, padding="max_length", max_length=77, truncation=True, return_tensors="np")
    t5 = pipeline.tokenizer_2(PROMPT, padding="max_length", max_length=32, truncation=True, return_tensors="np")
    assert np.array_equal(clip.input_ids, ref["clip.input_ids"])
    assert np.array_equal(t5.input_ids, ref["t5.input_ids"])
    assert "sentencepiece" not in sys.modules


def test_t5_tokenizer_with_the_hubs_add_prefix_space_loads_without_sentencepiece(tmp_path):
    """The hub's FLUX.1 tokenizer_2/tokenizer_config.json sets add_prefix_space, which makes transformers rebuild
    the tokenizer from sentencepiece; tokenizer.json already prepends the space, so it is read as it is."""
    from sdjax_runner.families.flux.models.t5 import t5_tokenizer

    tokenizer_2 = shutil.copytree(folder("dev") / "tokenizer_2", tmp_path / "tokenizer_2")
    (tokenizer_2 / "spiece.model").unlink()  # the hub download fetches the JSON files only
    config = json.loads((tokenizer_2 / "tokenizer_config.json").read_text())
    config["add_prefix_space"] = True
    (tokenizer_2 / "tokenizer_config.json").write_text(json.dumps(config))
    ids = t5_tokenizer(tokenizer_2)(PROMPT, padding="max_length", max_length=32, truncation=True).input_ids
    assert ids == reference("dev")["t5.input_ids"][0].tolist()


# -- folders that do not load: one line naming the key -----------------------------------------------------------


def _edit_json(path: Path, change) -> None:
    data = json.loads(path.read_text())
    change(data)
    path.write_text(json.dumps(data))


def _drop_shard(directory: Path, component: str, index: str) -> None:
    weight_map = json.loads((directory / component / index).read_text())["weight_map"]
    (directory / component / sorted(set(weight_map.values()))[1]).unlink()


DAMAGE = {
    "no tokenizer_2/": (lambda d: shutil.rmtree(d / "tokenizer_2"), "tokenizer_2/ is missing"),
    "a transformer shard deleted": (
        lambda d: _drop_shard(d, "transformer", "diffusion_pytorch_model.safetensors.index.json"),
        "diffusion_pytorch_model-00002-of-00003.safetensors, which is missing"),
    "a T5 shard deleted": (lambda d: _drop_shard(d, "text_encoder_2", "model.safetensors.index.json"),
                           "model-00002-of-00002.safetensors, which is missing"),
    "wrong scheduler class": (
        lambda d: _edit_json(d / "scheduler" / "scheduler_config.json",
                             lambda c: c.update(_class_name="EulerDiscreteScheduler")),
        "the scheduler is EulerDiscreteScheduler; FLUX.1 runs FlowMatchEulerDiscreteScheduler only"),
    "index names another scheduler": (
        lambda d: _edit_json(d / "model_index.json", lambda c: c.update(scheduler=["diffusers", "DDIMScheduler"])),
        "component 'scheduler' is DDIMScheduler (diffusers), not a FLUX.1 pipeline's"),
    "scheduler with Karras sigmas": (
        lambda d: _edit_json(d / "scheduler" / "scheduler_config.json", lambda c: c.update(use_karras_sigmas=True)),
        "use_karras_sigmas is true; the FLUX.1 sampler runs false only"),
    "VAE with pickles only": (
        lambda d: (d / "vae" / "diffusion_pytorch_model.safetensors").rename(d / "vae" / "diffusion_pytorch_model.bin"),
        "vae/ has no diffusion_pytorch_model.safetensors weights"),
    "index lacks tokenizer_2": (lambda d: _edit_json(d / "model_index.json", lambda c: c.pop("tokenizer_2")),
                                "names no 'tokenizer_2' component"),
    "transformer config not FLUX's": (
        lambda d: _edit_json(d / "transformer" / "config.json",
                             lambda c: c.update(_class_name="SD3Transformer2DModel")),
        "is a SD3Transformer2DModel's config, not a FLUX.1 transformer's"),
    "transformer config with an unknown key": (
        lambda d: _edit_json(d / "transformer" / "config.json", lambda c: c.update(caption_projection_dim=64)),
        "is not a FLUX.1 transformer config: FLUX transformer config has unknown key(s) caption_projection_dim"),
    "transformer config and weights differ": (
        lambda d: _edit_json(d / "transformer" / "config.json", lambda c: c.update(num_single_layers=3)),
        "transformer/ does not match its config.json"),
    "schnell config on dev weights": (
        lambda d: _edit_json(d / "transformer" / "config.json", lambda c: c.update(guidance_embeds=False)),
        "transformer/ does not match its config.json"),
    "a truncated VAE file": (
        lambda d: (d / "vae" / "diffusion_pytorch_model.safetensors").write_bytes(
            (d / "vae" / "diffusion_pytorch_model.safetensors").read_bytes()[:5000]),
        "vae/: its weights cannot be read: diffusion_pytorch_model.safetensors is not a safetensors file"),
}


@pytest.mark.parametrize("case", list(DAMAGE))
def test_a_damaged_folder_is_one_line_naming_the_key(tmp_path, case):
    directory = shutil.copytree(folder("dev"), tmp_path / "damaged")
    damage, expected = DAMAGE[case]
    damage(directory)
    with pytest.raises(UserError) as raised:
        load(directory)
    message = str(raised.value)
    assert raised.value.key == KEY and message.startswith(f"{KEY}: ")
    assert "\n" not in message and expected in message, message
    assert "torch" not in sys.modules
