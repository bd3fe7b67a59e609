"""timestep_spacing (issue #49) for diffusers' DDIM and Euler, which their Flax versions lack in part (Flax DDIM:
leading only; Flax Euler: no trailing): the timesteps are diffusers' PyTorch ``set_timesteps``', transcribed here
from its source (DDIMScheduler, EulerDiscreteScheduler, diffusers 0.39) as the reference; SDXL Lightning's trailing
Euler runs through the command line."""

from __future__ import annotations

import json

import numpy as np
import pytest

from helpers.cli import run_cli


def pytorch_ddim_timesteps(spacing: str, steps: int, train: int = 1000, steps_offset: int = 0) -> np.ndarray:
    """DDIMScheduler.set_timesteps (diffusers 0.39), NumPy."""
    if spacing == "linspace":
        return np.linspace(0, train - 1, steps).round()[::-1].copy().astype(np.int64)
    if spacing == "leading":
        step_ratio = train // steps
        return (np.arange(0, steps) * step_ratio).round()[::-1].copy().astype(np.int64) + steps_offset
    step_ratio = train / steps  # trailing
    return np.round(np.arange(train, 0, -step_ratio)).astype(np.int64) - 1


def pytorch_euler_trailing(alphas_cumprod: np.ndarray, steps: int, train: int = 1000) -> tuple[np.ndarray, ...]:
    """EulerDiscreteScheduler.set_timesteps with timestep_spacing="trailing" (interpolation "linear"), NumPy:
    (timesteps, sigmas with the final 0, init_noise_sigma)."""
    step_ratio = train / steps
    timesteps = (np.arange(train, 0, -step_ratio)).round().copy().astype(np.float32) - 1
    sigmas = np.array(((1 - alphas_cumprod) / alphas_cumprod) ** 0.5)
    sigmas = np.interp(timesteps, np.arange(0, len(sigmas)), sigmas)
    sigmas = np.concatenate([sigmas, [0.0]]).astype(np.float32)
    return timesteps, sigmas, sigmas.max()


@pytest.mark.parametrize("spacing", ["linspace", "leading", "trailing"])
@pytest.mark.parametrize("steps", [1, 4, 7, 50])
def test_ddim_spaces_its_timesteps_as_diffusers_pytorch(tiny_model_dir, spacing, steps):
    from sdjax_runner.models.schedulers import build_scheduler

    scheduler, state = build_scheduler("ddim", {"timestep_spacing": spacing}, str(tiny_model_dir))
    offset = scheduler.config.steps_offset
    ours = np.asarray(scheduler.set_timesteps(state, steps).timesteps)
    np.testing.assert_array_equal(ours, pytorch_ddim_timesteps(spacing, steps, steps_offset=offset))
    if spacing == "trailing":
        assert ours[0] == 999  # the last training timestep: zero terminal SNR's recipe needs it


@pytest.mark.parametrize("steps", [1, 4, 8, 25])
def test_euler_trailing_is_diffusers_pytorch(tiny_model_dir, steps):
    from sdjax_runner.models.schedulers import build_scheduler

    scheduler, state = build_scheduler("euler", {"timestep_spacing": "trailing"}, str(tiny_model_dir))
    after = scheduler.set_timesteps(state, steps)
    timesteps, sigmas, init = pytorch_euler_trailing(np.asarray(state.common.alphas_cumprod, np.float64), steps)
    np.testing.assert_array_equal(np.asarray(after.timesteps), timesteps)
    np.testing.assert_allclose(np.asarray(after.sigmas), sigmas, rtol=1e-5)
    assert float(after.init_noise_sigma) == pytest.approx(float(init), rel=1e-5)


@pytest.mark.slow
def test_lightnings_trailing_euler_runs(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false",
                     f"paths.cache_dir={cache_dir}", "parallelism.num_devices=2", "scheduler=euler",
                     "+scheduler.config_overrides.timestep_spacing=trailing,leading", "sampling.guidance_scale=1",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads((sweep / job / "images.json").read_text()) for job in ("0", "1")]
    assert all(r["non_finite"] is False for job in records for r in job)
    assert {r["pixels_sha256"] for r in records[0]}.isdisjoint(r["pixels_sha256"] for r in records[1])
