"""Guiders (guider=NAME, issue #62 item 1): each is diffusers' guider of the same name, checked against a NumPy
transcription of diffusers' code (tests/helpers/guiders_reference.py) on fixed predictions; through the command line a
sweep over a guider's setting compiles once, APG at eta 1 without a cap is plain CFG's images, the record and the PNG
name the guider and from_png remakes its images; what a guider cannot run with is one line."""

from __future__ import annotations

import dataclasses
import json
import logging

import numpy as np
import pytest
from PIL import Image

from helpers import guiders_reference as reference
from helpers.cli import ONE_DEVICE, assert_one_line_error, call_cli, run_cli


def predictions(seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """(unconditional, conditional) predictions of 3 images, correlated as a model's are."""
    rng = np.random.default_rng(seed)
    uncond = rng.standard_normal((3, 4, 8, 8)).astype(np.float32)
    return uncond, (uncond + 0.6 * rng.standard_normal((3, 4, 8, 8))).astype(np.float32)


def ours(name: str, scale: float, step: int = 3, **settings) -> np.ndarray:
    from sdjax_runner.engine.guiders import Guidance, guided

    uncond, cond = predictions()
    values = {key: np.float32(value) for key, value in settings.items()}
    return np.asarray(guided(uncond, cond, Guidance(np.float32(scale), name, settings=values), np.int32(step)))


@pytest.mark.parametrize("scale", [0.5, 3.0, 7.5])
def test_cfg_is_diffusers_classifier_free_guidance(scale):
    uncond, cond = predictions()
    np.testing.assert_allclose(ours("cfg", scale), reference.classifier_free_guidance(cond, uncond, scale),
                               rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("scale", [3.0, 7.5])
@pytest.mark.parametrize(("step", "zero_init_steps"), [(0, 1), (1, 1), (0, 0), (2, 3), (3, 3)])
def test_cfg_zero_star_is_diffusers_classifier_free_zero_star_guidance(scale, step, zero_init_steps):
    uncond, cond = predictions()
    expected = reference.classifier_free_zero_star_guidance(cond, uncond, scale, step, zero_init_steps)
    got = ours("cfg_zero_star", scale, step, zero_init_steps=zero_init_steps)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5)
    assert (step < zero_init_steps) == (not got.any())  # zeros on the first zero_init_steps steps alone
    if step >= zero_init_steps:  # the optimal scale moves it off plain CFG
        assert np.abs(got - reference.classifier_free_guidance(cond, uncond, scale)).max() > 1e-3


@pytest.mark.parametrize("scale", [3.0, 7.5])
@pytest.mark.parametrize("eta", [0.0, 0.5, 1.0])
@pytest.mark.parametrize("norm_threshold", [0.0, 2.0, 15.0])
def test_apg_is_diffusers_normalized_guidance(scale, eta, norm_threshold):
    uncond, cond = predictions()
    expected = reference.normalized_guidance(cond, uncond, scale, eta, norm_threshold)
    np.testing.assert_allclose(ours("apg", scale, eta=eta, norm_threshold=norm_threshold), expected,
                               rtol=1e-5, atol=1e-5)
    if eta == 1 and norm_threshold == 0:  # the update's two parts put back together: plain CFG
        np.testing.assert_allclose(expected, reference.classifier_free_guidance(cond, uncond, scale), atol=1e-5)


@pytest.mark.parametrize("steps", [1, 4, 10, 28, 50])
@pytest.mark.parametrize(("start", "stop"), [(0.0, 1.0), (0.2, 0.8), (0.0, 0.5), (0.35, 1.0), (0.29, 0.71)])
def test_a_guiders_window_is_diffusers_and_outside_it_the_conditional_prediction(steps, start, stop):
    """diffusers' BaseGuidance: a step guides where int(start * steps) <= step < int(stop * steps); the others give
    pred_cond. The bounds as Python computes them for a count known when tracing, in float32 for a traced one."""
    import jax.numpy as jnp

    from sdjax_runner.engine.guiders import Guidance, guided, within

    expected = [int(start * steps) <= step < int(stop * steps) for step in range(steps)]
    assert [bool(within(step, steps, start, stop)) for step in range(steps)] == expected
    assert [bool(within(step, jnp.int32(steps), start, stop)) for step in range(steps)] == expected
    uncond, cond = predictions()
    guidance = Guidance(np.float32(7.5), "apg", settings={"eta": np.float32(0.5), "norm_threshold": np.float32(0)},
                        window=(start, stop))
    for step in range(steps):
        got = np.asarray(guided(uncond, cond, guidance, np.int32(step), steps))
        np.testing.assert_array_equal(got, np.asarray(guided(uncond, cond, dataclasses.replace(guidance, window=None),
                                                             np.int32(step))) if expected[step] else cond)


def test_every_guider_is_in_both_registries_and_in_the_families_that_run_it():
    from sdjax_runner.config.families import FAMILIES
    from sdjax_runner.config.guiders import COMBINING
    from sdjax_runner.config.guiders import GUIDERS as ENTRIES
    from sdjax_runner.engine.guiders import GUIDERS, PERTURBING

    assert set(ENTRIES) == set(GUIDERS) and set(PERTURBING) == {"pag", "seg"}
    assert GUIDERS["pag"] is GUIDERS["seg"] is GUIDERS["skip_layer"] is GUIDERS["cfg"]
    assert set(FAMILIES["sd"].guiders) == set(ENTRIES) - {"skip_layer"}  # (a UNet has no blocks to skip)
    assert set(COMBINING) == {"cfg", "cfg_zero_star", "apg"}
    # FLUX.1's transformer takes no change (PAG, SEG, FreeU, skipped blocks); SD 3's takes PAG's and SEG's perturbed
    # attention (tests/test_pag_sd3.py) and skip-layer guidance's skipped blocks (tests/test_sd3_runs.py)
    assert set(FAMILIES["flux"].guiders) == set(COMBINING)
    assert set(FAMILIES["sd3"].guiders) == {*COMBINING, "pag", "seg", "skip_layer"}


def test_a_family_that_lists_fewer_guiders_refuses_the_others_in_one_line():
    import dataclasses

    from helpers.configs import compose_cfg
    from sdjax_runner.config import guiders
    from sdjax_runner.config.families import FAMILIES
    from sdjax_runner.config.plan import admit
    from sdjax_runner.errors import UserError

    config = admit(compose_cfg(["+experiment=smoke", "guider=apg"]))
    with pytest.raises(UserError) as refused:
        guiders.check(config, dataclasses.replace(FAMILIES["sd"], guiders=("cfg",)))
    assert str(refused.value) == "guider: apg: tiny-random is a sd model, which runs cfg (allowed: cfg)"


def test_a_setting_the_guider_does_not_read_is_said_and_left_out(caplog):
    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan

    with caplog.at_level(logging.WARNING, logger="sdjax_runner"):
        plan = make_plan(admit(compose_cfg(["+experiment=smoke", "guider.eta=0.5"])), 8)
    assert plan.guider.name == "cfg" and plan.guider.settings == ()
    assert "guider.eta: 0.5 is read by apg; guider=cfg runs without it" in caplog.text
    plan = make_plan(admit(compose_cfg(["+experiment=smoke", "guider=apg", "guider.eta=0.5"])), 8)
    assert plan.guider.settings == (("eta", 0.5), ("norm_threshold", 15.0))


@pytest.mark.parametrize(("overrides", "expected"), [
    (["guider=nope"], "error: guider=nope: no such option (allowed: apg, cfg, cfg_zero_star, freeu, pag, seg, "
                      "skip_layer)"),
    (["model=tiny-random-flux", "guider=apg"],
     "error: guider: apg: FLUX.1 combines two predictions only with true CFG (its guidance is distilled) (allowed: "
     "cfg, or apg with sampling.true_cfg_scale and prompts.negative)"),
    (["guider=apg", "guider.norm_threshold=-1"], "error: guider.norm_threshold: must be >= 0, got -1.0"),
    (["guider=apg", "guider.eta=inf"], "error: guider.eta: must be a finite number, got inf"),
    (["guider=cfg_zero_star", "guider.zero_init_steps=-2"], "error: guider.zero_init_steps: must be >= 0, got -2"),
    (["guider.start=0.8", "guider.stop=0.5"],
     "error: guider.stop: start 0.8, stop 0.5 (allowed: 0 <= start < stop <= 1, fractions of the steps)"),
    (["model=tiny-random-flux", "guider.stop=0.5"], "error: guider: cfg with a window: FLUX.1 combines two "
     "predictions only with true CFG (its guidance is distilled) (allowed: cfg, or cfg with sampling.true_cfg_scale "
     "and prompts.negative)"),
])
def test_what_a_guider_cannot_run_with_is_one_line(tmp_path, overrides, expected):
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", *overrides, cwd=tmp_path), expected)


def _hashes(run_dir) -> list[str]:
    return [r["pixels_sha256"] for r in json.loads((run_dir / "images.json").read_text())]


def _pixels(run_dir) -> np.ndarray:
    return np.stack([np.asarray(Image.open(p), dtype=np.int16) for p in sorted((run_dir / "images").glob("*.png"))])


@pytest.mark.slow
def test_an_apg_sweep_compiles_once_its_eta_1_is_cfg_and_from_png_remakes_it(tmp_path, cache_dir):
    quiet = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", *ONE_DEVICE,
             "compilation_cache.executables=false", f"paths.cache_dir={cache_dir}"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *quiet, "guider=apg", "guider.norm_threshold=0", "guider.eta=1,0",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "; guider apg (eta 1, norm_threshold 0)" in result.stdout  # the plan line
    plain = run_cli(*quiet, "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    # eta 1 without a cap recombines CFG's update: CFG's images within float32 rounding; eta 0 drops its parallel part
    assert np.abs(_pixels(sweep / "0") - _pixels(tmp_path / "plain")).max() <= 1
    assert np.abs(_pixels(sweep / "1") - _pixels(sweep / "0")).max() >= 2
    timings = json.loads((sweep / "1" / "timings.json").read_text())
    assert timings["compile_reused"] == 1  # eta is a traced input: one program for the sweep
    record = json.loads((sweep / "1" / "images.json").read_text())[0]
    assert (record["guider"], record["guider_settings"]) == ("apg", "eta=0 norm_threshold=0")
    assert "guider" not in json.loads((tmp_path / "plain" / "images.json").read_text())[0]
    png = sweep / "1" / record["file"]
    with Image.open(png) as image:
        assert "Guider: apg, Guider eta: 0, Guider norm_threshold: 0, " in image.text["parameters"]
    remade = run_cli(str(png), "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
                     *ONE_DEVICE, "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    assert "Guider: apg -> guider=apg" in said and "Guider eta: 0 -> guider.eta=0" in said
    assert _hashes(tmp_path / "from_png")[0] == record["pixels_sha256"]
    # A window: CFG on the first half of the steps alone (the conditional prediction on the others)
    window = run_cli(*quiet, "guider.stop=0.5", "hydra.run.dir=window", cwd=tmp_path)
    assert window.returncode == 0, window.stderr[-3000:]
    assert "; guider cfg (start 0, stop 0.5)" in window.stdout
    assert np.abs(_pixels(tmp_path / "window") - _pixels(tmp_path / "plain")).max() >= 2
    record = json.loads((tmp_path / "window" / "images.json").read_text())[0]
    assert (record["guider"], record["guider_settings"]) == ("cfg", "start=0 stop=0.5")


@pytest.mark.slow
def test_cfg_zero_star_zeroes_its_first_steps_on_a_k_sampler_and_a_sweep_compiles_once(tmp_path, cache_dir):
    """On a k sampler the step is the sigma's place in its schedule. With every step zeroed, Euler's derivative is
    zero at each step: the latents stay the initial noise, the same whatever the prompt (the guidance is never
    read); with none zeroed the prompt shows."""
    quiet = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", *ONE_DEVICE,
             "compilation_cache.executables=false", f"paths.cache_dir={cache_dir}", "sampler=Euler",
             "guider=cfg_zero_star"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *quiet, "guider.zero_init_steps=0,1,4", "prompts.texts=[a red cube],[a blue sphere]",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {}
    for job in sweep.glob("[0-9]"):
        record = json.loads((job / "images.json").read_text())[0]
        jobs[(record["guider_settings"], record["prompt"])] = _pixels(job)
    assert len(jobs) == 6
    compiled = [json.loads((job / "timings.json").read_text())["compile_reused"] for job in sweep.glob("[0-9]")]
    assert sorted(compiled) == [0, 1, 1, 1, 1, 1]  # the steps zeroed and the prompts are inputs: one program
    assert np.array_equal(jobs[("zero_init_steps=4", "a red cube")], jobs[("zero_init_steps=4", "a blue sphere")])
    assert np.abs(jobs[("zero_init_steps=0", "a red cube")] - jobs[("zero_init_steps=0", "a blue sphere")]).max() >= 2
    assert np.abs(jobs[("zero_init_steps=1", "a red cube")] - jobs[("zero_init_steps=0", "a red cube")]).max() >= 2
    # one zeroed step is not four: each call's step is its sigma's place, not the first's
    assert np.abs(jobs[("zero_init_steps=1", "a red cube")] - jobs[("zero_init_steps=4", "a red cube")]).max() >= 2


@pytest.mark.slow
@pytest.mark.parametrize(("sampler", "others"), [([], 0), (["sampler=dpmpp_2m", "scheduler=karras"], 1)],
                         ids=["euler", "k sampler"])
def test_sd3_runs_the_guiders_on_its_euler_and_a_flow_k_sampler(tmp_path, cache_dir, sampler, others):
    """SD 3's flow model (the family CFG-Zero* was made for): with every step zeroed the velocity is zero and the
    latents stay the initial noise, whatever the prompt, while fewer zeroed steps differ (on the k sampler: the step
    is its sigma's place in the schedule); one program for the sweep. On its Euler, APG at eta 1 without a cap is
    CFG's images."""
    quiet = ["+experiment=sd3_smoke", "tracking=none", "metrics.clip_score.enabled=false", *ONE_DEVICE,
             "compilation_cache.executables=false", f"paths.cache_dir={cache_dir}", *sampler]
    zero = tmp_path / "zero"
    result = run_cli("-m", *quiet, "guider=cfg_zero_star", f"guider.zero_init_steps=4,{others}",
                     "prompts.texts=[a red cube],[a blue sphere]", f"hydra.sweep.dir={zero}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = {(r["guider_settings"], r["prompt"]): _pixels(job) for job in zero.glob("[0-9]")
            for r in json.loads((job / "images.json").read_text())[:1]}
    assert np.array_equal(jobs[("zero_init_steps=4", "a red cube")], jobs[("zero_init_steps=4", "a blue sphere")])
    fewer = f"zero_init_steps={others}"
    assert np.abs(jobs[(fewer, "a red cube")] - jobs[(fewer, "a blue sphere")]).max() >= 2
    assert np.abs(jobs[(fewer, "a red cube")] - jobs[("zero_init_steps=4", "a red cube")]).max() >= 2
    assert sorted(json.loads((job / "timings.json").read_text())["compile_reused"] for job in zero.glob("[0-9]")) \
        == [0, 1, 1, 1]
    if sampler:
        return
    apg = run_cli(*quiet, "guider=apg", "guider.eta=1", "guider.norm_threshold=0", "hydra.run.dir=apg", cwd=tmp_path)
    plain = run_cli(*quiet, "hydra.run.dir=plain", cwd=tmp_path)
    assert apg.returncode == 0 and plain.returncode == 0, (apg.stderr + plain.stderr)[-3000:]
    assert np.abs(_pixels(tmp_path / "apg") - _pixels(tmp_path / "plain")).max() <= 1


@pytest.mark.slow
def test_flux_true_cfg_is_traced_and_takes_the_guiders(tmp_path, cache_dir):
    """FLUX.1 [dev]'s true CFG (FluxPipeline's true_cfg_scale, its negative prompt's prediction the unconditional
    one): a sweep over its scale compiles once (it was a constant of the program), and a guider combines the two
    predictions -- APG at eta 1 without a cap is true CFG's images."""
    quiet = ["+experiment=flux_smoke", "tracking=none", "metrics.clip_score.enabled=false", *ONE_DEVICE,
             "compilation_cache.executables=false", f"paths.cache_dir={cache_dir}", "prompts.negative=blurry"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *quiet, "sampling.true_cfg_scale=2,4", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert [json.loads((sweep / job / "timings.json").read_text())["compile_reused"] for job in "01"] == [0, 1]
    assert np.abs(_pixels(sweep / "0") - _pixels(sweep / "1")).max() >= 2
    apg = run_cli(*quiet, "sampling.true_cfg_scale=4", "guider=apg", "guider.eta=1", "guider.norm_threshold=0",
                  "hydra.run.dir=apg", cwd=tmp_path)
    assert apg.returncode == 0, apg.stderr[-3000:]
    assert np.abs(_pixels(tmp_path / "apg") - _pixels(sweep / "1")).max() <= 1
    zero = run_cli(*quiet, "sampling.true_cfg_scale=4", "guider=cfg_zero_star", "hydra.run.dir=zero", cwd=tmp_path)
    assert zero.returncode == 0, zero.stderr[-3000:]
    assert np.abs(_pixels(tmp_path / "zero") - _pixels(sweep / "1")).max() >= 2
