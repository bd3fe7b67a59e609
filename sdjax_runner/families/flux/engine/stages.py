"""FLUX.1's program stages, each what diffusers 0.39's ``FluxPipeline`` does (its ``encode_prompt``,
``prepare_latents`` / ``_pack_latents`` / ``_prepare_latent_image_ids``, the denoising loop with
``FlowMatchEulerDiscreteScheduler`` and ``calculate_shift``, ``_unpack_latents`` and the VAE decode), written
for one device's share of a batch inside the traced program. ``pipeline`` is families/flux/models/pipeline.FluxPipeline,
``params`` its placed weights by component.

Prompt ids are one array per image: CLIP's 77 ids, then T5's ``max_sequence_length`` ids (:class:`FluxTokens`).
There is no classifier-free guidance: [dev] is guidance-distilled (``guidance`` is the embedded guidance value,
diffusers' ``guidance_scale``), [schnell] takes none; the conditioning holds one half, not two."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from sdjax_runner.config import guiders
from sdjax_runner.engine.caches import Cached
from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.guiders import Guidance, flow_step, guided
from sdjax_runner.engine.modes import controlnet as controlnet_mode
from sdjax_runner.engine.modes.start import Start
from sdjax_runner.models.nn.step_cache import (
    first_block_state,
    first_block_steps,
    mag_cache_call,
    mag_ratios,
    mag_state,
)

CLIP_TOKENS = 77


def image_seq_len(height: int, width: int, vae_scale_factor: int) -> int:
    """How many image tokens a ``height`` x ``width`` image is: its latents packed 2x2."""
    return (latent_side(height, vae_scale_factor) // 2) * (latent_side(width, vae_scale_factor) // 2)


def latent_side(pixels: int, vae_scale_factor: int) -> int:
    """diffusers' ``2 * (int(pixels) // (vae_scale_factor * 2))``: the latent side, even for the 2x2 packing."""
    return 2 * (pixels // (vae_scale_factor * 2))


def shift_mu(seq_len: int, config: dict) -> float:
    """diffusers' ``calculate_shift``: the resolution-dependent shift, linear in the image's token count."""
    base_len, max_len = config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096)
    base_shift, max_shift = config.get("base_shift", 0.5), config.get("max_shift", 1.15)
    slope = (max_shift - base_shift) / (max_len - base_len)
    return seq_len * slope + (base_shift - slope * base_len)


def flow_sigmas(steps: int, seq_len: int, config: dict) -> np.ndarray:
    """The schedule's ``steps + 1`` sigmas (the last 0), float32, as ``FluxPipeline`` sets them: ``linspace(1,
    1/steps, steps)`` shifted -- by ``exp(mu) / (exp(mu) + 1/s - 1)`` with dynamic shifting ([dev]), else by
    ``shift * s / (1 + (shift - 1) * s)`` ([schnell]: shift 1, unchanged). Host constants of the program."""
    base = np.linspace(1.0, 1 / steps, steps).astype(np.float32)
    if config.get("use_dynamic_shifting", False):
        shifted = exponential_shift(base, shift_mu(seq_len, config))
    else:
        shift = float(config.get("shift", 1.0))
        shifted = shift * base / (1 + (shift - 1) * base)
    return np.append(shifted.astype(np.float32), np.float32(0.0))


def exponential_shift(sigmas: np.ndarray, mu: float) -> np.ndarray:
    """``FlowMatchEulerDiscreteScheduler.time_shift`` (exponential, sigma 1) of float32 ``sigmas``: ``exp(mu) / (exp(mu)
    + 1/s - 1)``, exp(mu) a Python float as diffusers computes it."""
    import math

    scale = math.exp(mu)
    return (scale / (scale + (1 / sigmas - 1))).astype(np.float32)


def pack(latents):
    """(batch, C, h, w) -> (batch, h/2 * w/2, 4C): 2x2 patches as tokens (diffusers' ``_pack_latents``)."""
    batch, channels, height, width = latents.shape
    patches = latents.reshape(batch, channels, height // 2, 2, width // 2, 2).transpose(0, 2, 4, 1, 3, 5)
    return patches.reshape(batch, (height // 2) * (width // 2), channels * 4)


def unpack(tokens, height: int, width: int):
    """The inverse of :func:`pack` for latents ``height`` x ``width`` (diffusers' ``_unpack_latents``)."""
    batch, _, features = tokens.shape
    channels = features // 4
    patches = tokens.reshape(batch, height // 2, width // 2, channels, 2, 2).transpose(0, 3, 1, 4, 2, 5)
    return patches.reshape(batch, channels, height, width)


def image_ids(height: int, width: int) -> np.ndarray:
    """(h/2 * w/2, 3) float32 positions of the packed tokens: (0, row, column) (``_prepare_latent_image_ids``)."""
    ids = np.zeros((height // 2, width // 2, 3), np.float32)
    ids[..., 1] = np.arange(height // 2)[:, None]
    ids[..., 2] = np.arange(width // 2)[None, :]
    return ids.reshape(-1, 3)


def _embeddings(pipeline: Any, params: dict, ids) -> tuple[Any, Any]:
    clip, t5 = ids[:, :CLIP_TOKENS], ids[:, CLIP_TOKENS:]
    pooled = pipeline.text_encoder.apply({"params": params["text_encoder"]}, clip).pooler_output
    states = pipeline.text_encoder_2.apply({"params": params["text_encoder_2"]}, t5).last_hidden_state
    return states.astype(pipeline.dtype), pooled.astype(pipeline.dtype)


def encode(pipeline: Any, params: dict, ids, negative_ids, spec: Any, inputs: dict) -> Conditioning:
    """``ids`` (batch, 77 + T): CLIP's pooled embedding of the first 77 (diffusers' ``pooled_prompt_embeds``)
    and T5's last hidden states of the rest (``prompt_embeds``); with true classifier-free guidance the negative
    prompt's alike (``negative_context``, ``negative_pooled``)."""
    states, pooled = _embeddings(pipeline, params, ids)
    added = {"pooled": pooled}
    if negative_ids is not None:
        added["negative_context"], added["negative_pooled"] = _embeddings(pipeline, params, negative_ids)
    return Conditioning(states, added)


def txt2img(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """The device's noise, (batch, 16, h, w) float32 standard normal: the SD family's convention with the
    VAE's 16 latent channels (packed by the sampler)."""
    import jax
    import jax.numpy as jnp

    factor = pipeline.vae_scale_factor
    shape = (batch, pipeline.vae.latent_channels, latent_side(spec.height, factor), latent_side(spec.width, factor))
    return Start(jax.random.normal(key, shape=shape, dtype=jnp.float32))


def with_init_image(start: Start, pipeline: Any, params: dict, key, inputs: dict) -> Start:
    """Image to image on a flow model (diffusers' FluxImg2ImgPipeline, StableDiffusion3Img2ImgPipeline): the
    txt2img ``start``'s noise, the init image's latents -- a sample of the 16-channel VAE's posterior drawn with the
    device's ``key`` (the SD family's convention), ``(latents - shift_factor) * scaling_factor``: :func:`drawn_latents`
    -- and the start step (from strength, ``inputs["start"]``: traced)."""
    return start._replace(image=drawn_latents(pipeline, params, key, inputs["init"]), step=inputs["start"])


def drawn_latents(pipeline: Any, params: dict, key, pixels, shift: Optional[float] = None):
    """``pixels`` ((batch, 3, H, W) in [-1, 1]) as the flow pipelines encode an input image: a sample of the
    16-channel VAE's posterior drawn with the device's ``key``, ``(latents - shift) * scaling_factor``, NCHW
    float32 (``shift``: the VAE's ``shift_factor`` unless given)."""
    import jax.numpy as jnp

    posterior = pipeline.vae.apply({"params": params["vae"]}, pixels.astype(pipeline.vae.dtype),
                                   method=pipeline.vae.encode)
    latents = posterior.sample(key).transpose((0, 3, 1, 2)).astype(jnp.float32)
    return (latents - (pipeline.shift_factor if shift is None else shift)) * pipeline.scaling_factor


def img2img(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """FLUX.1's image to image: :func:`txt2img`'s noise and the init image (:func:`with_init_image`)."""
    return with_init_image(txt2img(pipeline, params, key, spec, batch, inputs), pipeline, params, key, inputs)


def binary_mask(inputs: dict):
    """The mask (``inputs["mask"]``, (batch, 1, H, W)) binarized at 0.5 as the flow pipelines' mask processor does:
    1 repaints, float32."""
    import jax.numpy as jnp

    return (inputs["mask"] >= 0.5).astype(jnp.float32)


def nearest(mask, height: int, width: int):
    """``mask`` (batch, 1, H, W) brought to ``height`` x ``width`` by PyTorch's nearest interpolation (pixel i reads
    pixel ``floor(i * H / height)``), as the pipelines bring a mask to the latents' size."""
    rows = (np.arange(height) * mask.shape[-2]) // height
    columns = (np.arange(width) * mask.shape[-1]) // width
    return mask[:, :, rows][:, :, :, columns]


def with_mask(start: Start, inputs: dict) -> Start:
    """Inpainting on a flow model (diffusers' FluxInpaintPipeline, StableDiffusion3InpaintPipeline with an
    ordinary transformer): ``start`` (:func:`with_init_image`'s) keeping the init image where the mask is black --
    the mask binarized (:func:`binary_mask`) and brought to the latents' size (:func:`nearest`) -- as
    ``Start.keep``, 1 where kept."""
    return start._replace(keep=1.0 - nearest(binary_mask(inputs), *start.noise.shape[-2:]))


def inpaint(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """FLUX.1's inpainting: with an ordinary transformer :func:`img2img`'s start and the mask (:func:`with_mask`),
    with FLUX.1 Fill's :func:`fill`."""
    if pipeline.fill:
        return fill(pipeline, params, key, spec, batch, inputs)
    return with_mask(img2img(pipeline, params, key, spec, batch, inputs), inputs)


def fill(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """FLUX.1 Fill's inpainting (diffusers' FluxFillPipeline): :func:`img2img`'s start (at strength 1 the noise
    alone) and, as more transformer input after the packed latents (``Start.conditioning["concat"]``), the masked
    image's packed latents -- the init image with the area to repaint set to 0 (mid-grey), encoded as the init image
    is, with the same draw -- and the mask binarized at 0.5, each latent pixel's ``f x f`` mask pixels (f the VAE's
    factor) as channels, packed: ``(batch, tokens, 4 c + 4 f^2)``. No blend: the model repaints."""
    import jax.numpy as jnp

    start = img2img(pipeline, params, key, spec, batch, inputs)
    mask = (inputs["mask"] >= 0.5).astype(jnp.float32)  # (batch, 1, H, W): 1 repaints
    masked = inputs["init"] * (1.0 - mask)  # the init image, (batch, 3, H, W) in [-1, 1]
    blank = drawn_latents(pipeline, params, key, masked)
    factor = pipeline.vae_scale_factor
    _, _, height, width = start.noise.shape
    pixels = mask[:, 0].reshape(batch, height, factor, width, factor).transpose(0, 2, 4, 1, 3)
    pixels = pixels.reshape(batch, factor * factor, height, width)
    concat = jnp.concatenate([pack(blank), pack(pixels)], axis=-1)
    return start._replace(conditioning={"concat": concat})


def control(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """FLUX.1 Canny/Depth [dev] (diffusers' FluxControlPipeline): :func:`txt2img`'s noise and, as more transformer
    input after the packed latents (``Start.conditioning["concat"]``, as Fill's), the control image's packed latents
    -- :func:`control_latents`."""
    start = txt2img(pipeline, params, key, spec, batch, inputs)
    return start._replace(conditioning={"concat": control_latents(pipeline, params, key, inputs)})


def control_latents(pipeline: Any, params: dict, key, inputs: dict):
    """The control image (``inputs["control"]``, in [0, 1]) as Canny/Depth and the ControlNets read it: mapped to [-1,
    1], encoded as an init image is (:func:`drawn_latents`), packed: ``(batch, tokens, 4 c)``."""
    return pack(drawn_latents(pipeline, params, key, 2.0 * inputs["control"] - 1.0))


def control_img2img(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """FLUX.1 Canny/Depth from an init image (diffusers' FluxControlImg2ImgPipeline): :func:`control`'s start with the
    init image (:func:`with_init_image`: its latents drawn with the device's key, as the control image's are)."""
    return with_init_image(control(pipeline, params, key, spec, batch, inputs), pipeline, params, key, inputs)


def control_inpaint(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """FLUX.1 Canny/Depth repainting a mask's area (diffusers' FluxControlInpaintPipeline): :func:`control_img2img`'s
    start and the mask (:func:`with_mask`: the init image blended back outside it after each step, as FLUX.1's
    inpainting with an ordinary transformer)."""
    return with_mask(control_img2img(pipeline, params, key, spec, batch, inputs), inputs)


def controlnet(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """A FLUX.1 ControlNet (diffusers' FluxControlNetPipeline): :func:`txt2img`'s noise and, for the ControlNet that
    runs beside the transformer at every step (:func:`controlnet_model`), the control image's packed latents
    (:func:`control_latents`) -- XLabs' kind reads it in pixels, NHWC in [-1, 1], as the pipeline gives it --, the
    traced conditioning scale, control mode (a union ControlNet's) and window, as ``Conditioning.control``."""
    start = txt2img(pipeline, params, key, spec, batch, inputs)
    if pipeline.controlnet.reads_pixels:
        control = (2.0 * inputs["control"] - 1.0).transpose(0, 2, 3, 1)
    else:
        control = control_latents(pipeline, params, key, inputs)
    return start._replace(conditioning={"control": (control, inputs["control_scale"], inputs["control_mode"],
                                                    controlnet_mode.window(inputs))})


def edit(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """FLUX.1 Kontext's editing (diffusers' FluxKontextPipeline): :func:`txt2img`'s noise, and the init image's
    latents -- the mode of the VAE's posterior (no draw), ``(latents - shift_factor) * scaling_factor`` -- packed,
    as ``Conditioning.reference``: the tokens every transformer call reads after the noise's
    (:func:`transformer_call`)."""
    import jax.numpy as jnp

    start = txt2img(pipeline, params, key, spec, batch, inputs)
    posterior = pipeline.vae.apply({"params": params["vae"]}, inputs["init"].astype(pipeline.vae.dtype),
                                   method=pipeline.vae.encode)
    latents = posterior.mode().transpose((0, 3, 1, 2)).astype(jnp.float32)
    image = (latents - pipeline.shift_factor) * pipeline.scaling_factor
    return start._replace(conditioning={"reference": pack(image)})


def kept_area(start: Start, sigmas, prepare=lambda latents: latents):
    """``blend(index, x)``: after step ``index`` the latents ``x`` with the kept area set back to the init image
    noised to the next step's sigma -- ``sigma * noise + (1 - sigma) * image``, the image itself after the last
    step (sigma 0) -- as the inpaint pipelines do after each scheduler step; ``x`` unchanged without a mask.
    ``prepare``: the sampler's view of latents (FLUX.1 packs them into tokens)."""
    import jax.numpy as jnp

    if start.keep is None:
        return lambda index, x: x
    keep = prepare(jnp.broadcast_to(start.keep, start.noise.shape))
    noise, image, next_sigma = prepare(start.noise), prepare(start.image), jnp.asarray(sigmas[1:], jnp.float32)

    def blend(index, x):
        sigma = next_sigma[index]
        return ((1 - keep) * x + keep * (sigma * noise + (1 - sigma) * image)).astype(x.dtype)

    return blend


def euler_step(x, dt, velocity):
    """``FlowMatchEulerDiscreteScheduler.step``: ``x + (sigma_next - sigma) * v`` in float32, back in ``x``'s dtype."""
    import jax.numpy as jnp

    return (x.astype(jnp.float32) + dt * velocity.astype(jnp.float32)).astype(x.dtype)


def noised_start(start: Start, sigmas) -> Any:
    """The latents (unpacked) a flow sampler starts from at step ``start.step`` of ``sigmas``: the noise (txt2img:
    sigma 1), or the init image noised to that step's sigma -- ``sigma * noise + (1 - sigma) * image``
    (FlowMatchEulerDiscreteScheduler.scale_noise; ComfyUI's CONST noise scaling), in float32."""
    import jax.numpy as jnp

    if start.image is None:
        return start.noise
    sigma = jnp.asarray(sigmas, jnp.float32)[start.step]
    return sigma * start.noise + (1.0 - sigma) * start.image


def transformer_call(pipeline: Any, params: dict, conditioning: Conditioning, guidance: Guidance, spec: Any,
                     batch: int):
    """``call(x, timestep, context, pooled, around_blocks=None)``: the transformer on packed latents ``x`` at
    ``timestep`` ((batch,) in [0, 1]) with the image's and text's position ids and, for [dev], the embedded
    ``guidance``; ``around_blocks``: a step cache's call (the transformer's), then ``(prediction, its result)``."""
    import jax.numpy as jnp

    reference = conditioning.reference  # FLUX.1 Kontext's input image's tokens (edit), after the noise's
    ids, txt_ids = position_ids(pipeline, spec, conditioning)
    if reference is not None:  # their position ids those of an image of the same size, first coordinate 1
        ids = np.concatenate([ids, ids + np.asarray([1, 0, 0], np.float32)])
    img_ids = jnp.asarray(ids)
    embedded = embedded_guidance(pipeline, guidance, batch, pipeline.guidance_embeds)

    def call(x, timestep, context, pooled, around_blocks=None, controlnet=None):
        cached = {"around_blocks": around_blocks} if around_blocks is not None else {}  # (plain: the plain module's)
        if controlnet is not None:  # a ControlNet's residuals (:func:`controlnet_model`)
            cached["controlnet"] = controlnet
        x = x.astype(pipeline.dtype)
        tokens = x.shape[1]
        if conditioning.concat is not None:  # Fill's masked image and mask, Canny/Depth's control image (fill, control)
            x = jnp.concatenate([x, conditioning.concat.astype(pipeline.dtype)], axis=-1)
        if reference is not None:  # Kontext's input image's tokens after the noise's (no step cache: config)
            x = jnp.concatenate([x, reference.astype(pipeline.dtype)], axis=1)
        out = pipeline.transformer.apply({"params": params["transformer"]}, x, context, pooled, timestep, img_ids,
                                         txt_ids, guidance=embedded, **cached)
        return out if reference is None else out[:, :tokens]  # the prediction: the noise's tokens

    return call


def position_ids(pipeline: Any, spec: Any, conditioning: Conditioning) -> tuple[Any, Any]:
    """(img_ids, txt_ids) of a call on the run's image size and ``conditioning``'s text: the packed latents' rows and
    columns (host values), and zeros."""
    import jax.numpy as jnp

    factor = pipeline.vae_scale_factor
    ids = image_ids(latent_side(spec.height, factor), latent_side(spec.width, factor))
    return ids, jnp.zeros((conditioning.context.shape[1], 3))


def embedded_guidance(pipeline: Any, guidance: Guidance, batch: int, embeds: bool):
    """The guidance a module with a guidance embedder (``embeds``: [dev]'s) reads, one per image; else None."""
    import jax.numpy as jnp

    return jnp.full((batch,), guidance.scale, dtype=jnp.float32).astype(pipeline.dtype) if embeds else None


def controlnet_model(pipeline: Any, params: dict, conditioning: Conditioning, guidance: Guidance, spec: Any,
                     batch: int):
    """``residuals(x, timestep, step, count)``: a FLUX.1 ControlNet's (controlnet mode: ``conditioning.control``, the
    control image's packed latents, the traced conditioning scale, control mode -- read by a union model -- and
    window, engine/modes/controlnet.scale_at) for packed latents ``x`` at ``timestep``, step ``step`` of ``count``,
    on the prompt, as
    diffusers' FluxControlNetPipeline calls it (the embedded guidance where the ControlNet has a guidance embedder);
    None without one."""
    import jax.numpy as jnp

    if conditioning.control is None:
        return lambda x, timestep, step, count: None
    assert conditioning.added is not None  # encode's: the pooled embedding
    control, scale, mode, steered = conditioning.control
    pooled, net = conditioning.added["pooled"], pipeline.controlnet
    union = {"controlnet_mode": jnp.ravel(jnp.asarray(mode))[:1]} if net.num_mode is not None else {}
    ids, txt_ids = position_ids(pipeline, spec, conditioning)
    img_ids, embedded = jnp.asarray(ids), embedded_guidance(pipeline, guidance, batch, net.guidance_embeds)

    def residuals(x, timestep, step, count):
        return net.apply({"params": params["controlnet"]}, x.astype(pipeline.dtype), control.astype(pipeline.dtype),
                         controlnet_mode.scale_at(jnp.ravel(jnp.asarray(scale))[0], steered, step, count),
                         conditioning.context, pooled, timestep, img_ids, txt_ids, guidance=embedded, **union)

    return residuals


def velocity_model(pipeline: Any, params: dict, conditioning: Conditioning, guidance: Guidance, spec: Any,
                   batch: int, steps: Any = None):
    """``velocity(tokens, timestep, index=None)``: the transformer's prediction for packed latents at ``timestep`` (a
    scalar in [0, 1], diffusers' ``t / 1000``), conditioned on the prompt and, for [dev], the embedded ``guidance``.
    With true CFG (``guidance.true_scale``) the negative prompt's prediction too, combined by the run's guider:
    FluxPipeline's ``neg + true_cfg_scale * (pos - neg)`` for CFG, in the transformer's dtype; another guider in
    float32 (engine/guiders.py), its step ``index`` (the Euler loop's), else the place of ``timestep`` among
    ``steps`` (the sigmas a k sampler steps through)."""
    import jax.numpy as jnp

    call = transformer_call(pipeline, params, conditioning, guidance, spec, batch)
    control = controlnet_model(pipeline, params, conditioning, guidance, spec, batch)
    assert conditioning.added is not None  # encode's: the pooled embedding (and the negative prompt's)
    added = conditioning.added
    pooled = added["pooled"]

    def velocity(x, timestep, index=None):
        sigma = timestep
        timestep = jnp.broadcast_to(timestep, (batch,)).astype(pipeline.dtype)
        # (the prompt's, for the negative call too: FluxControlNetPipeline's)
        residuals = control(x, timestep, *flow_step(index, sigma, steps, spec.steps))
        positive = call(x, timestep, conditioning.context, pooled, controlnet=residuals)
        if guidance.true_scale is None:
            return positive
        negative = call(x, timestep, added["negative_context"], added["negative_pooled"], controlnet=residuals)
        scale = jnp.ravel(jnp.asarray(guidance.true_scale))[0]
        if guidance.guider == guiders.DEFAULT and guidance.window is None:
            # FluxPipeline's true CFG: neg_noise_pred + true_cfg_scale * (noise_pred - neg_noise_pred)
            return negative + scale.astype(positive.dtype) * (positive - negative)
        return guided(negative, positive, dataclasses.replace(guidance, scale=scale),
                      *flow_step(index, sigma, steps, spec.steps)).astype(positive.dtype)

    return velocity


def euler(pipeline: Any, params: dict, conditioning: Conditioning, start: Start, guidance, spec: Any, key=None):
    """The flow-matching Euler sampler (``FlowMatchEulerDiscreteScheduler.step``: ``x + (sigma_next - sigma) *
    v``, in float32) over the model's schedule (:func:`flow_sigmas`), in a ``lax.fori_loop``; the transformer
    sees each step's timestep ``sigma * 1000 / 1000`` (as the pipeline passes it) and, for [dev], ``guidance``.
    Returns the final latents unpacked, (batch, 16, h, w)."""
    import jax
    import jax.numpy as jnp

    factor = pipeline.vae_scale_factor
    height, width = latent_side(spec.height, factor), latent_side(spec.width, factor)
    sigmas = flow_sigmas(spec.steps, image_seq_len(spec.height, spec.width, factor), pipeline.scheduler_config)
    timesteps = jnp.asarray(sigmas[:-1] * np.float32(1000))  # the scheduler's, float32
    steps_dt = jnp.asarray(sigmas[1:] - sigmas[:-1])
    latents = pack(noised_start(start, sigmas)).astype(start.noise.dtype)
    if guidance.cache is not None:  # the step cache (config/caches.py) runs in this loop's transformer calls
        return euler_with_cache(pipeline, params, conditioning, latents, guidance, spec, timesteps, steps_dt,
                                start.step)
    velocity = velocity_model(pipeline, params, conditioning, guidance, spec, latents.shape[0])
    blend = kept_area(start, sigmas, pack)  # inpainting: the kept area set back after each step

    def step(index, x):
        v = velocity(x, timesteps[index].astype(pipeline.dtype) / 1000, index)
        return blend(index, euler_step(x, steps_dt[index], v))

    latents = jax.lax.fori_loop(start.step, spec.steps, step, latents)  # from step 0, or img2img's start
    return unpack(latents, height, width)


def euler_with_cache(pipeline: Any, params: dict, conditioning: Conditioning, latents, guidance: Guidance,
                     spec: Any, timesteps, steps_dt, first: Any = 0) -> Cached:
    """:func:`euler`'s loop with a step cache (:data:`CACHES`, by ``spec.cache``) in its transformer calls, its state
    carried from step to step (the loop's one call a step: no true CFG, config/caches.check); returns the final
    latents unpacked and the calls whose blocks the cache skipped."""
    import jax
    import jax.numpy as jnp

    batch = latents.shape[0]
    call = transformer_call(pipeline, params, conditioning, guidance, spec, batch)
    assert conditioning.added is not None and guidance.cache is not None  # encode's pooled embedding; euler's test
    pooled = conditioning.added["pooled"]
    state, around = CACHES[spec.cache](pipeline, conditioning, latents.shape, guidance.cache, spec)

    def step(index, carry):
        x, state, skipped = carry
        timestep = jnp.broadcast_to(timesteps[index].astype(pipeline.dtype) / 1000, (batch,)).astype(pipeline.dtype)
        v, (state, skip) = call(x, timestep, conditioning.context, pooled, around_blocks=around(index, state))
        x = euler_step(x, steps_dt[index], v)
        return x, state, skipped + skip

    latents, _, skipped = jax.lax.fori_loop(first, spec.steps, step, (latents, state, jnp.int32(0)))
    factor = pipeline.vae_scale_factor
    return Cached(unpack(latents, latent_side(spec.height, factor), latent_side(spec.width, factor)), skipped)


def first_block(pipeline: Any, conditioning: Conditioning, shape: tuple, settings: dict, spec: Any):
    """First-Block Cache (models/nn/step_cache.py): its state before the first call, and each step's call."""
    width = pipeline.transformer.inner_dim
    state = first_block_state(shape[:2] + (width,), (shape[0], conditioning.context.shape[1], width), pipeline.dtype)
    return state, first_block_steps(settings["threshold"])


# FLUX.1's magnitude ratios, one per step of a 28-step FLUX.1 [dev] run (MagCache's calibration; diffusers'
# hooks/mag_cache.py FLUX_MAG_RATIOS, for [dev] and [schnell]); a run of another step count reads the nearest
MAG_RATIOS = (1.0, 1.21094, 1.11719, 1.07812, 1.0625, 1.03906, 1.03125, 1.03906, 1.02344, 1.03125, 1.02344, 0.98047,
              1.01562, 1.00781, 1.0, 1.00781, 1.0, 1.00781, 1.0, 1.0, 0.99609, 0.99609, 0.98047, 0.98828, 0.96484,
              0.95703, 0.93359, 0.89062)


def mag_cache(pipeline: Any, conditioning: Conditioning, shape: tuple, settings: dict, spec: Any):
    """MagCache (models/nn/step_cache.py) with FLUX.1's ratios: its state before the first call, and each step's
    call."""
    import jax.numpy as jnp

    ratios = jnp.asarray(mag_ratios(MAG_RATIOS, spec.steps))
    state = mag_state(shape[:2] + (pipeline.transformer.inner_dim,), pipeline.dtype)
    # diffusers' int(retention_ratio * num_inference_steps + 0.5), the ratio a traced input
    retention_step = jnp.floor(settings["retention_ratio"] * spec.steps + 0.5)

    def around(index, state):
        def blocks(head, rest, x, context):
            def every_block(x, context):
                head_context, head_x = head(x, context)
                return rest(head_x, head_context)

            out_context, out_x, state_after, skipped = mag_cache_call(
                every_block, x, context, state, index, ratios[index], settings["threshold"],
                settings["max_skip_steps"], retention_step)
            return out_context, out_x, (state_after, skipped)

        return blocks

    return state, around


# The step caches FLUX.1's Euler runs (config/caches.py names them; FamilyEntry.caches lists them): (pipeline,
# conditioning, the packed latents' shape, the cache's traced settings, spec) -> (state, (step, state) -> the call)
CACHES = {"first_block": first_block, "magcache": mag_cache}

# What a call a cache skipped runs of the blocks, as the transformer's ``around_blocks`` (the embedders and the
# output layers run in every call): First-Block Cache still runs the first block, MagCache none -- the FLOPs of
# such a call are counted with it (engine/efficiency.py: the executed FLOPs of a cached run).
SKIPPED_CALLS = {"first_block": lambda head, rest, x, context: (*head(x, context), None),
                 "magcache": lambda head, rest, x, context: (context, x, None)}


def decode(pipeline: Any, params: dict, latents):
    """Latents -> pixels in [0, 1], (batch, H, W, 3): ``latents / scaling_factor + shift_factor`` through the
    VAE's decoder, ``x / 2 + 0.5`` clipped (the pipeline's image processor)."""
    latents = latents / pipeline.scaling_factor + pipeline.shift_factor
    image = pipeline.vae.apply({"params": params["vae"]}, latents.astype(pipeline.vae.dtype),
                               method=pipeline.vae.decode)
    return (image.astype("float32") / 2 + 0.5).clip(0, 1).transpose(0, 2, 3, 1)


def prompt_ids(pipeline: Any, texts: list[str], max_sequence_length: int) -> np.ndarray:
    """(len(texts), 77 + max_sequence_length) int32 on the host: CLIP's ids padded to 77, then T5's padded (and
    cut) to ``max_sequence_length`` -- what ``FluxPipeline.encode_prompt`` tokenizes."""
    clip = pipeline.tokenizer(texts, padding="max_length", max_length=CLIP_TOKENS, truncation=True,
                              return_tensors="np").input_ids
    t5 = pipeline.tokenizer_2(texts, padding="max_length", max_length=max_sequence_length, truncation=True,
                              return_tensors="np").input_ids
    return np.concatenate([clip, t5], axis=1).astype(np.int32)
