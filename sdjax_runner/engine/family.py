"""One model family as the engine runs it (:class:`Family`): what it checks once a model is loaded, how it reads
prompts, the stages of its program -- encode, prepare (its modes), denoise (its samplers), decode;
engine/program.py assembles them -- and what the engine measures of it (the configs a compiled program depends
on, the FLOPs of one denoiser call). Each family's package makes its own (``families/<name>/engine/entry.py``'s
``FAMILY``); engine/families.py gathers them."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from sdjax_runner.engine.encode import Conditioning
from sdjax_runner.models.loading import LoadedModel


@dataclass(frozen=True)
class DenoiserCall:
    """One call of a family's denoiser, as shapes: ``getattr(pipeline, family.denoiser).apply({"params": params},
    *args, **kwargs)`` with ``params = weights[family.denoiser]`` -- what engine/efficiency.py counts the FLOPs of
    and Qwix traces to learn how each weight is multiplied (models/quantize.py)."""

    args: tuple  # jax.ShapeDtypeStructs (or pytrees of them, or None)
    kwargs: dict = field(default_factory=dict)


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
    # (pipeline, images per device, height, width, tokens, mode=..., references=...) -> one guided denoiser call on a
    # device's images in that mode (FLUX.1 Kontext's edit reads its input image's tokens too; FLUX.2's edit and
    # inpaint ``references`` more images' too), as shapes
    # (engine/efficiency.step_flops counts it; models/quantize.py traces it)
    denoiser_call: Callable[..., DenoiserCall]
    denoiser: str = "transformer"  # the denoiser's pipeline attribute and weights' key ("unet" for the SD family)
    # per step cache it runs (config/caches.py): (the cache's Spec.cache_shape, pipeline, the denoiser's weights, a
    # DenoiserCall) -> a function, called as the call is traced, giving the denoiser's keyword arguments that make a
    # call the cache skipped (what such a call still runs) -- counted for the executed FLOPs of a cached run
    # (engine/efficiency.py); :func:`around_blocks` for a transformer's
    skipped_calls: Mapping[str, Callable[..., Callable[[], dict]]] = field(default_factory=dict)
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
    # (controlnet.model, paths.cache_dir, pipeline, activations dtype, weights dtype) -> models/controlnet.
    # LoadedControlNet: its ControlNet (controlnet mode), checked against the model; None: it runs none
    load_controlnet: Optional[Callable[..., Any]] = None


def around_blocks(skipped: Mapping[str, Callable]) -> dict[str, Callable[..., Callable[[], dict]]]:
    """:attr:`Family.skipped_calls` for a transformer whose ``around_blocks`` argument (per cache: what a skipped call
    runs of its blocks) makes the call."""
    return {name: (lambda shape, pipeline, weights, call, blocks=blocks: lambda: {"around_blocks": blocks})
            for name, blocks in skipped.items()}
