"""SD 3 / 3.5's program stages, each what diffusers 0.39's ``StableDiffusion3Pipeline`` does (its
``encode_prompt``, ``prepare_latents``, the denoising loop with classifier-free guidance and
``FlowMatchEulerDiscreteScheduler``, the VAE decode), written for one device's share of a batch inside the
traced program. ``pipeline`` is families/sd3/models/pipeline.SD3Pipeline, ``params`` its placed weights by component.

Prompt ids are one array per image: CLIP-L's 77 ids, CLIP-G's 77, then T5's ``max_sequence_length`` (none where
the folder has no T5). The conditioning is diffusers': the two CLIPs' penultimate states side by side, padded to
the T5 width, then T5's states (zeros without T5) along the sequence; the pooled input the two CLIPs' projections.
Classifier-free guidance runs as diffusers runs it: the negative prompt (diffusers' default "") and the prompt in
one batch, ``uncond + scale * (cond - uncond)``; with a scale of 1 or less diffusers makes no unconditional call,
and the program takes the conditional prediction as it is (the scale is a traced input: a guidance sweep
compiles once). Latents are NCHW between the stages, NHWC inside the transformer."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from sdjax_runner.config import guiders
from sdjax_runner.engine.caches import Cached
from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.guiders import Guidance, flow_step, guided
from sdjax_runner.engine.modes import controlnet as controlnet_mode
from sdjax_runner.engine.modes.start import Start
from sdjax_runner.families.flux.engine.stages import (
    binary_mask,
    drawn_latents,
    euler_step,
    kept_area,
    nearest,
    noised_start,
    with_init_image,
    with_mask,
)
from sdjax_runner.families.flux.engine.stages import decode as flux_decode
from sdjax_runner.models.nn.perturbed import Perturbed
from sdjax_runner.models.nn.step_cache import first_block_state, first_block_steps

CLIP_TOKENS = 77
decode = flux_decode  # latents / scaling_factor + shift_factor through the 16-channel VAE, as FLUX.1's


def latent_side(pixels: int, vae_scale_factor: int) -> int:
    return pixels // vae_scale_factor


def pack(latents):
    """The k samplers' view of the latents (families/flux/engine/samplers.py): SD 3's are used as they are."""
    return latents


def unpack(latents, height: int, width: int):
    return latents


def flow_sigmas(steps: int, config: dict) -> np.ndarray:
    """The schedule's ``steps + 1`` sigmas (the last 0), float32, as ``FlowMatchEulerDiscreteScheduler.set_timesteps
    (steps)`` makes them when the pipeline passes no sigmas: ``linspace`` from the largest to the smallest of the
    shifted training sigmas (float32), both on the 0..1000 scale, back to 0..1 and shifted again (float64)."""
    shift, train = float(config.get("shift", 1.0)), int(config.get("num_train_timesteps", 1000))
    trained = np.linspace(1, train, train, dtype=np.float32)[::-1] / np.float32(train)
    trained = (np.float32(shift) * trained / (np.float32(1) + np.float32(shift - 1) * trained)).astype(np.float32)
    sigma_max, sigma_min = float(trained[0]), float(trained[-1])
    sigmas = np.linspace(sigma_max * train, sigma_min * train, steps) / train
    sigmas = shift * sigmas / (1 + (shift - 1) * sigmas)
    return np.append(sigmas.astype(np.float32), np.float32(0.0))


def prompt_ids(pipeline: Any, texts: list[str], max_sequence_length: int) -> np.ndarray:
    """(len(texts), 77 + 77 [+ max_sequence_length]) int32 on the host: CLIP-L's and CLIP-G's ids padded to 77,
    then T5's padded (and cut) to ``max_sequence_length`` -- what ``StableDiffusion3Pipeline.encode_prompt``
    tokenizes."""
    parts = [tokenizer(texts, padding="max_length", max_length=CLIP_TOKENS, truncation=True,
                       return_tensors="np").input_ids for tokenizer in (pipeline.tokenizer, pipeline.tokenizer_2)]
    if pipeline.tokenizer_3 is not None:
        parts.append(pipeline.tokenizer_3(texts, padding="max_length", max_length=max_sequence_length,
                                          truncation=True, return_tensors="np").input_ids)
    return np.concatenate(parts, axis=1).astype(np.int32)


def embeddings(pipeline: Any, params: dict, ids, text_tokens: int) -> tuple[Any, Any]:
    """(prompt_embeds, pooled_prompt_embeds) of ``ids`` (:func:`prompt_ids`), as ``encode_prompt`` makes them."""
    import jax.numpy as jnp

    batch, width = ids.shape[0], pipeline.transformer.joint_attention_dim
    states, pooled = [], []
    for name, part in (("text_encoder", ids[:, :CLIP_TOKENS]), ("text_encoder_2", ids[:, CLIP_TOKENS:2 * CLIP_TOKENS])):
        out = getattr(pipeline, name).apply({"params": params[name]}, part, output_hidden_states=True)
        states.append(out.hidden_states[-2])  # the penultimate layer (diffusers' clip_skip None)
        pooled.append(out.text_embeds)
    clip = jnp.concatenate(states, axis=-1)
    clip = jnp.pad(clip, ((0, 0), (0, 0), (0, width - clip.shape[-1])))
    if pipeline.text_encoder_3 is not None:
        t5 = pipeline.text_encoder_3.apply({"params": params["text_encoder_3"]}, ids[:, 2 * CLIP_TOKENS:]).last_hidden_state
    else:  # diffusers' _get_t5_prompt_embeds without text_encoder_3
        t5 = jnp.zeros((batch, text_tokens, width), clip.dtype)
    context = jnp.concatenate([clip, t5.astype(clip.dtype)], axis=1)
    return context.astype(pipeline.dtype), jnp.concatenate(pooled, axis=-1).astype(pipeline.dtype)


def encode(pipeline: Any, params: dict, ids, negative_ids, spec: Any, inputs: dict) -> Conditioning:
    """The prompt's conditioning (``context``, ``added["pooled"]``) and the negative prompt's
    (``added["negative_context"]``, ``added["negative_pooled"]``): SD 3 always has one (diffusers' default "")."""
    context, pooled = embeddings(pipeline, params, ids, spec.text_tokens)
    negative_context, negative_pooled = embeddings(pipeline, params, negative_ids, spec.text_tokens)
    return Conditioning(context, {"pooled": pooled, "negative_context": negative_context,
                                  "negative_pooled": negative_pooled})


def txt2img(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """The device's noise, (batch, 16, h, w) float32 standard normal: the SD family's convention with the VAE's 16
    latent channels (diffusers' prepare_latents shape)."""
    import jax
    import jax.numpy as jnp

    factor = pipeline.vae_scale_factor
    shape = (batch, pipeline.vae.latent_channels, latent_side(spec.height, factor), latent_side(spec.width, factor))
    return Start(jax.random.normal(key, shape=shape, dtype=jnp.float32))


def img2img(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """SD 3's image to image (StableDiffusion3Img2ImgPipeline): :func:`txt2img`'s noise and the init image, as
    FLUX.1's (families/flux/engine/stages.with_init_image)."""
    return with_init_image(txt2img(pipeline, params, key, spec, batch, inputs), pipeline, params, key, inputs)


def inpaint(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """SD 3's inpainting with an ordinary transformer (StableDiffusion3InpaintPipeline): :func:`img2img`'s start and
    the mask, as FLUX.1's (families/flux/engine/stages.with_mask)."""
    return with_mask(img2img(pipeline, params, key, spec, batch, inputs), inputs)


def controlnet(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """SD 3's ControlNet (diffusers' StableDiffusion3ControlNetPipeline): :func:`txt2img`'s noise; the control image
    (``inputs["control"]``, in [0, 1]) encoded as the pipeline encodes it -- mapped to [-1, 1], a sample of the VAE's
    posterior drawn with the device's key (one per image, read by both guidance halves), ``(latents - shift) *
    scaling_factor``, the shift 0 for a ControlNet with ``force_zeros_for_pooled_projection`` (InstantX's: the
    pipeline applies none) -- and the traced conditioning scale, as ``Conditioning.control`` (the ControlNet runs
    beside the transformer at every step: :func:`controlnet_model`)."""
    start = txt2img(pipeline, params, key, spec, batch, inputs)
    shift = 0.0 if pipeline.controlnet.force_zeros_for_pooled_projection else None  # (None: the VAE's)
    latents = drawn_latents(pipeline, params, key, 2.0 * inputs["control"] - 1.0, shift)
    return start._replace(conditioning={"control": (latents, inputs["control_scale"], controlnet_mode.window(inputs))})


def controlnet_inpaint(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """An inpainting SD 3 ControlNet (diffusers' StableDiffusion3ControlNetInpaintingPipeline,
    ``extra_conditioning_channels`` 1): :func:`txt2img`'s noise; for the ControlNet, the init image (``inputs["init"]``,
    in [-1, 1]) with the mask's area (binarized at 0.5) set to -1, encoded as the pipeline encodes it
    (a sample drawn with the device's key, ``(latents - shift_factor) * scaling_factor``), beside the mask brought to
    the latents' size by PyTorch's nearest interpolation and inverted (1 kept, 0 repainted); no blend."""
    import jax.numpy as jnp

    start = txt2img(pipeline, params, key, spec, batch, inputs)
    mask = binary_mask(inputs)  # 1 repaints
    masked = jnp.where(mask > 0.5, -1.0, inputs["init"])  # (the init image arrives in [-1, 1])
    latents = drawn_latents(pipeline, params, key, masked)
    control = jnp.concatenate([latents, 1.0 - nearest(mask, *latents.shape[-2:])], axis=1)
    return start._replace(conditioning={"control": (control, inputs["control_scale"], controlnet_mode.window(inputs))})


def controlnet_model(pipeline: Any, params: dict, conditioning: Conditioning, batch: int):
    """``residuals(x, t, step, count)``: an SD 3 ControlNet's (controlnet mode: ``conditioning.control``, the control
    image's latents, the traced conditioning scale and window, engine/modes/controlnet.scale_at) for the guidance
    halves' NHWC latents ``x`` (negative first) at timesteps ``t``, step ``step`` of ``count``, as
    StableDiffusion3ControlNetPipeline calls it: the control latents for both halves; a ControlNet
    of joint blocks reads each half's prompt, one of single blocks none and the latents as the transformer embeds
    them; the pooled text zeros where the ControlNet says ``force_zeros_for_pooled_projection`` or is an inpainting one
    (StableDiffusion3ControlNetInpaintingPipeline's), else each half's.
    None without one."""
    import jax.numpy as jnp

    from sdjax_runner.families.sd3.models.controlnet import embedded_by_transformer

    if conditioning.control is None:
        return lambda x, t, step, count: None
    assert conditioning.added is not None  # encode's
    control, scale, steered = conditioning.control
    net, added = pipeline.controlnet, conditioning.added
    control = jnp.concatenate([control, control]).transpose(0, 2, 3, 1).astype(pipeline.dtype)
    pooled = jnp.concatenate([added["negative_pooled"], added["pooled"]])
    if net.force_zeros_for_pooled_projection or net.extra_conditioning_channels:  # (the inpainting pipeline's: zeros)
        pooled = jnp.zeros_like(pooled)
    context = jnp.concatenate([added["negative_context"], conditioning.context]) if net.joint else None

    def residuals(x, t, step, count):
        hidden = x if net.use_pos_embed else embedded_by_transformer(pipeline.transformer, params["transformer"], x)
        return net.apply({"params": params["controlnet"]}, hidden, control,
                         controlnet_mode.scale_at(jnp.ravel(jnp.asarray(scale))[0], steered, step, count),
                         context, pooled, t)

    return residuals


def velocity_model(pipeline: Any, params: dict, conditioning: Conditioning, guidance: Guidance, spec: Any,
                   batch: int, steps: Optional[np.ndarray] = None):
    """``velocity(latents, sigma, index=None)``: the guided prediction for NCHW latents at ``sigma`` in [0, 1] (the
    transformer sees diffusers' ``t = sigma * 1000``, float32; FLUX.1's velocity takes sigma likewise, so the flow k
    samplers drive both): the negative and positive prompts in one batch through the transformer, combined by the
    run's guider (``uncond + guidance * (cond - uncond)`` for CFG, in the transformer's dtype as diffusers; another
    guider in float32, engine/guiders.py) where ``guidance.scale`` > 1, else the conditional prediction alone (module
    docstring). The guider's step is ``index`` (the Euler loop's), else the place of ``sigma`` among ``steps`` (the
    sigmas a k sampler steps through)."""
    import jax.numpy as jnp

    added = conditioning.added
    assert added is not None  # encode's
    context = jnp.concatenate([added["negative_context"], conditioning.context])
    pooled = jnp.concatenate([added["negative_pooled"], added["pooled"]])
    scale = jnp.ravel(jnp.asarray(guidance.scale, pipeline.dtype))[0]  # one value (a device holds it as (1,))

    train = np.float32(pipeline.scheduler_config.get("num_train_timesteps", 1000))
    skipped_blocks = guidance.skipped  # guider=skip_layer's, else None
    control = controlnet_model(pipeline, params, conditioning, batch)
    steered = conditioning.control is not None

    def transformer(x, context, pooled, t, skip_layers=(), perturbed=None, around_blocks=None, controlnet=None):
        cached = {"around_blocks": around_blocks} if around_blocks is not None else {}
        return pipeline.transformer.apply({"params": params["transformer"]}, x, context, pooled, t,
                                          skip_layers=skip_layers, perturbed=perturbed, controlnet=controlnet,
                                          **cached)

    def velocity(latents, sigma, index=None, around_blocks=None):
        """The velocity; with a step cache's ``around_blocks`` (:func:`euler_with_cache`), ``(velocity, what the
        cache returned)``."""
        x = latents.transpose(0, 2, 3, 1).astype(pipeline.dtype)
        if guidance.perturbed is not None:
            return perturbed_velocity(x, sigma, index).transpose(0, 3, 1, 2)
        t = jnp.broadcast_to(jnp.asarray(sigma, jnp.float32) * train, (2 * batch,)).astype(pipeline.dtype)
        halves = jnp.concatenate([x, x])
        residuals = control(halves, t, *flow_step(index, sigma, steps, spec.steps)) if steered else None
        both = transformer(halves, context, pooled, t, around_blocks=around_blocks, controlnet=residuals)
        if around_blocks is not None:
            both, cached = both
            return guided_velocity(x, both, t, sigma, index), cached
        return guided_velocity(x, both, t, sigma, index)

    def guided_velocity(x, both, t, sigma, index):
        uncond, cond = both[:batch], both[batch:]
        if guidance.guider == guiders.DEFAULT and guidance.window is None:
            combined = uncond + scale * (cond - uncond)
        else:
            combined = guided(uncond, cond, guidance, *flow_step(index, sigma, steps, spec.steps)).astype(pipeline.dtype)
        if skipped_blocks is not None and index is not None:
            combined = combined + skip_layer_guidance(x, cond, t[:batch], index)
        return jnp.where(scale > 1, combined, cond).transpose(0, 3, 1, 2)

    def perturbed_velocity(x, sigma, index):
        """Perturbed-attention guidance (diffusers' StableDiffusion3PAGPipeline): a third chunk of the batch, the
        conditional input, runs the self-attention modules of guidance.perturbed perturbed; ``uncond + g (cond -
        uncond) + s (cond - perturbed)`` where g > 1, else ``cond + s (cond - perturbed)``, in float32."""
        assert guidance.perturbed is not None  # velocity's test
        timestep = jnp.asarray(sigma, jnp.float32) * train  # diffusers' t (PAG's adaptive scale reads it)
        t = jnp.broadcast_to(timestep, (3 * batch,)).astype(pipeline.dtype)
        three = transformer(jnp.concatenate([x, x, x]), jnp.concatenate([context, conditioning.context]),
                            jnp.concatenate([pooled, added["pooled"]]), t,
                            perturbed=Perturbed(guidance.perturbed, 3, guidance.query_blur))
        uncond, cond, perturbed = three[:batch], three[batch:2 * batch], three[2 * batch:]
        step, count = flow_step(index, sigma, steps, spec.steps)
        combined = jnp.where(scale > 1, guided(uncond, cond, guidance, step, count, perturbed, timestep),
                             guided(None, cond, guidance, step, count, perturbed, timestep)).astype(pipeline.dtype)
        if skipped_blocks is not None and index is not None:
            combined = combined + skip_layer_guidance(x, cond, t[:batch], index)
        return combined

    def skip_layer_guidance(x, cond, t, index):
        """guider=skip_layer: diffusers' ``(cond - cond without the skipped blocks) * skip_layer_guidance_scale`` on
        the steps ``i`` with ``skip_start * steps < i < skip_stop * steps`` (and guidance over 1); zero on the others,
        whose extra transformer call is not made (``lax.cond``). The weight and the window are traced inputs."""
        import jax

        settings = guidance.settings
        active = (index > spec.steps * settings["skip_start"]) & (index < spec.steps * settings["skip_stop"]) \
            & (scale > 1)
        skipped = jax.lax.cond(active, lambda: transformer(x, conditioning.context, added["pooled"], t, skipped_blocks),
                               lambda: cond)
        return (cond - skipped) * settings["scale"].astype(cond.dtype)

    return velocity


def first_block(pipeline: Any, conditioning: Conditioning, latents_shape: tuple, settings: dict) -> tuple:
    """First-Block Cache (models/nn/step_cache.py) on SD 3's transformer: its state before the first call (the
    tokens of both classifier-free guidance halves, as diffusers' hooks see one batch) and each step's call."""
    batch, _, height, width = latents_shape
    patch, dim = pipeline.transformer.patch_size, pipeline.transformer.inner_dim
    tokens = (height // patch) * (width // patch)
    state = first_block_state((2 * batch, tokens, dim), (2 * batch, conditioning.context.shape[1], dim),
                              pipeline.dtype)
    return state, first_block_steps(settings["threshold"])


# The step caches SD 3's Euler runs (config/caches.py names them; FamilyEntry.caches lists them): (pipeline,
# conditioning, the latents' shape, the cache's traced settings) -> (state, (step, state) -> the call's blocks)
CACHES = {"first_block": first_block}
# What a call the cache skipped runs of the blocks (engine/efficiency.py: the executed FLOPs of a cached run)
SKIPPED_CALLS = {"first_block": lambda head, rest, x, context: (*head(x, context), None)}


def euler_with_cache(pipeline: Any, params: dict, conditioning: Conditioning, latents, guidance: Guidance,
                     spec: Any, sigmas: np.ndarray, first: Any = 0) -> Cached:
    """:func:`euler`'s loop with a step cache (:data:`CACHES`, by ``spec.cache``) in its transformer calls, its state
    carried from step to step (one transformer call a step: no skip-layer guidance or PAG, config/caches.check);
    no inpainting blend (config: families/flux/config.flow_inpaint). Returns the final latents and the calls whose
    blocks the cache skipped."""
    import jax
    import jax.numpy as jnp

    assert guidance.cache is not None  # euler's test
    steps_dt, sigma = jnp.asarray(sigmas[1:] - sigmas[:-1]), jnp.asarray(sigmas[:-1])
    velocity = velocity_model(pipeline, params, conditioning, guidance, spec, latents.shape[0])
    state, around = CACHES[spec.cache](pipeline, conditioning, latents.shape, guidance.cache)

    def step(index, carry):
        x, state, skipped = carry
        v, (state, skip) = velocity(x, sigma[index], index, around_blocks=around(index, state))
        return euler_step(x, steps_dt[index], v), state, skipped + skip

    latents, _, skipped = jax.lax.fori_loop(first, spec.steps, step, (latents, state, jnp.int32(0)))
    return Cached(latents, skipped)


def euler(pipeline: Any, params: dict, conditioning: Conditioning, start: Start, guidance, spec: Any, key=None):
    """The flow-matching Euler sampler (``FlowMatchEulerDiscreteScheduler.step``: ``x + (sigma_next - sigma) * v`` in
    float32) over the model's schedule (:func:`flow_sigmas`), in a ``lax.fori_loop``; the transformer sees each
    step's timestep ``sigma * 1000`` (the scheduler's ``timesteps``) and its index (skip-layer guidance's window).
    Returns the final latents, (batch, 16, h, w)."""
    import jax
    import jax.numpy as jnp

    sigmas = flow_sigmas(spec.steps, pipeline.scheduler_config)
    steps_dt = jnp.asarray(sigmas[1:] - sigmas[:-1])
    latents = noised_start(start, sigmas).astype(start.noise.dtype)  # the noise, or img2img's noised image
    if guidance.cache is not None:  # the step cache (config/caches.py) runs in this loop's transformer calls
        return euler_with_cache(pipeline, params, conditioning, latents, guidance, spec, sigmas, start.step)
    velocity = velocity_model(pipeline, params, conditioning, guidance, spec, latents.shape[0])
    sigma = jnp.asarray(sigmas[:-1])
    blend = kept_area(start, sigmas)  # inpainting: the kept area set back after each step

    def step(index, x):
        v = velocity(x, sigma[index], index)
        return blend(index, euler_step(x, steps_dt[index], v))

    return jax.lax.fori_loop(start.step, spec.steps, step, latents)  # from step 0, or img2img's start
