"""SD 3 / 3.5 through the command line, against diffusers 0.39's PyTorch ``StableDiffusion3Pipeline``: the tiny
pipeline tests/helpers/make_sd3_reference.py made and saved with diffusers' own classes
(tests/fixtures/sd3/tiny-sd3: SD 3.5 Medium's shape, CLIP-L, CLIP-G and T5) and diffusers' images for the runner's
own initial latents (``pipeline.npz``: seed 0 on 2 devices, 32x32, 4 steps, guidance 5, 32 T5 tokens). The runner's
PNGs must be within 2/255 of them -- with classifier-free guidance and diffusers' default empty negative prompt,
with a negative prompt, at guidance 1 (no unconditional pass in diffusers), and from a folder without T5."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import run_cli

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sd3"
TOLERANCE = 2 / 255
RUN = ["dtype=fp32", "sampling.num_inference_steps=4", "sampling.height=32", "sampling.width=32",
       "parallelism.num_devices=2", "prompts.texts=[a red cube on a table]", "prompts.max_sequence_length=32",
       "tracking=none", "metrics.clip_score.enabled=false", "seed=0"]


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "pipeline.npz") as data:
        return {key: data[key] for key in data.files}


def images(run_dir: Path) -> np.ndarray:
    records = json.loads((run_dir / "images.json").read_text())
    return np.stack([np.asarray(Image.open(run_dir / r["file"]), np.float32) / 255 for r in records])


def local(folder: Path) -> list[str]:
    return ["model=local", f"model.pretrained_model_name_or_path={folder}"]


def without_t5(folder: Path) -> Path:
    """A copy of tiny-sd3 at ``folder`` without T5, its index saying so as diffusers writes it."""
    shutil.copytree(FIXTURES / "tiny-sd3", folder)
    shutil.rmtree(folder / "text_encoder_3")
    shutil.rmtree(folder / "tokenizer_3")
    index = json.loads((folder / "model_index.json").read_text())
    index["text_encoder_3"] = index["tokenizer_3"] = [None, None]
    (folder / "model_index.json").write_text(json.dumps(index))
    return folder


def test_a_guidance_sweep_gives_diffusers_images_and_compiles_once(tmp_path, reference):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *local(FIXTURES / "tiny-sd3"), *RUN, "sampling.guidance_scale=5,1",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for job, name in (("0", "default"), ("1", "no_cfg")):
        ours = images(sweep / job)
        assert ours.shape == reference[f"{name}_images"].shape
        assert float(np.abs(ours - reference[f"{name}_images"]).max()) <= TOLERANCE, name
    timings = json.loads((sweep / "1" / "timings.json").read_text())
    assert timings["compile_reused"] == 1 and timings["process_compiles"] <= 1  # guidance is a traced input
    records = json.loads((sweep / "0" / "images.json").read_text())
    assert records[0]["guidance_scale"] == 5 and records[0]["sampler"] == "Euler"


def test_a_negative_prompt_gives_diffusers_images(tmp_path, reference):
    result = run_cli(*local(FIXTURES / "tiny-sd3"), *RUN, "sampling.guidance_scale=5", "prompts.negative=blurry",
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "run") - reference["negative_images"]).max()) <= TOLERANCE


def test_a_folder_without_t5_runs_without_it_as_diffusers_does(tmp_path, reference):
    folder = without_t5(tmp_path / "no-t5")
    result = run_cli(*local(folder), *RUN, "sampling.guidance_scale=5", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "run") - reference["no_t5_images"]).max()) <= TOLERANCE
    assert float(np.abs(reference["no_t5_images"] - reference["default_images"]).max()) > 10 / 255  # T5 mattered


def test_model_t5_false_runs_a_folder_with_t5_without_it_as_diffusers_does(tmp_path, reference):
    """diffusers' ``text_encoder_3=None`` by a key (round five: only a hand-edited folder did it): the images of the
    folder without T5, the plan line and inputs.json's components saying T5 did not run."""
    result = run_cli(*local(FIXTURES / "tiny-sd3"), *RUN, "sampling.guidance_scale=5", "model.t5=false",
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "plan: without T5 (model.t5=false)" in result.stdout
    assert float(np.abs(images(tmp_path / "run") - reference["no_t5_images"]).max()) <= TOLERANCE
    components = json.loads((tmp_path / "run" / "inputs.json").read_text())["model"]["components"]
    assert components == ["text_encoder", "text_encoder_2", "transformer", "vae"]


def test_skip_layer_guidance_gives_diffusers_images(tmp_path, reference):
    # diffusers: skip_guidance_layers=[1], scale 2.8, start 0.01, stop 0.6 -> steps 1 and 2 of 4
    result = run_cli(*local(FIXTURES / "tiny-sd3"), *RUN, "sampling.guidance_scale=5", "guider=skip_layer",
                     "guider.layers=[1]", "guider.skip_stop=0.6", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    ours = images(tmp_path / "run")
    assert float(np.abs(ours - reference["slg_images"]).max()) <= TOLERANCE
    assert float(np.abs(reference["slg_images"] - reference["default_images"]).max()) > 10 / 255  # SLG mattered


def test_the_smoke_experiment_records_sd3s_settings_and_its_png_remakes_its_image(tmp_path, cache_dir):
    """Skip-layer guidance as a guider: a sweep over its scale compiles once, and scale 0 is classifier-free
    guidance's images bit for bit; the records, the A1111 line and from_png carry it."""
    quiet = ["tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}"]
    result = run_cli("-m", "+experiment=sd3_smoke", "guider=skip_layer", "guider.layers=[1]", "guider.skip_stop=0.6",
                     "guider.scale=2.8,0", *quiet, "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {json.loads((job / "images.json").read_text())[0]["guider_settings"]: job
            for job in (tmp_path / "sweep").glob("[0-9]")}
    assert sorted(jobs) == ["scale=0 skip_start=0.01 skip_stop=0.6", "scale=2.8 skip_start=0.01 skip_stop=0.6"]
    run = jobs["scale=2.8 skip_start=0.01 skip_stop=0.6"]
    reused = sorted(json.loads((job / "timings.json").read_text())["compile_reused"] for job in jobs.values())
    assert reused == [0, 1]  # the scale (and the window) are traced inputs
    plain = run_cli("+experiment=sd3_smoke", *quiet, "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    hashes = {name: [r["pixels_sha256"] for r in json.loads((job / "images.json").read_text())]
              for name, job in (("zero", jobs["scale=0 skip_start=0.01 skip_stop=0.6"]), ("plain", tmp_path / "plain"),
                                ("skip", run))}
    assert hashes["zero"] == hashes["plain"] != hashes["skip"]
    records = json.loads((run / "images.json").read_text())
    assert len(records) == 8 and records[0]["family"] == "sd3" and records[0]["shift"] == 3.0
    assert records[0]["guider"] == "skip_layer" and records[0]["guider_layers"] == ["1"]
    timings = json.loads((run / "timings.json").read_text())
    assert timings["flops_per_batch"] > 0
    png = run / records[0]["file"]
    with Image.open(png) as image:
        parameters = image.text["parameters"]
    assert ('Guider: skip_layer, Guider scale: 2.8, Guider skip_start: 0.01, Guider skip_stop: 0.6, Guider layers: 1'
            in parameters and "Shift: 3.0" in parameters)
    assert "CFG scale: 5.0" in parameters and "Model: tiny-random-sd3" in parameters
    remade = run_cli(str(png), *quiet, "parallelism.host_device_count=8", "prompts.max_sequence_length=16",
                     "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    assert "Guider: skip_layer -> guider=skip_layer" in said and "Guider layers: 1 -> guider.layers=['1']" in said
    assert "prompts.syntax=a1111" not in said
    assert "not honoured: Shift: 3.0: the model's scheduler config sets it" in said
    again = json.loads((tmp_path / "from_png" / "images.json").read_text())[0]
    assert again["pixels_sha256"] == records[0]["pixels_sha256"]
    rerun = run_cli(str(run), command="rerun", cwd=tmp_path)  # its recorded config names the cache
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    assert "rerun: identical -- all 8 image(s) match" in rerun.stdout + rerun.stderr


def test_a_flow_k_sampler_runs_on_sd3(tmp_path, cache_dir):
    quiet = ["tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}"]
    result = run_cli("+experiment=sd3_smoke", *quiet, "sampler=dpmpp_2m", "scheduler=karras", "hydra.run.dir=run",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads((tmp_path / "run" / "images.json").read_text())
    assert records[0]["sampler"] == "DPM++ 2M" and records[0]["schedule_type"] == "Karras"
    assert np.asarray(Image.open(tmp_path / "run" / records[0]["file"])).std() > 0


def test_skip_layer_guidance_beyond_the_transformers_blocks_is_one_line(tmp_path, cache_dir):
    from helpers.cli import assert_one_line_error

    result = run_cli("+experiment=sd3_smoke", "guider=skip_layer", "guider.layers=[3]", "guider.skip_stop=0.6",
                     "tracking=none", f"paths.cache_dir={cache_dir}", cwd=tmp_path)  # (a window holding steps)
    assert_one_line_error(result, "error: guider.layers: [3]: tiny-random-sd3's transformer has 3 blocks (0..2)")


def test_the_sharded_path_with_split_weights_gives_the_pmap_images_bit_for_bit(tmp_path, cache_dir):
    quiet = ["tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}"]
    for name, extra in (("pmap", []), ("sharded", ["parallelism=sharded", "parallelism.params=sharded"])):
        result = run_cli("+experiment=sd3_smoke", *quiet, *extra, f"hydra.run.dir={name}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
    hashes = {name: [r["pixels_sha256"] for r in json.loads((tmp_path / name / "images.json").read_text())]
              for name in ("pmap", "sharded")}
    assert len(hashes["pmap"]) == 8 and hashes["pmap"] == hashes["sharded"]


def test_a_single_file_transformer_in_stabilitys_layout_loads_onto_its_base(tmp_path, reference):
    # tiny-sd3's transformer in sd3.5_medium.safetensors' layout (model.diffusion_model.joint_blocks.*, a CLIP
    # tensor beside it), which diffusers' own from_single_file loads back to the same weights.
    from sdjax_runner.config.families import open_checkpoint

    single = FIXTURES / "tiny-sd3-transformer.safetensors"
    assert open_checkpoint(single).architecture == "sd3.5-medium"
    result = run_cli(*local(FIXTURES / "tiny-sd3"), f"model.checkpoint={single}", *RUN, "sampling.guidance_scale=5",
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "run") - reference["default_images"]).max()) <= TOLERANCE
    records = json.loads((tmp_path / "run" / "images.json").read_text())
    assert records[0]["checkpoint"].startswith("tiny-sd3-transformer.safetensors:sha256=")


def test_a_single_file_with_the_text_encoders_and_vae_inside_gives_diffusers_images(tmp_path):
    # tiny-sd3 as one file with everything inside (the MMDiT in Stability's layout, CLIP-L, CLIP-G and T5 under
    # text_encoders.*, the VAE under first_stage_model.), its text encoders and VAE perturbed from the folder's:
    # diffusers' StableDiffusion3Pipeline.from_single_file reads them (CLIP-L's projection the identity) and made
    # single_file.npz's images. Ours must be those, not the base folder's.
    from sdjax_runner.config.families import open_checkpoint
    from sdjax_runner.families.sd3.config import components_inside

    single = FIXTURES / "tiny-sd3-all-in-one.safetensors"
    checkpoint = open_checkpoint(single)
    assert checkpoint.architecture == "sd3.5-medium"
    assert components_inside(checkpoint.keys) == ("text_encoder", "text_encoder_2", "text_encoder_3", "vae")
    with np.load(FIXTURES / "single_file.npz") as data:
        expected, latents = data["images"], data["latents"]
    with np.load(FIXTURES / "pipeline.npz") as data:
        assert np.array_equal(latents, data["latents"])  # the runner's noise, as for the folder's images
        assert float(np.abs(expected - data["default_images"]).max()) > 10 / 255  # the file's components matter
    result = run_cli(*local(FIXTURES / "tiny-sd3"), f"model.checkpoint={single}", *RUN, "sampling.guidance_scale=5",
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "run") - expected).max()) <= TOLERANCE
    assert ("single-file checkpoint converted: text_encoder, text_encoder_2, text_encoder_3, transformer, vae"
            in result.stderr + result.stdout)


def test_a_single_files_t5_without_a_t5_in_the_base_is_said_and_left_unread(tmp_path):
    folder = without_t5(tmp_path / "no-t5")
    single = FIXTURES / "tiny-sd3-all-in-one.safetensors"
    result = run_cli(*local(folder), f"model.checkpoint={single}", *RUN, "sampling.guidance_scale=5",
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stderr + result.stdout
    assert "tiny-sd3-all-in-one.safetensors holds a T5 encoder, which is not read" in out
    assert "single-file checkpoint converted: text_encoder, text_encoder_2, transformer, vae" in out
    assert len(json.loads((tmp_path / "run" / "images.json").read_text())) == 2


def test_a_single_files_components_that_do_not_fit_are_one_line(tmp_path):
    from safetensors.numpy import load_file, save_file

    from helpers.cli import assert_one_line_error

    tensors = load_file(FIXTURES / "tiny-sd3-all-in-one.safetensors")
    broken = tmp_path / "broken.safetensors"
    save_file({k: v for k, v in tensors.items()
               if k != "text_encoders.clip_g.transformer.text_model.final_layer_norm.weight"}, broken)
    result = run_cli(*local(FIXTURES / "tiny-sd3"), f"model.checkpoint={broken}", *RUN, "hydra.run.dir=run",
                     cwd=tmp_path)
    assert_one_line_error(result, "error: model.checkpoint: does not fit the base model")
    assert "broken.safetensors (text_encoder_2)" in result.stderr and "final_layer_norm" in result.stderr
    strange = tmp_path / "strange.safetensors"
    save_file(dict(tensors, **{"first_stage_model.decoder.extra.weight": np.zeros(3, np.float32)}), strange)
    result = run_cli(*local(FIXTURES / "tiny-sd3"), f"model.checkpoint={strange}", *RUN, "hydra.run.dir=run2",
                     cwd=tmp_path)
    assert_one_line_error(result, "error: model.checkpoint: does not fit the base model")
    assert "first_stage_model.decoder.extra.weight is no tensor of a VAE in the original (LDM) layout" in result.stderr


def test_an_sd3_lora_gives_diffusers_images_and_a_scale_sweep_compiles_once(tmp_path, reference):
    # tiny-sd3-lora.safetensors: diffusers' / PEFT's layout (transformer.*, text_encoder.*, text_encoder_2.*);
    # lora.npz: tiny-sd3's images with it loaded by diffusers' own load_lora_weights (peft).
    adapter = FIXTURES / "tiny-sd3-lora.safetensors"
    with np.load(FIXTURES / "lora.npz") as data:
        expected = data["images"]
        assert np.array_equal(data["latents"], reference["latents"])
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *local(FIXTURES / "tiny-sd3"), *RUN, "sampling.guidance_scale=5",
                     f"lora=[{{path: {adapter}}}]", "lora.0.scale=1,0", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(sweep / "0") - expected).max()) <= TOLERANCE
    assert float(np.abs(images(sweep / "1") - reference["default_images"]).max()) <= TOLERANCE  # scale 0: the model
    assert float(np.abs(expected - reference["default_images"]).max()) > 10 / 255
    timings = [json.loads((sweep / job / "timings.json").read_text()) for job in ("0", "1")]
    assert timings[1]["compile_reused"] == 1  # the scale is an input: one program
    assert ("lora: tiny-sd3-lora.safetensors at scale 1 merged into 6 layer(s) (text_encoder 1, text_encoder_2 1, "
            "transformer 4)") in result.stdout + result.stderr
