"""The runner's own PyTorch -> Flax naming rules (sdjax_runner/models/nn/pytorch_names.py) place every tensor of
published PyTorch folders where diffusers 0.39's and transformers 4.57's own converters place it, in the same
layout. The names are real ones: the committed folders tests/helpers/make_*_reference.py saved with diffusers'
and transformers' PyTorch classes (SDXL base and refiner: UNet, VAE, both CLIP text encoders; FLUX.1: its
transformer, VAE, CLIP and T5; SD 3: its transformer and three text encoders). The Flax trees are the reference
libraries' Flax modules (diffusers' UNet and VAE, transformers' CLIP and T5) and the runner's own (FLUX.1's and
SD 3's transformers)."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from sdjax_runner.models.nn.pytorch_names import diffusers_param, diffusers_path, transformers_param
from sdjax_runner.tensor_files import read_safetensors

FIXTURES = Path(__file__).resolve().parent / "fixtures"
FOLDERS = {  # component folder -> what its model_index names it
    "refiner/tiny-sdxl-base/unet": "UNet2DConditionModel",
    "refiner/tiny-sdxl-base/vae": "AutoencoderKL",
    "refiner/tiny-sdxl-base/text_encoder": "CLIPTextModel",
    "refiner/tiny-sdxl-base/text_encoder_2": "CLIPTextModelWithProjection",
    "refiner/tiny-sdxl-refiner/unet": "UNet2DConditionModel",
    "flux/tiny-flux-dev/transformer": "FluxTransformer2DModel",
    "flux/tiny-flux-dev/vae": "AutoencoderKL16",
    "flux/tiny-flux-dev/text_encoder_2": "T5EncoderModel",
    "sd3/tiny-sd3/transformer": "SD3Transformer2DModel",
    "sd3/tiny-sd3/text_encoder_3": "T5EncoderModel",
}


def _reference_tree(kind: str, folder: Path, monkeypatch) -> dict:
    """The flattened parameter shapes of the Flax module ``kind`` for ``folder``'s config.json."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    key = jax.random.PRNGKey(0)
    if kind == "UNet2DConditionModel":
        from diffusers import FlaxUNet2DConditionModel

        module = FlaxUNet2DConditionModel.from_config({k: v for k, v in config.items() if k in
                                                       FlaxUNet2DConditionModel.__dataclass_fields__})
        return flatten_dict(jax.eval_shape(module.init_weights, key))
    if kind == "AutoencoderKL":
        from diffusers import FlaxAutoencoderKL

        module = FlaxAutoencoderKL.from_config({k: v for k, v in config.items()
                                                if k in FlaxAutoencoderKL.__dataclass_fields__})
        return flatten_dict(jax.eval_shape(module.init_weights, key))
    if kind == "AutoencoderKL16":
        from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL

        return flatten_dict(jax.eval_shape(FlaxFluxAutoencoderKL.from_config(config).init_weights, key))
    if kind == "FluxTransformer2DModel":
        from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer

        return flatten_dict(jax.eval_shape(FlaxFluxTransformer.from_config(config).init_weights, key))
    if kind == "SD3Transformer2DModel":
        from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer

        return flatten_dict(jax.eval_shape(FlaxSD3Transformer.from_config(config).init_weights, key))
    import jax.numpy as jnp
    import transformers

    if kind == "T5EncoderModel":  # transformers 4.57's Flax T5 calls jnp.clip(a_max=...), gone from JAX 0.10
        clip = jnp.clip
        monkeypatch.setattr(jnp, "clip", lambda x, a_min=None, a_max=None: clip(x, a_min, a_max))
    cls = getattr(transformers, "Flax" + kind)
    model = cls(cls.config_class.from_pretrained(folder), _do_init=False)
    return flatten_dict(jax.eval_shape(lambda k: model.init_weights(k, (1, 8)), key))


def _theirs(kind: str, name: str, tensor: np.ndarray, reference: dict) -> tuple[tuple, np.ndarray]:
    if kind in ("CLIPTextModel", "CLIPTextModelWithProjection", "T5EncoderModel"):
        from transformers.modeling_flax_pytorch_utils import rename_key_and_reshape_tensor

        return rename_key_and_reshape_tensor(tuple(name.split(".")), tensor, reference, "")
    from diffusers.models.modeling_flax_pytorch_utils import rename_key, rename_key_and_reshape_tensor

    return rename_key_and_reshape_tensor(tuple(rename_key(name).split(".")), tensor, reference)


@pytest.mark.parametrize("component", sorted(FOLDERS))
def test_every_published_tensor_lands_where_the_libraries_put_it(component, monkeypatch):
    folder, kind = FIXTURES / component, FOLDERS[component]
    reference = _reference_tree(kind, folder, monkeypatch)
    ours_rule = transformers_param if kind in ("CLIPTextModel", "CLIPTextModelWithProjection",
                                               "T5EncoderModel") else diffusers_param
    placed = set()
    tensors = {}
    for file in sorted(folder.glob("*.safetensors")):
        tensors.update(read_safetensors(file))
    assert tensors
    for name, view in tensors.items():
        tensor = np.array(view)
        ours, theirs = ours_rule(name, tensor, reference), _theirs(kind, name, tensor, reference)
        assert ours[0] == tuple(theirs[0]), name
        assert np.array_equal(ours[1], theirs[1]) and ours[1].shape == theirs[1].shape, name
        if ours[0] in reference:
            assert ours[1].shape == tuple(reference[ours[0]].shape), name
            placed.add(ours[0])
    assert placed == set(reference)  # every parameter of the module has its tensor


@pytest.mark.parametrize(("name", "path"), [
    ("down_blocks.0.attentions.1.transformer_blocks.0.attn1.to_out.0.weight",
     ("down_blocks_0", "attentions_1", "transformer_blocks_0", "attn1", "to_out_0", "weight")),
    ("time_embedding.linear_1.bias", ("time_embedding", "linear_1", "bias")),
    ("mid_block.resnets.10.conv1.weight", ("mid_block", "resnets_10", "conv1", "weight")),
    ("conv_in.weight", ("conv_in", "weight")),
])
def test_a_list_index_joins_its_name_in_diffusers_paths(name, path):
    from diffusers.models.modeling_flax_pytorch_utils import rename_key

    assert diffusers_path(name) == path == tuple(rename_key(name).split("."))


def test_layouts_of_convolutions_dense_layers_norms_and_old_layer_norms():
    conv = np.arange(2 * 3 * 5 * 7, dtype=np.float32).reshape(2, 3, 5, 7)
    dense = np.arange(6, dtype=np.float32).reshape(2, 3)
    reference = {("norm", "scale"): None, ("norm", "bias"): None, ("emb", "embedding"): None}
    assert diffusers_param("conv.weight", conv, reference)[1].shape == (5, 7, 3, 2)
    assert diffusers_param("conv.weight", conv, reference)[0] == ("conv", "kernel")
    assert np.array_equal(transformers_param("fc.weight", dense, reference)[1], dense.T)
    assert transformers_param("norm.weight", dense, reference)[0] == ("norm", "scale")
    assert transformers_param("emb.weight", dense, reference)[0] == ("emb", "embedding")
    assert transformers_param("old.gamma", dense, reference)[0] == ("old", "weight")
    assert transformers_param("old.beta", dense, reference)[0] == ("old", "bias")
    t5_norm = {("layer_norm", "weight"): None}  # T5's own RMS norm keeps PyTorch's name
    assert transformers_param("layer_norm.weight", dense, t5_norm)[0] == ("layer_norm", "weight")
