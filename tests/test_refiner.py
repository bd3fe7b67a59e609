"""SDXL's refiner (issue #49, item 4): ``model.refiner`` and ``sampling.refiner_switch`` against diffusers' PyTorch
base + refiner "ensemble of experts" (``denoising_end`` / ``denoising_start``) on tiny random models --
``tests/fixtures/refiner``, made by ``tests/helpers/make_refiner_reference.py`` with diffusers' own classes: the
folders, the runner's initial latents and the ensemble's images."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.images import images_of

FIXTURE = Path(__file__).parent / "fixtures" / "refiner"
BASE, REFINER = FIXTURE / "tiny-sdxl-base", FIXTURE / "tiny-sdxl-refiner"
REFERENCE = np.load(FIXTURE / "refiner.npz")
# The reference's settings: Euler (diffusers' EulerDiscreteScheduler, the folders' scheduler), 10 steps, guidance 5,
# 32 x 32, seed 0 on 2 devices (its latents are the runner's), its prompt.
COMMON = ["model.name=tiny-sdxl", f"model.pretrained_model_name_or_path={BASE}", "scheduler=euler",
          "sampling.num_inference_steps=10", "sampling.guidance_scale=5", "sampling.height=32", "sampling.width=32",
          "seed=0", f"prompts.texts=[{REFERENCE['prompt']}]", "parallelism.num_devices=2", "tracking=none",
          "metrics.clip_score.enabled=false"]
REFINED = [*COMMON, f"model.refiner={REFINER}"]


def pixels(run_dir: Path) -> np.ndarray:
    return np.stack(images_of(run_dir)).astype(np.float64)


def levels_off(got: np.ndarray, key: str) -> float:
    """The largest difference, in 8-bit levels, from the reference's float images made 8-bit."""
    return float(np.abs(got - np.round(REFERENCE[key] * 255)).max())


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    """One run per reference: a switch sweep (one process, sharded), a negative prompt (pmap), the base alone, and a k
    sampler with and without the refiner."""
    root = tmp_path_factory.mktemp("refiner")
    sweep = root / "sweep"
    init = root / "init.png"
    Image.fromarray((np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)).save(init)
    # (the switch sweep in the sharded mode, the negative prompt in pmap's: pmap's program with the refiner's
    # lax.cond compiles 2-3 times slower on the CPU)
    calls = {"sweep": ["-m", *REFINED, "parallelism=sharded", "sampling.refiner_switch=0.8,0.5",
                       f"hydra.sweep.dir={sweep}"],
             "negative": [*REFINED, "parallelism=pmap", f"prompts.negative={REFERENCE['negative_prompt']}"],
             "base": [*COMMON, "parallelism=sharded"],
             "k_sweep": ["-m", *COMMON, "sampler=Euler a", "model.refiner=null," + str(REFINER),
                         f"hydra.sweep.dir={root / 'k_sweep'}"],
             "i2i_sweep": ["-m", *COMMON, "mode=img2img", f"init_image={init}", "strength=0.5",
                           "model.refiner=null," + str(REFINER), f"hydra.sweep.dir={root / 'i2i_sweep'}"]}
    out = {}
    for name, overrides in calls.items():
        if not name.endswith("sweep"):
            overrides = [*overrides, f"hydra.run.dir={root / name}"]
        result = run_cli(*overrides, cwd=root)
        assert result.returncode == 0, result.stderr[-3000:]
        out[name] = root / name
    for name in ("sweep", "k_sweep", "i2i_sweep"):
        for job in sorted(out[name].glob("[0-9]")):
            record = json.loads((job / "images.json").read_text())[0]
            out[f"{name}:{record.get('refiner_switch')}"] = job
    return out


@pytest.mark.slow
def test_the_refiner_finishes_as_diffusers_ensemble_does_at_each_switch_in_both_parallel_modes(runs):
    # Within one 8-bit level of diffusers' PyTorch ensemble (float32 on both sides), at each switch; the base alone
    # and the other switch are further off, so the check tells them apart.
    refined_08, refined_05 = pixels(runs["sweep:0.8"]), pixels(runs["sweep:0.5"])
    assert levels_off(refined_08, "ensemble_images") <= 1 < levels_off(refined_08, "base_images")
    assert levels_off(refined_05, "ensemble_images_05") <= 1 < levels_off(refined_05, "ensemble_images")
    negative = pixels(runs["negative"])  # the negative prompt through both models' encoders
    assert levels_off(negative, "negative_ensemble_images") <= 1 < levels_off(negative, "ensemble_images")
    # one program for both switches (the cutoff is a traced input); the refiner loaded once in the sweep's process
    timings = [json.loads((runs[f"sweep:{s}"] / "timings.json").read_text()) for s in (0.8, 0.5)]
    assert [t["compile_reused"] for t in timings] == [0, 1] and timings[1]["model_reused"] == 1


def test_a_switch_past_the_last_step_says_the_refiner_runs_on_no_step(caplog):
    """0.999 hands over below timestep 1; the folders' Euler scheduler ends its 10 steps at timestep 1, so the base
    runs every call (the switch's lax.cond is never taken) -- said. A k sampler's last step is at the training
    schedule's smallest sigma (timestep 0): the refiner runs that one, and nothing is said."""
    from types import SimpleNamespace

    from diffusers import FlaxEulerDiscreteScheduler

    from sdjax_runner.config.refiner import Refiner
    from sdjax_runner.engine.refiner import RefinerPass, lowest_timestep, say_unused_refiner

    scheduler, _ = FlaxEulerDiscreteScheduler.from_pretrained(str(BASE), subfolder="scheduler")
    pipeline = SimpleNamespace(scheduler=scheduler)
    assert lowest_timestep(pipeline, "scheduler", None, 10) == 1
    assert lowest_timestep(pipeline, "euler_ancestral", "normal", 10) == 0

    def said(switch: float, sampler: str, sigmas=None) -> list[str]:
        caplog.clear()
        spec = SimpleNamespace(refiner=RefinerPass(True, ""), sampler=sampler, sigmas=sigmas, steps=10, hires=None)
        say_unused_refiner(pipeline, spec, Refiner(str(REFINER), "", switch, True))
        return [record.getMessage() for record in caplog.records]

    assert said(0.999, "scheduler") == [
        "sampling.refiner_switch: 0.999 hands over at timestep 1, and the last of the 10 steps runs at 1: the refiner "
        "runs on no step, the images are the base's alone (lower sampling.refiner_switch)"]
    assert said(0.8, "scheduler") == said(0.999, "euler_ancestral", "normal") == []


@pytest.mark.slow
def test_the_sdxl_base_alone_is_diffusers_pytorch_pipelines_at_32_pixels(runs):
    # A 32-pixel-wide SDXL image has latents 4 wide, as many as their channels: diffusers' Flax decode read them as
    # channels-last (engine/decode.py hands them over so); diffusers' PyTorch pipeline gives these images.
    assert levels_off(pixels(runs["base"]), "base_images") <= 1


@pytest.mark.slow
def test_a_k_sampler_hands_over_to_the_refiner_too(runs):
    # Only that the images change, and why that is enough: no published code runs a refiner inside a k sampler's
    # schedule but A1111's (a torch web UI, not a library), and the switch itself -- which calls run the refiner,
    # with what conditioning -- is the one the test above checks against diffusers' ensemble: a k sampler reaches it
    # through the same denoiser call (engine/samplers/unet.py), with A1111's nearest training timestep for its sigma.
    alone, refined = pixels(runs["k_sweep:None"]), pixels(runs["k_sweep:0.8"])
    assert np.abs(alone - refined).max() >= 2  # the refiner's UNet ran the low-noise calls


@pytest.mark.slow
def test_image_to_image_hands_over_to_the_refiner(runs):
    # strength 0.5: the base runs timesteps 501 .. 201 of the 10-step schedule, the refiner 101 and 1
    alone, refined = pixels(runs["i2i_sweep:None"]), pixels(runs["i2i_sweep:0.8"])
    assert np.abs(alone - refined).max() >= 2
    record = json.loads((runs["i2i_sweep:0.8"] / "images.json").read_text())[0]
    assert (record["mode"], record["strength"], record["refiner_switch"]) == ("img2img", 0.5, 0.8)


@pytest.mark.slow
def test_the_records_and_the_a1111_line_name_the_refiner_and_from_png_reads_them_back(runs, tmp_path):
    job = runs["sweep:0.5"]
    record = json.loads((job / "images.json").read_text())[0]
    assert record["refiner_switch"] == 0.5 and record["refiner"].startswith("tiny-sdxl-refiner:sha256=")
    inputs = json.loads((job / "inputs.json").read_text())
    with Image.open(job / record["file"]) as image:
        text = image.text["parameters"]
    digest = record["refiner"].rpartition("sha256=")[2]
    assert f", Refiner: tiny-sdxl-refiner [{digest[:10]}], Refiner switch at: 0.5" in text
    remade = run_cli(str(job / record["file"]), *REFINED, "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    assert "Refiner switch at: 0.5 -> sampling.refiner_switch=0.5" in said
    assert "refiners are not found by name here; give model.refiner=PATH" in said
    again = json.loads((tmp_path / "from_png" / "images.json").read_text())[0]
    assert again["pixels_sha256"] == record["pixels_sha256"]
    assert inputs["refiner"]["path"] == str(REFINER) and inputs["refiner"]["sha256"].startswith(digest)


@pytest.mark.parametrize("overrides, expected", [
    (["sampling.refiner_switch=1.5"], "error: sampling.refiner_switch: 1.5"),
    (["sampling.refiner_switch=0"], "error: sampling.refiner_switch: 0"),
    ([f"model.refiner={FIXTURE / 'missing'}"], "error: model.refiner: no such directory"),
    ([f"model.refiner={BASE}"], "error: model.refiner: " + str(BASE) + " holds a StableDiffusionXLPipeline, not an"),
    ([f"model.refiner={REFINER}", "mode=inpaint"], "error: model.refiner: mode=inpaint with a refiner"),
])
def test_bad_refiner_settings_are_one_line(tmp_path, overrides, expected):
    assert_one_line_error(call_cli(*COMMON, *overrides, cwd=tmp_path), expected)


def test_a_refiner_behind_an_sd1_model_is_one_line(tmp_path, cache_dir):
    result = run_cli("+experiment=smoke", "tracking=none", f"paths.cache_dir={cache_dir}", f"model.refiner={REFINER}",
                     cwd=tmp_path)
    assert_one_line_error(result, "error: model.refiner: a refiner takes over from an SDXL base")
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("*.png"))
