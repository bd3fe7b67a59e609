"""Zero terminal SNR (``rescale_betas_zero_snr``, issue #49): diffusers' ``rescale_zero_terminal_snr`` (Lin et al.
2023, algorithm 1) transcribed from its PyTorch source as the reference for the betas the runner's schedulers
run on; the last alphas_cumprod as each sampler family sets it (diffusers' Euler and DPM-Solver 2**-24, DDIM 0, the
k samplers A1111's and ComfyUI's 4.8973451890853435e-08); through the command line the v-prediction recipe of the
paper (zero SNR, CFG rescale) runs and a k sampler reads it rather than dropping it."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli


def diffusers_rescale_zero_terminal_snr(betas: np.ndarray) -> np.ndarray:
    """diffusers 0.39 schedulers/scheduling_ddim.py ``rescale_zero_terminal_snr``, torch ops in NumPy."""
    alphas = 1.0 - betas
    alphas_cumprod = np.cumprod(alphas, axis=0)
    alphas_bar_sqrt = np.sqrt(alphas_cumprod)
    alphas_bar_sqrt_0 = alphas_bar_sqrt[0].copy()
    alphas_bar_sqrt_T = alphas_bar_sqrt[-1].copy()
    alphas_bar_sqrt -= alphas_bar_sqrt_T
    alphas_bar_sqrt *= alphas_bar_sqrt_0 / (alphas_bar_sqrt_0 - alphas_bar_sqrt_T)
    alphas_bar = alphas_bar_sqrt**2
    alphas = alphas_bar[1:] / alphas_bar[:-1]
    alphas = np.concatenate([alphas_bar[0:1], alphas])
    return 1 - alphas


SD_BETAS = np.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=np.float64) ** 2


def test_the_betas_are_diffusers_rescale_zero_terminal_snr():
    from sdjax_runner.models.schedulers import rescale_zero_terminal_snr

    ours = rescale_zero_terminal_snr(SD_BETAS)
    np.testing.assert_allclose(ours, diffusers_rescale_zero_terminal_snr(SD_BETAS), rtol=1e-12, atol=1e-15)
    alphas_cumprod = np.cumprod(1 - ours)
    assert alphas_cumprod[-1] == 0 and np.isclose(alphas_cumprod[0], 1 - SD_BETAS[0])  # zero SNR, the start kept


@pytest.mark.parametrize("name,last", [("ddim", 0.0), ("euler", 2.0**-24), ("dpm_solver_pp", 2.0**-24)])
def test_each_scheduler_runs_on_the_rescaled_schedule(tiny_model_dir, name, last):
    from sdjax_runner.models.schedulers import build_scheduler

    _, plain = build_scheduler(name, {}, str(tiny_model_dir))
    scheduler, state = build_scheduler(name, {"rescale_betas_zero_snr": True}, str(tiny_model_dir))
    expected = diffusers_rescale_zero_terminal_snr(np.asarray(plain.common.betas, np.float64))
    np.testing.assert_allclose(np.asarray(state.common.betas), expected, rtol=1e-5, atol=1e-7)
    assert float(state.common.alphas_cumprod[-1]) == pytest.approx(last, abs=1e-12)
    assert scheduler.config["rescale_betas_zero_snr"] is True
    if name == "euler":  # its largest sigma is finite: sqrt((1 - 2**-24) / 2**-24)
        assert float(state.init_noise_sigma) == pytest.approx(np.sqrt((1 - 2.0**-24) / 2.0**-24), rel=1e-4)


def test_the_k_samplers_training_sigmas_end_where_a1111_and_comfyui_put_them():
    from sdjax_runner.engine.samplers.sigmas import training_sigmas

    sigmas = training_sigmas({"rescale_betas_zero_snr": True})
    last = 4.8973451890853435e-08  # A1111's rescale_zero_terminal_snr_abar, ComfyUI's ModelSamplingDiscrete(zsnr)
    assert sigmas[-1] == pytest.approx(np.sqrt((1 - last) / last))  # ~4518.8
    alphas_cumprod = np.cumprod(1 - diffusers_rescale_zero_terminal_snr(SD_BETAS))
    np.testing.assert_allclose(sigmas[:-1], np.sqrt((1 - alphas_cumprod[:-1]) / alphas_cumprod[:-1]), rtol=1e-10)


@pytest.mark.slow
def test_the_zero_snr_recipe_runs_and_a_k_sampler_reads_it(tmp_path, cache_dir):
    quiet = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
             "parallelism.num_devices=2", "compilation_cache.executables=false"]
    sweep = tmp_path / "ddim"
    result = run_cli("-m", *quiet, "scheduler=ddim", "+scheduler.config_overrides.rescale_betas_zero_snr=true,false",
                     "model.prediction_type=v_prediction", "sampling.guidance_rescale=0.7", f"hydra.sweep.dir={sweep}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    k = tmp_path / "k"
    result = run_cli("-m", *quiet, "sampler=euler", "scheduler=karras",
                     "+scheduler.config_overrides.rescale_betas_zero_snr=true,false", f"hydra.sweep.dir={k}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for runs in (sweep, k):
        records = [json.loads((runs / job / "images.json").read_text()) for job in ("0", "1")]
        assert all(r["non_finite"] is False for job in records for r in job)
        assert {r["pixels_sha256"] for r in records[0]}.isdisjoint(r["pixels_sha256"] for r in records[1])
    refused = run_cli(*quiet, "scheduler=pndm", "+scheduler.config_overrides.rescale_betas_zero_snr=true",
                      "hydra.run.dir=pndm", cwd=tmp_path)
    assert_one_line_error(refused, "error: scheduler.config_overrides.rescale_betas_zero_snr: not a pndm setting")


def test_a_sigma_schedules_other_settings_are_one_line_not_dropped(tmp_path):
    from helpers.cli import call_cli

    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", "sampler=euler", "scheduler=karras",
                                   "+scheduler.config_overrides.beta_end=0.02", cwd=tmp_path),
                          "error: scheduler.config_overrides.beta_end: euler runs on the karras sigma schedule, which "
                          "reads no diffusers scheduler setting (allowed: rescale_betas_zero_snr only")
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", "sampler=euler", "scheduler=karras",
                                   "+scheduler.config_overrides.rescale_betas_zero_snr=3", cwd=tmp_path),
                          "error: scheduler.config_overrides.rescale_betas_zero_snr: 3 is not true or false")
