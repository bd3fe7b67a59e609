"""Image modes on the flow families (issue #63, item 1): FLUX.1's and SD 3's img2img as diffusers' PyTorch
``FluxImg2ImgPipeline`` and ``StableDiffusion3Img2ImgPipeline`` run it, its strength a traced input.

* the start step: diffusers' PyTorch flow pipelines' ``get_timesteps`` (``int(steps - min(steps * strength,
  steps))``, unrounded), transcribed, for every step count and strength on a grid -- not the Flax rule the SD family
  keeps;
* from the command line on the published tiny FLUX.1 [dev] and SD 3 folders, the reference's prompt, init image,
  seed and draws (tests/fixtures/flow_image_modes, made by tests/helpers/make_flow_image_modes_reference.py): a strength
  sweep compiles once and each strength's images are the pipeline's within 2/255;
* at strength 1 img2img starts from the noise alone (sigma 1): the txt2img images, on the model's Euler and on a k
  sampler, which starts part-way down its own schedule at a lower strength;
* FLUX.1 Fill (``FluxFillPipeline``) and FLUX.1 Canny/Depth (``FluxControlPipeline``, mode=control) on tiny random
  transformers of their shapes, within 2/255 of their pipelines.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.images import recorded_pixels, records_of

FIXTURES = Path(__file__).resolve().parent / "fixtures"
REFERENCE = FIXTURES / "flow_image_modes"
FOLDERS = {"flux": FIXTURES / "flux" / "tiny-flux-dev", "sd3": FIXTURES / "sd3" / "tiny-sd3"}
QUIET = ("tracking=none", "metrics.clip_score.enabled=false")


def diffusers_start(steps: int, strength: float) -> int:
    """FluxImg2ImgPipeline.get_timesteps (diffusers 0.39; StableDiffusion3Img2ImgPipeline's, which it copies), the
    start index it returns."""
    init_timestep = min(steps * strength, steps)
    return int(max(steps - init_timestep, 0))


def test_the_flow_start_step_is_diffusers_pytorch_get_timesteps():
    from sdjax_runner.config.families import FAMILIES
    from sdjax_runner.config.modes import start_step

    flux, sd3 = FAMILIES["flux"].start_step, FAMILIES["sd3"].start_step
    differs = 0
    for steps in range(1, 61):
        for strength in np.round(np.arange(0.01, 1.001, 0.01), 2):
            assert flux(steps, float(strength)) == diffusers_start(steps, float(strength)), (steps, strength)
            assert sd3(steps, float(strength)) == diffusers_start(steps, float(strength)), (steps, strength)
            differs += flux(steps, float(strength)) != start_step(steps, float(strength))
    assert differs > 1000  # the SD family's Flax rule (int(steps * strength) rounded first) is another one
    assert flux(4, 0.6) == 1 and start_step(4, 0.6) == 2


def reference_run(ref: dict, folder: Path, cache_dir: Path) -> tuple[str, ...]:
    """The overrides that run the reference's prompt, seed, steps, guidance, size and devices on ``folder``."""
    return ("model=local", f"model.pretrained_model_name_or_path={folder}", "dtype=fp32",
            f"prompts.texts=[{ref['prompt']}]", f"seed={int(ref['seed'])}",
            f"sampling.num_inference_steps={int(ref['steps'])}", f"sampling.guidance_scale={float(ref['guidance_scale'])}",
            f"sampling.height={int(ref['height'])}", f"sampling.width={int(ref['width'])}",
            f"prompts.max_sequence_length={int(ref['max_sequence_length'])}",
            f"parallelism.num_devices={int(ref['num_devices'])}", *QUIET, f"paths.cache_dir={cache_dir}")


def pixels_of(job: Path) -> list[np.ndarray]:
    return [pixels.astype(np.float64) for pixels in recorded_pixels(job)]


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["img2img", "inpaint"])
@pytest.mark.parametrize("family", ["flux", "sd3"])
def test_each_mode_is_diffusers_pytorch_pipeline_and_a_strength_sweep_compiles_once(tmp_path, cache_dir, family, mode):
    """FluxImg2ImgPipeline, FluxInpaintPipeline, StableDiffusion3Img2ImgPipeline, StableDiffusion3InpaintPipeline."""
    ref = dict(np.load(REFERENCE / f"{family}_{mode}.npz"))
    masked = [f"mask_image={REFERENCE / 'mask.png'}"] if mode == "inpaint" else []
    strengths = [float(s) for s in ref["strengths"]]
    result = run_cli("-m", *reference_run(ref, FOLDERS[family], cache_dir), f"mode={mode}",
                     f"init_image={REFERENCE / 'init.png'}", *masked,
                     "strength=" + ",".join(f"{s:g}" for s in strengths),
                     "compilation_cache.executables=false", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {records_of(job)[0]["strength"]: job for job in (tmp_path / "sweep").glob("[0-9]")}
    assert sorted(jobs) == strengths
    reused = [json.loads((jobs[s] / "timings.json").read_text())["compile_reused"] for s in strengths]
    assert sorted(reused) == [0, 1, 1]  # strength is a traced input: one program for the sweep
    for strength, job in jobs.items():
        expected = ref[f"images_{strength:g}"]
        for record, pixels in zip(records_of(job), pixels_of(job), strict=True):
            difference = np.abs(pixels / 255 - expected[record["device"]]).max()
            assert difference <= 2 / 255, (strength, difference)
    if mode == "inpaint":  # the blend after each step makes other images than img2img's: the check sees it
        other = dict(np.load(REFERENCE / f"{family}_img2img.npz"))
        assert all(np.abs(ref[f"images_{s:g}"] - other[f"images_{s:g}"]).max() > 0.1 for s in strengths)
    # the strengths' images differ well beyond that bound: the check tells them apart
    assert np.abs(ref["images_0.3"] - ref["images_0.6"]).max() > 0.1


def fill_folder(out: Path, transformer: str = "tiny-flux-fill-transformer",
                pipeline_class: str = "FluxFillPipeline") -> Path:
    """tiny-flux-dev with the reference's ``transformer`` (FLUX.1 Fill's shape) and an index naming
    ``pipeline_class``, as tests/helpers/make_flow_image_modes_reference.py's fill_folder assembles it."""
    import shutil

    shutil.copytree(FOLDERS["flux"], out)
    shutil.rmtree(out / "transformer")
    shutil.copytree(REFERENCE / transformer, out / "transformer")
    index = json.loads((out / "model_index.json").read_text())
    (out / "model_index.json").write_text(json.dumps(dict(index, _class_name=pipeline_class)))
    return out


@pytest.mark.slow
def test_flux_fill_is_diffusers_fill_pipeline_and_a_strength_sweep_compiles_once(tmp_path, cache_dir):
    """FLUX.1 Fill (FluxFillPipeline: the masked image's latents and the mask as more transformer input, no blend) on
    a tiny random transformer of Fill's shape, from the reference's draws: each strength's images within 2/255;
    a Fill model outside mode=inpaint is one line."""
    ref = dict(np.load(REFERENCE / "flux_fill.npz"))
    folder = fill_folder(tmp_path / "tiny-flux-fill")
    strengths = [float(s) for s in ref["strengths"]]
    common = reference_run(ref, folder, cache_dir)
    result = run_cli("-m", *common, "mode=inpaint", f"init_image={REFERENCE / 'init.png'}",
                     f"mask_image={REFERENCE / 'mask.png'}", "strength=" + ",".join(f"{s:g}" for s in strengths),
                     "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {records_of(job)[0]["strength"]: job for job in (tmp_path / "sweep").glob("[0-9]")}
    assert sorted(jobs) == strengths
    reused = [json.loads((jobs[s] / "timings.json").read_text())["compile_reused"] for s in strengths]
    assert sorted(reused) == [0, 1, 1]
    for strength, job in jobs.items():
        for record, pixels in zip(records_of(job), pixels_of(job), strict=True):
            difference = np.abs(pixels / 255 - ref[f"images_{strength:g}"][record["device"]]).max()
            assert difference <= 2 / 255, (strength, difference)
    # Fill's own images: far from the ordinary model's blended inpainting and from each other across strengths
    blended = dict(np.load(REFERENCE / "flux_inpaint.npz"))
    assert all(np.abs(ref[f"images_{s:g}"] - blended[f"images_{s:g}"]).max() > 0.1 for s in strengths)
    assert np.abs(ref["images_0.3"] - ref["images_1"]).max() > 0.1
    assert_one_line_error(run_cli(*common, "hydra.run.dir=txt2img", cwd=tmp_path),
                          "error: mode: txt2img: local is FLUX.1 Fill, whose transformer reads a mask and the "
                          "masked init image beside the latents (allowed: inpaint (with init_image and mask_image))")
    # the built-in tiny Fill model, as the image modes guide runs it
    builtin = run_cli("+experiment=flux_smoke", "model=tiny-random-flux-fill", "mode=inpaint",
                      f"init_image={REFERENCE / 'init.png'}", f"mask_image={REFERENCE / 'mask.png'}", *QUIET,
                      f"paths.cache_dir={cache_dir}", "hydra.run.dir=builtin", cwd=tmp_path)
    assert builtin.returncode == 0, builtin.stderr[-3000:]
    records = records_of(tmp_path / "builtin")
    assert len(records) == 8 and {(r["model"], r["mode"], r["strength"]) for r in records} == {
        ("tiny-random-flux-fill", "inpaint", 1.0)}


@pytest.mark.slow
def test_flux_canny_and_depth_are_diffusers_control_pipeline_and_a_control_image_sweep_compiles_once(tmp_path,
                                                                                                    cache_dir):
    """FLUX.1 Canny/Depth [dev] (FluxControlPipeline: the control image's latents as more transformer input, from
    noise) on a tiny random transformer of their shape, from the reference's draws: an edge map and its inverse, each
    within 2/255 of the pipeline's images, from one program; the A1111 line names the control image and from_png
    remakes the image given it; such a model outside mode=control, and mode=control on another, are one line."""
    ref = dict(np.load(REFERENCE / "flux_control.npz"))
    folder = fill_folder(tmp_path / "tiny-flux-control", "tiny-flux-control-transformer", "FluxControlPipeline")
    edges, inverted = REFERENCE / "control.png", tmp_path / "inverted.png"
    with Image.open(edges) as image:
        Image.fromarray(255 - np.asarray(image)).save(inverted)
    common = reference_run(ref, folder, cache_dir)
    result = run_cli("-m", *common, "mode=control", f"controlnet.image={edges},{inverted}", "hydra.sweep.dir=sweep",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {records_of(job)[0]["control_image"]: job for job in (tmp_path / "sweep").glob("[0-9]")}
    assert sorted(jobs) == ["control.png", "inverted.png"]
    reused = [json.loads((job / "timings.json").read_text())["compile_reused"] for job in jobs.values()]
    assert sorted(reused) == [0, 1]  # the control image is a traced input
    for name, expected in (("control.png", ref["images"]), ("inverted.png", ref["control_images"])):
        for record, pixels in zip(records_of(jobs[name]), pixels_of(jobs[name]), strict=True):
            assert record["mode"] == "control" and "strength" not in record  # (none: from noise)
            difference = np.abs(pixels / 255 - expected[record["device"]]).max()
            assert difference <= 2 / 255, (name, difference)
    # the control image steers the images well beyond that bound, and they are not the plain [dev] model's
    assert np.abs(ref["images"] - ref["control_images"]).max() > 0.05
    # the A1111 line names it; from_png remakes the image given it, and says what to give without it
    record = records_of(jobs["control.png"])[0]
    png = jobs["control.png"] / record["file"]
    with Image.open(png) as image:
        assert image.text["parameters"].endswith(", Control image: control.png")
    remade = run_cli(str(png), f"model.pretrained_model_name_or_path={folder}", *QUIET, f"paths.cache_dir={cache_dir}",
                     f"controlnet.image={edges}", f"prompts.max_sequence_length={int(ref['max_sequence_length'])}",
                     "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    assert remade.returncode == 0, remade.stderr[-3000:]
    assert "Control image: control.png -> mode=control" in remade.stdout + remade.stderr
    assert records_of(tmp_path / "from_png")[0]["pixels_sha256"] == record["pixels_sha256"]
    uncontrolled = run_cli(str(png), f"model.pretrained_model_name_or_path={folder}", *QUIET,
                           f"paths.cache_dir={cache_dir}", "hydra.run.dir=without", command="from_png", cwd=tmp_path)
    assert "not honoured: Control image: control.png: FLUX.1 Canny/Depth's control image; give controlnet.image=PATH " \
           "to remake it" in uncontrolled.stdout + uncontrolled.stderr
    assert_one_line_error(run_cli(*common, "hydra.run.dir=txt2img", cwd=tmp_path),
                          "error: mode: txt2img: local is FLUX.1 Canny/Depth, whose transformer reads a control "
                          "image's latents beside the latents (allowed: control (with controlnet.image), "
                          "control_img2img (and init_image), control_inpaint (and init_image, mask_image))")
    assert_one_line_error(run_cli("+experiment=flux_smoke", "mode=control", f"controlnet.image={edges}", *QUIET,
                                  f"paths.cache_dir={cache_dir}", "hydra.run.dir=plain", cwd=tmp_path),
                          "error: mode: control: tiny-random-flux is no FLUX.1 Canny/Depth model (its index names "
                          "FluxControlPipeline): its transformer reads no control image (allowed: a FLUX.1 Canny/Depth "
                          "model (model=flux-canny-dev, flux-depth-dev, tiny-random-flux-control), or txt2img, "
                          "img2img, inpaint)")
    # the built-in tiny Canny/Depth model, as the image modes guide runs it
    builtin = run_cli("+experiment=flux_smoke", "model=tiny-random-flux-control", "mode=control",
                      f"controlnet.image={edges}", *QUIET, f"paths.cache_dir={cache_dir}", "hydra.run.dir=builtin",
                      cwd=tmp_path)
    assert builtin.returncode == 0, builtin.stderr[-3000:]
    records = records_of(tmp_path / "builtin")
    assert len(records) == 8 and {(r["model"], r["mode"], r["control_image"]) for r in records} == {
        ("tiny-random-flux-control", "control", "control.png")}
    # a step cache runs on it as on [dev] (the control image's channels enter before the blocks): threshold 0 skips
    # nothing and gives the same images bit for bit
    cached = run_cli("+experiment=flux_smoke", "model=tiny-random-flux-control", "mode=control",
                     f"controlnet.image={edges}", "cache=first_block", "cache.threshold=0", *QUIET,
                     f"paths.cache_dir={cache_dir}", "hydra.run.dir=cached", cwd=tmp_path)
    assert cached.returncode == 0, cached.stderr[-3000:]
    assert [r["pixels_sha256"] for r in records_of(tmp_path / "cached")] == [r["pixels_sha256"] for r in records]
    assert json.loads((tmp_path / "cached" / "timings.json").read_text())["denoiser_calls_skipped"] == 0


@pytest.mark.slow
def test_flux_canny_and_depth_from_an_init_image_and_repainting_a_mask_are_diffusers_pipelines(tmp_path, cache_dir):
    """FLUX.1 Canny/Depth with an init image: FluxControlImg2ImgPipeline at two strengths from one program and
    FluxControlInpaintPipeline, each within 2/255, from the reference's draws; from_png remakes the first given its
    images."""
    ref = dict(np.load(REFERENCE / "flux_control.npz"))
    folder = fill_folder(tmp_path / "tiny-flux-control", "tiny-flux-control-transformer", "FluxControlPipeline")
    edges = REFERENCE / "control.png"
    common = reference_run(ref, folder, cache_dir)
    init, mask = REFERENCE / "init.png", REFERENCE / "mask.png"
    img2img = run_cli("-m", *common, "mode=control_img2img", f"init_image={init}", f"controlnet.image={edges}",
                      "strength=0.6,1", "hydra.sweep.dir=img2img", cwd=tmp_path)
    assert img2img.returncode == 0, img2img.stderr[-3000:]
    inpaint = run_cli(*common, "mode=control_inpaint", f"init_image={init}", f"mask_image={mask}",
                      f"controlnet.image={edges}", "strength=0.8", "hydra.run.dir=inpaint", cwd=tmp_path)
    assert inpaint.returncode == 0, inpaint.stderr[-3000:]
    runs = {f"img2img_{records_of(job)[0]['strength']:g}": job for job in (tmp_path / "img2img").glob("[0-9]")}
    assert sorted(json.loads((job / "timings.json").read_text())["compile_reused"] for job in runs.values()) == [0, 1]
    runs["inpaint_0.8"] = tmp_path / "inpaint"
    for case, job in runs.items():
        for record, pixels in zip(records_of(job), pixels_of(job), strict=True):
            difference = np.abs(pixels / 255 - ref[case][record["device"]]).max()
            assert difference <= 2 / 255, (case, difference)
    assert np.abs(ref["img2img_0.6"] - ref["img2img_1"]).max() > 0.05  # (the strength tells them apart)
    record = records_of(runs["img2img_0.6"])[0]
    png = runs["img2img_0.6"] / record["file"]
    remade = run_cli(str(png), f"model.pretrained_model_name_or_path={folder}", *QUIET, f"paths.cache_dir={cache_dir}",
                     f"controlnet.image={edges}", f"init_image={init}",
                     f"prompts.max_sequence_length={int(ref['max_sequence_length'])}", "hydra.run.dir=img2img_png",
                     command="from_png", cwd=tmp_path)
    assert remade.returncode == 0, remade.stderr[-3000:]
    assert "Control image: control.png -> mode=control_img2img" in remade.stdout + remade.stderr
    assert records_of(tmp_path / "img2img_png")[0]["pixels_sha256"] == record["pixels_sha256"]


@pytest.mark.slow
def test_a_flux_controlnet_is_diffusers_controlnet_pipeline_and_a_scale_sweep_compiles_once(tmp_path, cache_dir):
    """A FLUX.1 ControlNet (FluxControlNetPipeline with diffusers' FluxControlNetModel: the control image's latents
    read beside the latents, its blocks' outputs added after the transformer's) on tiny-flux-dev with a tiny random
    ControlNet in the published layout, from the reference's draws: three conditioning scales from one program, each
    within 2/255 of the pipeline's images; a window of its steps and XLabs' kind likewise; the records name it; the
    built-in one on the sharded path; what does not fit is one line."""
    ref = dict(np.load(REFERENCE / "flux_controlnet.npz"))
    net, edges = REFERENCE / "tiny-flux-controlnet", REFERENCE / "control.png"
    common = (*reference_run(ref, FOLDERS["flux"], cache_dir), "mode=controlnet", f"controlnet.model={net}",
              f"controlnet.image={edges}")
    result = run_cli("-m", *common, "controlnet.conditioning_scale=0.7,1,0", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {records_of(job)[0]["conditioning_scale"]: job for job in (tmp_path / "sweep").glob("[0-9]")}
    assert sorted(jobs) == [0.0, 0.7, 1.0]
    reused = [json.loads((job / "timings.json").read_text())["compile_reused"] for job in jobs.values()]
    assert sorted(reused) == [0, 1, 1]  # the conditioning scale is a traced input
    for scale, expected in ((0.7, ref["images_0.7"]), (1.0, ref["images_1"]), (0.0, ref["plain"])):
        for record, pixels in zip(records_of(jobs[scale]), pixels_of(jobs[scale]), strict=True):
            assert (record["mode"], record["controlnet"]) == ("controlnet", str(net))
            difference = np.abs(pixels / 255 - expected[record["device"]]).max()
            assert difference <= 2 / 255, (scale, difference)
    # the scales steer the images well beyond that bound
    assert np.abs(ref["images_0.7"] - ref["images_1"]).max() > 0.05 and np.abs(ref["images_1"] - ref["plain"]).max() > 0.05
    with Image.open(jobs[0.7] / records_of(jobs[0.7])[0]["file"]) as image:
        assert f", ControlNet: {net}, Control weight: 0.7" in image.text["parameters"]
    assert_window_is_diffusers(tmp_path, common, ref)
    # XLabs' kind: the control image in pixels through its hint block, its double-block residuals repeated
    xlabs_net = REFERENCE / "tiny-flux-controlnet-xlabs"
    xlabs_run = run_cli(*common, f"controlnet.model={xlabs_net}", "hydra.run.dir=xlabs_run", cwd=tmp_path)
    assert xlabs_run.returncode == 0, xlabs_run.stderr[-3000:]
    for record, pixels in zip(records_of(tmp_path / "xlabs_run"), pixels_of(tmp_path / "xlabs_run"), strict=True):
        difference = np.abs(pixels / 255 - ref["xlabs_1"][record["device"]]).max()
        assert difference <= 2 / 255, difference
    assert min(np.abs(ref["xlabs_1"] - ref[key]).max() for key in ("images_1", "plain")) > 0.05
    # the built-in tiny FLUX.1 ControlNet, as the image modes guide runs it, its weights split across the devices
    builtin = run_cli("+experiment=flux_smoke", "mode=controlnet", "controlnet.model=tiny-random-flux-controlnet",
                      f"controlnet.image={edges}", "parallelism=sharded", "parallelism.params=sharded", *QUIET,
                      f"paths.cache_dir={cache_dir}", "hydra.run.dir=builtin", cwd=tmp_path)
    assert builtin.returncode == 0, builtin.stderr[-3000:]
    records = records_of(tmp_path / "builtin")
    assert len(records) == 8 and {(r["mode"], r["controlnet"]) for r in records} == {
        ("controlnet", "tiny-random-flux-controlnet")}
    # what does not fit: an SD ControlNet on FLUX.1 and this one on SD; a union model without its control mode, or one
    # past its modes, and a control mode for another; a hint block whose patches are not the latents' width; one made
    # for another transformer; a step cache;
    # FLUX.1 Canny/Depth (its transformer is the control model)
    union, xlabs, other = REFERENCE / "tiny-flux-controlnet-union", tmp_path / "xlabs", tmp_path / "other"
    for folder, change in ((xlabs, {"conditioning_embedding_channels": 8}), (other, {"joint_attention_dim": 64})):
        folder.mkdir()
        config = json.loads((net / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(dict(config, **change)))
    flux = ("+experiment=flux_smoke", "mode=controlnet", f"controlnet.image={edges}", *QUIET, f"paths.cache_dir={cache_dir}")
    for overrides, expected in (
            ((*flux, "controlnet.model=tiny-random-controlnet"), "error: controlnet.model: "),
            (("+experiment=smoke", "mode=controlnet", "controlnet.model=tiny-random-flux-controlnet",
              f"controlnet.image={edges}", *QUIET, f"paths.cache_dir={cache_dir}"), "error: controlnet.model: "),
            ((*common, f"controlnet.model={union}"), f"error: controlnet.control_mode: None: {union} is a union "
             "ControlNet of 4 control modes: give the number its card gives the control image's kind (allowed: 0 to 3)"),
            ((*common, f"controlnet.model={union}", "controlnet.control_mode=4"), "error: controlnet.control_mode: 4: "),
            ((*flux, "controlnet.model=tiny-random-flux-controlnet", "controlnet.control_mode=1"),
             "error: controlnet.control_mode: 1: tiny-random-flux-controlnet is no union ControlNet"),
            ((*flux, f"controlnet.model={xlabs}"), f"error: controlnet.model: {xlabs}: conditioning_embedding_channels "
             "8 in patches of 1 make 8 channels, not in_channels 64"),
            ((*flux, f"controlnet.model={other}"), f"error: controlnet.model: {other} was made for another FLUX.1 "
             "transformer: joint_attention_dim 64 (the transformer's 32)"),
            ((*flux, "controlnet.model=tiny-random-flux-controlnet", "cache=first_block"),
             "error: cache: first_block with mode=controlnet: the ControlNet's residuals reach every block"),
            ((*flux, "controlnet.model=tiny-random-flux-controlnet", "model=tiny-random-flux-control"),
             "error: mode: controlnet: tiny-random-flux-control is FLUX.1 Canny/Depth")):
        assert_one_line_error(call_cli(*overrides, cwd=tmp_path), expected)
    said = call_cli(*flux, "controlnet.model=tiny-random-controlnet", cwd=tmp_path).stderr
    assert "holds a FlaxControlNetModel, not a FluxControlNetModel (a FLUX.1 ControlNet" in said, said


@pytest.mark.slow
def test_a_union_flux_controlnet_reads_its_control_mode_as_diffusers_does(tmp_path, cache_dir):
    """A union FLUX.1 ControlNet (num_mode: the control mode's embedding as a token before the text): the module's
    residuals are diffusers' FluxControlNetModel's for each mode on the same inputs (within float32 rounding, which the
    modes are far beyond), and from the command line a control-mode sweep compiles once and gives
    FluxControlNetPipeline's images at each mode within 2/255."""
    import jax.numpy as jnp

    from sdjax_runner.families.flux.models.controlnet import load
    from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer

    ref = dict(np.load(REFERENCE / "flux_controlnet.npz"))
    union = REFERENCE / "tiny-flux-controlnet-union"
    transformer = FlaxFluxTransformer.from_config(
        {k: v for k, v in json.loads((FOLDERS["flux"] / "transformer" / "config.json").read_text()).items()
         if not k.startswith("_")})
    loaded = load(str(union), str(cache_dir), transformer, jnp.float32, np.float32)
    assert loaded.modes == 4
    call = {k.removeprefix("call_"): jnp.asarray(v) for k, v in ref.items()
            if k.startswith("call_") and not k.startswith(("call_double", "call_single"))}
    for mode in range(4):
        double, single, _ = loaded.module.apply({"params": loaded.host_weights}, **call, conditioning_scale=1.0,
                                                controlnet_mode=jnp.asarray([mode]))
        np.testing.assert_allclose(np.stack(double), ref[f"call_double_{mode}"], rtol=0, atol=2e-5, err_msg=str(mode))
        np.testing.assert_allclose(np.stack(single), ref[f"call_single_{mode}"], rtol=0, atol=2e-5, err_msg=str(mode))
        if mode:
            assert np.abs(ref[f"call_double_{mode}"] - ref["call_double_0"]).max() > 5e-3  # the modes apart
    common = (*reference_run(ref, FOLDERS["flux"], cache_dir), "mode=controlnet", f"controlnet.model={union}",
              f"controlnet.image={REFERENCE / 'control.png'}")
    result = run_cli("-m", *common, "controlnet.control_mode=1,3", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {records_of(job)[0]["control_mode"]: job for job in (tmp_path / "sweep").glob("[0-9]")}
    assert sorted(jobs) == [1, 3]
    assert sorted(json.loads((job / "timings.json").read_text())["compile_reused"] for job in jobs.values()) == [0, 1]
    for mode, job in jobs.items():
        for record, pixels in zip(records_of(job), pixels_of(job), strict=True):
            difference = np.abs(pixels / 255 - ref[f"union_{mode}"][record["device"]]).max()
            assert difference <= 2 / 255, (mode, difference)
        with Image.open(job / records_of(job)[0]["file"]) as image:
            assert f", Control mode: {mode}" in image.text["parameters"]
    # from_png remakes a union run given its control image: the ControlNet, its weight and mode from the A1111 line
    record = records_of(jobs[3])[0]
    remade = run_cli(str(jobs[3] / record["file"]), f"model.pretrained_model_name_or_path={FOLDERS['flux']}", *QUIET,
                     f"paths.cache_dir={cache_dir}", f"controlnet.image={REFERENCE / 'control.png'}",
                     f"prompts.max_sequence_length={int(ref['max_sequence_length'])}", "parallelism.num_devices=2",
                     "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    for line in (f"ControlNet: {union} -> controlnet.model=", "Control weight: 1.0 -> controlnet.conditioning_scale=1.0",
                 "Control mode: 3 -> controlnet.control_mode=3"):
        assert line in said, line
    assert records_of(tmp_path / "from_png")[0]["pixels_sha256"] == record["pixels_sha256"]


def test_the_controlnet_window_is_diffusers_controlnet_keep():
    """controlnet.guidance_start/end's scale at each step (engine/modes/controlnet.scale_at) is diffusers' pipelines'
    ``controlnet_keep`` (``1.0 - float(i / len(timesteps) < s or (i + 1) / len(timesteps) > e)``, transcribed) times
    the scale, for every step of 1 to 30 and windows on a grid."""
    from sdjax_runner.engine.modes.controlnet import scale_at

    windows = [(s, e) for s in np.round(np.arange(0, 1, 0.05), 2) for e in np.round(np.arange(0.05, 1.001, 0.05), 2)
               if s < e]
    steps = np.concatenate([np.full(n, n) for n in range(1, 31)])
    index = np.concatenate([np.arange(n) for n in range(1, 31)])
    for start, end in windows:
        ours = np.asarray(scale_at(0.7, (np.float32(start), np.float32(end)), index, steps))
        keep = [1.0 - float(i / n < start or (i + 1) / n > end) for i, n in zip(index, steps, strict=True)]
        np.testing.assert_array_equal(ours, np.float32(0.7) * np.asarray(keep, np.float32), err_msg=str((start, end)))


def assert_window_is_diffusers(tmp_path: Path, common: tuple[str, ...], ref: dict) -> None:
    """A ControlNet run steering the middle two of its four steps (controlnet.guidance_start/end as the reference's
    ``window``): the scale sweep's program (stored by it: this run loads it), the pipeline's images (``window_1``) within 2/255, the A1111 line saying
    it."""
    start, end = (float(v) for v in ref["window"])
    result = run_cli(*common, "controlnet.conditioning_scale=1", f"controlnet.guidance_start={start}",
                     f"controlnet.guidance_end={end}", "hydra.run.dir=window", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    timings = json.loads((tmp_path / "window" / "timings.json").read_text())  # the window is a traced input: the
    assert (timings["compile_path"], timings["executable_cache_hit"]) == ("executable_cache", 1)  # sweep's program
    for record, pixels in zip(records_of(tmp_path / "window"), pixels_of(tmp_path / "window"), strict=True):
        difference = np.abs(pixels / 255 - ref["window_1"][record["device"]]).max()
        assert difference <= 2 / 255, difference
    with Image.open(tmp_path / "window" / records_of(tmp_path / "window")[0]["file"]) as image:
        assert f", Guidance Start: {start}, Guidance End: {end}" in image.text["parameters"]
    # it steers: the window's images are neither scale 1's nor scale 0's
    assert min(np.abs(ref["window_1"] - ref[key]).max() for key in ("images_1", "plain")) > 0.05


def test_sd3_controlnets_residuals_are_diffusers_sd3_controlnet_models(cache_dir):
    """Both kinds of SD 3 ControlNet (InstantX's joint blocks with a position embedding of their own; SD 3.5 Large's
    single blocks reading the transformer's patch embedding), loaded from the published layout: their residuals are
    diffusers' SD3ControlNetModel's on the same fixed random inputs, within float32 rounding."""
    import functools

    import jax
    import jax.numpy as jnp

    from sdjax_runner.families.sd3.models.controlnet import load
    from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer

    ref = dict(np.load(REFERENCE / "sd3_controlnet.npz"))
    transformer = FlaxSD3Transformer.from_config(
        {k: v for k, v in json.loads((FOLDERS["sd3"] / "transformer" / "config.json").read_text()).items()
         if not k.startswith("_")})
    for name, prefix in (("tiny-sd3-controlnet", "call"), ("tiny-sd3-controlnet-single", "single_call")):
        loaded = load(str(REFERENCE / name), str(cache_dir), transformer, jnp.float32, np.float32)
        hidden = ref[f"{prefix}_hidden_states"]
        inputs = {"hidden_states": jnp.asarray(hidden.transpose(0, 2, 3, 1) if hidden.ndim == 4 else hidden),
                  "controlnet_cond": jnp.asarray(ref[f"{prefix}_controlnet_cond"].transpose(0, 2, 3, 1)),
                  "encoder_hidden_states": (jnp.asarray(ref[f"{prefix}_encoder_hidden_states"])
                                            if f"{prefix}_encoder_hidden_states" in ref else None),
                  "pooled_projections": jnp.asarray(ref[f"{prefix}_pooled_projections"]),
                  "timestep": jnp.asarray(ref[f"{prefix}_timestep"])}
        residuals = jax.jit(functools.partial(loaded.module.apply, conditioning_scale=0.5))(
            {"params": loaded.host_weights}, **inputs)
        assert len(residuals) == 2 and loaded.module.joint == (prefix == "call")
        np.testing.assert_allclose(np.stack(residuals), ref[f"{prefix}_residuals"], rtol=0, atol=2e-5, err_msg=name)
        assert np.abs(ref[f"{prefix}_residuals"]).max() > 0.1  # (they steer: the bound tells them apart)


@pytest.mark.slow
def test_an_sd3_controlnet_is_diffusers_sd3_controlnet_pipeline_and_a_scale_sweep_compiles_once(tmp_path, cache_dir):
    """SD 3 ControlNets (StableDiffusion3ControlNetPipeline with diffusers' SD3ControlNetModel) on tiny-sd3 from the
    reference's draws: InstantX's kind at three conditioning scales from one program, SD 3.5 Large's at one, each
    within 2/255 of the pipeline's images; the records and the A1111 line name it; the built-in ones run as the image
    modes guide runs them, on a k sampler too; what does not fit is one line."""
    ref = dict(np.load(REFERENCE / "sd3_controlnet.npz"))
    net, single, edges = REFERENCE / "tiny-sd3-controlnet", REFERENCE / "tiny-sd3-controlnet-single", \
        REFERENCE / "control.png"
    common = (*reference_run(ref, FOLDERS["sd3"], cache_dir), "mode=controlnet", f"controlnet.image={edges}")
    result = run_cli("-m", *common, f"controlnet.model={net},{single}", "controlnet.conditioning_scale=0.7,1,0",
                     "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {(records_of(job)[0]["controlnet"], records_of(job)[0]["conditioning_scale"]): job
            for job in (tmp_path / "sweep").glob("[0-9]")}
    assert len(jobs) == 6
    reused = {key: json.loads((job / "timings.json").read_text())["compile_reused"] for key, job in jobs.items()}
    for model in (net, single):  # the conditioning scale is a traced input: one program for each ControlNet
        assert sorted(value for (name, _), value in reused.items() if name == str(model)) == [0, 1, 1]
    expected = {(str(net), 0.7): ref["images_0.7"], (str(net), 1.0): ref["images_1"], (str(net), 0.0): ref["plain"],
                (str(single), 1.0): ref["single_1"], (str(single), 0.0): ref["plain"]}
    for key, images in expected.items():
        for record, pixels in zip(records_of(jobs[key]), pixels_of(jobs[key]), strict=True):
            assert record["mode"] == "controlnet"
            difference = np.abs(pixels / 255 - images[record["device"]]).max()
            assert difference <= 2 / 255, (key, difference)
    # the scales and the kinds steer the images well beyond that bound
    assert np.abs(ref["images_0.7"] - ref["images_1"]).max() > 0.05 and np.abs(ref["images_1"] - ref["plain"]).max() > 0.05
    assert np.abs(ref["single_1"] - ref["images_1"]).max() > 0.05
    with Image.open(jobs[(str(net), 0.7)] / records_of(jobs[(str(net), 0.7)])[0]["file"]) as image:
        assert f", ControlNet: {net}, Control weight: 0.7" in image.text["parameters"]
    assert_window_is_diffusers(tmp_path, (*common, f"controlnet.model={net}"), ref)
    # from_png remakes a run given its control image: the ControlNet and its weight from the A1111 line, bit for bit
    record = records_of(jobs[(str(single), 1.0)])[0]
    remade = run_cli(str(jobs[(str(single), 1.0)] / record["file"]), f"model.pretrained_model_name_or_path={FOLDERS['sd3']}",
                     *QUIET, f"paths.cache_dir={cache_dir}", f"controlnet.image={edges}",
                     f"prompts.max_sequence_length={int(ref['max_sequence_length'])}", "parallelism.num_devices=2",
                     "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    assert f"ControlNet: {single} -> controlnet.model=" in said, said[-3000:]
    assert records_of(tmp_path / "from_png")[0]["pixels_sha256"] == record["pixels_sha256"]
    # an inpainting ControlNet (mode=controlnet_inpaint): the init image with the mask's area masked out, and the mask
    inpainting = run_cli(*reference_run(ref, FOLDERS["sd3"], cache_dir), "mode=controlnet_inpaint",
                         f"controlnet.model={REFERENCE / 'tiny-sd3-controlnet-inpaint'}",
                         f"init_image={REFERENCE / 'init.png'}", f"mask_image={REFERENCE / 'mask.png'}",
                         "hydra.run.dir=inpaint_run", cwd=tmp_path)
    assert inpainting.returncode == 0, inpainting.stderr[-3000:]
    for record, pixels in zip(records_of(tmp_path / "inpaint_run"), pixels_of(tmp_path / "inpaint_run"), strict=True):
        assert (record["mode"], record["mask_image"]) == ("controlnet_inpaint", "mask.png")
        difference = np.abs(pixels / 255 - ref["inpaint_1"][record["device"]]).max()
        assert difference <= 2 / 255, difference
    assert np.abs(ref["inpaint_1"] - ref["plain"]).max() > 0.05
    # the built-in ones for tiny-random-sd3, as the image modes guide runs them (one on a k sampler)
    masked = (f"init_image={REFERENCE / 'init.png'}", f"mask_image={REFERENCE / 'mask.png'}")
    for builtin, mode, extra in (("tiny-random-sd3-controlnet", "controlnet", (f"controlnet.image={edges}",)),
                                 ("tiny-random-sd3-controlnet-single", "controlnet",
                                  (f"controlnet.image={edges}", "sampler=dpmpp_2m")),
                                 ("tiny-random-sd3-controlnet-inpaint", "controlnet_inpaint", masked)):
        run = run_cli("+experiment=sd3_smoke", f"mode={mode}", f"controlnet.model={builtin}", *extra,
                      "parallelism.num_devices=2", *QUIET, f"paths.cache_dir={cache_dir}", f"hydra.run.dir={builtin}",
                      cwd=tmp_path)
        assert run.returncode == 0, run.stderr[-3000:]
        assert {(r["mode"], r["controlnet"]) for r in records_of(tmp_path / builtin)} == {(mode, builtin)}
    # what does not fit: a FLUX.1 ControlNet on SD 3 and an SD 3 one on FLUX.1; one made for another transformer; extra
    # channels no ControlNet has; an inpainting ControlNet outside controlnet_inpaint and another in it; a control mode;
    # a guider making other calls; a step cache
    other, inpainting = tmp_path / "other", tmp_path / "inpainting"
    for folder, change in ((other, {"pooled_projection_dim": 48}), (inpainting, {"extra_conditioning_channels": 2})):
        folder.mkdir()
        config = json.loads((net / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps(dict(config, **change)))
    sd3 = ("+experiment=sd3_smoke", "mode=controlnet", f"controlnet.image={edges}", *QUIET, f"paths.cache_dir={cache_dir}")
    builtin = "controlnet.model=tiny-random-sd3-controlnet"
    for overrides, expected in (
            ((*sd3, "controlnet.model=tiny-random-flux-controlnet"), "error: controlnet.model: "),
            (("+experiment=flux_smoke", "mode=controlnet", builtin, f"controlnet.image={edges}", *QUIET,
              f"paths.cache_dir={cache_dir}"), "error: controlnet.model: "),
            ((*sd3, f"controlnet.model={other}"), f"error: controlnet.model: {other} was made for another SD 3 "
             "transformer: pooled_projection_dim 48 (the transformer's 24)"),
            ((*sd3, f"controlnet.model={inpainting}"), f"error: controlnet.model: {inpainting}: "
             "extra_conditioning_channels 2: an inpainting ControlNet reads one (the mask), an ordinary one none"),
            ((*sd3, "controlnet.model=tiny-random-sd3-controlnet-inpaint"), "error: mode: controlnet: "
             "tiny-random-sd3-controlnet-inpaint is an inpainting ControlNet (it reads a masked image and its mask) "
             "(allowed: controlnet_inpaint, with init_image and mask_image)"),
            (("+experiment=sd3_smoke", "mode=controlnet_inpaint", builtin, *masked, *QUIET, f"paths.cache_dir={cache_dir}"),
             "error: controlnet.model: tiny-random-sd3-controlnet is no inpainting ControlNet"),
            ((*sd3, builtin, "controlnet.control_mode=1"),
             "error: controlnet.control_mode: 1: tiny-random-sd3-controlnet is no union ControlNet"),
            ((*sd3, builtin, "guider=pag"), "error: guider: pag with mode=controlnet: "),
            ((*sd3, builtin, "guider=skip_layer"), "error: guider: skip_layer with mode=controlnet: "),
            ((*sd3, builtin, "cache=first_block"), "error: cache: first_block with mode=controlnet: ")):
        assert_one_line_error(call_cli(*overrides, cwd=tmp_path), expected)
    said = call_cli(*sd3, "controlnet.model=tiny-random-flux-controlnet", cwd=tmp_path).stderr
    assert "holds a FluxControlNetModel, not a SD3ControlNetModel (an SD 3 ControlNet" in said, said


@pytest.mark.slow
@pytest.mark.parametrize(("experiment", "sampler"), [("flux_smoke", "euler"), ("flux_smoke", "dpmpp_2m"),
                                                     ("sd3_smoke", "euler")])
def test_img2img_at_strength_1_is_txt2img_and_lower_starts_part_way(tmp_path, cache_dir, experiment, sampler):
    common = (f"+experiment={experiment}", *QUIET, f"paths.cache_dir={cache_dir}", "parallelism.num_devices=2",
              "compilation_cache.executables=false", f"sampler={sampler}")
    txt2img = run_cli(*common, "hydra.run.dir=txt2img", cwd=tmp_path)
    assert txt2img.returncode == 0, txt2img.stderr[-3000:]
    sweep = run_cli("-m", *common, "mode=img2img", f"init_image={REFERENCE / 'init.png'}", "strength=1.0,0.5",
                    "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    jobs = {records_of(job)[0]["strength"]: job for job in (tmp_path / "sweep").glob("[0-9]")}
    plain = pixels_of(tmp_path / "txt2img")
    # sigma 1 at the first step: the noise alone, whatever the image (the program differs: a rounding at most)
    assert max(np.abs(a - b).max() for a, b in zip(pixels_of(jobs[1.0]), plain, strict=True)) <= 1
    assert min(np.abs(a - b).mean() for a, b in zip(pixels_of(jobs[0.5]), plain, strict=True)) > 2
    record = records_of(jobs[0.5])[0]
    assert (record["mode"], record["strength"]) == ("img2img", 0.5)
    with Image.open(jobs[0.5] / record["file"]) as image:
        assert "Denoising strength: 0.5" in image.text["parameters"]


INPAINT = ("mode=inpaint", "init_image=x.png", "mask_image=m.png")


@pytest.mark.parametrize(("overrides", "expected"), [
    (["+experiment=sd3_smoke", "mode=edit", "init_image=x.png"], "error: mode: edit, but tiny-random-sd3 is a "),
    (["+experiment=sd3_smoke", *INPAINT, "sampler=dpmpp_2m"],
     "error: sampler: dpmpp_2m with mode=inpaint: SD 3 inpaints on its own Euler"),
    (["+experiment=flux_smoke", *INPAINT, "sampler=euler", "scheduler=karras"],
     "error: sampler: euler with mode=inpaint: FLUX.1 inpaints on its own Euler"),
    (["+experiment=flux_smoke", *INPAINT, "cache=first_block"], "error: cache: first_block with mode=inpaint"),
    # FLUX.1 Canny/Depth's mode: no SD 3 or SD model reads a control image's latents as input channels
    (["+experiment=sd3_smoke", "mode=control", "controlnet.image=x.png"], "error: mode: control, but tiny-random-sd3 "
     "is a"),
    (["+experiment=smoke", "mode=control", "controlnet.image=x.png"], "error: mode: control, but tiny-random is a"),
    # Canny/Depth's img2img on a model that is not one
    (["+experiment=flux_smoke", "mode=control_img2img", f"init_image={REFERENCE / 'init.png'}",
      f"controlnet.image={REFERENCE / 'control.png'}"], "error: mode: control_img2img: tiny-random-flux is no FLUX.1 "
     "Canny/Depth model (its index names FluxControlPipeline)"),
])
def test_what_the_flow_families_do_not_run_yet_is_one_line(tmp_path, overrides, expected):
    assert_one_line_error(call_cli(*overrides, *QUIET, cwd=tmp_path), expected)
