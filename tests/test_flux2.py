"""FLUX.2 [klein] (issue #63) against diffusers 0.39's PyTorch ``Flux2KleinPipeline``: the tiny pipeline
tests/helpers/make_flux2_reference.py made and saved with diffusers' and transformers' own classes
(tests/fixtures/flux2/tiny-flux2-klein: a toy Qwen3, the transformer, the VAE with its batch-norm statistics) and what
they compute (``flux2.npz``) -- each module on fixed inputs, and the pipeline's images for the runner's own noise (seed
0 on 2 devices, 32x64, 3 steps, 40 chat tokens), distilled and as a base model with classifier-free guidance 4."""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from helpers.cli import ONE_DEVICE, assert_one_line_error, run_cli
from helpers.images import recorded_pixels

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "flux2"
FOLDER = FIXTURES / "tiny-flux2-klein"
TOLERANCE = 2 / 255
RUN = ["model=local", "model.name=tiny-flux2", "model.family=flux2", "dtype=fp32", "sampling.num_inference_steps=3",
       "sampling.height=32", "sampling.width=64", "parallelism.num_devices=2", "parallelism.per_device_batch_size=1",
       "prompts.texts=[a red cube on a table]", "prompts.max_sequence_length=40", "tracking=none",
       "metrics.clip_score.enabled=false", "seed=0"]


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "flux2.npz") as data:
        return {key: data[key] for key in data.files}


def images(run_dir: Path) -> np.ndarray:
    """The run's images in its records' order, in [0, 1]."""
    return np.stack(recorded_pixels(run_dir)).astype(np.float32) / 255


def base_copy(folder: Path) -> Path:
    """The tiny pipeline as a base (undistilled) model: its index says is_distilled false, as the base klein's do."""
    shutil.copytree(FOLDER, folder)
    index = json.loads((folder / "model_index.json").read_text())
    (folder / "model_index.json").write_text(json.dumps(dict(index, is_distilled=False)))
    return folder


def converted(component: str, module, tensors=None) -> dict:
    from sdjax_runner.families.flux.models.convert import convert_state_dict, load_safetensors

    files = sorted((FOLDER / component).glob("*.safetensors"))
    state = tensors or {k: v for f in files for k, v in load_safetensors(f).items()}
    return convert_state_dict({k: v for k, v in state.items() if k != "bn.num_batches_tracked"}, module, np.float32)


@pytest.mark.slow  # (seconds of tracing: kept out of the fast tier, whose budget is two minutes)
def test_the_tokenizer_and_qwen3_are_transformers_own(reference):
    """The chat text, its ids and mask are Qwen2TokenizerFast's (with Qwen3's template, thinking off) and every hidden
    state of the runner's Qwen3 is Qwen3ForCausalLM's (fp32, CPU) within 1e-5 of their scale."""
    from sdjax_runner.families.flux.models.convert import load_safetensors
    from sdjax_runner.models.nn.qwen3 import Qwen3TextModel, torch_names
    from sdjax_runner.models.nn.qwen_tokenizer import QwenTokenizer, chat_text

    text = chat_text(str(reference["prompt"]))
    assert text == str(reference["qwen3.text"])
    tokenizer = QwenTokenizer.from_folder(FOLDER / "tokenizer")
    encoded = tokenizer([text], padding="max_length", max_length=int(reference["max_sequence_length"]),
                        truncation=True, return_tensors="np")
    np.testing.assert_array_equal(encoded.input_ids, reference["qwen3.input_ids"])
    np.testing.assert_array_equal(encoded.attention_mask, reference["qwen3.attention_mask"])
    assert 0 < encoded.attention_mask.sum() < encoded.attention_mask.size  # padded: the mask is read
    config = json.loads((FOLDER / "text_encoder" / "config.json").read_text())
    model = Qwen3TextModel.from_config(config)
    params = converted("text_encoder", model, torch_names(load_safetensors(FOLDER / "text_encoder" / "model.safetensors")))
    wanted = tuple(range(config["num_hidden_layers"] + 1))  # the embeddings, each layer, the last one normed
    ours = np.asarray(model.apply({"params": params}, jnp.asarray(encoded.input_ids),
                                  jnp.asarray(encoded.attention_mask), wanted))[:, 0]
    theirs = reference["qwen3.hidden_states"][:, 0]
    assert ours.shape == theirs.shape
    assert np.abs(ours - theirs).max() <= 1e-5 * np.abs(theirs).max()


@pytest.mark.slow  # (seconds of tracing: kept out of the fast tier, whose budget is two minutes)
def test_the_transformer_and_the_vae_are_diffusers_own(reference):
    """Flux2Transformer2DModel's prediction (two images at two timesteps, position ids as the pipeline makes them) and
    AutoencoderKLFlux2's decode and encode on the same weights, within 1e-5 of their scale; the pipeline's ids are
    the runner's."""
    from sdjax_runner.families.flux2.engine.stages import image_ids, text_ids
    from sdjax_runner.families.flux2.models.autoencoder import FlaxFlux2AutoencoderKL
    from sdjax_runner.families.flux2.models.transformer import FlaxFlux2Transformer

    img_ids, txt_ids = reference["transformer.img_ids"][0], reference["transformer.txt_ids"][0]
    np.testing.assert_array_equal(image_ids(2, 4), img_ids)
    np.testing.assert_array_equal(text_ids(txt_ids.shape[0]), txt_ids)
    transformer = FlaxFlux2Transformer.from_config(json.loads((FOLDER / "transformer" / "config.json").read_text()))
    out = transformer.apply({"params": converted("transformer", transformer)}, reference["transformer.hidden_states"],
                            reference["transformer.encoder_hidden_states"], reference["transformer.timestep"],
                            img_ids.astype(np.float32), txt_ids.astype(np.float32))
    theirs = reference["transformer.out"]
    assert np.abs(np.asarray(out) - theirs).max() <= 1e-5 * np.abs(theirs).max()

    vae = FlaxFlux2AutoencoderKL.from_config(json.loads((FOLDER / "vae" / "config.json").read_text()))
    params = converted("vae", vae)
    np.testing.assert_array_equal(params["bn"]["running_var"], reference["vae.bn_var"])
    decoded = np.asarray(vae.apply({"params": params}, reference["vae.latents"], method=vae.decode))
    assert np.abs(decoded - reference["vae.decoded"]).max() <= 1e-5 * np.abs(reference["vae.decoded"]).max()
    mean = np.asarray(vae.apply({"params": params}, reference["vae.image"], method=vae.encode).mean)
    assert np.abs(mean.transpose(0, 3, 1, 2) - reference["vae.encoded_mean"]).max() <= 1e-5


@pytest.mark.slow  # (seconds of tracing: kept out of the fast tier, whose budget is two minutes)
def test_the_full_size_architectures_have_diffusers_parameter_counts(reference):
    """flux2-klein-4b-arch and -9b-arch: the transformer, the Qwen3 text encoder (without its LM head) and the VAE (its
    batch-norm statistics counted) have the parameter counts of diffusers' and transformers' classes at the published
    shapes (the reference maker counts them on the meta device)."""
    from flax.traverse_util import flatten_dict

    from sdjax_runner.families.flux2.models.autoencoder import FlaxFlux2AutoencoderKL
    from sdjax_runner.families.flux2.models.builtin import FLUX2_SPECS
    from sdjax_runner.families.flux2.models.transformer import FlaxFlux2Transformer
    from sdjax_runner.models.checkpoints import param_shapes
    from sdjax_runner.models.nn.qwen3 import Qwen3TextModel

    def count(module) -> int:
        return sum(int(np.prod(leaf.shape)) for leaf in flatten_dict(param_shapes(module, "diffusers")).values())

    for size in ("4b", "9b"):
        spec = FLUX2_SPECS[f"flux2-klein-{size}-arch"]
        assert count(FlaxFlux2Transformer.from_config(spec["transformer"])) == reference[f"params.{size}.transformer"]
        assert count(Qwen3TextModel.from_config(spec["qwen3"])) == reference[f"params.{size}.text_encoder"]
        assert count(FlaxFlux2AutoencoderKL.from_config(spec["vae"])) == reference["params.vae"]


@pytest.mark.slow
def test_klein_from_the_command_line_is_diffusers_pipeline_distilled_with_a_lora_and_base(tmp_path, reference):
    """The distilled folder from the command line with a LoRA in diffusers' / PEFT's layout gives Flux2KleinPipeline's
    images with it loaded by diffusers' load_lora_weights at scale 1 and the plain ones at 0 (one program); as a base
    model a guidance sweep compiles once and gives its classifier-free guidance's images at 4 and, at 1 (no guidance),
    the distilled ones."""
    lora = FIXTURES / "tiny-flux2-lora.safetensors"
    sweep = tmp_path / "lora"
    result = run_cli("-m", *RUN, f"model.pretrained_model_name_or_path={FOLDER}", f"lora=[{{path: {lora}}}]",
                     "lora.0.scale=1,0", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "lora: tiny-flux2-lora.safetensors at scale 1 merged into 6 layer(s) (transformer 6)" in result.stdout + result.stderr
    assert float(np.abs(images(sweep / "0") - reference["lora_images"]).max()) <= TOLERANCE
    assert float(np.abs(images(sweep / "1") - reference["images"]).max()) <= TOLERANCE
    assert json.loads((sweep / "1" / "timings.json").read_text())["compile_reused"] == 1  # the scale is traced
    record = json.loads((sweep / "1" / "images.json").read_text())[0]
    assert (record["family"], record["sampler"], record["steps"]) == ("flux2", "Euler", 3)

    # a LoRA in ai-toolkit's layout (BFL's names after diffusion_model.; a double block's fused q/k/v, a single block's
    # fused projections, a shared modulation), which diffusers' load_lora_weights converts itself
    result = run_cli(*RUN, f"model.pretrained_model_name_or_path={FOLDER}",
                     f"lora=[{{path: {FIXTURES / 'tiny-flux2-bfl-lora.safetensors'}}}]", "hydra.run.dir=bfl", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "merged into 7 layer(s) (transformer 7)" in result.stdout + result.stderr  # q, k, v from the fused one
    assert float(np.abs(images(tmp_path / "bfl") - reference["bfl_lora_images"]).max()) <= TOLERANCE

    # the transformer as one file in BFL's layout (the reference maker wrote it and read it back with diffusers'
    # from_single_file), here as ComfyUI saves it (model.diffusion_model. before every name), on the folder as base
    from safetensors.numpy import load_file, save_file

    tensors = load_file(FIXTURES / "tiny-flux2-klein-transformer.safetensors")
    save_file({f"model.diffusion_model.{name}": value for name, value in tensors.items()}, tmp_path / "comfy.safetensors")
    result = run_cli(*RUN, f"model.pretrained_model_name_or_path={FOLDER}", f"model.checkpoint={tmp_path / 'comfy.safetensors'}",
                     "hydra.run.dir=single", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "single") - reference["images"]).max()) <= TOLERANCE
    assert json.loads((tmp_path / "single" / "images.json").read_text())[0]["checkpoint"].startswith("comfy.safetensors")

    sweep = tmp_path / "sweep"
    result = run_cli("-m", *RUN, f"model.pretrained_model_name_or_path={base_copy(tmp_path / 'base')}",
                     "sampling.guidance_scale=4,1", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(sweep / "0") - reference["base_images"]).max()) <= TOLERANCE
    assert float(np.abs(images(sweep / "1") - reference["images"]).max()) <= TOLERANCE
    assert json.loads((sweep / "1" / "timings.json").read_text())["compile_reused"] == 1  # the scale is traced
    assert json.loads((sweep / "0" / "images.json").read_text())[0]["guidance_scale"] == 4


@pytest.mark.slow
def test_an_edit_with_a_reference_image_is_diffusers_with_the_weights_split_across_devices(tmp_path, reference):
    """mode=edit with init_image (Flux2KleinPipeline's ``image``, at the run's size) on the base model, the weights split
    across the devices (parallelism.params=sharded): diffusers' images without guidance and with guidance 4, one
    program; the records and the A1111 line name the reference image."""
    Image.fromarray(reference["edit_image"]).save(tmp_path / "reference.png")
    sweep = tmp_path / "edit"
    result = run_cli("-m", *RUN, f"model.pretrained_model_name_or_path={base_copy(tmp_path / 'base')}",
                     "sampling.height=64", "sampling.width=128", "mode=edit", f"init_image={tmp_path / 'reference.png'}",
                     "parallelism=sharded", "parallelism.params=sharded", "sampling.guidance_scale=1,4",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(sweep / "0") - reference["edit_images"]).max()) <= TOLERANCE
    assert float(np.abs(images(sweep / "1") - reference["base_edit_images"]).max()) <= TOLERANCE
    assert json.loads((sweep / "1" / "timings.json").read_text())["compile_reused"] == 1
    record = json.loads((sweep / "1" / "images.json").read_text())[0]
    assert record["mode"] == "edit" and record["init_image"].endswith("reference.png")
    assert "Edit image: " in Image.open(sweep / "1" / record["file"]).text["parameters"]

    # two reference images (the pipeline's image list): the second's tokens at time coordinate 20
    Image.fromarray(reference["second_image"]).save(tmp_path / "second.png")
    result = run_cli(*RUN, f"model.pretrained_model_name_or_path={FOLDER}", "sampling.height=64", "sampling.width=128",
                     "mode=edit", f"init_image={tmp_path / 'reference.png'}",
                     f"reference_images=[{tmp_path / 'second.png'}]", "hydra.run.dir=two", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "two") - reference["two_reference_images"]).max()) <= TOLERANCE
    record = json.loads((tmp_path / "two" / "images.json").read_text())[0]
    assert record["reference_images"] == "second.png"
    assert "Reference images: second.png" in Image.open(tmp_path / "two" / record["file"]).text["parameters"]


@pytest.mark.slow
def test_inpainting_is_diffusers_klein_inpaint_pipeline(tmp_path, reference):
    """mode=inpaint (diffusers' Flux2KleinInpaintPipeline: the image noised to strength 0.6's start, read as a
    reference too, blended back outside the mask resized bilinearly to the tokens) on the base model: its images
    without guidance and with guidance 4, one program."""
    Image.fromarray(reference["edit_image"]).save(tmp_path / "image.png")
    Image.fromarray(reference["inpaint_mask"]).save(tmp_path / "mask.png")
    sweep = tmp_path / "inpaint"
    result = run_cli("-m", *RUN, f"model.pretrained_model_name_or_path={base_copy(tmp_path / 'base')}",
                     "sampling.height=64", "sampling.width=128", "mode=inpaint", f"init_image={tmp_path / 'image.png'}",
                     f"mask_image={tmp_path / 'mask.png'}", f"strength={float(reference['inpaint_strength'])}",
                     "sampling.guidance_scale=1,4", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(sweep / "0") - reference["inpaint_images"]).max()) <= TOLERANCE
    assert float(np.abs(images(sweep / "1") - reference["base_inpaint_images"]).max()) <= TOLERANCE
    assert json.loads((sweep / "1" / "timings.json").read_text())["compile_reused"] == 1

    # with a reference image beside (the pipeline's image_reference, time coordinate 20), distilled
    Image.fromarray(reference["second_image"]).save(tmp_path / "second.png")
    result = run_cli(*RUN, f"model.pretrained_model_name_or_path={FOLDER}", "sampling.height=64", "sampling.width=128",
                     "mode=inpaint", f"init_image={tmp_path / 'image.png'}", f"mask_image={tmp_path / 'mask.png'}",
                     f"strength={float(reference['inpaint_strength'])}", f"reference_images={tmp_path / 'second.png'}",
                     "hydra.run.dir=referenced", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "referenced") - reference["inpaint_reference_images"]).max()) <= TOLERANCE


@pytest.mark.slow
def test_the_smoke_experiment_and_a_k_sampler_run_on_the_builtin_model(tmp_path):
    """``+experiment=flux2_smoke`` on the built-in tiny model, with FLUX.1's flow k samplers on FLUX.2's shift: the
    Euler images and DPM++ 2M's differ, both finite and not flat, recorded as FLUX.2's; a rerun gives the same images
    and from_png remakes one from its PNG (the chat length given again: no infotext carries it, as for FLUX.1's T5)."""
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=flux2_smoke", *ONE_DEVICE, "sampler=euler,dpmpp_2m", "tracking=none",
                     "metrics.clip_score.enabled=false", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    euler, dpm = images(sweep / "0"), images(sweep / "1")
    assert euler.shape == dpm.shape == (8, 32, 32, 3)
    assert min(float(euler.std()), float(dpm.std())) > 0.01
    assert np.abs(euler - dpm).max() > 0.01
    records = json.loads((sweep / "1" / "images.json").read_text())
    assert {(r["family"], r["model"], r["sampler"]) for r in records} == {("flux2", "tiny-random-flux2", "DPM++ 2M")}
    result = run_cli(str(sweep / "1"), command="rerun", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "rerun: identical -- all 8 image(s) match" in result.stdout + result.stderr
    png = sweep / "1" / records[0]["file"]
    assert "CFG scale: 1," in Image.open(png).text["parameters"]  # no guidance, as A1111 and Forge write it
    result = run_cli(str(png), *ONE_DEVICE, "prompts.max_sequence_length=48", "tracking=none",
                     "metrics.clip_score.enabled=false", "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    remade = json.loads((tmp_path / "from_png" / "images.json").read_text())[0]
    assert (remade["pixels_sha256"], remade["sampler"]) == (records[0]["pixels_sha256"], "DPM++ 2M")


@pytest.mark.slow
@pytest.mark.parametrize(("overrides", "expected"), [
    (["sampling.guidance_scale=3"], "error: sampling.guidance_scale: 3, but tiny-flux2 is a distilled FLUX.2 [klein]"),
    (["prompts.negative=blurry"], "error: prompts.negative: given, but tiny-flux2 is a distilled FLUX.2 [klein]"),
    (["prompts.syntax=a1111"], "error: prompts.syntax: a1111:"),
])
def test_what_a_distilled_klein_does_not_read_is_one_line(tmp_path, overrides, expected):
    result = run_cli(*RUN, f"model.pretrained_model_name_or_path={FOLDER}", *overrides, "hydra.run.dir=run",
                     cwd=tmp_path, process=True)
    assert_one_line_error(result, expected)
    assert not (tmp_path / "run" / "images.json").exists()


@pytest.mark.slow
def test_reference_images_on_a_family_that_reads_none_are_one_line(tmp_path):
    """reference_images with FLUX.1 Kontext's edit (which reads its init image alone) is one line before anything
    loads; with a mode that reads none (txt2img) it is said and the run goes on (config/modes.check's rule)."""
    init = Path(__file__).resolve().parent.parent / "examples" / "init.png"
    result = run_cli("+experiment=kontext_smoke", f"init_image={init}", f"reference_images=[{init}]",
                     "hydra.run.dir=run", cwd=tmp_path, process=True)
    assert_one_line_error(result, "error: reference_images: given, but tiny-random-flux-kontext is a FLUX.1")
    assert not (tmp_path / "run" / "images.json").exists()


def test_a_flux2_images_infotext_reads_back_with_its_edit_and_reference_images_said():
    """A FLUX.2 edit's A1111 line (as record/rundir.py writes it) read by from_png's reading: the family from its
    model, CFG scale 1 as guidance 1 (none, on a distilled model), the edit mode where init_image is given, and its more
    reference images said -- a line cannot give their files."""
    from sdjax_runner.config import infotext

    line = ("a red cube\nSteps: 4, Sampler: Euler, CFG scale: 1, Seed: 3, Size: 64x32, Model: tiny-random-flux2, "
            'Dtype: float32, Batch: 0, Device: 0, Edit image: init.png, Reference images: "b.png, c.png"')
    info = infotext.parse(line)
    out = infotext.overrides(info, ("tiny-random-flux2",), ("fp32",), has_init_image=True)
    assert {"mode=edit", "sampling.guidance_scale=1.0", "seed=3", "model=tiny-random-flux2"} <= set(out.overrides)
    assert any(said.startswith("Reference images: ") and "give reference_images=[PATH, ...]" in said
               for said in out.not_honoured), out.not_honoured
    assert "Prompt: read as written (FLUX.2 reads no A1111 emphasis)" in out.honoured


@pytest.mark.parametrize(("blocks", "expected"), [((5, 20), "flux2-klein"), ((8, 24), "flux2-klein-9b"),
                                                  ((1, 2), "flux2-klein"), ((8, 48), "error")])
def test_a_flux2_single_file_is_told_by_its_blocks(blocks, expected):
    """BFL-layout FLUX.2 files (the shared modulation's key, with or without ComfyUI's prefix): klein 9B by its
    blocks, any other klein (4B's, a base folder's own shape) as klein, FLUX.2 [dev] (48 single blocks, a Mistral
    text encoder) one line; a FLUX.1 file is not FLUX.2's, nor FLUX.2's FLUX.1's."""
    from sdjax_runner.errors import UserError
    from sdjax_runner.families.flux.config import architecture_of as flux1_architecture
    from sdjax_runner.families.flux2.config import architecture_of

    for prefix in ("", "model.diffusion_model."):
        keys = frozenset({f"{prefix}single_stream_modulation.lin.weight", f"{prefix}img_in.weight"}
                         | {f"{prefix}double_blocks.{i}.img_attn.qkv.weight" for i in range(blocks[0])}
                         | {f"{prefix}single_blocks.{i}.linear1.weight" for i in range(blocks[1])})
        assert flux1_architecture(keys) is None
        if expected == "error":
            with pytest.raises(UserError, match=re.escape("FLUX.2 [dev] transformer")):
                architecture_of(keys, "flux2-dev.safetensors")
        else:
            assert architecture_of(keys, "x.safetensors") == expected
    flux1 = frozenset({"double_blocks.0.img_mod.lin.weight", "single_blocks.0.linear1.weight"})
    assert architecture_of(flux1) is None and flux1_architecture(flux1) == "flux-schnell"
