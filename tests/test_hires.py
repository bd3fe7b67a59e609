"""A1111's Hires. fix (sampling.hires.*, issue #49): the latent upscalers against PyTorch's own interpolate (a
fixture made by tests/helpers/make_hires_reference.py), the Lanczos upscaler against Pillow's, the second pass's
steps against A1111's setup_img2img_steps transcribed; the pass with the Lanczos upscaler is the image-to-image
mode's run on Pillow's upscaled first-pass image (SD and SDXL); through the command line a sweep over the upscaler,
the records, the A1111 line and from_png; what it cannot run is one line."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "hires" / "interpolate.npz"


def test_latent_upscalers_are_torchs_interpolate():
    import jax.numpy as jnp

    from sdjax_runner.engine.upscale import LATENT, upscale_latents

    reference = np.load(FIXTURE)
    checked = set()
    for key in reference.files:
        if key.startswith("in_"):
            continue
        name, source, target = key.rsplit("_", 2)
        height, width = map(int, target.split("x"))
        ours = np.asarray(upscale_latents(jnp.asarray(reference[f"in_{source}"]), height, width, name))
        np.testing.assert_allclose(ours, reference[key], rtol=0, atol=1e-5, err_msg=key)
        checked.add(name)
    assert checked == set(LATENT)  # every latent upscaler, at five sizes each


@pytest.mark.parametrize(("size", "target"), [((64, 64), (128, 128)), ((40, 24), (60, 36)), ((17, 23), (34, 31)),
                                              ((64, 48), (64, 96)), ((32, 32), (32, 32))])
def test_the_lanczos_upscaler_is_pillows_on_a1111s_8_bit_image(size, target):
    import jax.numpy as jnp

    from sdjax_runner.engine.upscale import upscale_pixels

    rng = np.random.default_rng(sum(size))
    noise = rng.random((2, *size, 3))
    ramp = np.linspace(0, 1, size[1])[None, None, :, None] * np.ones((2, size[0], 1, 3))
    pixels = np.concatenate([noise, ramp, np.clip(ramp + 0.3 * noise - 0.1, 0, 1)]).astype(np.float32)
    ours = np.asarray(upscale_pixels(jnp.asarray(pixels), *target))
    for index, image in enumerate(pixels):
        eight_bit = (255.0 * image).astype(np.uint8)  # A1111: 255. * x, astype(np.uint8)
        pillow = np.asarray(Image.fromarray(eight_bit).resize(target[::-1], resample=Image.LANCZOS))
        assert np.array_equal(np.round(ours[index] * 255).astype(np.uint8), pillow), index


def a1111_setup_img2img_steps(steps: int, denoising_strength: float) -> tuple[int, int]:
    """A1111's modules/sd_samplers_common.setup_img2img_steps for a pass given its steps (sample_hr_pass passes
    ``hr_second_pass_steps or steps``): (the schedule's steps, t_enc); the pass runs sigmas[steps - t_enc - 1:]."""
    requested_steps = steps
    steps = int(requested_steps / min(denoising_strength, 0.999)) if denoising_strength > 0 else 0
    t_enc = requested_steps - 1
    return steps, t_enc


@pytest.mark.parametrize("steps", [1, 4, 10, 20, 28, 50])
@pytest.mark.parametrize("strength", [0.05, 0.3, 0.45, 0.5, 0.7, 0.75, 0.999, 1.0])
def test_the_second_pass_runs_a1111s_steps(steps, strength):
    from sdjax_runner.config.hires import Hires

    pass_ = Hires(2.0, steps, strength, "latent")
    schedule, t_enc = a1111_setup_img2img_steps(steps, strength)
    assert pass_.schedule == schedule
    assert pass_.start == schedule - t_enc - 1
    assert pass_.schedule - pass_.start == steps  # the steps A1111's "Hires steps" names are the ones that run


def batch_images(overrides: list[str]) -> tuple[np.ndarray, object]:
    """Batch 0's images as floats, and the generator, for a run composed of ``overrides``, in this process."""
    import jax

    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan
    from sdjax_runner.engine.engine import Engine

    cfg = compose_cfg(overrides)
    plan = make_plan(admit(cfg), jax.device_count())
    engine = ENGINE.setdefault("engine", Engine())
    model = engine.load(plan, "cpu")
    program = engine.program(plan, model, jax.devices()[: plan.num_devices], 0.0)
    generator = program.generator
    return generator.fetch(generator.run(*generator.inputs(0))), generator


ENGINE: dict = {}  # one engine for the module: the tiny models load once


@pytest.fixture(scope="module", autouse=True)
def engine_let_go():
    """The module's engine and its programs go with the module (each holds compiled code: tests/conftest.py)."""
    yield
    ENGINE.clear()


REFINER_PAIR = Path(__file__).parent / "fixtures" / "refiner"


@pytest.mark.slow
@pytest.mark.parametrize(("model", "sampler", "second"), [
    ("tiny-random", "DPM++ 2M", {}),
    ("tiny-random-xl", "Euler a", {}),
    # A1111's "Hires sampler" and "Hires CFG Scale": the img2img run with that sampler and guidance (1: no CFG there)
    ("tiny-random", "DPM++ 2M", {"sampler": "Euler a", "guidance_scale": 1.0}),
    # SDXL's refiner: in the second pass alone (A1111's default), so the img2img run has it and the first pass not
    ("refiner", "Euler a", {}),
    # the flow families (Forge runs Hires. fix on FLUX.1 and SD 3 alike): their own Euler, their img2img
    ("tiny-random-flux", "euler", {}),
    ("tiny-random-sd3", "euler", {}),
])
def test_the_lanczos_pass_is_img2img_on_pillows_upscaled_first_pass(tmp_path, cache_dir, model, sampler, second):
    """Hires. fix = txt2img, then A1111's 8-bit first-pass image resized by Pillow (LANCZOS), then the img2img mode at
    the upscaled size from the same seed, over A1111's schedule: the first pass and the img2img run are the runner's
    plain modes, the resize is Pillow's and the step arithmetic A1111's (a1111_setup_img2img_steps)."""
    steps, hires_steps, strength, scale, size = 4, 3, 0.55, 1.5, 64
    models = {"refiner": ["model.name=tiny-sdxl", f"model.pretrained_model_name_or_path={REFINER_PAIR / 'tiny-sdxl-base'}",
                          "sampling.refiner_switch=0.9"]}
    refiner = [f"model.refiner={REFINER_PAIR / 'tiny-sdxl-refiner'}"] if model == "refiner" else []
    common = [*models.get(model, [f"model={model}"]), "dtype=fp32", "prompts=guide_single", f"paths.cache_dir={cache_dir}",
              "parallelism.num_devices=1", "parallelism.num_batches=1", "seed=7", "compilation_cache.executables=false"]
    first, _ = batch_images(common + [f"sampler={sampler}", f"sampling.num_inference_steps={steps}",
                                      f"sampling.height={size}", f"sampling.width={size}"])
    two_passes = [f"sampler={sampler}", f"sampling.num_inference_steps={steps}", f"sampling.height={size}",
                  f"sampling.width={size}", f"sampling.hires.scale={scale}", f"sampling.hires.steps={hires_steps}",
                  f"sampling.hires.denoising_strength={strength}", "sampling.hires.upscaler=lanczos",
                  *(f"sampling.hires.{key}={value}" for key, value in second.items())]
    hires, generator = batch_images(common + refiner + two_passes)
    if refiner:  # it ran: the same two passes without it differ
        assert np.abs(batch_images(common + two_passes)[0] - hires).max() > 1e-3
    upscaled = int(size * scale)
    assert hires.shape == (1, upscaled, upscaled, 3) and generator.height == upscaled
    eight_bit = (255.0 * first[0]).astype(np.uint8)
    Image.fromarray(eight_bit).resize((upscaled, upscaled), resample=Image.LANCZOS).save(tmp_path / "init.png")
    schedule, t_enc = a1111_setup_img2img_steps(hires_steps, strength)
    # the img2img mode runs the last t_enc + 1 steps of its schedule at a strength its family's start rule reads so
    # (the SD family's Flax rule: int(schedule * strength) steps run; the flow families' PyTorch one: int(schedule -
    # schedule * strength) is the start)
    from sdjax_runner.config.families import FAMILIES

    start_rule = FAMILIES[generator.spec.family].start_step
    img2img_strength = next(s for s in ((t_enc + 1.5) / schedule, (t_enc + 0.5) / schedule)
                            if start_rule(schedule, s) == schedule - t_enc - 1)
    img2img, _ = batch_images(common + refiner + [
        f"sampler={second.get('sampler', sampler)}", f"sampling.num_inference_steps={schedule}",
        f"sampling.height={upscaled}", f"sampling.width={upscaled}", "mode=img2img", f"init_image={tmp_path / 'init.png'}",
        f"strength={img2img_strength}",
        *([f"sampling.guidance_scale={second['guidance_scale']}"] if "guidance_scale" in second else [])])
    np.testing.assert_allclose(hires, img2img, rtol=0, atol=2e-4)
    assert np.abs(hires[0] - np.asarray(Image.fromarray(eight_bit).resize((upscaled, upscaled))) / 255).max() > 0.05


@pytest.mark.slow
def test_a_hires_sweep_runs_its_upscalers_and_from_png_remakes_an_image(tmp_path, cache_dir):
    quiet = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
             "compilation_cache.executables=false", "parallelism.num_devices=2", "sampler=Euler a",
             "sampling.num_inference_steps=3", "sampling.hires.scale=2", "sampling.hires.denoising_strength=0.6",
             "sampling.hires.sampler=DPM++ 2M Karras"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *quiet, "sampling.hires.upscaler=latent_bicubic,lanczos", "sampling.hires.guidance_scale=3,5",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "; Hires. fix x2 to 128x128, 3 steps at strength 0.6 (lanczos)" in result.stdout  # the plan line
    jobs = {}
    for job in sweep.glob("[0-9]"):
        record = json.loads((job / "images.json").read_text())[0]
        jobs[(record["hires_upscaler"], record["hires_guidance_scale"])] = (job, record)
    assert set(jobs) == {(upscaler, guidance) for upscaler in ("Latent (bicubic)", "Lanczos") for guidance in (3.0, 5.0)}
    for (upscaler, _), (_, record) in jobs.items():
        assert (record["height"], record["width"], record["first_pass_height"], record["first_pass_width"]) == \
            (128, 128, 64, 64)
        assert (record["hires_scale"], record["hires_steps"], record["hires_strength"], record["hires_upscaler"],
                record["hires_sampler"], record["hires_schedule_type"]) == (2.0, 3, 0.6, upscaler, "DPM++ 2M", "Karras")
    assert len({record["pixels_sha256"] for _, record in jobs.values()}) == 4
    # the second pass's guidance is a traced input: one program per upscaler
    compiles = sorted(json.loads((job / "timings.json").read_text())["compile_reused"] for job, _ in jobs.values())
    assert compiles == [0, 0, 1, 1]
    job, record = jobs[("Lanczos", 5.0)]
    png = job / record["file"]
    with Image.open(png) as image:
        assert image.size == (128, 128)
        assert "Size: 64x64, " in image.text["parameters"]
        assert ("Denoising strength: 0.6, Hires upscale: 2, Hires steps: 3, Hires upscaler: Lanczos, Hires sampler: "
                "DPM++ 2M, Hires schedule type: Karras, Hires CFG Scale: 5.0" in image.text["parameters"])
    # (and in the other parallel mode: the same pixels)
    remade = run_cli(str(png), "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
                     "parallelism=sharded", "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    for line in ("Hires upscale: 2 -> sampling.hires.scale=2.0", "Hires steps: 3 -> sampling.hires.steps=3",
                 "Hires upscaler: Lanczos -> sampling.hires.upscaler=lanczos",
                 "Denoising strength: 0.6 -> sampling.hires.denoising_strength=0.6",
                 "Hires sampler: DPM++ 2M -> sampling.hires.sampler='DPM++ 2M Karras'",
                 "Hires CFG Scale: 5.0 -> sampling.hires.guidance_scale=5.0"):
        assert line in said, line
    again = json.loads((tmp_path / "from_png" / "images.json").read_text())[0]
    assert again["pixels_sha256"] == record["pixels_sha256"]


def test_an_a1111_infotext_with_another_upscaler_runs_lanczos_and_says_so():
    from sdjax_runner.config.infotext import overrides, parse

    info = parse("a cat\nSteps: 20, Sampler: Euler a, CFG scale: 7, Seed: 1, Size: 512x768, Denoising strength: 0.45, "
                 "Hires upscale: 1.5, Hires steps: 0, Hires upscaler: R-ESRGAN 4x+, Hires sampler: DPM++ 2M, "
                 "Hires schedule type: Karras, Hires CFG Scale: 4")
    translated = overrides(info, ("tiny-random",), ("fp32",), has_init_image=False)
    assert {"sampling.hires.scale=1.5", "sampling.hires.steps=null", "sampling.hires.upscaler=lanczos",
            "sampling.hires.denoising_strength=0.45", "sampling.hires.sampler='DPM++ 2M Karras'",
            "sampling.hires.guidance_scale=4.0"} <= set(translated.overrides)
    assert any(line.startswith("Hires upscaler: R-ESRGAN 4x+: not here, Lanczos runs in its place")
               for line in translated.not_honoured)
    # A1111's "Use same sampler", and a schedule the sampler's name cannot carry (said)
    info = parse("a cat\nSteps: 20, Sampler: Euler a, Seed: 1, Size: 512x512, Hires upscale: 2, Hires sampler: Use same "
                 "sampler")
    assert not any("hires.sampler" in line for line in overrides(info, (), (), has_init_image=False).overrides)
    info = parse("a cat\nSteps: 20, Sampler: Euler a, Seed: 1, Size: 512x512, Hires upscale: 2, Hires sampler: Euler, "
                 "Hires schedule type: SGM Uniform")
    translated = overrides(info, (), (), has_init_image=False)
    assert "sampling.hires.sampler='Euler'" in translated.overrides
    assert any(line.startswith("Hires schedule type: SGM Uniform: the second pass runs on the run's schedule")
               for line in translated.not_honoured)


@pytest.mark.parametrize(("overrides", "expected"), [
    (["sampling.hires.scale=0.5"], "error: sampling.hires.scale: 0.5 (allowed: a number from 1 to 4"),
    (["sampling.hires.scale=2", "sampling.hires.denoising_strength=0"],
     "error: sampling.hires.denoising_strength: 0.0 (allowed: a number in (0, 1]"),
    (["sampling.hires.scale=2", "sampling.hires.steps=0"], "error: sampling.hires.steps: must be a positive integer"),
    (["sampling.hires.scale=2", "sampling.hires.steps=50", "sampling.hires.denoising_strength=0.01"],
     "error: sampling.hires.denoising_strength: 0.01 with 50 steps makes a schedule of 5000 steps"),
    (["sampling.hires.scale=2", "sampling.hires.sampler=DDIM"],
     "error: sampling.hires.sampler: DDIM steps on the run's diffusers scheduler, which the second pass shares"),
    (["sampling.hires.scale=2", "sampling.hires.sampler=Euler b"], "error: sampling.hires.sampler: unknown sampler"),
    (["sampling.hires.scale=2", "sampling.hires.sampler=UniPC", "sampling.hires.steps=1"],
     "error: sampling.hires.steps: 1: uni_pc takes at least 2 steps"),
    (["sampling.hires.scale=2", "sampling.hires.upscaler=esrgan"],
     "error: sampling.hires.upscaler: Invalid value 'esrgan', expected one of [latent, latent_antialiased, "),
    (["sampling.hires.scale=2", "mode=img2img", "init_image=x.png"],
     "error: sampling.hires.scale: 2.0: Hires. fix is a text-to-image pass, not mode=img2img's (allowed: null, or "
     "mode=txt2img)"),
    (["model=tiny-random-flux", "sampling.hires.scale=2", "sampling.hires.sampler=Euler a"],
     "error: sampling.hires.sampler: Euler a: the flow models (FLUX.1, SD 3) run euler, heun, dpmpp_2m, lms"),
    (["sampling.hires.scale=1.1"],
     "error: sampling.hires.scale: 1.1 upscales the height 64 to 70 pixels, which does not fit tiny-random's "
     "down-sampling"),
    (["sampling.height=2048", "sampling.hires.scale=2.5"],
     "error: sampling.hires.scale: 2.5 upscales sampling.height 2048 to 5120 pixels, more than this runner allows (4096)"),
])
def test_hires_it_cannot_run_is_one_line(tmp_path, overrides, expected):
    (tmp_path / "x.png").write_bytes(b"")
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", *overrides, cwd=tmp_path), expected)
