"""The generation programs, assembled from stages, one interface each:

    encode (prompt ids -> conditioning) -> prepare (key -> initial latents: the mode)
        -> denoise (latents -> latents: the sampler, with classifier-free guidance) | decode (latents -> pixels)

:func:`generate` (the sampling program: every stage but the last) and :func:`decode` (the decoding program) are one
device's share of a batch; the parallel modes (:mod:`.parallel`) pmap them or run them under ``shard_map``, the
decoding program on the sampling program's latents. Two programs, because the decoder is the same for every sampler,
step count, guider, cache, mode or prompt length of a model at one size: compiled (or loaded) once for all of them,
it is a third to two fifths less of what each new sampling program costs to trace and compile (on the tiny models).
Everything in :class:`Spec` is static (it shapes the traced program); the prompt
ids, params, keys, the guidance scale, the refiner's switch and the mode's inputs (images, start step,
conditioning scale) are traced inputs, so new prompts, seeds, guidance, switches, strengths or images never
recompile. Each stage comes from
the model's family (:data:`.families.FAMILIES`): its encoder, its modes (:data:`.modes.MODES`), its
samplers (:data:`.samplers.SAMPLERS`) and its decoder; adding a mode, a sampler or a family is new modules
and a registry entry.

For the text-to-image mode with diffusers' schedulers the stages do exactly what diffusers 0.39's
``FlaxStableDiffusionPipeline._generate`` and ``FlaxStableDiffusionXLPipeline._generate`` do, op for op,
so the images are the guide's (``tests/test_guide_parity.py``).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Optional

from sdjax_runner.config.caches import CACHES as CACHE_ENTRIES
from sdjax_runner.config.caches import DEFAULT as CACHE_DEFAULT
from sdjax_runner.config.guiders import GUIDERS as GUIDER_ENTRIES
from sdjax_runner.engine.caches import CACHE_INPUT
from sdjax_runner.engine.families import FAMILIES
from sdjax_runner.engine.guiders import GUIDER_INPUT, Guidance
from sdjax_runner.engine.hires import HiresPass, second_pass
from sdjax_runner.engine.refiner import RefinerPass, refiner_pass, with_refiner
from sdjax_runner.engine.samplers.unet import conditional_only
from sdjax_runner.engine.tokens import TOKENS


@dataclass(frozen=True)
class Spec:
    """Everything static that shapes the compiled program, besides the model's structure and the devices.
    Both program caches key on the whole of it -- the reuse cache across a sweep's jobs
    (:mod:`.reuse`) and the stored executables across processes (:mod:`.executable_cache`) -- so a field
    a new stage adds here keys both. Traced inputs (prompts, seeds, guidance, LoRA scales) are not in it."""

    steps: int
    height: int
    width: int
    batch: int  # images per device
    negative: bool  # negative prompt ids are an input (else the pipeline's own unconditional input)
    parallel: str  # "pmap" or "sharded" (engine/parallel.py)
    attention: str  # performance.attention (models/nn/attention.py)
    scheduler: str  # scheduler.name; its config_overrides and the prediction type below
    scheduler_overrides: tuple = ()
    prediction_type: Optional[str] = None
    mode: str = "txt2img"  # engine/modes
    references: int = 0  # reference_images read (FLUX.2's edit and inpaint): each adds its tokens to every call
    sampler: str = "scheduler"  # engine/samplers: a k-diffusion sampler, or "scheduler" (diffusers')
    sigmas: Optional[str] = None  # a k sampler's sigma schedule (engine/samplers/sigmas.py)
    eta: Optional[float] = None  # sampling.eta (None: the sampler's default)
    controlnet: str = ""  # the ControlNet's structure (its config), in controlnet mode
    clip_skip: int = 1  # prompts.clip_skip (engine/encode.py)
    prompt_chunks: int = 0  # prompts.syntax: 0 plain (the guide's 77 tokens), else A1111's chunks (engine/tokens.py)
    family: str = "sd"  # the model's family (engine/families.py): the program's stages
    text_tokens: int = 0  # FLUX.1: T5's sequence length (prompts.max_sequence_length); 0 for SD
    params: str = "replicated"  # parallelism.params: weights whole on every device, or split (engine/sharded.py)
    true_cfg: bool = False  # FLUX.1: true classifier-free guidance runs (two denoiser calls a step; its scale is traced)
    cfg_rescale: bool = False  # SD: CFG rescale runs (its value is a traced input, "guidance_rescale")
    guider: str = "cfg"  # guider=NAME (engine/guiders.py); its settings are traced inputs ("guider_" + the setting)
    guider_window: Optional[tuple[float, float]] = None  # guider.start/stop: where it guides (None: every step)
    # a perturbing guider's (pag's, seg's) guider.layers: its extra denoiser call; skip_layer's: the blocks its extra
    # call (on its window's steps) skips
    guider_layers: tuple[str, ...] = ()
    cache: str = "none"  # cache=NAME (config/caches.py); its settings are traced inputs ("cache_" + the setting)
    cache_shape: tuple = ()  # ... but those that shape the program ((key, value), the entry's ``shapes``)
    quantize: str = "none"  # quantize=NAME (config/quantizers.py): the denoiser's module and weights quantized
    embeddings: tuple = ()  # SD: the textual-inversion tables' shapes (their vectors are inputs, params["embeddings"])
    # SD: classifier-free guidance runs (guidance over 1); at 1 or less the UNet sees the conditional half alone, as
    # diffusers' PyTorch pipelines do (do_classifier_free_guidance): SDXL Turbo's guidance 0 is the prompt's image
    cfg: bool = True
    hires: Optional[HiresPass] = None  # A1111's Hires. fix: the second pass, upscaled (engine/hires.py)
    refiner: Optional[RefinerPass] = None  # SDXL's refiner: its switch and structure (engine/refiner.py)

    @property
    def calls_per_step(self) -> float:
        """Denoiser batches a step runs on a device's images relative to what the family's step_flops counts: two
        with FLUX.1's true CFG; a half for the SD family without classifier-free guidance (its step FLOPs count the
        guided, doubled batch); else one -- and a half more with a perturbing guider's call on the conditional
        input (PAG: counted as a whole call, though its perturbed layers skip their attention's QK and softmax)."""
        if self.true_cfg:
            return 2
        return (1 if self.cfg else 0.5) + (0.5 if GUIDER_ENTRIES[self.guider].perturbs else 0)

    @property
    def prompt_tokens(self) -> int:
        """How many tokens of conditioning the denoiser reads: 77, or 77 per chunk with A1111's syntax; FLUX.1's
        T5 length."""
        return self.text_tokens or TOKENS * max(1, self.prompt_chunks)


def program_spec(plan: Any, pipeline: Any, height: int, width: int, family: str, controlnet: str = "",
                 tokens: Optional[Any] = None, refiner: str = "") -> Spec:
    """The one place the Plan's program-relevant fields are read (``plan``: config/plan.Plan);
    ``controlnet``: the loaded ControlNet's structure; ``tokens``: reads the prompts' chunk count (and keeps
    what it read, for the generator); ``family``: the loaded model's; ``refiner``: the loaded refiner's
    structure."""
    prediction = plan.model.prediction_type
    stepping = plan.sampling.sampler == "scheduler"  # else the diffusers scheduler steps nothing: not in the key
    tokens = tokens or FAMILIES[family].tokens(pipeline, plan)
    chunks = tokens.chunk_count(plan.prompts + (plan.negative or "",))
    cfg = FAMILIES[family].runs_cfg(plan)
    return Spec(steps=plan.num_inference_steps, height=height, width=width, batch=plan.per_device_batch_size,
                negative=FAMILIES[family].negative(plan.negative, pipeline, chunks) is not None, parallel=plan.mode,
                attention=plan.attention, scheduler=plan.scheduler.name if stepping else "",
                # (a k sampler's are the training schedule's alone: zero terminal SNR, config/plan.py)
                scheduler_overrides=tuple(sorted((str(k), repr(v)) for k, v in plan.scheduler.config_overrides.items())),
                prediction_type=getattr(prediction, "name", prediction),
                sampler=plan.sampling.sampler, sigmas=plan.sampling.sigmas, eta=plan.sampling.eta,
                mode=plan.generation, references=len(plan.inputs.references), controlnet=controlnet,
                clip_skip=plan.clip_skip, prompt_chunks=chunks,
                family=family, text_tokens=plan.max_sequence_length, params=plan.params_placement,
                true_cfg=plan.true_cfg_scale is not None, cfg_rescale=plan.guidance_rescale is not None,
                guider=plan.guider.name, guider_window=plan.guider.window, guider_layers=plan.guider.layers,
                cache=plan.cache.name, cache_shape=plan.cache.shaping, quantize=plan.quantize,
                embeddings=tokens.embeddings.shapes if getattr(tokens, "embeddings", None) else (),
                cfg=cfg, hires=hires_pass(plan.hires, height, width, cfg),
                refiner=refiner_pass(plan.refiner, refiner))


def hires_pass(hires: Any, height: int, width: int, cfg: bool) -> Optional[HiresPass]:
    """The plan's second pass (config/hires.Hires, or None) for a first pass of ``height`` x ``width`` whose
    classifier-free guidance runs where ``cfg`` (its own guidance scale decides its own)."""
    if hires is None:
        return None
    upscaled = hires.size(height, width)
    sampling = hires.sampling
    return HiresPass(upscaled[0], upscaled[1], hires.schedule, hires.start, hires.upscaler,
                     sampler=sampling.sampler if sampling else "", sigmas=sampling.sigmas if sampling else None,
                     guided=hires.guidance is not None, cfg=cfg if hires.guidance is None else hires.guidance > 1)


def generate(pipeline: Any, spec: Spec, ids, params: dict, key, guidance, inputs: dict,
             negative_ids: Optional[Any] = None):
    """One device's final latents, what :func:`decode` makes its images of -- with a step cache (``spec.cache``),
    ``(latents, (1,) int32 denoiser calls the cache skipped)``. ``ids``: its prompts' token ids
    ((batch, 77), SDXL (batch, 2, 77); A1111's syntax: ``spec.prompt_chunks * 77`` tokens, engine/tokens.py);
    ``key``: its PRNG key (the mode's initial noise; a sampler's own noise comes from a key folded from
    it); ``inputs``: the mode's traced inputs (engine/modes: init images, masks, control images, the start
    step, the conditioning scale; empty for text to image), with A1111's syntax the prompts' token
    weights (``prompt_weights``, ``negative_weights``), with SDXL's refiner its cutoff timestep
    (``refiner_cutoff``); ``negative_ids``: like ``ids``, or None for the
    pipeline's own unconditional input."""
    family = FAMILIES[spec.family]
    second_scale = inputs["hires_guidance"] if spec.hires and spec.hires.guided else guidance
    guidance, second_guidance = (guiding(spec, scale, inputs) for scale in (guidance, second_scale))
    second_guidance = dataclasses.replace(second_guidance, cache=None)  # the cache runs in the first pass
    conditioning = family.encode(pipeline, params, ids, negative_ids, spec, inputs)
    start = family.modes[spec.mode](pipeline, params, key, spec, ids.shape[0], inputs)
    if start.conditioning:
        conditioning = conditioning._replace(**start.conditioning)
    upscaled = family.at_size(conditioning, spec.hires.height, spec.hires.width) if spec.hires else conditioning
    if spec.refiner:  # SDXL's refiner: its own conditioning, run past its cutoff (with Hires. fix: the second pass's)
        conditioning, upscaled = with_refiner(pipeline, params, ids, negative_ids, spec, inputs, conditioning, upscaled)
    if not spec.cfg:  # the SD samplers then run the UNet on the conditional half alone (engine/samplers/unet.py)
        conditioning = conditional_only(conditioning)
    if spec.hires and not spec.hires.cfg:  # the second pass likewise, by its own guidance
        upscaled = conditional_only(upscaled)
    latents = family.samplers[spec.sampler](pipeline, params, conditioning, start, guidance, spec, key)
    if spec.cache != CACHE_DEFAULT:  # the sampler says how many denoiser calls its cache skipped
        latents, skipped = latents
    if spec.hires:
        latents = second_pass(family, pipeline, params, upscaled, latents, second_guidance, spec, key)
    if spec.cache != CACHE_DEFAULT:  # (latents, this device's skipped calls with a leading axis: sharded's concat)
        import jax.numpy as jnp

        return latents, jnp.reshape(skipped, (1,))
    return latents


def decode(pipeline: Any, family: str, params: dict, latents):
    """One device's images, (batch, height, width, 3) floats in [0, 1], from :func:`generate`'s latents: the
    family's decoder on ``params["vae"]`` (``params``: the decoding program's, the VAE's weights alone)."""
    return FAMILIES[family].decode(pipeline, params, latents)


def guiding(spec: Spec, scale, inputs: dict) -> Guidance:
    """The guidance the samplers apply at ``scale``: the run's guider with its settings and CFG rescale, traced
    inputs all (engine/generate.py places them)."""
    entry = GUIDER_ENTRIES[spec.guider]
    settings = {key: inputs[GUIDER_INPUT + key] for key in entry.reads}
    stepping = CACHE_ENTRIES[spec.cache]
    cache = ({key: inputs[CACHE_INPUT + key] for key in stepping.reads if key not in stepping.shapes}
             if spec.cache != CACHE_DEFAULT else None)
    return Guidance(scale, spec.guider, inputs["guidance_rescale"] if spec.cfg_rescale else None, settings,
                    inputs["true_cfg_scale"] if spec.true_cfg else None, spec.guider_window, cache,
                    perturbed=spec.guider_layers if entry.perturbs else None,
                    skipped=tuple(int(block) for block in spec.guider_layers) if entry.skips else None)
