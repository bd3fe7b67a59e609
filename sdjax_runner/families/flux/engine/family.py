"""What the engine needs of FLUX.1 besides its stages (:mod:`.stages`): its prompts' tokens, its checks once a
model is loaded, its pipeline for a job's settings, what its compiled programs depend on and the FLOPs of one
transformer call. engine/families.py's ``FAMILIES["flux"]`` is made of these and the stages."""

from __future__ import annotations

import dataclasses
from typing import Any, Optional

import numpy as np

from sdjax_runner.engine.family import DenoiserCall
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.engine import stages
from sdjax_runner.models.checkpoints import config_dict

# performance.attention -> the transformer's (models/nn/attention.py's attend): its default is XLA's
# jax.nn.dot_product_attention, as diffusers' PyTorch reference attends with scaled_dot_product_attention.
ATTENTION = {"default": "dot_product", "dot_product": "dot_product", "cudnn_flash": "cudnn_flash"}


class FluxTokens:
    """Prompt texts -> ids ``(batch, 77 + max_sequence_length)``: CLIP's then T5's (stages.prompt_ids). Prompts
    are read as written (config/families.py refuses A1111's syntax for FLUX.1): no chunks, no weights. Another
    family whose prompts are read as written sets its own ``prompt_ids`` (SD 3: families/sd3/engine/family.py)."""

    prompt_ids = staticmethod(stages.prompt_ids)  # (pipeline, texts, T5 length) -> ids

    def __init__(self, pipeline: Any, plan: Any):
        self.pipeline, self.length = pipeline, plan.max_sequence_length

    def chunk_count(self, texts) -> int:
        return 0

    def chunks_of(self, text: str) -> int:
        return 0

    def __call__(self, texts: list[str], count: int) -> tuple[np.ndarray, Optional[np.ndarray]]:
        return self.prompt_ids(self.pipeline, list(texts), self.length), None


@dataclasses.dataclass(frozen=True)
class Variant:
    """A FLUX.1 model whose index's pipeline class says it reads more than the noise (models/pipeline.py)."""

    flag: str  # the pipeline's property that says it is one
    title: str
    runs: tuple[str, ...]  # the modes it runs
    reads: str  # what it reads, as the line for another mode says it
    runs_allowed: str
    own_modes: tuple[str, ...] = ()  # the modes no other model runs
    index: str = ""  # its pipeline class, as the line for its mode on another model names it
    lacks: str = ""  # what another model lacks for its mode
    own_allowed: str = ""


CONTROL_MODES = ("control", "control_img2img", "control_inpaint")
VARIANTS = (
    Variant("control", "FLUX.1 Canny/Depth", CONTROL_MODES, "whose transformer reads a control image's latents beside "
            "the latents", "control (with controlnet.image), control_img2img (and init_image), control_inpaint (and "
            "init_image, mask_image)", CONTROL_MODES, "FluxControlPipeline",
            "its transformer reads no control image", "a FLUX.1 Canny/Depth model (model=flux-canny-dev, "
            "flux-depth-dev, tiny-random-flux-control), or txt2img, img2img, inpaint"),
    Variant("fill", "FLUX.1 Fill", ("inpaint",), "whose transformer reads a mask and the masked init image beside the "
            "latents", "inpaint (with init_image and mask_image)"),
    Variant("kontext", "FLUX.1 Kontext", ("txt2img", "edit"), "which edits an input image (or makes one from the "
            "prompt alone)", "edit (with init_image), txt2img", ("edit",), "FluxKontextPipeline",
            "it reads no input image beside the noise", "a Kontext model (model=flux-kontext-dev, "
            "tiny-random-flux-kontext), or txt2img, img2img, inpaint"),
)


def check_loaded(plan: Any, loaded: Any) -> None:
    """[schnell] (no guidance embedder) reads no guidance: a sampling.guidance_scale given for it is refused; each
    :data:`VARIANTS` model runs its modes alone, and its own mode runs on it alone (Fill repaints in mode=inpaint,
    Kontext edits in mode=edit, Canny/Depth read a control image in mode=control)."""
    pipeline, mode, name = loaded.pipeline, plan.generation, plan.model.name
    for variant in VARIANTS:
        if getattr(pipeline, variant.flag) and mode not in variant.runs:
            raise UserError("mode", f"{mode}: {name} is {variant.title}, {variant.reads}", variant.runs_allowed)
        if mode in variant.own_modes and not getattr(pipeline, variant.flag):
            raise UserError("mode", f"{mode}: {name} is no {variant.title} model (its index names {variant.index}): "
                            f"{variant.lacks}", variant.own_allowed)
    if not pipeline.guidance_embeds and plan.guidance_given:
        raise UserError("sampling.guidance_scale", f"{plan.guidance_scale:g}, but {plan.model.name} is FLUX.1 "
                        "[schnell] (its transformer has no guidance embedder): it reads no guidance", "null")


def guidance(pipeline: Any) -> str:
    """[dev] embeds the guidance value ("distilled"); [schnell] reads none."""
    return "distilled" if pipeline.guidance_embeds else "none"


def with_scheduler(loaded: Any, scheduler: Any, prediction_type: Any = None, attention: str = "default"):
    """The pipeline for a job: its transformer set up for ``attention``; no scheduler state (the flow schedule
    is the program's constants, families/flux/engine/stages.py)."""
    pipeline = loaded.pipeline
    transformer = pipeline.transformer.clone(attention_implementation=ATTENTION[attention])
    return dataclasses.replace(pipeline, transformer=transformer), {}


BLOCKS = ("transformer_blocks", "single_transformer_blocks")


def split_weights(pipeline: Any, specs: dict) -> tuple[Any, Any]:
    """parallelism.params=sharded: the transformer gathers each block's split weights as the block runs
    (``gather_blocks``: one block whole at a time); the rest of the weights are gathered per component."""
    from sdjax_runner.engine.split import gather_tree

    def gather_block(kind: str, block: Any) -> Any:
        return gather_tree(block, specs["transformer"][f"{kind}_0"])  # every block of a kind: the same placement

    transformer = pipeline.transformer.clone(gather_blocks=gather_block)
    return dataclasses.replace(pipeline, transformer=transformer), \
        lambda component, key: component == "transformer" and key.rsplit("_", 1)[0] in BLOCKS


def negative(negative_prompt: Optional[str], pipeline: Any, chunks: int) -> Optional[str]:
    """The negative prompt, encoded for true classifier-free guidance (config/families.py lets one through only
    with sampling.true_cfg_scale), or None."""
    return negative_prompt


def structure(pipeline: Any) -> list:
    """The configs a compiled FLUX.1 program depends on (engine/families.py: ``structure``)."""
    return ["FluxPipeline", str(pipeline.dtype), sorted(pipeline.scheduler_config.items()),
            pipeline.transformer.config, pipeline.vae.config, str(pipeline.vae.dtype),
            config_dict(pipeline.text_encoder), config_dict(pipeline.text_encoder_2)]


def transformer_call(pipeline: Any, per_device_images: int, height: int, width: int, tokens: int,
                     mode: str = "txt2img", references: int = 0) -> DenoiserCall:
    """One transformer call on a device's images (no guidance batch: FLUX.1 is distilled); ``tokens``: T5's
    sequence length; in ``mode`` edit (Kontext) the input image's tokens after the noise's."""
    import jax
    import jax.numpy as jnp

    batch, factor = per_device_images, pipeline.vae_scale_factor
    seq = stages.image_seq_len(height, width, factor) * (2 if mode == "edit" else 1)
    transformer = pipeline.transformer
    hidden = jax.ShapeDtypeStruct((batch, seq, transformer.in_channels), pipeline.dtype)
    context = jax.ShapeDtypeStruct((batch, tokens, transformer.joint_attention_dim), pipeline.dtype)
    pooled = jax.ShapeDtypeStruct((batch, transformer.pooled_projection_dim), pipeline.dtype)
    timestep = jax.ShapeDtypeStruct((batch,), pipeline.dtype)
    guidance = timestep if pipeline.guidance_embeds else None
    img_ids = jax.ShapeDtypeStruct((seq, 3), jnp.float32)
    txt_ids = jax.ShapeDtypeStruct((tokens, 3), jnp.float32)
    return DenoiserCall((hidden, context, pooled, timestep, img_ids, txt_ids), {"guidance": guidance})


def load_controlnet(value: str, cache_dir: str, pipeline: Any, activations: Any, weights: Any) -> Any:
    """:attr:`~sdjax_runner.engine.family.Family.load_controlnet`: a FLUX.1 ControlNet for the model's transformer
    (families/flux/models/controlnet.py), computing with the run's attention as the transformer does."""
    from sdjax_runner.families.flux.models import controlnet

    loaded = controlnet.load(value, cache_dir, pipeline.transformer, activations, weights)
    return dataclasses.replace(loaded, for_attention=lambda attention: loaded.module.clone(
        attention_implementation=ATTENTION[attention]))
