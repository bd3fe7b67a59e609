"""FLUX.1 Kontext's editing (``mode=edit``, issue #63 item 2): the init image's latents (the VAE posterior's mode)
packed into tokens after the noise's in every transformer call, their position ids' first coordinate 1, the
prediction the noise's tokens' -- diffusers' ``FluxKontextPipeline``.

Against that pipeline (PyTorch, diffusers 0.39) on ``tests/fixtures/kontext/tiny-flux-kontext`` from the runner's
noise: ``tests/fixtures/kontext``, made by ``tests/helpers/make_kontext_reference.py``."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.images import recorded_pixels, records_of

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "kontext"
REFERENCE = dict(np.load(FIXTURE / "kontext.npz"))
QUIET = ("tracking=none", "metrics.clip_score.enabled=false")


def run_args(cache_dir: Path) -> list[str]:
    ref = REFERENCE
    return ["model=local", f"model.pretrained_model_name_or_path={FIXTURE / 'tiny-flux-kontext'}", "dtype=fp32",
            f"prompts.texts=[{ref['prompt']}]", f"seed={int(ref['seed'])}",
            f"sampling.num_inference_steps={int(ref['steps'])}", f"sampling.height={int(ref['height'])}",
            f"sampling.width={int(ref['width'])}", f"prompts.max_sequence_length={int(ref['max_sequence_length'])}",
            f"parallelism.num_devices={int(ref['num_devices'])}", *QUIET, f"paths.cache_dir={cache_dir}"]


def levels_off(job: Path, expected: np.ndarray) -> float:
    return max(float(np.abs(pixels.astype(np.float64) - np.round(expected[record["device"]] * 255)).max())
               for record, pixels in zip(records_of(job), recorded_pixels(job), strict=True))


@pytest.mark.slow
def test_edit_is_diffusers_kontext_pipeline_and_a_guidance_and_image_sweep_compiles_once(tmp_path, cache_dir):
    guidances = [float(g) for g in REFERENCE["guidances"]]
    inverted = tmp_path / "inverted.png"
    Image.fromarray(255 - np.asarray(Image.open(FIXTURE / "init.png"))).save(inverted)
    result = run_cli("-m", *run_args(cache_dir), "mode=edit", f"init_image={FIXTURE / 'init.png'},{inverted}",
                     "sampling.guidance_scale=" + ",".join(f"{g:g}" for g in guidances), "hydra.sweep.dir=sweep",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {}
    for job in (tmp_path / "sweep").glob("[0-9]"):
        record = records_of(job)[0]
        assert record["mode"] == "edit"
        jobs[(record["init_image"], record["distilled_guidance"])] = job
    assert len(jobs) == 4
    for guidance in guidances:
        assert levels_off(jobs[("init.png", guidance)], REFERENCE[f"images_{guidance:g}"]) <= 2, guidance
    assert levels_off(jobs[("inverted.png", guidances[0])], REFERENCE["inverted"]) <= 2
    # the input image matters: without it (FluxPipeline) and inverted, the images are far off
    first = REFERENCE[f"images_{guidances[0]:g}"]
    assert np.abs(first - REFERENCE["txt2img"]).max() > 10 / 255 and np.abs(first - REFERENCE["inverted"]).max() > 5 / 255
    timings = [json.loads((job / "timings.json").read_text()) for job in jobs.values()]
    assert sorted(t["compile_reused"] for t in timings) == [0, 1, 1, 1]  # the image and the guidance are inputs


@pytest.mark.slow
def test_a_kontext_model_without_an_input_image_is_fluxpipelines_txt2img_and_counts_fewer_flops(tmp_path, cache_dir):
    """With no input image Kontext is FluxPipeline's txt2img; an edit's step FLOPs count twice the image tokens."""
    import jax

    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan
    from sdjax_runner.engine import efficiency
    from sdjax_runner.engine.engine import Engine
    from sdjax_runner.engine.families import FAMILIES

    guidance = float(REFERENCE["guidances"][0])
    plain = run_cli(*run_args(cache_dir), f"sampling.guidance_scale={guidance:g}", "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    assert levels_off(tmp_path / "plain", REFERENCE["txt2img"]) <= 2
    edited = run_cli(*run_args(cache_dir), f"sampling.guidance_scale={guidance:g}", "mode=edit",
                     f"init_image={FIXTURE / 'init.png'}", "hydra.run.dir=edit", cwd=tmp_path)
    assert edited.returncode == 0, edited.stderr[-3000:]
    flops = [json.loads((tmp_path / name / "timings.json").read_text())["flops_per_batch"] for name in ("plain", "edit")]
    assert flops[1] > flops[0]
    plan = make_plan(admit(compose_cfg(run_args(cache_dir))), jax.device_count())
    loaded = Engine().load(plan, "cpu").loaded
    family = FAMILIES[loaded.family]
    calls = {mode: family.denoiser_call(loaded.pipeline, 1, 32, 32, 32, mode=mode) for mode in ("txt2img", "edit")}
    assert calls["edit"].args[0].shape[1] == 2 * calls["txt2img"].args[0].shape[1]  # the image tokens, twice
    step = {mode: efficiency.step_flops(call, family.denoiser, loaded.pipeline, loaded.host_weights)
            for mode, call in calls.items()}
    # (the tiny model's 4 image tokens beside 32 text tokens: 40 tokens a call where there were 36)
    assert step["edit"] > 1.1 * step["txt2img"]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["+experiment=flux_smoke", "mode=edit", "init_image=examples/init.png"],
     "error: mode: edit: tiny-random-flux is no FLUX.1 Kontext model (its index names FluxKontextPipeline): it reads "
     "no input image beside the noise"),
    (["+experiment=smoke", "mode=edit", "init_image=examples/init.png"],
     "error: mode: edit, but tiny-random is a Stable Diffusion 1.x, 2.x and XL: CLIP text encoder(s), UNet, VAE "
     "model, which runs txt2img, img2img, inpaint, controlnet"),
    (["+experiment=flux_smoke", "mode=edit"], "error: init_image: a value is required with mode=edit"),
    (["+experiment=flux_smoke", "mode=edit", "init_image=examples/init.png", "cache=first_block"],
     "error: cache: first_block with mode=edit: the cache's state does not follow the input image's tokens yet"),
])
def test_what_edit_cannot_run_with_is_one_line(tmp_path, overrides, expected):
    root = Path(__file__).resolve().parent.parent
    overrides = [o.replace("examples/", f"{root}/examples/") for o in overrides]
    assert_one_line_error(call_cli(*overrides, "tracking=none", cwd=tmp_path), expected)


def test_a_kontext_model_in_img2img_is_one_line(tmp_path, cache_dir):
    result = run_cli(*run_args(cache_dir), "mode=img2img", f"init_image={FIXTURE / 'init.png'}", "hydra.run.dir=run",
                     cwd=tmp_path)
    assert_one_line_error(result, "error: mode: img2img: local is FLUX.1 Kontext, which edits an input image (or makes "
                                  "one from the prompt alone) (allowed: edit (with init_image), txt2img)")


@pytest.mark.slow
def test_the_kontext_smoke_experiment_edits_the_example_image_on_the_builtin_model(tmp_path, cache_dir):
    root = Path(__file__).resolve().parent.parent
    result = run_cli("+experiment=kontext_smoke", f"init_image={root / 'examples' / 'init.png'}", *QUIET,
                     f"paths.cache_dir={cache_dir}", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = records_of(tmp_path / "run")
    assert len(records) == 8 and {r["mode"] for r in records} == {"edit"} and records[0]["model"] == "tiny-random-flux-kontext"
    assert records[0]["init_image"] == "init.png" and records[0]["distilled_guidance"] == 2.5
    # the A1111 line names the input image: from_png remakes the edit given it, and says what to give without it
    png = tmp_path / "run" / records[0]["file"]
    with Image.open(png) as image:
        assert image.text["parameters"].endswith(", Edit image: init.png")  # (QUIET: no CLIP score after it)
    quiet = (*QUIET, f"paths.cache_dir={cache_dir}", "prompts.max_sequence_length=16")
    remade = run_cli(str(png), *quiet, f"init_image={root / 'examples' / 'init.png'}", "hydra.run.dir=from_png",
                     command="from_png", cwd=tmp_path)
    assert remade.returncode == 0, remade.stderr[-3000:]
    assert "Edit image: init.png -> mode=edit" in remade.stdout + remade.stderr
    assert records_of(tmp_path / "from_png")[0]["pixels_sha256"] == records[0]["pixels_sha256"]
    unedited = run_cli(str(png), *quiet, "hydra.run.dir=without", command="from_png", cwd=tmp_path)
    assert ("not honoured: Edit image: init.png: the edited input image (FLUX.1 Kontext's, FLUX.2's); give "
            "init_image=PATH to remake the edit") in unedited.stdout + unedited.stderr
