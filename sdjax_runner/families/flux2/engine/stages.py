"""FLUX.2 [klein]'s program stages, each what diffusers 0.39's ``Flux2KleinPipeline`` does (its ``encode_prompt`` with
Qwen3's chat text, ``prepare_latents`` / ``_pack_latents`` / ``_prepare_latent_ids`` / ``_prepare_text_ids``, the
denoising loop with ``FlowMatchEulerDiscreteScheduler`` on ``compute_empirical_mu``'s shift, the batch norm's
statistics undone, ``_unpatchify_latents`` and the VAE decode), for one device's share of a batch inside the traced
program. ``pipeline`` is families/flux2/models/pipeline.Flux2Pipeline, ``params`` its placed weights by component.

Prompt ids are one array per image: the chat text's ``max_sequence_length`` ids, then its attention mask (the
pipeline pads every prompt to that length and the text encoder reads the mask). A distilled model runs one
transformer call a step; a base model classifier-free guidance's two, the negative prompt (diffusers': "") and the
prompt in one batch, ``neg + scale * (pos - neg)`` where the scale is over 1, else the prompt's prediction (the scale
is traced: a guidance sweep compiles once). The latents are the patchified ``(batch, 4 c, h, w)`` (the pipeline draws
its noise so) between the stages, and packed as tokens ``(batch, h w, 4 c)`` inside the samplers."""

from __future__ import annotations

from typing import Any, Optional

import numpy as np

from sdjax_runner.config import guiders
from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.guiders import Guidance, flow_step, guided
from sdjax_runner.engine.modes.start import Start
from sdjax_runner.families.flux.engine.stages import euler_step, exponential_shift, kept_area, noised_start


def latent_side(pixels: int, vae_scale_factor: int) -> int:
    """The token grid's side for ``pixels``: ``int(pixels) // (vae_scale_factor * 2)`` (prepare_latents' ``height // 2``
    of its latent height)."""
    return pixels // (vae_scale_factor * 2)


def pack(latents):
    """(batch, C, h, w) -> (batch, h w, C): ``_pack_latents`` (each position's channels a token)."""
    batch, channels, height, width = latents.shape
    return latents.reshape(batch, channels, height * width).transpose(0, 2, 1)


def unpack(tokens, height: int, width: int):
    """The inverse of :func:`pack` for a ``height`` x ``width`` grid (``_unpack_latents_with_ids`` for the ids of
    :func:`image_ids`, which place the tokens row by row)."""
    batch, _, channels = tokens.shape
    return tokens.transpose(0, 2, 1).reshape(batch, channels, height, width)


def image_ids(height: int, width: int) -> np.ndarray:
    """(h w, 4) float32 positions of the packed tokens: (t=0, row, column, l=0) (``_prepare_latent_ids``)."""
    ids = np.zeros((height, width, 4), np.float32)
    ids[..., 1] = np.arange(height)[:, None]
    ids[..., 2] = np.arange(width)[None, :]
    return ids.reshape(-1, 4)


def text_ids(tokens: int) -> np.ndarray:
    """(tokens, 4) float32 positions of the text: (0, 0, 0, l) (``_prepare_text_ids``)."""
    ids = np.zeros((tokens, 4), np.float32)
    ids[:, 3] = np.arange(tokens)
    return ids


def empirical_mu(image_seq_len: int, steps: int) -> float:
    """diffusers' ``compute_empirical_mu``: the shift FLUX.2 fits to the image's token count and the step count."""
    a1, b1 = 8.73809524e-05, 1.89833333
    a2, b2 = 0.00016927, 0.45666666
    if image_seq_len > 4300:
        return float(a2 * image_seq_len + b2)
    m_200, m_10 = a2 * image_seq_len + b2, a1 * image_seq_len + b1
    a = (m_200 - m_10) / 190.0
    return float(a * steps + m_200 - 200.0 * a)


def flow_sigmas(steps: int, seq_len: int) -> np.ndarray:
    """The schedule's ``steps + 1`` sigmas (the last 0), float32, as the pipeline sets them: ``linspace(1, 1/steps,
    steps)`` shifted by ``exp(mu) / (exp(mu) + 1/s - 1)`` with :func:`empirical_mu` (the scheduler's dynamic shift,
    exponential). Host constants of the program."""
    base = np.linspace(1.0, 1 / steps, steps).astype(np.float32)
    return np.append(exponential_shift(base, empirical_mu(seq_len, steps)), np.float32(0.0))


def sigma_table(pipeline: Any, spec: Any):
    """(table of sigmas, sigma(t)) of the k samplers' model sampling on FLUX.2 (families/flux/engine/samplers.py):
    ComfyUI's ModelSamplingFlux form -- ``sigma(t) = exp(mu) / (exp(mu) + 1/t - 1)`` over T = 10000 -- with the
    pipeline's own shift (:func:`empirical_mu` for the image's tokens and the step count)."""
    from sdjax_runner.families.flux.engine.sigmas import exponential_model

    factor = pipeline.vae_scale_factor
    return exponential_model(empirical_mu(latent_side(spec.height, factor) * latent_side(spec.width, factor),
                                          spec.steps))


def prompt_ids(pipeline: Any, texts: list[str], max_sequence_length: int) -> np.ndarray:
    """(len(texts), 2 * max_sequence_length) int32 on the host: each prompt's chat text (Qwen3's template, thinking
    off) tokenized, padded and cut to ``max_sequence_length``, then its attention mask -- what
    ``Flux2KleinPipeline._get_qwen3_prompt_embeds`` tokenizes."""
    from sdjax_runner.models.nn.qwen_tokenizer import chat_text

    encoded = pipeline.tokenizer([chat_text(text) for text in texts], padding="max_length",
                                 max_length=max_sequence_length, truncation=True, return_tensors="np")
    return np.concatenate([encoded.input_ids, encoded.attention_mask], axis=1).astype(np.int32)


def embeddings(pipeline: Any, params: dict, ids):
    """``prompt_embeds`` of :func:`prompt_ids`' ids: Qwen3's hidden states ``out_layers`` (9, 18, 27) side by side
    per token, ``(batch, tokens, 3 * hidden_size)``, in the activations dtype."""
    tokens = ids.shape[1] // 2
    states = pipeline.text_encoder.apply({"params": params["text_encoder"]}, ids[:, :tokens], ids[:, tokens:],
                                         pipeline.out_layers)  # (layers, batch, tokens, width)
    layers, batch, _, width = states.shape
    return states.transpose(1, 2, 0, 3).reshape(batch, tokens, layers * width).astype(pipeline.dtype)


def encode(pipeline: Any, params: dict, ids, negative_ids, spec: Any, inputs: dict) -> Conditioning:
    """The prompt's ``prompt_embeds`` and, for a base model, the negative prompt's (``added["negative_context"]``)."""
    added = None if negative_ids is None else {"negative_context": embeddings(pipeline, params, negative_ids)}
    return Conditioning(embeddings(pipeline, params, ids), added)


def txt2img(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """The device's noise, ``(batch, 4 c, H/16, W/16)`` float32 standard normal: the patchified latents
    Flux2KleinPipeline.prepare_latents draws."""
    import jax
    import jax.numpy as jnp

    factor, channels = pipeline.vae_scale_factor, 4 * pipeline.vae.latent_channels
    shape = (batch, channels, latent_side(spec.height, factor), latent_side(spec.width, factor))
    return Start(jax.random.normal(key, shape=shape, dtype=jnp.float32))


def reference_latents(pipeline: Any, params: dict, pixels):
    """``pixels`` ((batch, 3, H, W) in [-1, 1]) as the pipelines encode an image: the mode of the VAE's posterior (no
    draw), patchified, normalised by the batch norm's statistics -- ``(batch, 4 c, H/16, W/16)`` float32."""
    import jax.numpy as jnp

    from sdjax_runner.families.flux2.models.autoencoder import patchify

    vae = pipeline.vae
    posterior = vae.apply({"params": params["vae"]}, pixels.astype(vae.dtype), method=vae.encode)
    latents = patchify(posterior.mode().transpose((0, 3, 1, 2)).astype(jnp.float32))
    return vae.apply({"params": params["vae"]}, latents, method=vae.normalise)


def reference_tokens(pipeline: Any, params: dict, first, inputs: dict):
    """The reference images' tokens, in order: ``first`` (the init image's :func:`reference_latents`), then each of
    ``inputs["references"]`` ((batch, R, 3, H, W), reference_images) encoded alike, packed and concatenated --
    ``(batch, (1 + R) h w, 4 c)``, read at time coordinates 10, 20, ... (:func:`velocity_model`)."""
    import jax.numpy as jnp

    images = [first]
    more = inputs.get("references")
    if more is not None:
        images += [reference_latents(pipeline, params, more[:, r]) for r in range(more.shape[1])]
    return jnp.concatenate([pack(image) for image in images], axis=1)


def edit(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """Editing with reference images (Flux2KleinPipeline's ``image``, one or a list): :func:`txt2img`'s noise, and
    the init image (``inputs["init"]``, at the run's size) and any more (reference_images) encoded
    (:func:`reference_latents`) and packed, as ``Conditioning.reference``: tokens every transformer call reads after
    the noise's, the i-th image's at time coordinate 10 (i + 1) (:func:`reference_ids`)."""
    start = txt2img(pipeline, params, key, spec, batch, inputs)
    tokens = reference_tokens(pipeline, params, reference_latents(pipeline, params, inputs["init"]), inputs)
    return start._replace(conditioning={"reference": tokens})


def bilinear(mask, height: int, width: int):
    """``mask`` (batch, 1, H, W) at ``height`` x ``width`` by PyTorch's bilinear interpolation without antialiasing
    (``interpolate(mode="bilinear", align_corners=False)``: Hires. fix's latent upscaler's weights, engine/upscale.py,
    along each axis), float32."""
    import jax.numpy as jnp

    from sdjax_runner.engine.upscale import bilinear as weights

    rows, columns = weights(mask.shape[-2], height), weights(mask.shape[-1], width)
    return jnp.einsum("oh,bchw,pw->bcop", rows, mask.astype(jnp.float32), columns)


def inpaint(pipeline: Any, params: dict, key, spec: Any, batch: int, inputs: dict) -> Start:
    """Inpainting (diffusers' Flux2KleinInpaintPipeline): the init image encoded (:func:`reference_latents`) is both
    where the sampler starts -- noised with :func:`txt2img`'s noise to the step strength gives (``inputs["start"]``,
    traced) -- and a reference image's tokens every call reads; after each step the latents outside the mask are set
    back to it, noised to the next sigma (``Start.keep``: 1 - the binary mask resized bilinearly to the token grid,
    so its edges are fractions)."""
    start = txt2img(pipeline, params, key, spec, batch, inputs)
    image = reference_latents(pipeline, params, inputs["init"])
    keep = 1.0 - bilinear(inputs["mask"], *start.noise.shape[-2:])
    references = reference_tokens(pipeline, params, image, inputs)  # (and image_reference: reference_images)
    return start._replace(image=image, step=inputs["start"], keep=keep, conditioning={"reference": references})


REFERENCE_TIME = 10  # _prepare_image_ids' scale: the i-th reference image's time coordinate is 10 + 10 i


def reference_ids(height: int, width: int, count: int = 1) -> np.ndarray:
    """(count h w, 4) float32 positions of ``count`` reference images' tokens, each ``height`` x ``width``: (10 (i + 1),
    row, column, 0) for the i-th (``_prepare_image_ids``)."""
    blocks = []
    for i in range(count):
        ids = image_ids(height, width)
        ids[:, 0] = REFERENCE_TIME * (i + 1)
        blocks.append(ids)
    return np.concatenate(blocks)


def position_ids(pipeline: Any, spec: Any, conditioning: Conditioning) -> tuple[Any, Any]:
    """(img_ids, txt_ids) of a call: the noise's tokens', then each reference image's (``conditioning.reference``,
    every one of the run's size) at its time coordinate; the text's."""
    import jax.numpy as jnp

    factor = pipeline.vae_scale_factor
    grid = (latent_side(spec.height, factor), latent_side(spec.width, factor))
    ids = image_ids(*grid)
    if conditioning.reference is not None:
        count = conditioning.reference.shape[1] // (grid[0] * grid[1])
        ids = np.concatenate([ids, reference_ids(*grid, count)])
    return jnp.asarray(ids), jnp.asarray(text_ids(conditioning.context.shape[1]))


def velocity_model(pipeline: Any, params: dict, conditioning: Conditioning, guidance: Guidance, spec: Any,
                   batch: int, steps: Optional[np.ndarray] = None):
    """``velocity(tokens, sigma, index=None)``: the transformer's prediction for packed latents at ``sigma`` (a scalar
    in [0, 1]; the transformer sees diffusers' ``t / 1000``); a base model's guided by the run's guider (module
    docstring: CFG in the transformer's dtype as diffusers combines it, another guider in float32), its step ``index``
    (the Euler loop's) or ``sigma``'s place among ``steps`` (a k sampler's sigmas)."""
    import jax.numpy as jnp

    img_ids, txt_ids = position_ids(pipeline, spec, conditioning)
    reference = conditioning.reference  # the reference images' tokens (edit, inpaint), read after the noise's
    guided_halves = conditioning.added is not None
    context = conditioning.context
    if guided_halves:
        assert conditioning.added is not None
        context = jnp.concatenate([conditioning.added["negative_context"], conditioning.context])
    scale = jnp.ravel(jnp.asarray(guidance.scale, pipeline.dtype))[0]  # one value (a device holds it as (1,))

    def velocity(x, sigma, index=None):
        x = x.astype(pipeline.dtype)
        tokens = x.shape[1]
        if reference is not None:
            x = jnp.concatenate([x, reference.astype(pipeline.dtype)], axis=1)
        halves = 2 if guided_halves else 1
        t = jnp.broadcast_to(jnp.asarray(sigma).astype(pipeline.dtype), (halves * batch,)).astype(pipeline.dtype)
        out = pipeline.transformer.apply({"params": params["transformer"]}, jnp.concatenate([x] * halves), context,
                                         t, img_ids, txt_ids)[:, :tokens]  # the prediction: the noise's tokens
        if not guided_halves:
            return out
        uncond, cond = out[:batch], out[batch:]
        if guidance.guider == guiders.DEFAULT and guidance.window is None:
            combined = uncond + scale * (cond - uncond)
        else:
            combined = guided(uncond, cond, guidance, *flow_step(index, sigma, steps, spec.steps)).astype(cond.dtype)
        return jnp.where(scale > 1, combined, cond)

    return velocity


def euler(pipeline: Any, params: dict, conditioning: Conditioning, start: Start, guidance, spec: Any, key=None):
    """The flow-matching Euler sampler (``FlowMatchEulerDiscreteScheduler.step``: ``x + (sigma_next - sigma) * v`` in
    float32) over :func:`flow_sigmas`, in a ``lax.fori_loop``; the transformer sees each step's timestep ``sigma *
    1000 / 1000`` in its dtype (as the pipeline passes it). Returns the final latents, patchified ``(batch, 4 c, h,
    w)``."""
    import jax
    import jax.numpy as jnp

    factor = pipeline.vae_scale_factor
    height, width = latent_side(spec.height, factor), latent_side(spec.width, factor)
    sigmas = flow_sigmas(spec.steps, height * width)
    timesteps = jnp.asarray(sigmas[:-1] * np.float32(1000))  # the scheduler's, float32
    steps_dt = jnp.asarray(sigmas[1:] - sigmas[:-1])
    latents = pack(noised_start(start, sigmas)).astype(start.noise.dtype)  # the noise, or inpainting's noised image
    velocity = velocity_model(pipeline, params, conditioning, guidance, spec, latents.shape[0])
    blend = kept_area(start, sigmas, pack)  # inpainting: the kept area set back after each step

    def step(index, x):
        v = velocity(x, timesteps[index].astype(pipeline.dtype) / 1000, index)
        return blend(index, euler_step(x, steps_dt[index], v))

    return unpack(jax.lax.fori_loop(start.step, spec.steps, step, latents), height, width)


def decode(pipeline: Any, params: dict, latents):
    """Patchified latents -> pixels in [0, 1], (batch, H, W, 3): the batch norm's statistics undone (``latents *
    sqrt(running_var + eps) + running_mean``), unpatchified, through the VAE's decoder, ``x / 2 + 0.5`` clipped."""
    from sdjax_runner.families.flux2.models.autoencoder import unpatchify

    vae = pipeline.vae
    latents = vae.apply({"params": params["vae"]}, latents, method=vae.denormalise)
    image = vae.apply({"params": params["vae"]}, unpatchify(latents).astype(vae.dtype), method=vae.decode)
    return (image.astype("float32") / 2 + 0.5).clip(0, 1).transpose(0, 2, 3, 1)
