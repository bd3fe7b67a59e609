"""How the engine runs each model family (config/families.py names them), one :class:`Family` entry each:
what it checks once a model is loaded, how it reads prompts, the stages of its program -- encode, prepare
(its modes), denoise (its samplers), decode; engine/program.py assembles them -- and what the engine
measures of it (the configs a compiled program depends on, the FLOPs of one denoiser call).

A new family (SD 3.5) is its loader in models/ (``loaders.LOADERS``), its stage modules here and one
entry in :data:`FAMILIES`: the runner and the engine take everything family-specific from the entry
(docs/architecture.md, "Where a new model family goes")."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any, Optional

from sdjax_runner.config import checks, families, modes
from sdjax_runner.engine import efficiency
from sdjax_runner.engine.decode import decode
from sdjax_runner.engine.encode import Conditioning, encode, negative_text, with_time_ids
from sdjax_runner.engine.flux import family as flux
from sdjax_runner.engine.flux import samplers as flux_samplers
from sdjax_runner.engine.flux import stages as flux_stages
from sdjax_runner.engine.modes import MODES
from sdjax_runner.engine.samplers import SAMPLERS
from sdjax_runner.engine.sd3 import family as sd3
from sdjax_runner.engine.sd3 import stages as sd3_stages
from sdjax_runner.engine.tokens import PromptTokens
from sdjax_runner.models.checkpoints import config_dict
from sdjax_runner.models.loading import LoadedModel
from sdjax_runner.models.sd.loading import with_scheduler


@dataclass(frozen=True)
class Family:
    """One model family as the engine runs it."""

    name: str  # as in config/families.py
    # (plan, loaded model) -> None: what only the loaded model tells, beyond the family's modes (which the engine
    # checks for every family): the UNet's channels fit the mode, prompts.clip_skip ...
    check_loaded: Callable[[Any, LoadedModel], None]
    # (loaded, scheduler config, prediction type, attention) -> (pipeline sharing its modules, scheduler state)
    with_scheduler: Callable[..., tuple[Any, Any]]
    tokens: Callable[[Any, Any], Any]  # (pipeline, plan) -> its prompts' token reader (engine/tokens.py's interface)
    # (prompts.negative, pipeline, chunks) -> the negative prompt encoded for every image, or None (engine/encode.py)
    negative: Callable[[Optional[str], Any, int], Optional[str]]
    # Stage 1: (pipeline, params, ids, negative ids, spec, inputs) -> the conditioning
    encode: Callable[..., Conditioning]
    modes: Mapping[str, Callable]  # stage 2 per mode (engine/modes): -> modes.start.Start
    samplers: Mapping[str, Callable]  # stage 3 per sampler (engine/samplers): -> the final latents
    decode: Callable[[Any, dict, Any], Any]  # stage 4: (pipeline, params, latents) -> pixels in [0, 1]
    structure: Callable[[Any], list]  # the pipeline's configs its compiled programs depend on
    # (pipeline, host weights, images per device, height, width, tokens) -> FLOPs of one guided denoiser call
    step_flops: Callable[..., Any]
    # (pipeline) -> how it reads sampling.guidance_scale: "cfg" (classifier-free guidance), "distilled" (embedded
    # in the denoiser: FLUX.1 [dev]) or "none" ([schnell]); the records say it so (record/rundir.py)
    guidance: Callable[[Any], str] = lambda pipeline: "cfg"
    # (pipeline, the weights' PartitionSpecs) -> (the pipeline set to gather some of its split weights itself,
    # (component, top-level key) -> whether it does) -- parallelism.params=sharded (engine/sharded.py); the
    # default gathers nothing itself: every component is gathered whole as the program starts
    split_weights: Callable[[Any, Any], tuple[Any, Callable[[str, str], bool]]] = \
        lambda pipeline, specs: (pipeline, lambda component, key: False)
    # (pipeline) -> its scheduler's shift where the records name it (SD 3: Forge's "Shift"), else None
    shift: Callable[[Any], Optional[float]] = lambda pipeline: None
    # (plan) -> whether the SD samplers' classifier-free guidance runs (Spec.cfg): the SD family's only with a
    # guidance scale over 1 (A1111's and diffusers' rule: the conditional half alone otherwise); the flow families
    # guide inside their own samplers, and their programs take the flag as set
    runs_cfg: Callable[[Any], bool] = lambda plan: True
    # (conditioning, height, width) -> the conditioning for images of that size (Hires. fix's second pass, engine/
    # hires.py: SDXL's size conditioning); the default: the same
    at_size: Callable[[Conditioning, int, int], Conditioning] = lambda conditioning, height, width: conditioning


def sd_check_loaded(plan: Any, loaded: LoadedModel) -> None:
    pipeline = loaded.pipeline
    modes.fits_model(plan.generation, pipeline.unet.config.in_channels, plan.model.name)
    checks.clip_skip(plan.clip_skip, pipeline.text_encoder.config.num_hidden_layers,
                     hasattr(pipeline, "text_encoder_2"), plan.model.name)


def sd_tokens(pipeline: Any, plan: Any) -> PromptTokens:
    """The prompts' tokens, with prompts.embeddings' names matched (models/embeddings.py)."""
    from sdjax_runner.models import embeddings

    return PromptTokens(pipeline, plan.syntax, embeddings.load(plan.embeddings, pipeline) if plan.embeddings else None)


def sd_encode(pipeline: Any, params: dict, ids, negative_ids, spec: Any, inputs: dict) -> Conditioning:
    """CLIP encoder(s) (engine/encode.py); SDXL's size conditioning added."""
    conditioning = encode(pipeline, params, ids, negative_ids, spec.clip_skip, spec.prompt_chunks,
                          inputs.get("prompt_weights"), inputs.get("negative_weights"))
    return with_time_ids(conditioning, spec.height, spec.width, conditioning.context.dtype)  # SDXL only


def sd_structure(pipeline: Any) -> list:
    return [type(pipeline).__name__, str(pipeline.dtype), type(pipeline.scheduler).__name__,
            config_dict(pipeline.scheduler), config_dict(pipeline.unet), config_dict(pipeline.vae),
            str(pipeline.vae.dtype),  # float32 where an fp16 run upcasts the VAE (loading.component_dtype)
            config_dict(getattr(pipeline, "text_encoder", None)),
            config_dict(getattr(pipeline, "text_encoder_2", None))]


FAMILIES: dict[str, Family] = {
    "sd": Family("sd", check_loaded=sd_check_loaded, with_scheduler=with_scheduler, tokens=sd_tokens,
                 negative=negative_text, encode=sd_encode, modes=MODES, samplers=SAMPLERS, decode=decode,
                 structure=sd_structure, step_flops=efficiency.unet_step_flops,
                 runs_cfg=lambda plan: plan.guidance_scale > 1,
                 at_size=lambda conditioning, height, width: with_time_ids(conditioning, height, width,
                                                                           conditioning.context.dtype)),
    # FLUX.1 (engine/flux/): guidance-distilled, no negative prompt; text to image with the flow-matching Euler.
    "flux": Family("flux", check_loaded=flux.check_loaded, with_scheduler=flux.with_scheduler,
                   tokens=flux.FluxTokens, negative=flux.negative, encode=flux_stages.encode,
                   modes={"txt2img": flux_stages.txt2img}, samplers=flux_samplers.SAMPLERS,
                   decode=flux_stages.decode, structure=flux.structure, step_flops=flux.step_flops,
                   guidance=flux.guidance, split_weights=flux.split_weights),
    # SD 3 / 3.5 (engine/sd3/): classifier-free guidance with a negative prompt; text to image with the
    # flow-matching Euler and FLUX.1's flow k samplers on SD 3's velocity.
    "sd3": Family("sd3", check_loaded=sd3.check_loaded, with_scheduler=sd3.with_scheduler, tokens=sd3.SD3Tokens,
                  negative=sd3.negative, encode=sd3_stages.encode, modes={"txt2img": sd3_stages.txt2img},
                  samplers={name: flux_samplers.k_sampler(name, sd3_stages) for name in flux_samplers.SAMPLERS},
                  decode=sd3_stages.decode, structure=sd3.structure, step_flops=sd3.step_flops,
                  split_weights=sd3.split_weights, shift=lambda pipeline: float(pipeline.scheduler_config["shift"])),
}
if tuple(FAMILIES) != tuple(families.FAMILIES):
    raise RuntimeError(f"engine/families runs {tuple(FAMILIES)}, config/families.py lists {tuple(families.FAMILIES)}")
