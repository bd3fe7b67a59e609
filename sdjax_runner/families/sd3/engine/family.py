"""What the engine needs of SD 3 / 3.5 besides its stages (:mod:`.stages`): its prompts' tokens, its checks once a
model is loaded, its pipeline for a job's settings, what its compiled programs depend on and the FLOPs of one
transformer call. engine/families.py's ``FAMILIES["sd3"]`` is made of these, the stages and FLUX.1's flow samplers
(families/flux/engine/samplers.py) driven by SD 3's velocity."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

from sdjax_runner.config.guiders import GUIDERS
from sdjax_runner.engine.family import DenoiserCall
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.engine.family import ATTENTION, FluxTokens
from sdjax_runner.families.sd3.engine import stages
from sdjax_runner.models.checkpoints import config_dict


class SD3Tokens(FluxTokens):
    """Prompt texts -> ids ``(batch, 77 + 77 [+ max_sequence_length])`` (stages.prompt_ids), read as written as
    FLUX.1's are (config/families.py refuses A1111's syntax for SD 3)."""

    prompt_ids = staticmethod(stages.prompt_ids)


def check_loaded(plan: Any, loaded: Any) -> None:
    """Skip-layer guidance's blocks are blocks of the loaded transformer, a perturbing guider's layers pick some of
    its self-attention; the image fits its position table (a hub model's folder is on disk only now:
    config/families.check_side could not tell before)."""
    transformer = loaded.pipeline.transformer
    largest = transformer.pos_embed_max_size * transformer.patch_size * loaded.pipeline.vae_scale_factor
    native = plan.model.resolution or loaded.native_size
    height, width = plan.height or native, plan.width or native
    if height and width and max(height, width) > largest:
        raise UserError("sampling.height" if height > largest else "sampling.width",
                        f"{height}x{width}: {plan.model.name} takes at most {largest}x{largest} (its transformer's "
                        f"position table is {transformer.pos_embed_max_size}x{transformer.pos_embed_max_size} patches)",
                        f"a height and width up to {largest}")
    if GUIDERS[plan.guider.name].perturbs:  # (skip-layer guidance's layers are block numbers, below)
        perturbed_layers(plan.guider.layers, loaded.host_weights["transformer"], plan.model.name)
    if GUIDERS[plan.guider.name].skips:
        blocks = loaded.pipeline.transformer.num_layers
        layers = [int(layer) for layer in plan.guider.layers]
        if any(layer >= blocks for layer in layers):
            raise UserError("guider.layers", f"{layers}: {plan.model.name}'s transformer has {blocks} blocks "
                            f"(0..{blocks - 1})", f"block numbers below {blocks}")


def perturbed_layers(layers: tuple[str, ...], weights: dict, model: str) -> None:
    """Each of a perturbing guider's ``guider.layers`` picks at least one of the transformer's self-attention
    modules (models/nn/perturbed.check_layers)."""
    from sdjax_runner.families.sd3.models.transformer import self_attention_names
    from sdjax_runner.models.nn.perturbed import check_layers

    names = self_attention_names(weights)
    blocks = sorted({name.rpartition(".")[0] for name in names}, key=lambda name: int(name.rpartition(".")[2]))
    check_layers(layers, names, model, blocks, "transformer_blocks.1.attn")


def split_weights(pipeline: Any, specs: dict) -> tuple[Any, Any]:
    """parallelism.params=sharded: the transformer gathers each block's split weights as the block runs (one block
    whole at a time; each block has its own placement: the last one and SD 3.5 Medium's dual-attention blocks
    differ from the rest); the rest of the weights are gathered per component."""
    from sdjax_runner.engine.split import gather_tree

    def gather_block(number: int, block: Any) -> Any:
        return gather_tree(block, specs["transformer"][f"transformer_blocks_{number}"])

    transformer = pipeline.transformer.clone(gather_blocks=gather_block)
    return dataclasses.replace(pipeline, transformer=transformer), \
        lambda component, key: component == "transformer" and key.startswith("transformer_blocks_")


def negative(negative_prompt: Optional[str], pipeline: Any, chunks: int) -> str:
    """The negative prompt, or diffusers' default "": SD 3 always runs classifier-free guidance's two halves."""
    return negative_prompt or ""


def structure(pipeline: Any) -> list:
    """The configs a compiled SD 3 program depends on (engine/families.py: ``structure``)."""
    return ["StableDiffusion3Pipeline", str(pipeline.dtype), sorted(pipeline.scheduler_config.items()),
            pipeline.transformer.config, pipeline.vae.config, str(pipeline.vae.dtype),
            config_dict(pipeline.text_encoder), config_dict(pipeline.text_encoder_2),
            config_dict(pipeline.text_encoder_3)]


def transformer_call(pipeline: Any, per_device_images: float, height: int, width: int, tokens: int,
                     mode: str = "txt2img", references: int = 0) -> DenoiserCall:
    """One guided transformer call on a device's images (the negative and positive halves in one batch; with
    perturbed-attention guidance a third, ``per_device_images`` counting it as half an image each); ``tokens``: T5's
    sequence length (the conditioning is 77 CLIP tokens plus these)."""
    import jax

    batch, factor = round(2 * per_device_images), pipeline.vae_scale_factor
    transformer = pipeline.transformer
    hidden = jax.ShapeDtypeStruct((batch, height // factor, width // factor, transformer.in_channels), pipeline.dtype)
    context = jax.ShapeDtypeStruct((batch, stages.CLIP_TOKENS + tokens, transformer.joint_attention_dim),
                                   pipeline.dtype)
    pooled = jax.ShapeDtypeStruct((batch, transformer.pooled_projection_dim), pipeline.dtype)
    timestep = jax.ShapeDtypeStruct((batch,), pipeline.dtype)
    return DenoiserCall((hidden, context, pooled, timestep))


def load_controlnet(value: str, cache_dir: str, pipeline: Any, activations: Any, weights: Any) -> Any:
    """:attr:`~sdjax_runner.engine.family.Family.load_controlnet`: an SD 3 ControlNet for the model's transformer
    (families/sd3/models/controlnet.py), computing with the run's attention as the transformer does."""
    from sdjax_runner.families.sd3.models import controlnet

    loaded = controlnet.load(value, cache_dir, pipeline.transformer, activations, weights)
    return dataclasses.replace(loaded, for_attention=lambda attention: loaded.module.clone(
        attention_implementation=ATTENTION[attention]))
