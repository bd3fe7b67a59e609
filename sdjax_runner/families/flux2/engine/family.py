"""What the engine needs of FLUX.2 [klein] besides its stages (:mod:`.stages`): its prompts' tokens, its checks once a
model is loaded, what its compiled programs depend on and the FLOPs of one transformer call. engine/families.py's
``FAMILIES["flux2"]`` is made of these, the stages, FLUX.1's flow samplers (families/flux/engine/samplers.py) driven
by FLUX.2's velocity, and FLUX.1's pipeline per job and block-by-block gathering of split weights (the transformer's
blocks carry FLUX.1's list names and ``gather_blocks``)."""

from __future__ import annotations

from typing import Any, Optional

from sdjax_runner.engine.family import DenoiserCall
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.engine.family import FluxTokens
from sdjax_runner.families.flux2.engine import stages
from sdjax_runner.models.checkpoints import config_dict


class Flux2Tokens(FluxTokens):
    """Prompt texts -> ids ``(batch, 2 * max_sequence_length)``: the chat text's ids, then its attention mask
    (stages.prompt_ids), read as written (config/families.py refuses A1111's syntax for FLUX.2)."""

    prompt_ids = staticmethod(stages.prompt_ids)


def check_loaded(plan: Any, loaded: Any) -> None:
    """A distilled [klein] (its index's ``is_distilled``) reads no guidance: a sampling.guidance_scale over 1 (1 is no
    guidance: A1111's "CFG scale: 1", which its images' infotext says), a negative prompt or a guider given for it is
    one line each, where diffusers ignores the first with a warning."""
    if not loaded.pipeline.distilled:
        return
    name = plan.model.name
    why = f"{name} is a distilled FLUX.2 [klein] (its index says is_distilled), which runs without guidance"
    if plan.guidance_given and plan.guidance_scale > 1:
        raise UserError("sampling.guidance_scale", f"{plan.guidance_scale:g}, but {why}",
                        "null, or a base model (FLUX.2-klein-base-*) for classifier-free guidance")
    if plan.negative is not None:
        raise UserError("prompts.negative", f"given, but {why}", "null, or a base model (FLUX.2-klein-base-*)")
    if not plan.guider.plain:
        raise UserError("guider", f"{plan.guider.name}: {why}", "cfg (the default), or a base model")


def guidance(pipeline: Any) -> str:
    """A base model guides with classifier-free guidance ("cfg"); a distilled one reads none."""
    return "none" if pipeline.distilled else "cfg"


def negative(negative_prompt: Optional[str], pipeline: Any, chunks: int) -> Optional[str]:
    """A base model's negative prompt (diffusers' "" when none is given); a distilled model has none."""
    return None if pipeline.distilled else negative_prompt or ""


def structure(pipeline: Any) -> list:
    """The configs a compiled FLUX.2 program depends on (engine/families.py: ``structure``)."""
    return ["Flux2KleinPipeline", pipeline.distilled, str(pipeline.dtype), sorted(pipeline.scheduler_config.items()),
            pipeline.transformer.config, pipeline.vae.config, str(pipeline.vae.dtype),
            config_dict(pipeline.text_encoder), list(pipeline.out_layers)]


def transformer_call(pipeline: Any, per_device_images: int, height: int, width: int, tokens: int,
                     mode: str = "txt2img", references: int = 0) -> DenoiserCall:
    """One transformer call on a device's images (a base model's two guidance halves in one batch); ``tokens``: the
    prompt's; in ``mode`` edit or inpaint the reference images' tokens after the noise's -- the init image's and
    ``references`` more."""
    import jax
    import jax.numpy as jnp

    batch = per_device_images * (1 if pipeline.distilled else 2)
    factor = pipeline.vae_scale_factor
    images = 1 + (1 + references if mode in ("edit", "inpaint") else 0)  # the noise's tokens, then the references'
    seq = stages.latent_side(height, factor) * stages.latent_side(width, factor) * images
    transformer = pipeline.transformer
    hidden = jax.ShapeDtypeStruct((batch, seq, transformer.in_channels), pipeline.dtype)
    context = jax.ShapeDtypeStruct((batch, tokens, transformer.joint_attention_dim), pipeline.dtype)
    timestep = jax.ShapeDtypeStruct((batch,), pipeline.dtype)
    axes = len(transformer.axes_dims_rope)
    return DenoiserCall((hidden, context, timestep, jax.ShapeDtypeStruct((seq, axes), jnp.float32),
                         jax.ShapeDtypeStruct((tokens, axes), jnp.float32)))
