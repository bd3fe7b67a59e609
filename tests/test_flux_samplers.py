"""FLUX.1's k samplers as ComfyUI runs them on flow models, against a NumPy transcription of ComfyUI's published
code (tests/helpers/comfy_flow_reference.py for its model sampling and schedules, tests/helpers/k_reference.py
for the k-diffusion samplers it runs unchanged): the schedules over the flow sigmas, and each sampler's stage
on a closed-form flow model (Gaussian data, whose velocity is known exactly). Then the samplers through the
tiny FLUX model from the command line, as users name them."""

from __future__ import annotations

import json
from types import SimpleNamespace

import numpy as np
import pytest

from helpers import comfy_flow_reference as comfy
from helpers import k_reference
from helpers.cli import assert_one_line_error, call_cli, run_cli
from sdjax_runner.config.samplers import FLOW_K_SAMPLERS, FLOW_SCHEDULES
from sdjax_runner.families.flux.engine import sigmas as flow

# FLUX.1-dev's and -schnell's scheduler configs (the values the engine reads).
DEV = {"use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15, "base_image_seq_len": 256,
       "max_image_seq_len": 4096, "shift": 3.0}
SCHNELL = {"use_dynamic_shifting": False, "shift": 1.0, "base_image_seq_len": 256, "max_image_seq_len": 4096}


@pytest.mark.parametrize("name", FLOW_SCHEDULES)
@pytest.mark.parametrize("config", [DEV, SCHNELL], ids=["dev", "schnell"])
def test_each_flow_schedule_is_comfyuis(name, config):
    for height, width in ((1024, 1024), (512, 768), (32, 32)):
        table, sigma = flow.flow_model(config, height, width, 8)
        reference = comfy.model_sampling(config, width, height)
        np.testing.assert_allclose(table, reference.sigmas, rtol=1e-6)
        for steps in (1, 4, 20, 50):
            ours = flow.schedule(name, steps, table, sigma)
            expected = comfy.calculate_sigmas(reference, name, steps)
            assert ours.dtype == np.float32 and ours[-1] == 0 and np.all(np.diff(ours) < 0)
            np.testing.assert_allclose(ours, expected, rtol=2e-6, atol=1e-7, err_msg=f"{name} {steps} {height}x{width}")


MU, VAR = 0.3, 0.5  # the data: every latent element ~ N(MU, VAR)


def closed_form_denoised(x, t):
    """E[x0 | x_t] for x_t = (1 - t) x0 + t eps, x0 ~ N(MU, VAR), eps ~ N(0, 1)."""
    return MU + (1 - t) * VAR / ((1 - t) ** 2 * VAR + t**2) * (x - (1 - t) * MU)


class ClosedFormTransformer:
    """Stands for the FLUX transformer: the exact velocity ``(x - E[x0 | x]) / t`` at timestep ``t``."""

    def apply(self, variables, x, context, pooled, timestep, img_ids, txt_ids, guidance=None):
        t = timestep[:, None, None]
        return (x - closed_form_denoised(x, t)) / t


@pytest.mark.parametrize("name", FLOW_K_SAMPLERS)
@pytest.mark.parametrize("schedule", ["simple", "normal", "beta"])
def test_each_flow_sampler_is_comfyuis_on_a_closed_form_model(name, schedule):
    import jax
    import jax.numpy as jnp

    from sdjax_runner.engine.encode import Conditioning
    from sdjax_runner.engine.guiders import Guidance
    from sdjax_runner.engine.modes.start import Start
    from sdjax_runner.families.flux.engine import stages
    from sdjax_runner.families.flux.engine.samplers import SAMPLERS

    height = width = 64
    pipeline = SimpleNamespace(transformer=ClosedFormTransformer(), vae_scale_factor=8, scheduler_config=DEV,
                               dtype=jnp.float32, guidance_embeds=False)
    spec = SimpleNamespace(steps=10, height=height, width=width, sigmas=schedule)
    noise = np.random.default_rng(0).standard_normal((2, 16, 8, 8)).astype(np.float32)
    conditioning = Conditioning(jnp.zeros((2, 4, 8)), {"pooled": jnp.zeros((2, 8))})
    ours = jax.jit(lambda n: SAMPLERS[name](pipeline, {"transformer": {}}, conditioning, Start(n), Guidance(3.5),
                                            spec))(noise)

    reference = comfy.model_sampling(DEV, width, height)
    sigmas = comfy.calculate_sigmas(reference, schedule, spec.steps)
    x = sigmas[0] * stages.pack(noise) + (1.0 - sigmas[0]) * 0  # CONST.noise_scaling on an empty latent
    expected = k_reference.sample(name, closed_form_denoised, x, sigmas, None) / (1.0 - sigmas[-1])
    np.testing.assert_allclose(stages.pack(np.asarray(ours)), expected, rtol=2e-4, atol=2e-5)
    if name != "dpmpp_2m":
        # Euler, Heun and LMS integrate dx/dsigma = (x - D) / sigma, which for a flow model is its own ODE (the
        # velocity): they end with the data's statistics. DPM++ 2M's exponential step is derived for x0 + sigma
        # eps, not (1 - sigma) x0 + sigma eps; ComfyUI runs it on FLUX as it is, and so does the runner.
        assert abs(float(expected.mean()) - MU) < 0.1 and abs(float(expected.var()) - VAR) < 0.15


def test_euler_without_a_schedule_is_diffusers_and_with_one_comfyuis():
    from sdjax_runner.config.samplers import resolve_flow

    assert resolve_flow(None, "pndm").sigmas is None and resolve_flow("euler", "flow_match_euler").sigmas is None
    assert resolve_flow("Euler", "simple").sigmas == "simple" and resolve_flow("euler", "beta").label == "Euler Beta"
    assert resolve_flow("DPM++ 2M", "pndm").sigmas == "simple"  # a k sampler's default schedule on FLUX.1
    assert resolve_flow("DPM++ 2M Karras", "pndm").label == "DPM++ 2M Karras"


@pytest.mark.parametrize("overrides,expected", [
    (["sampler=euler_ancestral"], "error: sampler: euler_ancestral: the flow models (FLUX.1, SD 3) run euler, heun, dpmpp_2m, lms"),
    (["sampler=heun", "scheduler=ddim"], "error: scheduler: ddim: the flow models (FLUX.1, SD 3) step with their own flow_match_euler"),
    (["sampler=DPM++ 2M Karras", "scheduler=simple"], "error: scheduler: simple, but sampler=DPM++ 2M Karras names "
     "the karras schedule"),
])
def test_what_flux_samplers_refuse_is_one_line(overrides, expected, tmp_path):
    assert_one_line_error(call_cli("+experiment=flux_smoke", "tracking=none", *overrides, cwd=tmp_path), expected)


def test_sd_refuses_the_flow_only_schedule_in_one_line(tmp_path):
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", "sampler=euler", "scheduler=beta",
                                   cwd=tmp_path),
                          "error: scheduler: beta: ComfyUI's beta schedule runs for FLUX.1's k samplers so far")


@pytest.mark.slow
def test_flux_samplers_from_the_command_line_as_users_name_them(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=flux_smoke", "sampler=Euler,Heun,DPM++ 2M,LMS", "scheduler=simple,beta",
                     "tracking=none", "metrics.clip_score.enabled=false", "parallelism.num_devices=1",
                     "compilation_cache.executables=false", f"paths.cache_dir={cache_dir}",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted((p for p in sweep.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    records = [json.loads((job / "images.json").read_text())[0] for job in jobs]
    timings = [json.loads((job / "timings.json").read_text()) for job in jobs]
    assert [(r["sampler"], r["schedule_type"]) for r in records] == [
        (sampler, schedule) for sampler in ("Euler", "Heun", "DPM++ 2M", "LMS") for schedule in ("Simple", "Beta")]
    assert len({r["pixels_sha256"] for r in records}) == len(records)  # each its own images
    assert {t["process_model_loads"] for t in timings} == {1}  # one load for the sweep
    from PIL import Image

    with Image.open(jobs[4] / records[4]["file"]) as image:
        assert "Sampler: DPM++ 2M, Schedule type: Simple, CFG scale: 1, Distilled CFG Scale: 3.5" \
               in image.info["parameters"]
