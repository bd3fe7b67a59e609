"""scheduler=lcm, diffusers' PyTorch LCMScheduler (issue #49), which diffusers has no Flax class for: its timesteps and
its steps against the source of diffusers 0.39's scheduling_lcm.py transcribed in NumPy (set_timesteps, step with its
boundary condition), run in the pipeline's jitted loop on a stand-in model with the same noise; what it cannot run is
one line. (Its images through the UNet: tests/test_schedulers.py's sweep over every scheduler.)"""

from __future__ import annotations

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, call_cli

SD_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000)


def diffusers_lcm_timesteps(num_inference_steps: int, original_steps: int = 50, num_train_timesteps: int = 1000,
                            strength: float = 1.0) -> np.ndarray:
    """LCMScheduler.set_timesteps, "standard" schedule."""
    k = num_train_timesteps // original_steps
    lcm_origin_timesteps = np.asarray(list(range(1, int(original_steps * strength) + 1))) * k - 1
    skipping_step = len(lcm_origin_timesteps) // num_inference_steps
    if skipping_step < 1 or num_inference_steps > original_steps:
        raise ValueError("too many steps")
    lcm_origin_timesteps = lcm_origin_timesteps[::-1].copy()
    inference_indices = np.linspace(0, len(lcm_origin_timesteps), num=num_inference_steps, endpoint=False)
    inference_indices = np.floor(inference_indices).astype(np.int64)
    return lcm_origin_timesteps[inference_indices]


def diffusers_lcm_step(alphas_cumprod, timesteps, step_index, model_output, timestep, sample, noise,
                       prediction_type="epsilon", timestep_scaling=10.0):
    """LCMScheduler.step (no clipping or thresholding, its defaults): (prev_sample, denoised)."""
    prev_step_index = step_index + 1
    prev_timestep = timesteps[prev_step_index] if prev_step_index < len(timesteps) else timestep
    alpha_prod_t = alphas_cumprod[timestep]
    alpha_prod_t_prev = alphas_cumprod[prev_timestep]
    beta_prod_t, beta_prod_t_prev = 1 - alpha_prod_t, 1 - alpha_prod_t_prev
    sigma_data = 0.5
    scaled_timestep = timestep * timestep_scaling
    c_skip = sigma_data**2 / (scaled_timestep**2 + sigma_data**2)
    c_out = scaled_timestep / (scaled_timestep**2 + sigma_data**2) ** 0.5
    if prediction_type == "epsilon":
        predicted_original_sample = (sample - np.sqrt(beta_prod_t) * model_output) / np.sqrt(alpha_prod_t)
    else:  # v_prediction
        predicted_original_sample = np.sqrt(alpha_prod_t) * sample - np.sqrt(beta_prod_t) * model_output
    denoised = c_out * predicted_original_sample + c_skip * sample
    if step_index != len(timesteps) - 1:
        prev_sample = np.sqrt(alpha_prod_t_prev) * denoised + np.sqrt(beta_prod_t_prev) * noise
    else:
        prev_sample = denoised
    return prev_sample, denoised


@pytest.mark.parametrize("original", [50, 20])
def test_the_timesteps_are_lcm_schedulers(original):
    from sdjax_runner.families.sd.models.schedulers import lcm_timesteps

    for steps in range(1, original + 1):
        np.testing.assert_array_equal(lcm_timesteps(steps, 1000, original), diffusers_lcm_timesteps(steps, original))
    np.testing.assert_array_equal(lcm_timesteps(4), [999, 759, 499, 259])
    with pytest.raises(ValueError):
        lcm_timesteps(original + 1, 1000, original)


def toy_model(sample, t):
    """A stand-in for the UNet: any smooth function of the sample and timestep will do."""
    return 0.3 * sample + 0.001 * t


@pytest.mark.parametrize(("steps", "prediction"), [(1, "epsilon"), (4, "epsilon"), (8, "v_prediction")])
def test_the_jitted_loop_steps_as_lcm_scheduler(monkeypatch, steps, prediction):
    import jax
    import jax.numpy as jnp

    from sdjax_runner.families.sd.models.schedulers import LCMScheduler, ddim

    rng = np.random.default_rng(steps)
    shape = (2, 4, 8, 8)
    noises = rng.standard_normal((1000, *shape)).astype(np.float32)  # the noise drawn at timestep t: noises[t]
    monkeypatch.setattr(ddim, "image_noise", lambda key, t, sample: jnp.asarray(noises)[t])
    scheduler = LCMScheduler.from_config(dict(SD_SCHEDULER, prediction_type=prediction))
    start = rng.standard_normal(shape).astype(np.float32)

    @jax.jit
    def loop(sample):
        state = scheduler.set_timesteps(scheduler.create_state(), num_inference_steps=steps, shape=shape)
        sample = sample * state.init_noise_sigma

        def body(i, carry):
            sample, state = carry
            t = jnp.array(state.timesteps, dtype=jnp.int32)[i]
            return scheduler.step(state, toy_model(scheduler.scale_model_input(state, sample, t), t), t,
                                  sample).to_tuple()

        return jax.lax.fori_loop(0, steps, body, (sample, state))[0]

    got = np.asarray(loop(jnp.asarray(start)))

    betas = np.linspace(0.00085**0.5, 0.012**0.5, 1000, dtype=np.float64) ** 2
    alphas_cumprod = np.cumprod(1.0 - betas)
    timesteps = diffusers_lcm_timesteps(steps)
    sample = start.astype(np.float64)  # init_noise_sigma 1
    for index, t in enumerate(timesteps):
        sample, _ = diffusers_lcm_step(alphas_cumprod, timesteps, index, toy_model(sample, t), int(t), sample,
                                       noises[t].astype(np.float64), prediction)
    np.testing.assert_allclose(got, sample, rtol=2e-4, atol=2e-4)
    assert np.abs(got - start).max() > 0.1


@pytest.mark.parametrize(("overrides", "expected"), [
    (["scheduler=lcm", "sampling.num_inference_steps=60"],
     "error: sampling.num_inference_steps: 60 steps: scheduler=lcm runs at most its 50 distillation steps"),
    (["scheduler=lcm", "sampling.num_inference_steps=8", "+scheduler.config_overrides.original_inference_steps=4"],
     "error: sampling.num_inference_steps: 8 steps: scheduler=lcm runs at most its 4 distillation steps"),
    (["scheduler=lcm", "sampling.num_inference_steps=8", "sampling.hires.scale=2",
      "sampling.hires.denoising_strength=0.1"],
     "error: sampling.hires.steps: 80 steps (the second pass's schedule: steps / strength): scheduler=lcm runs at "
     "most its 50"),
    (["scheduler=lcm", "+scheduler.config_overrides.skip_prk_steps=true"],
     "error: scheduler.config_overrides.skip_prk_steps: not a lcm setting"),
])
def test_lcm_it_cannot_run_is_one_line(tmp_path, overrides, expected):
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", *overrides, cwd=tmp_path), expected)
