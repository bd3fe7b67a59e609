"""Single-file checkpoints without torch: the original LDM layout of SD 1.x (CLIP), SD 2.x (OpenCLIP)
and SDXL, converted tensor by tensor, give exactly the weights -- and so the images -- of the same
model in diffusers format; the records name the file and its hash; bad files are one line."""

import hashlib
import json
import os
import sys

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, run_cli
from helpers.configs import compose_cfg
from helpers.images import images_of
from helpers.ldm_layout import PUBLISHED_SD15, PUBLISHED_SDXL, ldm_state, write_single_file
from helpers.params import assert_same_params

pytestmark = pytest.mark.slow

KEY = "error: model.checkpoint:"


def _zero_strided(shape):
    """An array of ``shape`` that takes no memory: full-size architectures, names and shapes only."""
    return np.lib.stride_tricks.as_strided(np.zeros(1, np.int8), shape, (0,) * len(shape))


@pytest.mark.parametrize("name,published", [("sd-v1-arch", PUBLISHED_SD15), ("sdxl-arch", PUBLISHED_SDXL)])
def test_every_parameter_of_the_full_size_architecture_comes_from_exactly_one_checkpoint_tensor(name, published):
    import jax
    from flax.traverse_util import flatten_dict

    from sdjax_runner.config import weight_files
    from sdjax_runner.families.sd.models.builtin import SPECS, architecture
    from sdjax_runner.models import single_file
    from sdjax_runner.models.nn.pytorch_names import PARAM_RULES

    _, shapes = architecture(name)
    layers = SPECS[name]["unet"]["layers_per_block"]
    params = {c: jax.tree_util.tree_map(lambda s: _zero_strided(s.shape), tree) for c, tree in shapes.items()}
    state = ldm_state(params, layers, 4, SPECS[name]["xl"], cast=False)
    # The helper writes what the published files hold, and the runner puts it where diffusers does.
    for key, (shape, diffusers_name) in published.items():
        assert state[key].shape == shape, key
        assert single_file.renamed(key, layers, 4)[1][0][0] == diffusers_name
    checkpoint = weight_files.Checkpoint(None, "", tuple(state), layers, 4)
    assert single_file.unrecognised(checkpoint) == []
    found = {c: {} for c in shapes}
    for key, value in state.items():
        component, names = single_file.renamed(key, layers, 4)
        reference = flatten_dict(shapes[component])
        library = "diffusers" if component in ("unet", "vae") else "transformers"
        for pt_name, transform in names:
            flax_key, array = PARAM_RULES[library](pt_name, transform(value), reference)
            assert flax_key not in found[component], flax_key  # no parameter written twice
            found[component][flax_key] = array.shape
    for component, tree in shapes.items():
        assert found[component] == {k: v.shape for k, v in flatten_dict(tree).items()}, component


def _load(overrides):
    from sdjax_runner.models.loaders import load_model

    cfg = compose_cfg(overrides)
    return load_model(cfg.model, cfg.dtype)


@pytest.mark.parametrize("fixture,model,open_clip", [("tiny_model_dir", "tiny-random", False),
                                                      ("tiny_model_dir", "tiny-random", True),
                                                      ("tiny_xl_dir", "tiny-random-xl", False)],
                         ids=["sd1-clip", "sd2-openclip", "sdxl"])
def test_single_file_weights_are_the_diffusers_weights(tmp_path, request, fixture, model, open_clip):
    model_dir = request.getfixturevalue(fixture)
    checkpoint = write_single_file(model_dir, tmp_path / "model.safetensors", open_clip_text=open_clip,
                                   dtype=np.float32)
    native = _load([f"model={model}"])
    converted = _load([f"model={model}", f"model.checkpoint={checkpoint}"])
    assert "torch" not in sys.modules
    assert set(converted.formats.values()) == {"single_file"}
    assert converted.host_weights.keys() == native.host_weights.keys()
    for name in native.host_weights:
        assert_same_params(converted.host_weights[name], native.host_weights[name])
    half = _load([f"model={model}", f"model.checkpoint={write_single_file(model_dir, tmp_path / 'h.safetensors')}",
                  "dtype=bf16"])  # an fp16 file, cast to the weights dtype while it is read
    assert {leaf.dtype.name for leaf in half.host_weights["unet"]["conv_in"].values()} == {"bfloat16"}
    if fixture == "tiny_model_dir" and not open_clip:  # a file replaced after the plan hashed it: not run
        from sdjax_runner.errors import UserError
        from sdjax_runner.files import file_sha256
        from sdjax_runner.models.loaders import load_model

        cfg = compose_cfg([f"model={model}", f"model.checkpoint={checkpoint}"])
        planned = file_sha256(checkpoint)
        assert load_model(cfg.model, cfg.dtype, planned).formats
        replacement = write_single_file(model_dir, tmp_path / "other.safetensors")  # fp16: other bytes
        os.replace(replacement, checkpoint)
        with pytest.raises(UserError, match=f"model.checkpoint: {checkpoint} changed since the run was planned "
                                            f"\\(sha256 {planned[:12]} -> "):
            load_model(cfg.model, cfg.dtype, planned)


def test_a_checkpoint_run_makes_the_models_images_and_names_the_file(smoke_run, tmp_path, tiny_model_dir):
    _, plain_dir, _ = smoke_run
    sd1 = write_single_file(tiny_model_dir, tmp_path / "fine-tune.safetensors", dtype=np.float32,
                            extra={"some_extension.weight": np.zeros(3, np.float32)})
    sd2 = write_single_file(tiny_model_dir, tmp_path / "openclip.safetensors", open_clip_text=True, dtype=np.float32)
    sweep = tmp_path / "sweep"
    # Stored executables off: this counts what the process itself compiles (test_warm_start covers them).
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "compilation_cache.executables=false", f"model.checkpoint={sd1},{sd2}",
                     "compilation_cache.executables=false", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    timings = [json.loads((sweep / job / "timings.json").read_text()) for job in ("0", "1")]
    assert [t["process_model_loads"] for t in timings] == [1, 2]  # the weights differ ...
    assert [t["process_compiles"] for t in timings] == [1, 1]  # ... the program does not: compiled once
    # Unknown tensors are named once; the training leftovers every checkpoint has are not noise.
    output = (result.stdout + result.stderr).splitlines()
    warnings = [line for line in output if "are not weights of this pipeline" in line]
    assert len(warnings) == 1 and "1 tensor(s) of fine-tune.safetensors" in warnings[0]
    assert "some_extension.weight" in warnings[0] and "alphas_cumprod" not in warnings[0]
    assert any("single-file checkpoint converted: text_encoder, unet, vae" in line for line in output)
    plain = images_of(plain_dir)
    for job, path in (("0", sd1), ("1", sd2)):
        assert all(np.array_equal(a, b) for a, b in zip(plain, images_of(sweep / job), strict=True))
        sha = hashlib.sha256(path.read_bytes()).hexdigest()
        record = json.loads((sweep / job / "images.json").read_text())[0]
        assert record["checkpoint"] == f"{path.name}:sha256={sha[:12]}"
        config = (sweep / job / ".hydra" / "overrides.yaml").read_text()
        assert str(path) in config
        with Image.open(sweep / job / record["file"]) as image:
            assert f"Checkpoint: {path.name}:sha256={sha[:12]}" in image.text["parameters"]


def test_bad_checkpoints_are_one_line(tmp_path, tiny_model_dir, tiny_xl_dir):
    pickle = tmp_path / "model.ckpt"
    pickle.write_bytes(b"not loaded: a pickle would run code")
    result = run_cli("+experiment=smoke", "tracking=none", f"model.checkpoint={pickle}", cwd=tmp_path)
    assert_one_line_error(result, f"{KEY} model.ckpt is not a .safetensors file; pickle checkpoints")
    garbage = tmp_path / "garbage.safetensors"
    garbage.write_bytes(b"\xff" * 64)
    result = run_cli("+experiment=smoke", "tracking=none", f"model.checkpoint={garbage}", cwd=tmp_path)
    assert_one_line_error(result, f"{KEY} garbage.safetensors: not a readable safetensors file")
    lora_like = tmp_path / "lora.safetensors"
    from safetensors.numpy import save_file

    save_file({"lora_unet_x.lora_down.weight": np.zeros((2, 2), np.float32)}, str(lora_like))
    result = run_cli("+experiment=smoke", "tracking=none", f"model.checkpoint={lora_like}", cwd=tmp_path)
    assert_one_line_error(result, f"{KEY} lora.safetensors has no tensors of a model this runner runs")
    result = run_cli("+experiment=smoke", "tracking=none", "model=single_file", cwd=tmp_path)
    assert_one_line_error(result, f"{KEY} a value is required")
    # An SDXL file on an SD 1.x base: the first tensor that does not fit is named.
    xl = write_single_file(tiny_xl_dir, tmp_path / "xl.safetensors")
    result = run_cli("+experiment=smoke", "tracking=none", f"model.checkpoint={xl}", cwd=tmp_path)
    assert_one_line_error(result, f"{KEY} does not fit the base model")
    # No base given and the standard one not cached offline: the command that fetches just its configs.
    sd1 = write_single_file(tiny_model_dir, tmp_path / "sd1.safetensors")
    result = run_cli("+experiment=smoke", "tracking=none", "model=single_file", f"model.checkpoint={sd1}",
                     cwd=tmp_path, env={"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")})
    assert_one_line_error(result, "error: model.pretrained_model_name_or_path: stable-diffusion-v1-5/"
                                  "stable-diffusion-v1-5 is not in the local Hugging Face cache")
    assert "hf download stable-diffusion-v1-5/stable-diffusion-v1-5 --include 'model_index.json'" in result.stderr
