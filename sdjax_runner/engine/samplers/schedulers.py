"""The diffusers Flax schedulers as a sampler: ``set_timesteps``, then per step the UNet on the
unconditional and conditional halves at once, classifier-free guidance, and ``scheduler.step`` -- the loop
of diffusers 0.39's Flax pipelines, so every scheduler of ``models/schedulers.py`` gives diffusers' images.
Only DDIM with ``sampling.eta`` > 0 draws noise (from ``key``, as the k samplers do)."""

from __future__ import annotations

from typing import Any

from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.samplers.k_samplers import NOISE_STREAM, key_noise


def denoise(pipeline: Any, params: dict, conditioning: Conditioning, latents, guidance, spec: Any, key=None):
    import jax
    import jax.numpy as jnp

    scheduler = pipeline.scheduler
    guidance = jnp.array([guidance], dtype=jnp.float32)  # the model output stays float32 into the scheduler
    added = {} if conditioning.added is None else {"added_cond_kwargs": conditioning.added}
    state = scheduler.set_timesteps(params["scheduler"], num_inference_steps=spec.steps, shape=latents.shape)
    # The initial noise scaled to the scheduler's spread. diffusers' SD pipeline reads init_noise_sigma from
    # the state before set_timesteps, its SDXL pipeline from the state after (they differ for Euler only).
    sigma = (state if conditioning.added is not None else params["scheduler"]).init_noise_sigma
    latents = latents * sigma

    def step(index, carry):
        latents, state = carry
        model_input = jnp.concatenate([latents] * 2)
        t = jnp.array(state.timesteps, dtype=jnp.int32)[index]
        timestep = jnp.broadcast_to(t, model_input.shape[0])
        model_input = scheduler.scale_model_input(state, model_input, t)
        noise = pipeline.unet.apply({"params": params["unet"]}, jnp.array(model_input),
                                    jnp.array(timestep, dtype=jnp.int32), encoder_hidden_states=conditioning.context,
                                    **added).sample
        unconditional, conditional = jnp.split(noise, 2, axis=0)
        noise = unconditional + guidance * (conditional - unconditional)
        if spec.eta:  # DDIM with eta (config/samplers.py allows it for DDIM alone)
            return ddim_step(scheduler, state, noise, t, latents, spec.eta, draws(index, 0))
        return scheduler.step(state, noise, t, latents).to_tuple()

    draws = key_noise(jax.random.fold_in(key, NOISE_STREAM), latents.shape, latents.dtype) if spec.eta else None
    latents, _ = jax.lax.fori_loop(0, spec.steps, step, (latents, state))
    return latents


def ddim_step(scheduler: Any, state: Any, noise, t, latents, eta: float, draw):
    """diffusers' Flax DDIM step with eta, and the noise it leaves out: its step computes sigma_t(eta) and
    narrows the direction to x_t by it, but never adds sigma_t * z (diffusers' PyTorch DDIMScheduler does,
    DDIM paper eq. 12); here z is the step's draw from the device's key."""
    prev_t = t - scheduler.config.num_train_timesteps // state.num_inference_steps
    sigma_t = eta * scheduler._get_variance(state, t, prev_t) ** 0.5
    latents, state = scheduler.step(state, noise, t, latents, eta=eta).to_tuple()
    return latents + sigma_t * draw, state
