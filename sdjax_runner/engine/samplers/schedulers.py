"""The diffusers Flax schedulers as a sampler: ``set_timesteps``, then per step the UNet on the
unconditional and conditional halves at once, classifier-free guidance, and ``scheduler.step`` -- the loop
of diffusers 0.39's Flax pipelines, so every scheduler of ``models/schedulers.py`` gives diffusers' images.
Only DDIM with ``sampling.eta`` > 0 draws noise (from ``key``, as the k samplers do). With ``cache=deepcache`` the
loop carries DeepCache's state (:mod:`.deep_cache`) and returns :class:`~sdjax_runner.engine.caches.Cached`."""

from __future__ import annotations

from typing import Any

from sdjax_runner.config.caches import DEFAULT as CACHE_DEFAULT
from sdjax_runner.engine.caches import Cached
from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.guiders import Guidance, guided
from sdjax_runner.engine.modes import controlnet
from sdjax_runner.engine.modes.start import Start, initial, kept
from sdjax_runner.engine.samplers import deep_cache, unet
from sdjax_runner.engine.samplers.k_samplers import NOISE_STREAM, key_noise


def denoise(pipeline: Any, params: dict, conditioning: Conditioning, start: Start, guidance: Guidance, spec: Any,
            key=None):
    import jax
    import jax.numpy as jnp

    scheduler = pipeline.scheduler
    state = scheduler.set_timesteps(params["scheduler"], num_inference_steps=spec.steps, shape=start.noise.shape)
    # The initial noise scaled to the scheduler's spread. diffusers' SD pipeline reads init_noise_sigma from
    # the state before set_timesteps, its SDXL pipeline from the state after (they differ for Euler only).
    sigma = (state if conditioning.added is not None else params["scheduler"]).init_noise_sigma

    def noised(index):
        return noised_to(scheduler, state, params["scheduler"], start, index)

    latents = initial(start, start.noise * sigma, noised)

    deep = deep_cache.branch(spec.cache_shape) if spec.cache != CACHE_DEFAULT else None

    def step(index, carry):
        latents, state, cache = carry
        t = jnp.array(state.timesteps, dtype=jnp.int32)[index]
        # (scale_model_input is element-wise: scaling before the halves are doubled is the same as after)
        model_input = scheduler.scale_model_input(state, latents, t)
        steered = controlnet.at_step(conditioning, index - start.step, spec.steps - start.step)
        if deep is None:
            predictions = unet.halves(pipeline, params, steered, model_input, t, guidance=guidance)
        else:
            whole = deep_cache.whole_call(guidance, jnp.asarray(state.timesteps), index, start.step)
            predictions, cache = deep_cache.predictions(pipeline, params, steered, model_input, t, guidance,
                                                        deep, cache, whole)
        noise = guided(predictions.unconditional, predictions.conditional, guidance, index - start.step,
                       spec.steps - start.step, predictions.perturbed, t)
        if spec.eta and draws is not None:  # DDIM with eta (config/samplers.py allows it for DDIM alone)
            latents, state = ddim_step(scheduler, state, noise, t, latents, spec.eta, draws(index, 0))
        else:
            latents, state = scheduler.step(state, noise, t, latents).to_tuple()
        if start.keep is not None and start.image is not None:  # (a kept area comes with its image)
            # Inpainting with an ordinary model, as diffusers' StableDiffusionInpaintPipeline does for a
            # 4-channel UNet: the kept area is the init image noised to the next step's level (clean after
            # the last step).
            following = index + 1
            proper = jnp.where(following < spec.steps, noised(jnp.minimum(following, spec.steps - 1)), start.image)
            latents = kept(start, proper, latents)
        return latents, state, cache

    draws = key_noise(jax.random.fold_in(key, NOISE_STREAM), latents.shape, latents.dtype) if spec.eta else None
    cache = None
    if deep is not None:
        t = jnp.array(state.timesteps, dtype=jnp.int32)[start.step]
        first = controlnet.at_step(conditioning, 0, spec.steps - start.step)
        cache = deep_cache.initial_state(pipeline, params, first, scheduler.scale_model_input(state, latents, t),
                                         t, guidance, deep)
    latents, _, cache = jax.lax.fori_loop(start.step, spec.steps, step, (latents, state, cache))
    return latents if deep is None else Cached(latents, cache.skipped)


def noised_to(scheduler: Any, state: Any, initial_state: Any, start: Start, index):
    """The init image noised to the level of step ``index`` (``state``: the scheduler's after set_timesteps,
    ``initial_state`` before). diffusers' Flax img2img pipeline: ``scheduler.add_noise`` at ``timesteps[index]``,
    times init_noise_sigma (1 for these). A scheduler that steps in sigma space (Euler, LMS) adds ``noise *
    sigmas[index]``, as diffusers' PyTorch schedulers do: its Flax ``add_noise`` indexes sigmas by the timestep's
    value, and init_noise_sigma is the largest sigma there, which would noise the image twice."""
    import jax.numpy as jnp

    if hasattr(state, "sigmas"):
        return start.image + start.noise * jnp.asarray(state.sigmas)[index]
    t = jnp.broadcast_to(jnp.asarray(state.timesteps)[index], start.noise.shape[:1])
    return scheduler.add_noise(initial_state, start.image, start.noise, t) * initial_state.init_noise_sigma


def ddim_step(scheduler: Any, state: Any, noise, t, latents, eta: float, draw):
    """diffusers' Flax DDIM step with eta, and the noise it leaves out: its step computes sigma_t(eta) and
    narrows the direction to x_t by it, but never adds sigma_t * z (diffusers' PyTorch DDIMScheduler does,
    DDIM paper eq. 12); here z is the step's draw from the device's key."""
    prev_t = t - scheduler.config.num_train_timesteps // state.num_inference_steps
    sigma_t = eta * scheduler._get_variance(state, t, prev_t) ** 0.5
    latents, state = scheduler.step(state, noise, t, latents, eta=eta).to_tuple()
    return latents + sigma_t * draw, state
