"""What every sampler asks of the UNet: one call on the unconditional and conditional halves of a batch at
once (the inputs doubled, SDXL's added conditioning passed along), split back into the two predictions.
Each sampler combines them by the run's guider (engine/guiders.py) in its own precision (the diffusers schedulers in
the UNet's dtype, as diffusers does; the k samplers in float32)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple, Optional

from sdjax_runner.config.guiders import GUIDERS as GUIDER_ENTRIES
from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.engine.guiders import Guidance
from sdjax_runner.families.sd.models.unet import DeepCache, FreeU
from sdjax_runner.models.nn.perturbed import Perturbed


class Predictions(NamedTuple):
    """A step's UNet predictions: the unconditional one (None without classifier-free guidance), the conditional
    one and, with a perturbing guider (PAG), the conditional input's with self-attention perturbed."""

    unconditional: Any
    conditional: Any
    perturbed: Any = None

    def as_float32(self) -> Predictions:
        import jax.numpy as jnp

        return Predictions(*(None if part is None else part.astype(jnp.float32) for part in self))


def halves(pipeline: Any, params: dict, conditioning: Conditioning, x, timestep, switch_timestep=None,
           guidance: Optional[Guidance] = None) -> Predictions:
    """(unconditional, conditional) predictions for ``x`` (one half's inputs) at the scalar ``timestep``,
    whose dtype the UNet receives (the schedulers' integer timesteps, the k samplers' fractional ones).
    An inpainting model reads the mode's extra channels after ``x``; a ControlNet (controlnet mode) sees
    ``x`` and adds its scaled residuals to the UNet's skip connections, as diffusers' Flax ControlNet
    pipeline does. With SDXL's refiner (``conditioning.refiner``) a call whose ``switch_timestep`` (the
    training timestep the call is at, A1111's nearest one for a k sampler's sigma; ``timestep`` where None) is
    below the cutoff runs the refiner's UNet on its own conditioning (engine/refiner.py). With a perturbing guider
    (``guidance.perturbed``, PAG's layers) a third, the conditional input's prediction with the self-attention they
    pick perturbed: (unconditional, conditional, perturbed), all in one call of the UNet on a batch grown by the
    conditional rows, as diffusers' PAG pipelines make it; with one that reweighs the UNet (FreeU), its up blocks
    reweighed by the guider's traced factors."""
    import jax.numpy as jnp

    perturbed = guidance.perturbed if guidance is not None else None
    freeu = reweighing(guidance)
    guided = conditioning.context.shape[0] != x.shape[0]  # else the conditional half alone (no CFG)
    if perturbed:
        chunks = 3 if guided else 2
        grown = with_conditional_rows(conditioning, guided)
        out = _switched(pipeline, params, grown, jnp.concatenate([x] * chunks), timestep, switch_timestep,
                        Perturbed(perturbed, chunks, guidance.query_blur if guidance else None), freeu)
        parts = jnp.split(out, chunks, axis=0)
        return Predictions(*parts) if guided else Predictions(None, *parts)
    if not guided:
        return Predictions(None, _switched(pipeline, params, conditioning, x, timestep, switch_timestep, freeu=freeu))
    both = _switched(pipeline, params, conditioning, jnp.concatenate([x] * 2), timestep, switch_timestep, freeu=freeu)
    return Predictions(*jnp.split(both, 2, axis=0))


def reweighing(guidance: Optional[Guidance]) -> Optional[FreeU]:
    """The UNet's FreeU factors where the guider reweighs it (``guider=freeu``: its traced settings), else None."""
    if guidance is None or not GUIDER_ENTRIES[guidance.guider].reweighs:
        return None
    settings = guidance.settings
    return FreeU((settings["b1"], settings["b2"]), (settings["s1"], settings["s2"]))


def rows_mapped(conditioning: Conditioning, rows: Callable) -> Conditioning:
    """``conditioning`` with ``rows`` applied to each of its batch-leading arrays (the text context, SDXL's added
    conditioning, an inpainting model's extra channels, a ControlNet's image; the refiner's own likewise)."""
    control, refiner = conditioning.control, conditioning.refiner
    return Conditioning(rows(conditioning.context),
                        None if conditioning.added is None else {k: rows(v) for k, v in conditioning.added.items()},
                        None if conditioning.concat is None else rows(conditioning.concat),
                        None if control is None else (rows(control[0]), *control[1:]),
                        None if refiner is None else (rows_mapped(refiner[0], rows), refiner[1]))


def with_conditional_rows(conditioning: Conditioning, guided: bool) -> Conditioning:
    """``conditioning`` with its conditional rows -- the last half of every batch-leading array (``guided``: it
    holds the unconditional half first), else all of them -- repeated at the end: the perturbed call's inputs."""
    import jax.numpy as jnp

    return rows_mapped(conditioning,
                       lambda array: jnp.concatenate([array, array[array.shape[0] // 2:] if guided else array]))


def _switched(pipeline: Any, params: dict, conditioning: Conditioning, model_input, timestep, switch_timestep,
              perturbed: Optional[Perturbed] = None, freeu: Optional[FreeU] = None):
    """The base's UNet (:func:`_unet`), or past the refiner's cutoff the refiner's (one ``lax.cond`` per call).
    (A guider that changes the UNet runs without the refiner: config/guiders.py.)"""
    if conditioning.refiner is None:
        return _unet(pipeline, params, conditioning, model_input, timestep, perturbed=perturbed, freeu=freeu)
    import jax

    refining, cutoff = conditioning.refiner
    base = conditioning._replace(refiner=None)
    unet, weights = pipeline.refiner.unet, params["refiner"]["unet"]
    when = timestep if switch_timestep is None else switch_timestep
    return jax.lax.cond(when < cutoff, lambda x: _unet(pipeline, params, refining, x, timestep, unet, weights),
                        lambda x: _unet(pipeline, params, base, x, timestep), model_input)


def deep_cached(pipeline: Any, params: dict, conditioning: Conditioning, model_input, timestep, deep: DeepCache,
                freeu: Optional[FreeU] = None) -> tuple[Any, Any]:
    """The pipeline's UNet (and a ControlNet's residuals) on ``model_input`` under DeepCache (engine/samplers/
    deep_cache.py): ``(its output, the branch's input)`` -- with ``deep.cached`` the branch alone, on that input
    (which it returns), else every layer, the input the branch's first up layer received."""
    import jax

    if deep.cached is not None:
        return _unet(pipeline, params, conditioning, model_input, timestep, freeu=freeu, deep_cache=deep), deep.cached
    out, sown = _unet(pipeline, params, conditioning, model_input, timestep, freeu=freeu, deep_cache=deep,
                      mutable=("intermediates",))
    (kept,) = jax.tree_util.tree_leaves(sown)
    return out, kept


def _unet(pipeline: Any, params: dict, conditioning: Conditioning, model_input, timestep, unet: Any = None,
          weights: Any = None, perturbed: Optional[Perturbed] = None, freeu: Optional[FreeU] = None,
          deep_cache: Optional[DeepCache] = None, mutable: tuple[str, ...] = ()):
    """The UNet (and a ControlNet's residuals) on ``model_input``, whose rows are the conditioning's; ``unet`` and
    its ``weights``: another UNet than the pipeline's (SDXL's refiner); ``perturbed``: the UNet's self-attention
    perturbed (PAG; the ControlNet's is not, as in diffusers' PAG ControlNet pipelines); ``freeu``: its up blocks
    reweighed; ``deep_cache``: DeepCache's branch (:func:`deep_cached`); ``mutable``: the collections the call
    returns beside its output (``(output, collections)``)."""
    import jax.numpy as jnp

    timesteps = jnp.broadcast_to(timestep, model_input.shape[:1])
    extra: dict[str, Any] = {} if conditioning.added is None else {"added_cond_kwargs": conditioning.added}
    if conditioning.control is not None:
        image, scale = conditioning.control[:2]  # (the scale at this step: engine/modes/controlnet.at_step)
        down, mid = pipeline.controlnet.apply({"params": params["controlnet"]}, model_input, timesteps,
                                              encoder_hidden_states=conditioning.context, controlnet_cond=image,
                                              conditioning_scale=scale)
        extra.update(down_block_additional_residuals=down, mid_block_additional_residual=mid)
    if conditioning.concat is not None:
        model_input = jnp.concatenate([model_input, conditioning.concat], axis=1)
    unet, weights = (pipeline.unet, params["unet"]) if unet is None else (unet, weights)
    if perturbed is not None:
        extra["perturbed"] = perturbed
    if freeu is not None:
        extra["freeu"] = freeu
    if deep_cache is not None:
        extra["deep_cache"] = deep_cache
    if mutable:
        out, collections = unet.apply({"params": weights}, model_input, timesteps,
                                      encoder_hidden_states=conditioning.context, mutable=list(mutable), **extra)
        return out.sample, collections
    return unet.apply({"params": weights}, model_input, timesteps, encoder_hidden_states=conditioning.context,
                      **extra).sample


def conditional_only(conditioning: Conditioning) -> Conditioning:
    """``conditioning`` without its unconditional half (the first half of every batch-leading array), for a
    program without classifier-free guidance (engine/program.py: Spec.cfg)."""
    return rows_mapped(conditioning, lambda array: array[array.shape[0] // 2:])
