"""Every diffusers scheduler runs the pipeline's loop to real, distinct images; a scheduler sweep loads once.
(The scheduler group's sigma schedules -- karras, ... -- are the k samplers': tests/test_samplers.py.)"""

import json

import numpy as np
import pytest
from PIL import Image

from helpers.cli import ONE_DEVICE, run_cli
from helpers.configs import options
from sdjax_runner.config.samplers import FLOW_ONLY_SCHEDULES, FLOW_SCHEDULER, SCHEDULES
from sdjax_runner.config.schema import SCHEDULERS as DIFFUSERS

# The SD family's diffusers schedulers (FLUX.1's own flow_match_euler: tests/test_flux_runs.py).
FLOW = {FLOW_SCHEDULER, *FLOW_ONLY_SCHEDULES}
SCHEDULERS = [name for name in options("scheduler") if name not in SCHEDULES and name not in FLOW]
assert sorted(SCHEDULERS) == sorted(DIFFUSERS)
assert set(options("scheduler")) == set(SCHEDULERS) | set(SCHEDULES) | FLOW


@pytest.mark.slow
def test_every_scheduler_gives_its_own_images_from_one_model_load(tmp_path, tiny_model_dir):
    sweep_dir = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", f"scheduler={','.join(SCHEDULERS)}", "tracking=none", *ONE_DEVICE,
                     f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    grids = {}
    for job, name in enumerate(SCHEDULERS):
        job_dir = sweep_dir / str(job)
        with Image.open(job_dir / "images" / "0000_seed0.png") as image:
            assert image.text["scheduler"] == name
        grid = np.asarray(Image.open(job_dir / "grid.png"))
        assert grid.std() > 10 and 5 < grid.mean() < 250  # a picture, not black (NaN) or blown out
        grids[name] = grid
        timings = json.loads((job_dir / "timings.json").read_text())
        assert timings["process_model_loads"] == 1  # the weights load once; each scheduler compiles
    assert len({g.tobytes() for g in grids.values()}) == len(SCHEDULERS)


SD_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000)


def toy_model(sample, t):
    """A stand-in for the UNet: any smooth function of the sample and timestep will do."""
    return 0.3 * sample + 0.001 * t


def run_in_jitted_loop(scheduler, steps, sample):
    """The pipeline's loop: set_timesteps, then step inside jax.lax.fori_loop, all under jit."""
    import jax
    import jax.numpy as jnp

    @jax.jit
    def loop(state, sample):
        state = scheduler.set_timesteps(state, num_inference_steps=steps, shape=sample.shape)
        sample = sample * state.init_noise_sigma

        def body(i, carry):
            sample, state = carry
            t = jnp.array(state.timesteps, dtype=jnp.int32)[i]
            output = toy_model(scheduler.scale_model_input(state, sample, t), t)
            return scheduler.step(state, output, t, sample).to_tuple()

        return jax.lax.fori_loop(0, steps, body, (sample, state))[0], state

    return loop(scheduler.create_state(), sample)


def test_lms_in_the_jitted_loop_matches_the_scipy_integrated_reference():
    import jax.numpy as jnp
    from scipy import integrate

    from sdjax_runner.families.sd.models.schedulers import LMSDiscreteScheduler as LMSScheduler

    scheduler = LMSScheduler(**SD_SCHEDULER)
    start = np.random.default_rng(0).standard_normal((2, 4, 8, 8)).astype(np.float32)
    got, state = run_in_jitted_loop(scheduler, 12, jnp.asarray(start))

    # diffusers' PyTorch LMSDiscreteScheduler, step by step, in NumPy + SciPy.
    sigmas, timesteps = np.asarray(state.sigmas, np.float64), np.asarray(state.timesteps)
    sample, derivatives = start.astype(np.float64) * sigmas.max(), []
    for i, t in enumerate(timesteps):
        sigma = sigmas[i]
        output = toy_model(sample / (sigma**2 + 1) ** 0.5, t)
        derivatives.append((sample - (sample - sigma * output)) / sigma)
        derivatives = derivatives[-4:]
        order = min(i + 1, 4)

        def coefficient(j, i=i, order=order):
            def basis(tau):
                return np.prod([(tau - sigmas[i - k]) / (sigmas[i - j] - sigmas[i - k]) for k in range(order) if k != j])
            return integrate.quad(basis, sigmas[i], sigmas[i + 1], epsrel=1e-6)[0]

        sample = sample + sum(coefficient(j) * d for j, d in enumerate(reversed(derivatives)))
    np.testing.assert_allclose(np.asarray(got), sample, rtol=2e-4, atol=2e-4)


@pytest.mark.slow
def test_ddpm_steps_between_inference_timesteps_and_noises_each_image_by_its_own_latents():
    import jax
    import jax.numpy as jnp

    from sdjax_runner.families.sd.models.schedulers import DDPMScheduler
    from sdjax_runner.families.sd.models.schedulers.common import image_noise

    scheduler = DDPMScheduler(**SD_SCHEDULER, clip_sample=False)
    state = scheduler.set_timesteps(scheduler.create_state(), num_inference_steps=10, shape=(2, 4, 8, 8))
    step = jax.jit(lambda sample, t: scheduler.step(state, toy_model(sample, t), t, sample).prev_sample)
    alphas_cumprod = np.asarray(state.common.alphas_cumprod, np.float64)
    sample = jnp.asarray(np.random.default_rng(1).standard_normal((2, 4, 8, 8)), jnp.float32)
    assert list(np.asarray(state.timesteps).astype(int)) == list(range(900, -1, -100))
    for t in np.asarray(state.timesteps).astype(int):
        got = step(sample, t)
        # diffusers' PyTorch DDPMScheduler.step (previous timestep t - 1000 // 10), in NumPy, same input.
        x, output, prev = np.asarray(sample, np.float64), np.asarray(toy_model(sample, t), np.float64), t - 100
        a_t, a_prev = alphas_cumprod[t], alphas_cumprod[prev] if prev >= 0 else 1.0
        alpha, beta = a_t / a_prev, 1 - a_t / a_prev
        x0 = (x - (1 - a_t) ** 0.5 * output) / a_t**0.5
        expected = (a_prev**0.5 * beta / (1 - a_t)) * x0 + (alpha**0.5 * (1 - a_prev) / (1 - a_t)) * x
        if t > 0:
            variance = max((1 - a_prev) / (1 - a_t) * beta, 1e-20)
            expected = expected + variance**0.5 * np.asarray(image_noise(jax.random.key(0), t, sample), np.float64)
        np.testing.assert_allclose(np.asarray(got), expected, rtol=1e-4, atol=1e-4)
        sample = got

    # An image's noise depends on that image alone: the same latents alone or in a batch get the same noise.
    key, batch = jax.random.key(0), sample
    alone = image_noise(key, 500, batch[1:])
    assert np.array_equal(np.asarray(image_noise(key, 500, batch))[1:], np.asarray(alone))
    assert not np.array_equal(np.asarray(image_noise(key, 499, batch)), np.asarray(image_noise(key, 500, batch)))
