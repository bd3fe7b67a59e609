"""Stage 1, encode: prompt token ids -> the conditioning the UNet reads (classifier-free guidance's
unconditional half first), for one text encoder (SD 1.x/2.x) or two (SDXL).

With A1111's prompt syntax (``chunks`` > 0; the ids from :mod:`.tokens`) each image's ids are ``chunks``
rows of 77 that the encoder reads one by one; their hidden states are concatenated along the tokens (SDXL:
its pooled embedding is the first chunk's, as A1111's), and each token's is scaled by its weight with the
mean restored -- A1111's default emphasis ("Original": ``z *= weights; z *= old_mean / new_mean``), taken
per encoder and per chunk, in float32. A1111 takes that mean over the chunk of a whole batch of prompts;
here it is each image's own, so an image does not depend on which prompts share its batch (the same
numbers where A1111's batch holds one prompt, its common case).
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple, Optional

import jax.numpy as jnp


class Conditioning(NamedTuple):
    """What the UNet is conditioned on, unconditional half first (a pytree: it crosses the sampling loop)."""

    context: Any  # (2 * batch, tokens, width): encoder_hidden_states
    added: Optional[dict] = None  # SDXL's added conditioning: text_embeds (pooled), time_ids
    # The modes' (engine/modes/), both halves: more UNet input channels after the latents (an inpainting
    # model's mask and masked-image latents, (2 * batch, 5, h, w)), and a ControlNet's inputs.
    concat: Optional[Any] = None
    # the SD family's (control image (2 * batch, 3, H, W) in [0, 1], conditioning scale); FLUX.1's (the control image's
    # packed latents, conditioning scale, control mode): families/flux/engine/stages.controlnet
    control: Optional[Any] = None
    # FLUX.1 Kontext's input image as tokens after the noise's, (batch, tokens, 4 * latent channels): mode=edit
    reference: Optional[Any] = None
    # SDXL's refiner (engine/refiner.py): (its own Conditioning, the cutoff timestep below which its UNet runs)
    refiner: Optional[tuple] = None


def negative_prompt(negative: Optional[str], pipeline: Any) -> Optional[str]:
    """The negative prompt encoded for every image, or None for the pipeline's own unconditional input.

    SD 1.x/2.x: diffusers' Flax pipeline encodes "" when it is given no negative prompt, so "" is None
    here (one program, the same images). SDXL follows diffusers' ``StableDiffusionXLPipeline.encode_prompt``
    (``zero_out_negative_prompt = negative_prompt is None and self.config.force_zeros_for_empty_prompt``):
    zero embeddings (what the Flax SDXL pipeline computes when it gets no negative ids) only when no
    negative prompt is given and the model's index says ``force_zeros_for_empty_prompt`` (true for SDXL
    base, diffusers' default); otherwise the negative prompt, "" included, is encoded. (``negative``:
    prompts.negative.)
    """
    if not hasattr(pipeline, "text_encoder_2"):
        return negative or None
    if negative is None and not pipeline.force_zeros_for_empty_prompt:
        return ""
    return negative


def negative_text(negative: Optional[str], pipeline: Any, chunks: int) -> Optional[str]:
    """:func:`negative_prompt`; with A1111's syntax (``chunks`` > 0) SD 1.x/2.x encode the empty prompt
    from ids like any other (its chunks, padded to the prompts' count)."""
    chosen = negative_prompt(negative, pipeline)
    if chosen is None and chunks and not hasattr(pipeline, "text_encoder_2"):
        return ""
    return chosen


def encode(pipeline: Any, params: dict, ids, negative_ids=None, clip_skip: int = 1, chunks: int = 0,
           weights=None, negative_weights=None) -> Conditioning:
    """``chunks``, ``weights``, ``negative_weights``: A1111's syntax (module docstring); 0 and None for the
    guide's encoding."""
    def read(encoder, ids, weights):
        return read_chunks(encoder, ids, chunks, weights)

    if hasattr(pipeline, "text_encoder_2"):
        return _two_encoders(pipeline, params, ids, negative_ids, read, weights, negative_weights)
    return _one_encoder(pipeline, params, ids, negative_ids, clip_skip, read, weights, negative_weights)


def read_chunks(encoder, ids, chunks: int, weights):
    """``encoder``'s outputs (hidden states, and any others with a batch axis) for ``ids``; with ``chunks``,
    each row's chunks read one by one, the hidden states concatenated and emphasized, the rest the first
    chunk's."""
    if not chunks:
        return encoder(ids)
    rows = ids.shape[0]
    hidden, *rest = encoder(ids.reshape(rows * chunks, -1))
    hidden = emphasis(hidden.reshape(rows, chunks, *hidden.shape[1:]), weights.reshape(rows, chunks, -1))
    return (hidden.reshape(rows, -1, hidden.shape[-1]), *(r.reshape(rows, chunks, *r.shape[1:])[:, 0] for r in rest))


def emphasis(hidden, weights):
    """A1111's "Original" emphasis on (rows, chunks, 77, width) hidden states with (rows, chunks, 77)
    weights: each token's state times its weight, then the chunk scaled back to its old mean."""
    states = hidden.astype(jnp.float32)
    old = states.mean(axis=(-2, -1), keepdims=True)
    states = states * weights[..., None]
    new = states.mean(axis=(-2, -1), keepdims=True)
    return (states * (old / new)).astype(hidden.dtype)


def _hidden_states(pipeline: Any, params: dict, ids, clip_skip: int):
    """The text encoder's last hidden states (``clip_skip`` 1), or -- A1111's Clip skip -- the output of the
    ``clip_skip``-th layer from the end through the final layer norm (its ``encode_with_transformers``)."""
    if clip_skip == 1:
        return pipeline.text_encoder.apply({"params": params["text_encoder"]}, ids).last_hidden_state
    import flax.linen as nn

    hidden = pipeline.text_encoder.apply({"params": params["text_encoder"]}, ids, output_hidden_states=True).hidden_states
    config = pipeline.text_encoder.config
    norm = nn.LayerNorm(epsilon=config.layer_norm_eps, dtype=pipeline.text_encoder.dtype)
    return norm.apply({"params": params["text_encoder"]["text_model"]["final_layer_norm"]}, hidden[-clip_skip])


def embedded(pipeline: Any, params: dict, component: str, call):
    """``call(ids)`` (a text encoder's outputs) reading textual-inversion vectors (models/embeddings.py): ids at or
    past the encoder's vocabulary are rows of ``params["embeddings"][component]``; the encoder reads id 0 there (the
    end-of-text pooling looks for the largest id or for the end token: neither is 0) and its token embedding at
    those positions is the row, through flax's method interception. Without embeddings, ``call`` itself."""
    table = params.get("embeddings", {}).get(component)
    if table is None:
        return call
    import flax.linen as nn

    vocabulary = int(getattr(pipeline, component).config.vocab_size)

    def with_vectors(ids):
        rows = ids - vocabulary
        inside = rows >= 0
        vectors = jnp.take(table, jnp.clip(rows, 0, table.shape[0] - 1), axis=0)

        def replace(next_fun, args, kwargs, context):
            out = next_fun(*args, **kwargs)
            if context.method_name == "__call__" and isinstance(context.module, nn.Embed) \
                    and context.module.name == "token_embedding":
                return jnp.where(inside[..., None], vectors.astype(out.dtype), out)
            return out

        with nn.intercept_methods(replace):
            return call(jnp.where(inside, 0, ids))

    return with_vectors


def _one_encoder(pipeline: Any, params: dict, ids, negative_ids, clip_skip: int, read,
                 weights, negative_weights) -> Conditioning:
    """SD 1.x/2.x: the text encoder's last hidden states (or an earlier layer's: clip skip); no negative
    prompt is the empty prompt's. ``read(encoder, ids, weights)``: the encoder's outputs (:func:`read_chunks`)."""
    @functools.partial(embedded, pipeline, params, "text_encoder")
    def states(rows):
        return (_hidden_states(pipeline, params, rows, clip_skip),)

    (embeds,) = read(states, ids, weights)
    if negative_ids is None:
        negative_ids = pipeline.tokenizer([""] * ids.shape[0], padding="max_length", max_length=ids.shape[-1],
                                          return_tensors="np").input_ids
    (negative,) = read(states, negative_ids, negative_weights)
    return Conditioning(jnp.concatenate([negative, embeds]))


def _sdxl_embeddings(pipeline: Any, params: dict, ids, read, weights):
    """Both encoders' penultimate hidden states side by side, and the second's pooled projection."""
    @functools.partial(embedded, pipeline, params, "text_encoder")
    def first(rows):
        return (pipeline.text_encoder.apply({"params": params["text_encoder"]}, rows, output_hidden_states=True)
                .hidden_states[-2],)

    @functools.partial(embedded, pipeline, params, "text_encoder_2")
    def second(rows):
        out = pipeline.text_encoder_2.apply({"params": params["text_encoder_2"]}, rows, output_hidden_states=True)
        return out.hidden_states[-2], out.text_embeds

    (states,) = read(first, ids[:, 0], None if weights is None else weights[:, 0])
    states_2, pooled = read(second, ids[:, 1], None if weights is None else weights[:, 1])
    return jnp.concatenate([states, states_2], axis=-1), pooled


def _two_encoders(pipeline: Any, params: dict, ids, negative_ids, read, weights,
                  negative_weights) -> Conditioning:
    """SDXL: no negative ids -> zero embeddings (negative_prompt above decides when that is meant); the
    added time ids come from with_time_ids."""
    context, pooled = _sdxl_embeddings(pipeline, params, ids, read, weights)
    if negative_ids is None:
        negative_context, negative_pooled = jnp.zeros_like(context), jnp.zeros_like(pooled)
    else:
        negative_context, negative_pooled = _sdxl_embeddings(pipeline, params, negative_ids, read,
                                                             negative_weights)
    return Conditioning(jnp.concatenate([negative_context, context], axis=0),
                        {"text_embeds": jnp.concatenate([negative_pooled, pooled], axis=0)})


def with_time_ids(conditioning: Conditioning, height: int, width: int, dtype) -> Conditioning:
    """SDXL's micro-conditioning for an uncropped image of ``height`` x ``width``: original size, crop
    corner (0, 0), target size -- diffusers' ``_get_add_time_ids((h, w), (0, 0), (h, w), ...)``."""
    if conditioning.added is None:
        return conditioning
    rows = conditioning.context.shape[0] // 2
    time_ids = jnp.array([[height, width, 0, 0, height, width]] * rows, dtype=dtype)
    return conditioning._replace(added=dict(conditioning.added,
                                            time_ids=jnp.concatenate([time_ids, time_ids], axis=0)))
