"""The Stable Diffusion family (1.x, 2.x, XL; inpainting, ControlNet, the refiner) as the engine runs it: the
stages are the engine's shared ones -- CLIP encoding (engine/encode.py), the modes (engine/modes), the SD
samplers and k samplers on the UNet (engine/samplers), the VAE decode (engine/decode.py) -- and this entry
says what only this family checks and measures."""

from __future__ import annotations

from typing import Any, Optional

from sdjax_runner.config import checks, modes
from sdjax_runner.engine.decode import decode
from sdjax_runner.engine.encode import Conditioning, encode, negative_text, with_time_ids
from sdjax_runner.engine.family import DenoiserCall, Family
from sdjax_runner.engine.modes import MODES
from sdjax_runner.engine.samplers import SAMPLERS, deep_cache
from sdjax_runner.engine.tokens import PromptTokens
from sdjax_runner.errors import UserError
from sdjax_runner.families.sd.models.loading import with_scheduler
from sdjax_runner.models.checkpoints import config_dict
from sdjax_runner.models.loading import LoadedModel


def sd_check_loaded(plan: Any, loaded: LoadedModel) -> None:
    pipeline = loaded.pipeline
    modes.fits_model(plan.generation, pipeline.unet.config.in_channels, plan.model.name)
    checks.clip_skip(plan.clip_skip, pipeline.text_encoder.config.num_hidden_layers,
                     hasattr(pipeline, "text_encoder_2"), plan.model.name)
    perturbed_layers(plan.guider.layers, loaded.host_weights["unet"], plan.model.name)
    deep_cache_branch(dict(plan.cache.shaping).get("branch"), len(pipeline.unet.config.block_out_channels),
                      plan.model.name)


def deep_cache_branch(branch: Optional[float], levels: int, model: str) -> None:
    """DeepCache's ``cache.branch`` names a level of the UNet (``branch // 3``: engine/samplers/deep_cache.py)."""
    if branch is not None and branch >= deep_cache.LEVEL_LAYERS * levels:
        raise UserError("cache.branch", f"{branch:g}: {model}'s UNet has {levels} levels, DeepCache's branches "
                        f"0 to {deep_cache.LEVEL_LAYERS * levels - 1} (level branch // 3, layer branch % 3)",
                        f"a whole number from 0 to {deep_cache.LEVEL_LAYERS * levels - 1}")


def perturbed_layers(layers: tuple[str, ...], unet_weights: dict, model: str) -> None:
    """Each of a perturbing guider's ``guider.layers`` picks at least one of the UNet's self-attention modules
    (models/nn/perturbed.check_layers)."""
    from sdjax_runner.families.sd.models.unet import self_attention_names
    from sdjax_runner.models.nn.perturbed import check_layers

    names = self_attention_names(unet_weights)
    check_layers(layers, names, model, sorted({name.rpartition(".attentions")[0] for name in names}),
                 "down_blocks.1.attentions.0.transformer_blocks.0.attn1")


def sd_tokens(pipeline: Any, plan: Any) -> PromptTokens:
    """The prompts' tokens, with prompts.embeddings' names matched (models/embeddings.py)."""
    from sdjax_runner.models import embeddings

    return PromptTokens(pipeline, plan.syntax, embeddings.load(plan.embeddings, pipeline) if plan.embeddings else None)


def sd_encode(pipeline: Any, params: dict, ids, negative_ids, spec: Any, inputs: dict) -> Conditioning:
    """CLIP encoder(s) (engine/encode.py); SDXL's size conditioning added."""
    conditioning = encode(pipeline, params, ids, negative_ids, spec.clip_skip, spec.prompt_chunks,
                          inputs.get("prompt_weights"), inputs.get("negative_weights"))
    return with_time_ids(conditioning, spec.height, spec.width, conditioning.context.dtype)  # SDXL only


def unet_call(pipeline: Any, per_device_images: float, height: int, width: int, tokens: int,
              mode: str = "txt2img", references: int = 0) -> DenoiserCall:
    """One guided UNet application (the batch doubled for classifier-free guidance); ``tokens``: the prompt's length
    as the UNet reads it (77, or 77 per chunk with A1111's syntax)."""
    import jax
    import jax.numpy as jnp

    unet, batch = pipeline.unet, round(2 * per_device_images)  # (a half image each: no guidance, one batch)
    factor = pipeline.vae_scale_factor
    latents = jax.ShapeDtypeStruct((batch, unet.config.in_channels, height // factor, width // factor), jnp.float32)
    steps = jax.ShapeDtypeStruct((batch,), jnp.int32)
    context = jax.ShapeDtypeStruct((batch, tokens, unet.config.cross_attention_dim), jnp.float32)  # CLIP outputs fp32
    added = None
    if getattr(unet.config, "addition_embed_type", None) == "text_time":
        embeds = pipeline.text_encoder_2.config.projection_dim
        added = {"text_embeds": jax.ShapeDtypeStruct((batch, embeds), jnp.float32),
                 "time_ids": jax.ShapeDtypeStruct((batch, 6), jnp.float32)}
    return DenoiserCall((latents, steps), {"encoder_hidden_states": context, "added_cond_kwargs": added})


def deep_cache_call(shape: tuple, pipeline: Any, weights: dict, call: DenoiserCall):
    """:attr:`Family.skipped_calls`' ``deepcache``: the UNet's call on DeepCache's branch alone (engine/samplers/
    deep_cache.py), its kept input zeros of the shape a whole call keeps."""
    import jax
    import jax.numpy as jnp

    deep = deep_cache.branch(shape)
    shapes = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), weights)
    _, sown = jax.eval_shape(lambda p, args, kwargs: pipeline.unet.apply(
        {"params": p}, *args, **kwargs, deep_cache=deep, mutable=["intermediates"]), shapes, call.args, call.kwargs)
    (kept,) = jax.tree_util.tree_leaves(sown)
    return lambda: {"deep_cache": deep._replace(cached=jnp.zeros(kept.shape, kept.dtype))}


def sd_controlnet(value: str, cache_dir: str, pipeline: Any, activations: Any, weights: Any) -> Any:
    """:attr:`Family.load_controlnet`: an SD ControlNet, checked against the model's UNet (models/controlnet.py)."""
    from sdjax_runner.models import controlnet

    return controlnet.load(value, cache_dir, pipeline.unet.config, activations, weights)


def sd_structure(pipeline: Any) -> list:
    return [type(pipeline).__name__, str(pipeline.dtype), type(pipeline.scheduler).__name__,
            config_dict(pipeline.scheduler), config_dict(pipeline.unet), config_dict(pipeline.vae),
            str(pipeline.vae.dtype),  # float32 where an fp16 run upcasts the VAE (loading.component_dtype)
            config_dict(getattr(pipeline, "text_encoder", None)),
            config_dict(getattr(pipeline, "text_encoder_2", None))]


FAMILY = Family("sd", check_loaded=sd_check_loaded, with_scheduler=with_scheduler, tokens=sd_tokens,
                negative=negative_text, encode=sd_encode, modes=MODES, samplers=SAMPLERS, decode=decode,
                structure=sd_structure, denoiser_call=unet_call, denoiser="unet",
                runs_cfg=lambda plan: plan.guidance_scale > 1, skipped_calls={"deepcache": deep_cache_call},
                load_controlnet=sd_controlnet,
                at_size=lambda conditioning, height, width: with_time_ids(conditioning, height, width,
                                                                          conditioning.context.dtype))
