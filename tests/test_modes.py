"""img2img, inpainting and ControlNet, run as users run them (the CLI in a subprocess, images read from disk),
against diffusers 0.39's own Flax pipelines for the same model, inputs and seed -- and the ordinary-model
inpainting, which diffusers' Flax code lacks, against what blending must give at its two ends."""

from __future__ import annotations

import json
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.configs import compose_cfg
from helpers.flax_references import folder_digest, reference
from helpers.images import images_of
from helpers.published import write_published
from sdjax_runner.files import file_sha256

SIZE = 64
SEED = 0


def smooth_image(seed: int) -> np.ndarray:
    """A 64 x 64 RGB picture with structure at several scales (not white noise)."""
    rng = np.random.default_rng(seed)
    low = rng.random((8, 8, 3))
    image = np.asarray(Image.fromarray((low * 255).astype(np.uint8)).resize((SIZE, SIZE), Image.Resampling.BICUBIC))
    return np.clip(image.astype(int) + rng.integers(-20, 20, image.shape), 0, 255).astype(np.uint8)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("inputs")
    Image.fromarray(smooth_image(1)).save(folder / "init.png")
    mask = np.zeros((SIZE, SIZE), np.uint8)
    mask[16:48, 8:40] = 255  # white repaints
    Image.fromarray(mask).save(folder / "mask.png")
    # The same mask as A1111's inpaint sketch hands one over: painted (opaque) where it repaints, transparent
    # elsewhere, the colour of no account (create_binary_mask reads the alpha).
    painted = np.zeros((SIZE, SIZE, 4), np.uint8)
    painted[..., :3] = (200, 30, 30)
    painted[..., 3] = np.where(mask > 0, 255, 0)
    Image.fromarray(painted, "RGBA").save(folder / "painted_mask.png")
    Image.fromarray(np.full((SIZE, SIZE), 255, np.uint8)).save(folder / "white.png")
    Image.fromarray(np.zeros((SIZE, SIZE), np.uint8)).save(folder / "black.png")
    edges = np.zeros((SIZE, SIZE, 3), np.uint8)
    edges[::8], edges[:, ::8] = 255, 255  # a canny-like line map
    Image.fromarray(edges).save(folder / "control.png")
    return {name: folder / f"{name}.png" for name in ("init", "mask", "painted_mask", "white", "black", "control")}


def smoke_prompt() -> tuple[str, float, int]:
    """The smoke experiment's prompt, guidance and steps, as the runner reads them (the family's default guidance
    where the config leaves it null)."""
    from sdjax_runner.config.families import guidance
    from sdjax_runner.config.plan import admit

    config = admit(compose_cfg(["+experiment=smoke"]))
    return config.prompts.texts[0], guidance(config), int(config.sampling.num_inference_steps)


def sweep(tmp_path: Path, *overrides: str) -> list[Path]:
    """A multirun in one process; its job directories in job order, each run checked to have finished."""
    tmp_path.mkdir(parents=True, exist_ok=True)
    # Stored executables off: the jobs' process_compiles count what this process compiles, whatever other
    # tests stored in the shared cache before.
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "compilation_cache.executables=false", *overrides,
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = sorted((p for p in (tmp_path / "sweep").iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    return jobs


def as_uint8(images) -> list[np.ndarray]:
    images = np.asarray(images)
    images = images.reshape((-1,) + images.shape[-3:])
    return [np.asarray(image) for image in ((images * 255).round().astype("uint8"))]


def assert_matches(got: list[np.ndarray], expected: list[np.ndarray], exact: bool = True) -> None:
    """Pixel for pixel, or (``exact=False``) within one level (1/255) with at least 99% of the values equal:
    float rounding, where the programs differ in how XLA compiles them (a start step that is a traced number
    makes the denoising loop a while loop; diffusers' own is a fixed-count loop)."""
    assert len(got) == len(expected) == jax.device_count()
    for index, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
        difference = np.abs(mine.astype(int) - theirs.astype(int))
        if exact:
            assert difference.max() == 0, f"image {index} differs by up to {difference.max()} levels"
        else:
            assert difference.max() <= 1 and (difference == 0).mean() >= 0.99, \
                f"image {index}: up to {difference.max()} levels, {(difference > 0).sum()} values differ"


# --- img2img -----------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def img2img_sweep(tmp_path_factory, inputs):
    """One process sweeps strength: one load, one compile (strength is a traced input)."""
    work = tmp_path_factory.mktemp("img2img")
    return sweep(work, "mode=img2img", f"init_image={inputs['init']}", "scheduler=pndm,ddim,dpm_solver_pp",
                 "strength=0.5,0.75")


@pytest.mark.slow
def test_img2img_equals_diffusers_flax_img2img_pipeline_and_a_strength_sweep_compiles_once(img2img_sweep, inputs,
                                                                                             tiny_model_dir):
    """PNDM, DDIM and DPM-Solver++ (the schedulers diffusers' Flax img2img pipeline runs right), two strengths
    each: diffusers' images, and one compile per scheduler."""
    prompt, guidance, steps = smoke_prompt()
    points = [(name, strength) for name in ("pndm", "ddim", "dpm_solver_pp") for strength in (0.5, 0.75)]
    count = jax.device_count()

    def diffusers_images():
        import diffusers
        from diffusers import FlaxStableDiffusionImg2ImgPipeline
        from flax.jax_utils import replicate
        from flax.training.common_utils import shard

        pipeline, params = FlaxStableDiffusionImg2ImgPipeline.from_pretrained(
            str(tiny_model_dir), dtype=jnp.float32, safety_checker=None, feature_extractor=None)
        with Image.open(inputs["init"]) as init:
            prompt_ids, image = pipeline.prepare_inputs([prompt] * count, [init.convert("RGB")] * count)
        rng = jax.random.split(jax.random.PRNGKey(SEED), count)
        classes = {"pndm": "FlaxPNDMScheduler", "ddim": "FlaxDDIMScheduler",
                   "dpm_solver_pp": "FlaxDPMSolverMultistepScheduler"}
        out = []
        for name, strength in points:
            scheduler, state = getattr(diffusers, classes[name]).from_pretrained(str(tiny_model_dir),
                                                                                 subfolder="scheduler")
            reference_pipeline = FlaxStableDiffusionImg2ImgPipeline(
                vae=pipeline.vae, text_encoder=pipeline.text_encoder, tokenizer=pipeline.tokenizer,
                unet=pipeline.unet, scheduler=scheduler, safety_checker=None, feature_extractor=None,
                dtype=jnp.float32)
            out.append(as_uint8(reference_pipeline(
                shard(prompt_ids), shard(image), replicate(dict(params, scheduler=state)), rng, strength=strength,
                num_inference_steps=steps, height=SIZE, width=SIZE, guidance_scale=guidance, jit=True).images))
        return np.stack([np.stack(images) for images in out])

    expected = reference("img2img", diffusers_images, model=folder_digest(tiny_model_dir),
                         init=file_sha256(inputs["init"]), prompt=prompt, guidance=guidance, steps=steps, size=SIZE,
                         seed=SEED, devices=count, points=points)
    for job, images in zip(img2img_sweep, expected, strict=True):
        assert_matches(images_of(job), list(images), exact=False)
    compiles = [json.loads((job / "timings.json").read_text())["process_compiles"] for job in img2img_sweep]
    assert compiles == [1, 1, 2, 2, 3, 3]  # once per scheduler: strength is a traced input
    assert not np.array_equal(images_of(img2img_sweep[0])[0], images_of(img2img_sweep[1])[0])


@pytest.mark.slow
def test_img2img_records_its_input_and_shows_it_in_the_grid(img2img_sweep, inputs):
    import hashlib

    job = img2img_sweep[0]
    recorded = json.loads((job / "inputs.json").read_text())
    assert recorded["images"] == [{"key": "init_image", "path": str(inputs["init"]),
                                   "sha256": hashlib.sha256(inputs["init"].read_bytes()).hexdigest()}]
    record = json.loads((job / "images.json").read_text())[0]
    assert (record["mode"], record["strength"], record["init_image"]) == ("img2img", 0.5, "init.png")
    with Image.open(sorted((job / "images").glob("*.png"))[0]) as png:
        assert "Denoising strength: 0.5" in png.text["parameters"]
    with Image.open(job / "grid.png") as grid:
        grid = np.asarray(grid.convert("RGB"))
    # 8 images in 2 x 4 cells of 64 px, the init image in a column on their left, a gap of 6 px between.
    assert grid.shape == (2 * SIZE, SIZE + 6 + 4 * SIZE, 3)
    assert np.array_equal(grid[:SIZE, :SIZE], smooth_image(1))
    assert np.array_equal(grid[:SIZE, SIZE + 6:2 * SIZE + 6], images_of(job)[0])


# --- inpainting --------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_inpainting_model_equals_diffusers_flax_inpaint_pipeline(tmp_path, inputs, cache_dir):
    from sdjax_runner.models.builtin import build_builtin

    jobs = sweep(tmp_path, "mode=inpaint", "model=tiny-random-inpaint", f"init_image={inputs['init']}",
                 f"mask_image={inputs['mask']}", "sampling.guidance_scale=7.5,3")
    model_dir = build_builtin("tiny-random-inpaint", cache_dir / "models" / "tiny-random-inpaint-v2")
    index = json.loads((model_dir / "model_index.json").read_text())
    assert index["_class_name"].removeprefix("Flax") == "StableDiffusionInpaintPipeline"  # runwayml's kind
    assert json.loads((model_dir / "unet" / "config.json").read_text())["in_channels"] == 9
    prompt, _, steps = smoke_prompt()
    count = jax.device_count()
    guidances = (7.5, 3.0)

    def diffusers_images():
        from diffusers import FlaxStableDiffusionInpaintPipeline
        from flax.jax_utils import replicate
        from flax.training.common_utils import shard

        pipeline, params = FlaxStableDiffusionInpaintPipeline.from_pretrained(
            str(model_dir), dtype=jnp.float32, safety_checker=None, feature_extractor=None)
        assert pipeline.unet.config.in_channels == 9
        with Image.open(inputs["init"]) as init, Image.open(inputs["mask"]) as mask:
            prompt_ids, masked, masks = pipeline.prepare_inputs([prompt] * count, [init.convert("RGB")] * count,
                                                                [mask.copy()] * count)
        rng = jax.random.split(jax.random.PRNGKey(SEED), count)
        return np.stack([np.stack(as_uint8(pipeline(
            shard(prompt_ids), shard(masks), shard(masked), replicate(params), rng, num_inference_steps=steps,
            height=SIZE, width=SIZE, guidance_scale=guidance, jit=True).images)) for guidance in guidances])

    expected = reference("inpaint", diffusers_images, model=folder_digest(model_dir), init=file_sha256(inputs["init"]),
                         mask=file_sha256(inputs["mask"]), prompt=prompt, steps=steps, size=SIZE, seed=SEED,
                         devices=count, guidances=guidances)
    for job, images in zip(jobs, expected, strict=True):
        assert_matches(images_of(job), list(images), exact=False)
    # The same model laid out as the published SD 1.5 inpainting repository (runwayml's): its model index
    # names StableDiffusionInpaintPipeline, PyTorch safetensors only, every published config key; and the
    # same mask as an RGBA sketch (its alpha is the mask, as in A1111), said on the console.
    published = write_published(model_dir, tmp_path / "stable-diffusion-inpainting", "sd15",
                                {"_class_name": "StableDiffusionInpaintPipeline"})
    assert json.loads((published / "unet" / "config.json").read_text())["in_channels"] == 9
    run = run_cli("+experiment=smoke", "tracking=none", "model=local", f"model.pretrained_model_name_or_path={published}",
                  "mode=inpaint", f"init_image={inputs['init']}", f"mask_image={inputs['painted_mask']}",
                  f"hydra.run.dir={tmp_path / 'published'}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    assert f"mask_image: {inputs['painted_mask']} has transparency: its alpha is the mask" in run.stdout + run.stderr
    assert_matches(images_of(tmp_path / "published"), images_of(jobs[0]))


@pytest.mark.slow
def test_inpainting_with_an_ordinary_model_blends_the_kept_area(tmp_path, inputs, smoke_run, tiny_model_dir):
    """diffusers' Flax code has no inpainting for a 4-channel UNet; blending has two ends to check against
    references that are not this code: a white mask (repaint all) at strength 1 is text to image -- the
    guide's images (the smoke run, tests/test_guide_parity.py) -- and a black mask (keep all) gives the init
    image through diffusers' VAE: encoded, sampled with the device's key, decoded. The second end runs a k
    sampler (A1111's blending of the denoised sample), part-way (strength 0.6)."""
    from diffusers import FlaxAutoencoderKL

    white = sweep(tmp_path / "white", "mode=inpaint", f"init_image={inputs['init']}", f"mask_image={inputs['white']}")
    assert_matches(images_of(white[0]), images_of(smoke_run[1]), exact=False)
    black = sweep(tmp_path / "black", "mode=inpaint", f"init_image={inputs['init']}", f"mask_image={inputs['black']}",
                  "sampler=Euler a", "strength=0.6")
    vae, params = FlaxAutoencoderKL.from_pretrained(str(tiny_model_dir), subfolder="vae", dtype=jnp.float32)
    pixels = jnp.asarray(smooth_image(1)[None].transpose(0, 3, 1, 2) / 255.0 * 2 - 1, jnp.float32)
    expected = []
    for key in jax.random.split(jax.random.PRNGKey(SEED), jax.device_count()):
        latents = vae.apply({"params": params}, pixels, method=vae.encode).latent_dist.sample(key=key)
        decoded = vae.apply({"params": params}, latents.transpose((0, 3, 1, 2)), method=vae.decode).sample
        expected.append(((decoded / 2 + 0.5).clip(0, 1).transpose(0, 2, 3, 1)[0] * 255).round().astype(np.uint8))
    assert_matches(images_of(black[0]), [np.asarray(e) for e in expected], exact=False)


# --- ControlNet --------------------------------------------------------------------------------------------


def write_pytorch_controlnet(flax_dir: Path, target: Path) -> Path:
    """The built-in ControlNet as a hub ControlNet looks (lllyasviel/sd-controlnet-*): config.json naming
    ControlNetModel, PyTorch-named safetensors weights, written without torch."""
    from diffusers import FlaxControlNetModel
    from safetensors.numpy import save_file

    from helpers.pt_layout import pytorch_state_dict

    _, params = FlaxControlNetModel.from_pretrained(str(flax_dir))
    target.mkdir(parents=True)
    config = json.loads((flax_dir / "config.json").read_text())
    config["_class_name"] = "ControlNetModel"
    (target / "config.json").write_text(json.dumps(config))
    save_file(pytorch_state_dict(params, "diffusers"), str(target / "diffusion_pytorch_model.safetensors"))
    return target


@pytest.mark.slow
def test_controlnet_from_a_pytorch_folder_equals_diffusers_flax_controlnet_pipeline(tmp_path, inputs, cache_dir,
                                                                                     tiny_model_dir, smoke_run):
    from sdjax_runner.models.builtin import build_builtin

    flax_dir = build_builtin("tiny-random-controlnet", cache_dir / "models" / "tiny-random-controlnet-v1")
    torch_dir = write_pytorch_controlnet(flax_dir, tmp_path / "sd-controlnet-tiny")
    jobs = sweep(tmp_path, "mode=controlnet", f"controlnet.model={torch_dir}", f"controlnet.image={inputs['control']}",
                 "controlnet.conditioning_scale=1.0,0.5,0")
    prompt, guidance, steps = smoke_prompt()
    count = jax.device_count()
    scales = (1.0, 0.5)

    def diffusers_images():
        from diffusers import FlaxControlNetModel, FlaxStableDiffusionControlNetPipeline, FlaxStableDiffusionPipeline
        from flax.jax_utils import replicate
        from flax.training.common_utils import shard

        base, params = FlaxStableDiffusionPipeline.from_pretrained(str(tiny_model_dir), dtype=jnp.float32,
                                                                   safety_checker=None, feature_extractor=None)
        controlnet, params["controlnet"] = FlaxControlNetModel.from_pretrained(str(flax_dir), dtype=jnp.float32)
        pipeline = FlaxStableDiffusionControlNetPipeline(
            vae=base.vae, text_encoder=base.text_encoder, tokenizer=base.tokenizer, unet=base.unet,
            controlnet=controlnet, scheduler=base.scheduler, safety_checker=None, feature_extractor=None,
            dtype=jnp.float32)
        with Image.open(inputs["control"]) as control:
            image = pipeline.prepare_image_inputs([control.convert("RGB")] * count)
        prompt_ids = pipeline.prepare_text_inputs([prompt] * count)
        rng = jax.random.split(jax.random.PRNGKey(SEED), count)
        return np.stack([np.stack(as_uint8(pipeline(
            shard(prompt_ids), shard(image), replicate(params), rng, num_inference_steps=steps,
            guidance_scale=guidance, controlnet_conditioning_scale=scale, jit=True).images)) for scale in scales])

    expected = reference("controlnet", diffusers_images, model=folder_digest(tiny_model_dir),
                         controlnet=folder_digest(flax_dir), control=file_sha256(inputs["control"]), prompt=prompt,
                         guidance=guidance, steps=steps, seed=SEED, devices=count, scales=scales)
    for job, images in zip(jobs, expected, strict=False):  # the third job (scale 0) is checked below
        assert_matches(images_of(job), list(images))
    timings = [json.loads((job / "timings.json").read_text()) for job in jobs]
    assert [t["process_compiles"] for t in timings] == [1, 1, 1]  # the scale is a traced input
    # Scale 0 adds nothing: text to image, the guide's images (the README's smoke run).
    assert_matches(images_of(jobs[2]), images_of(smoke_run[1]), exact=False)
    record = json.loads((jobs[0] / "images.json").read_text())[0]
    assert (record["mode"], record["conditioning_scale"], record["control_image"]) == ("controlnet", 1.0, "control.png")
    assert "control_guidance_start" not in record  # the whole run steered: nothing to say
    # controlnet.guidance_start/end (diffusers' control_guidance_start/end): traced, a sweep over them compiles once;
    # a window past every step of the 4 (3/4 < 0.8) steers none -- scale 0's images bit for bit --, one from
    # half-way steers the last two
    windows = sweep(tmp_path / "window", "mode=controlnet", f"controlnet.model={torch_dir}",
                    f"controlnet.image={inputs['control']}", "controlnet.guidance_start=0.8,0.5")
    assert [json.loads((job / "timings.json").read_text())["compile_reused"] for job in windows] == [0, 1]
    assert_matches(images_of(windows[0]), images_of(jobs[2]))
    late = images_of(windows[1])
    for other in (images_of(jobs[0]), images_of(jobs[2])):
        assert min(np.abs(a.astype(int) - b.astype(int)).max() for a, b in zip(late, other, strict=True)) > 0
    record = json.loads((windows[1] / "images.json").read_text())[0]
    assert (record["control_guidance_start"], record["control_guidance_end"]) == (0.5, 1.0)
    with Image.open(windows[1] / record["file"]) as image:
        assert ", Control weight: 1.0, Guidance Start: 0.5, Guidance End: 1.0" in image.text["parameters"]


# --- bad input ---------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def bad_files(tmp_path_factory, inputs) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("bad")
    (folder / "notes.png").write_text("not an image at all")
    Image.fromarray(np.zeros((32, 32), np.uint8)).save(folder / "small_mask.png")
    whole = inputs["init"].read_bytes()
    (folder / "truncated.png").write_bytes(whole[: len(whole) // 2])
    # A decompression bomb: a tiny PNG whose header says 20000 x 20000 pixels.
    Image.new("L", (20000, 20000)).save(folder / "bomb.png", optimize=True)
    with open(folder / "huge.png", "wb") as sparse:  # 300 MB that take no disk
        sparse.truncate(300 * 2**20)
    return {p.stem: p for p in folder.iterdir()}


@pytest.mark.parametrize("overrides, expected", [
    (["mode=img2img"], "error: init_image: a value is required with mode=img2img"),
    (["mode=inpaint", "init_image={init}"], "error: mask_image: a value is required with mode=inpaint"),
    (["mode=controlnet", "controlnet.image={control}"], "error: controlnet.model: a value is required"),
    (["mode=img2img", "init_image={bad}/notes.png"], "error: init_image: {bad}/notes.png is not an image"),
    (["mode=img2img", "init_image={bad}/truncated.png"], "error: init_image: {bad}/truncated.png cannot be decoded"),
    (["mode=img2img", "init_image={bad}/bomb.png"], "error: init_image: {bad}/bomb.png is a decompression bomb"),
    (["mode=img2img", "init_image={bad}/missing.png"], "error: init_image: no such file"),
    (["mode=img2img", "init_image={bad}/huge.png"], "error: init_image: {bad}/huge.png has 0.3 GB"),
    (["mode=inpaint", "init_image={init}", "mask_image={bad}/small_mask.png"], "error: mask_image: {bad}/small_mask.png is 32 x 32"),
    (["mode=img2img", "init_image=[{init},{init}]"], "error: init_image: has 2 images for 1 prompt(s)"),
    (["mode=img2img", "init_image={init}", "strength=1.5"], "error: strength: must be in (0, 1]"),
    (["mode=img2img", "init_image={init}", "strength=0.1"], "error: strength: 0.1 of 4 steps runs 0 step(s)"),
    (["mode=controlnet", "controlnet.model={bad}", "controlnet.image={control}"], "error: controlnet.model: {bad} has no config.json"),
    (["mode=controlnet", "controlnet.model=tiny-random-controlnet", "controlnet.image={control}",
      "controlnet.conditioning_scale=nan"], "error: controlnet.conditioning_scale: must be a finite number"),
    (["mode=controlnet", "controlnet.model=tiny-random-controlnet", "controlnet.image={control}",
      "controlnet.guidance_start=0.6", "controlnet.guidance_end=0.4"], "error: controlnet.guidance_end: 0.6 to 0.4: "
     "the part of the steps the ControlNet steers (allowed: 0 <= controlnet.guidance_start < controlnet.guidance_end "
     "<= 1"),
    (["mode=controlnet", "controlnet.model=tiny-random-controlnet", "controlnet.image={control}",
      "controlnet.guidance_start=-0.1"], "error: controlnet.guidance_start: -0.1 to 1.0"),
])
def test_bad_mode_input_is_one_line(tmp_path, inputs, bad_files, overrides, expected):
    bad = bad_files["notes"].parent
    values = {"init": inputs["init"], "control": inputs["control"], "bad": bad}
    result = call_cli("+experiment=smoke", "tracking=none", *[o.format(**values) for o in overrides], cwd=tmp_path)
    assert_one_line_error(result, expected.format(**values))
    assert not [p for p in tmp_path.rglob("*.png") if p.is_file()]  # no image written


@pytest.mark.slow
def test_an_inpainting_model_outside_inpaint_mode_is_one_line(tmp_path):
    result = run_cli("+experiment=smoke", "tracking=none", "model=tiny-random-inpaint", cwd=tmp_path)
    assert result.returncode != 0 and "Traceback" not in result.stderr + result.stdout
    assert "mode: txt2img, but tiny-random-inpaint is an inpainting model" in result.stderr


@pytest.mark.slow
def test_controlnet_for_another_unet_is_one_line(tmp_path, inputs, cache_dir):
    """A ControlNet must fit its UNet (SD 1.x vs 2.x widths); said when the model is loaded, with no traceback."""
    from sdjax_runner.models.builtin import build_builtin

    flax_dir = build_builtin("tiny-random-controlnet", cache_dir / "models" / "tiny-random-controlnet-v1")
    other = tmp_path / "other"
    other.mkdir()
    config = json.loads((flax_dir / "config.json").read_text())
    config["cross_attention_dim"] = 1024
    (other / "config.json").write_text(json.dumps(config))
    result = run_cli("+experiment=smoke", "tracking=none", "mode=controlnet", f"controlnet.model={other}",
                     f"controlnet.image={inputs['control']}", cwd=tmp_path)
    assert result.returncode != 0
    assert "Traceback" not in result.stderr + result.stdout
    assert "controlnet.model: " in result.stderr and "was made for another UNet (cross_attention_dim 1024" in result.stderr


def test_readme_mode_examples_are_valid_runs(monkeypatch):
    """Every mode example in the README and the documentation pages (run from a checkout) is a run the runner
    accepts, on inputs that ship in examples/ (each ran when it was written; the tests above run the same modes
    through the CLI)."""
    import shlex

    from sdjax_runner.config.plan import admit, make_plan

    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    lines = [line for page in pages for line in page.read_text().splitlines()
             if line.startswith("python -m sdjax_runner") and "mode=" in line]
    assert {next(w for w in shlex.split(line) if w.startswith("mode=")) for line in lines} == \
        {"mode=img2img", "mode=inpaint", "mode=controlnet", "mode=edit", "mode=control", "mode=control_img2img",
         "mode=control_inpaint", "mode=controlnet_inpaint"}
    for line in lines:
        words = [w for w in shlex.split(line)[3:] if w != "-m"]
        first_points = [w.split(",")[0] if "," in w and "[" not in w else w for w in words]
        plan = make_plan(admit(compose_cfg(first_points)), available_devices=8)
        assert plan.inputs.all(), line
        for image in plan.inputs.all():
            assert Path(image.path).is_file() and Path(image.path).parent.name == "examples"


@pytest.mark.slow
def test_a_rerun_names_an_input_image_that_changed(tmp_path, inputs):
    import shutil

    picture = tmp_path / "picture.png"
    shutil.copy(inputs["init"], picture)
    run = run_cli("+experiment=smoke", "tracking=none", "mode=img2img", f"init_image={picture}",
                  f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert run.returncode == 0, run.stderr
    Image.fromarray(smooth_image(7)).save(picture)  # edited in place after the run
    again = run_cli(str(tmp_path / "run"), "--no-tracking", cwd=tmp_path, command="rerun")
    said = again.stdout + again.stderr
    assert "init_image.0.sha256" in said and "Traceback" not in said, said
    assert again.returncode != 0  # the images differ from the record


def a1111_binary_mask(image: Image.Image) -> np.ndarray:
    """A1111's create_binary_mask (modules/processing.py), transcribed: an RGBA image that is not wholly
    opaque by its alpha (> 128 repaints), anything else by Pillow's luminance."""
    if image.mode == "RGBA" and image.getextrema()[-1] != (255, 255):
        return np.where(np.asarray(image.split()[-1]) > 128, 255, 0)
    return np.asarray(image.convert("L"))


@pytest.mark.parametrize("name", ["rgb", "rgb_colour", "palette", "rgba_sketch", "rgba_opaque", "la_sketch",
                                  "palette_transparent"])
def test_masks_as_users_have_them_are_read_as_a1111_reads_them(tmp_path, name):
    from sdjax_runner.config.input_images import read_image

    rng = np.random.default_rng(3)
    repaint = np.zeros((16, 16), bool)
    repaint[4:12, 2:9] = True
    grey = np.where(repaint, 255, 0).astype(np.uint8)
    alpha = np.where(repaint, rng.integers(129, 256, repaint.shape), rng.integers(0, 129, repaint.shape))
    colour = rng.integers(0, 256, (16, 16, 3)).astype(np.uint8)
    images = {
        "rgb": Image.fromarray(np.repeat(grey[..., None], 3, axis=2)),
        "rgb_colour": Image.fromarray(colour),  # its luminance, whatever it looks like
        "palette": Image.fromarray(np.repeat(grey[..., None], 3, axis=2)).convert("P"),
        "rgba_sketch": Image.fromarray(np.dstack([colour, alpha]).astype(np.uint8), "RGBA"),
        "rgba_opaque": Image.fromarray(np.dstack([colour, np.full((16, 16), 255)]).astype(np.uint8), "RGBA"),
        "la_sketch": Image.fromarray(np.dstack([grey, alpha]).astype(np.uint8), "LA"),
    }
    palette_transparent = images["palette"].copy()
    palette_transparent.info["transparency"] = int(np.asarray(images["palette"])[0, 0])  # the black index
    images["palette_transparent"] = palette_transparent
    path = tmp_path / f"{name}.png"
    images[name].save(path)
    with Image.open(path) as saved:
        as_rgba = saved.convert("RGBA") if saved.mode in ("LA", "P") and name.endswith(("sketch", "transparent")) \
            else saved
        expected = a1111_binary_mask(as_rgba)
    read = read_image("mask_image", path, mask=True)
    assert read.pixels.shape == (16, 16, 1)
    np.testing.assert_array_equal(read.pixels[..., 0], expected)
    if name not in ("rgb_colour", "rgba_opaque"):
        np.testing.assert_array_equal(read.pixels[..., 0], grey)  # the mask that was drawn
