"""A run's records as typed data, written and read here only: images.json's image records (:class:`ImageRecord`),
timings.json (:class:`RunTimings`) and quality.json (:class:`Quality`).

Each field is the JSON key of the same name; ``to_json`` gives the object written to disk (the keys and values
runs have always written) and ``from_json`` reads any run's file back, old or new: a key a record lacks is
None, a key this version does not know is kept in ``extra`` and written back, and a record read from a file
writes exactly the keys that file held (a null there stays a null; a key it lacked stays absent) plus any
field set since. A record made here writes the fields that have a value, and those of ``ALWAYS`` even when
they are None (null on disk: a figure that could not be measured). Values are kept as read: a damaged or
crafted file's readers check the values they use, as they did when records were plain dicts.

A bottom module (docs/architecture.md): metrics/, record/ and the engine may all use it; it imports nothing of
the package.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar, Optional, Self


@dataclass(kw_only=True)
class _Record:
    """What the three records share: ``extra`` (the keys this version does not know, kept as read) and the
    keys of the file a record was read from (None: made here)."""

    # Fields written even when None (null on disk) by a record made here; the others are left out when None.
    ALWAYS: ClassVar[frozenset[str]] = frozenset()

    extra: dict[str, Any] = field(default_factory=dict)
    read_keys: Optional[frozenset[str]] = field(default=None, compare=False, repr=False)

    @classmethod
    def json_keys(cls) -> tuple[str, ...]:
        """The JSON keys this version knows, in the order a record made here writes them."""
        return _json_keys(cls)

    @classmethod
    def _known(cls) -> frozenset[str]:
        return frozenset(_json_keys(cls))

    def to_json(self) -> dict[str, Any]:
        """The JSON object written to disk: the fields that have a value (see the module's docstring for
        those written as null), then ``extra``."""
        written = self.ALWAYS if self.read_keys is None else self.read_keys
        out = {key: getattr(self, key) for key in self.json_keys()
               if getattr(self, key) is not None or key in written}
        out.update(self.extra)
        return out

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> Self:
        """A record read from its JSON object, of this version or an older one (see the module's docstring)."""
        known: dict[str, Any] = {}
        extra: dict[str, Any] = {}
        names = cls._known()
        for key, value in data.items():
            (known if key in names else extra)[key] = value
        return cls(**known, extra=extra, read_keys=frozenset(data))

    def updated(self, other: Self) -> Self:
        """This record with ``other``'s keys written over it (what ``dict(self, **other)`` was)."""
        return type(self).from_json({**self.to_json(), **other.to_json()})


_BOOKKEEPING = frozenset(f.name for f in dataclasses.fields(_Record))


def _json_keys(cls: type) -> tuple[str, ...]:
    """A record class's JSON keys: its fields but the bookkeeping ones, in order."""
    return tuple(f.name for f in dataclasses.fields(cls) if f.name not in _BOOKKEEPING)


def required[T](value: Optional[T], key: str) -> T:
    """``value``, a field a reader cannot do without; KeyError naming ``key`` where the record (an older or
    damaged file) lacks it -- what reading the plain dict's key raised."""
    if value is None:
        raise KeyError(key)
    return value


@dataclass(kw_only=True)
class ImageRecord(_Record):
    """One image of a run: an entry of images.json, and (but for the quality fields, added after the image
    is written) its PNG's text chunks. Optional fields are written only where they apply."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset({"negative_prompt"})

    # What every image of the run shares (record/rundir.py: image_meta).
    negative_prompt: Optional[str] = None  # the negative prompt; null: none
    seed: Optional[int] = None  # the run's seed
    steps: Optional[int] = None  # sampling.num_inference_steps
    guidance_scale: Optional[float] = None  # classifier-free guidance scale (null: none ran -- FLUX.1)
    # optional: FLUX.1 [dev]'s distilled guidance, the value its transformer embeds (Forge's "Distilled CFG Scale")
    distilled_guidance: Optional[float] = None
    scheduler: Optional[str] = None  # the diffusers scheduler; with a k sampler, its sigma schedule (ComfyUI's "scheduler")
    sampler: Optional[str] = None  # what sampled, as A1111 spells it ("Euler a", "DPM++ 2M", "pndm")
    schedule_type: Optional[str] = None  # optional: A1111's "Schedule type" of a k sampler ("Karras")
    unipc_variant: Optional[str] = None  # optional: A1111's "UniPC variant" (bh2)
    eta: Optional[float] = None  # optional: the sampler's eta, where it takes one
    clip_skip: Optional[int] = None  # optional: prompts.clip_skip, where above 1
    prompt_syntax: Optional[str] = None  # optional: prompts.syntax, where not "plain" ("a1111")
    mode: Optional[str] = None  # the generation mode: txt2img, img2img, inpaint, controlnet, edit, control
    strength: Optional[float] = None  # optional: img2img / inpaint denoising strength, 0-1
    controlnet: Optional[str] = None  # optional: controlnet.model
    conditioning_scale: Optional[float] = None  # optional, with controlnet: controlnet.conditioning_scale
    control_mode: Optional[int] = None  # optional, with a union ControlNet: controlnet.control_mode
    # optional, with controlnet where it steers part of the steps: controlnet.guidance_start, guidance_end
    control_guidance_start: Optional[float] = None
    control_guidance_end: Optional[float] = None
    model: Optional[str] = None  # model.name
    family: Optional[str] = None  # optional: the model family where it is not Stable Diffusion ("flux")
    model_path: Optional[str] = None  # the model directory or hub id it loaded from
    dtype: Optional[str] = None  # the weights' dtype ("float32", "bfloat16", "float16")
    height: Optional[int] = None  # pixels
    width: Optional[int] = None  # pixels
    lora: Optional[str] = None  # optional: the adapters, "style.safetensors:0.8:sha256=ab12cd34ef56; ..."
    checkpoint: Optional[str] = None  # optional: model.checkpoint, "model.safetensors:sha256=ab12cd34ef56"
    vae: Optional[str] = None  # optional: model.vae, "vae-ft-mse.safetensors:sha256=ab12cd34ef56"
    # optional: prompts.embeddings, the run's textual-inversion embeddings, "easynegative:sha256=ab12cd34ef56; ..."
    embeddings: Optional[str] = None
    shift: Optional[float] = None  # optional, SD 3: its scheduler's shift (Forge's "Shift")
    guidance_rescale: Optional[float] = None  # optional, SD: CFG rescale (sampling.guidance_rescale; Forge's "Rescale CFG")
    # optional: the guider where it is not classifier-free guidance (guider=NAME, config/guiders.py), and the settings
    # it read ("eta=0.5 norm_threshold=15")
    guider: Optional[str] = None
    guider_settings: Optional[str] = None
    guider_layers: Optional[list] = None  # optional, pag and seg: guider.layers, the patterns of the perturbed self-attention
    # optional: the step cache where one ran (cache=NAME, config/caches.py) and its settings, "KEY=VALUE ..."
    cache: Optional[str] = None
    cache_settings: Optional[str] = None
    quantize: Optional[str] = None  # optional: the denoiser's weights quantized (quantize=NAME, config/quantizers.py)
    # optional, A1111's Hires. fix (sampling.hires.*): its scale, the steps the second pass ran, its upscaler (A1111's
    # name) and denoising strength, and the first pass's size (A1111's "Size"; height and width are the image's)
    hires_scale: Optional[float] = None
    hires_steps: Optional[int] = None
    hires_upscaler: Optional[str] = None
    hires_strength: Optional[float] = None
    first_pass_height: Optional[int] = None
    first_pass_width: Optional[int] = None
    # optional: its own sampler (A1111's "Hires sampler", "Hires schedule type") and guidance ("Hires CFG Scale")
    hires_sampler: Optional[str] = None
    hires_schedule_type: Optional[str] = None
    hires_guidance_scale: Optional[float] = None
    # optional: SDXL's refiner (model.refiner), "sd_xl_refiner_1.0:sha256=ab12cd34ef56" (its UNet's and text encoder
    # 2's weights, hashed: config/refiner.py), and where it took over (sampling.refiner_switch; A1111's "Refiner
    # switch at")
    refiner: Optional[str] = None
    refiner_switch: Optional[float] = None
    # This image's own (record/rundir.py: write_images).
    index: Optional[int] = None  # its position in the run (batch-major, then device, then slot)
    batch: Optional[int] = None  # the batch it was made in
    device: Optional[int] = None  # the device that made it, within its batch
    prompt: Optional[str] = None  # its prompt, as given
    init_image: Optional[str] = None  # optional: the init image's file name (img2img, inpaint)
    mask_image: Optional[str] = None  # optional: the mask's file name (inpaint)
    control_image: Optional[str] = None  # optional: the control image's file name (controlnet, control)
    # optional: more reference images' file names, in order, comma-separated (reference_images: FLUX.2's edit, inpaint)
    reference_images: Optional[str] = None
    file: Optional[str] = None  # the PNG, relative to the run directory ("images/0000_seed0.png")
    pixels_sha256: Optional[str] = None  # SHA-256 of its H x W x 3 uint8 pixels (what a re-run compares)
    non_finite: Optional[bool] = None  # whether the pipeline's output had NaN or infinite pixels (written as 0)
    # Its quality (metrics/evaluate.py), after it is written: optional, where measured.
    clip_score: Optional[float] = None  # CLIP score against its prompt (100 x cosine similarity, at least 0)
    pick_score: Optional[float] = None  # PickScore for its prompt (exp(logit_scale) x cosine similarity)
    aesthetic: Optional[float] = None  # the LAION aesthetic predictor's score (AVA's 1-10 scale)
    psnr: Optional[float] = None  # dB against the reference's image of the same slot; Infinity: identical
    ssim: Optional[float] = None  # SSIM against that image, at most 1

    # PNG text chunks that are numbers or booleans (every chunk is text; "" is None for the numbers).
    INT_CHUNKS: ClassVar[tuple[str, ...]] = ("index", "batch", "device", "seed", "steps", "height", "width",
                                            "clip_skip", "hires_steps", "first_pass_height", "first_pass_width",
                                            "control_mode")
    FLOAT_CHUNKS: ClassVar[tuple[str, ...]] = ("guidance_scale", "distilled_guidance", "eta", "strength",
                                              "conditioning_scale", "control_guidance_start",
                                              "control_guidance_end", "shift",
                                              "guidance_rescale", "hires_scale", "hires_strength",
                                              "hires_guidance_scale", "refiner_switch",
                                              # the metrics' per-image values (metrics/registry.py)
                                              "clip_score", "pick_score", "aesthetic", "psnr", "ssim")
    BOOL_CHUNKS: ClassVar[tuple[str, ...]] = ("non_finite",)

    @classmethod
    def from_text(cls, chunks: Mapping[str, str]) -> ImageRecord:
        """The record read back from its PNG's text chunks (what record/rundir.py's save_png wrote, less the
        A1111 ``parameters`` chunk): numbers and booleans read from their text, an empty negative prompt None.
        ValueError where a number's chunk is not one."""
        record: dict[str, Any] = {}
        for key, value in chunks.items():
            if key in cls.INT_CHUNKS:
                record[key] = int(value)
            elif key in cls.FLOAT_CHUNKS:
                record[key] = float(value)
            elif key in cls.BOOL_CHUNKS:
                record[key] = value == "True"
            else:
                record[key] = value if value != "" or key != "negative_prompt" else None
        return cls.from_json(record)


@dataclass(kw_only=True)
class RunTimings(_Record):
    """timings.json: compile and steady-state timings (seconds), layout and device facts, the reuse facts of a
    sweep's process and the efficiency figures (docs/reference/outputs.md#timing). A complete run writes every
    field but the last two and a step cache's counts (written where a cache ran), null where a figure could not be
    measured; a run stopped early writes the timings it got to, ``batches_done`` and ``partial``."""

    ALWAYS: ClassVar[frozenset[str]] = frozenset()  # set below: every field of a complete run

    # The steady state (engine/generate.py: Timings.summary).
    first_batch_s: Optional[float] = None  # s: the first execution (no compilation; one-time costs)
    generate_s: Optional[float] = None  # s per batch: median of the steady-state calls, else the first call's
    generate_s_min: Optional[float] = None  # s: the fastest of those calls
    generate_s_max: Optional[float] = None  # s: the slowest
    steady_calls: Optional[int] = None  # how many timed calls generate_s rests on (0: the first call's alone)
    generate_s_from: Optional[str] = None  # "steady_median" or "first_call"
    timing_base_s: Optional[float] = None  # s: the job's cost before its timing re-runs
    timing_extra_calls: Optional[int] = None  # re-runs of batch 0 made for timing only
    timing_extra_s: Optional[float] = None  # s: those re-runs
    images_per_s: Optional[float] = None  # images per second at generate_s
    s_per_step: Optional[float] = None  # s per sampling step at generate_s (Hires. fix: both passes' steps)
    # The program (engine/engine.py: CompileFacts).
    trace_s: Optional[float] = None  # s: tracing and lowering (0 when reused or loaded)
    compile_s: Optional[float] = None  # s: XLA compilation, or loading a stored executable
    compile_path: Optional[str] = None  # "traced", "executable_cache" or "reused"
    executable_cache_hit: Optional[int] = None  # 1: a stored executable was loaded (else 0)
    # Efficiency at generate_s (engine/efficiency.py): null where not measurable.
    flops_per_batch: Optional[float] = None  # FLOPs of one batch, as XLA counts them
    tflops_per_s: Optional[float] = None  # TFLOP/s achieved
    mfu: Optional[float] = None  # model FLOPs utilisation, 0-1 (null without a known peak)
    peak_tflops_per_device: Optional[float] = None  # the peak it is measured against, TFLOP/s per device
    device_memory_peak_bytes: Optional[int] = None  # bytes: the devices' peak memory (null on a CPU)
    program_memory_bytes: Optional[int] = None  # bytes: the compiled program's memory, as XLA states it
    host_peak_rss_bytes: Optional[int] = None  # bytes: the process's peak resident memory
    # A step cache (cache=NAME, config/caches.py; written only where one ran): the denoiser calls the batches made, one
    # per step on each device, and those whose blocks the cache skipped (all but the first for first_block). The
    # FLOPs, TFLOP/s and MFU above count what ran: a skipped call's skipped blocks left out (Engine.efficiency).
    denoiser_calls: Optional[int] = None
    denoiser_calls_skipped: Optional[int] = None
    # The job (runner.py).
    load_s: Optional[float] = None  # s: loading the model (0 when reused)
    replicate_s: Optional[float] = None  # s: placing the weights on the devices
    write_s: Optional[float] = None  # s: writing images, images.json and the grid
    model_reused: Optional[int] = None  # 1: the model came from an earlier job of this process (else 0)
    compile_reused: Optional[int] = None  # 1: the program came from an earlier job of this process (else 0)
    compile_cache_hit: Optional[int] = None  # 1: JAX's persistent compilation cache served the program (else 0)
    process_model_loads: Optional[int] = None  # models this process has loaded so far
    process_compiles: Optional[int] = None  # programs this process has compiled so far
    process_models_held: Optional[int] = None  # models this process holds now
    device_kind: Optional[str] = None  # JAX's device kind ("cpu", "NVIDIA H100 80GB HBM3", ...)
    backend: Optional[str] = None  # JAX's backend ("cpu", "gpu", "tpu")
    process_count: Optional[int] = None  # processes of the run (multi-host: more than 1)
    # Where it ran: a sweep worker's name ("ray worker 2", "array task 0"; null: the command's own process), the
    # host, the process id and the devices JAX gave it ("cpu 0-3", with CUDA_VISIBLE_DEVICES or TPU_VISIBLE_CHIPS
    # where set).
    worker: Optional[str] = None
    host: Optional[str] = None
    pid: Optional[int] = None
    devices: Optional[str] = None
    num_images: Optional[int] = None  # images written
    images_per_batch: Optional[int] = None  # images one batch makes (devices x per device)
    num_batches: Optional[int] = None  # batches of the run
    num_devices: Optional[int] = None  # devices the batch is spread over
    per_device_batch_size: Optional[int] = None  # images per device per batch
    param_bytes_per_device: Optional[int] = None  # bytes of one device's copy of the weights
    # of which the denoiser's (the UNet or transformer): what quantize=NAME shrinks (config/quantizers.py)
    denoiser_param_bytes_per_device: Optional[int] = None
    wall_s: Optional[float] = None  # s: the job from its start to its records written
    # A run stopped early only (record/job.py: keep_partial).
    batches_done: Optional[int] = None  # batches finished before it stopped
    partial: Optional[int] = None  # 1: these are the timings it got to


RunTimings.ALWAYS = frozenset(RunTimings.json_keys()) - {"batches_done", "partial", "denoiser_calls",
                                                         "denoiser_calls_skipped"}


@dataclass(kw_only=True)
class Quality(_Record):
    """quality.json: the run's quality (metrics/evaluate.py), each field written only where it was measured --
    and what could not be measured, and why (``*_error``)."""

    # CLIP score (metrics/clip_score.py): 100 x the cosine similarity of image and prompt, at least 0.
    clip_score_mean: Optional[float] = None  # over the run's images
    clip_score_std: Optional[float] = None  # their standard deviation
    clip_score_error: Optional[str] = None  # why there is no CLIP score (the model could not be loaded or run)
    clip_score_s: Optional[float] = None  # s: scoring, loading included
    clip_score_compile_path: Optional[str] = None  # "traced", "executable_cache" or "reused"
    clip_model: Optional[str] = None  # metrics.clip_score.model
    # PickScore (metrics/pick_score.py): exp(logit_scale) x the cosine similarity of image and prompt, on PickScore's CLIP.
    pick_score_mean: Optional[float] = None  # over the run's images
    pick_score_std: Optional[float] = None  # their standard deviation
    pick_score_error: Optional[str] = None  # why there is no PickScore (the model could not be loaded or run)
    pick_score_s: Optional[float] = None  # s: scoring, loading included
    pick_model: Optional[str] = None  # metrics.pick_score.model
    # CMMD (metrics/cmmd.py) of the run's images against metrics.cmmd.reference's folder of real images: a statistic
    # of the set (0: the same distribution; compare runs of the same image count).
    cmmd: Optional[float] = None
    cmmd_reference: Optional[str] = None  # the folder
    cmmd_reference_images: Optional[int] = None  # how many images it holds
    cmmd_model: Optional[str] = None  # the CLIP (metrics.cmmd.model, else metrics.clip_score.model)
    cmmd_error: Optional[str] = None  # why there is no CMMD
    # The LAION aesthetic predictor (metrics/aesthetic.py): the predicted mean rating on AVA's 1-10 scale.
    aesthetic_mean: Optional[float] = None  # over the run's images
    aesthetic_std: Optional[float] = None  # their standard deviation
    aesthetic_error: Optional[str] = None  # why there is no aesthetic score (the predictor or CLIP could not be had)
    aesthetic_s: Optional[float] = None  # s: scoring, loading included
    # Fidelity to a reference (metrics/fidelity.py): metrics.reference, or a sweep's reference point.
    reference: Optional[str] = None  # the reference run's directory
    reference_error: Optional[str] = None  # why nothing was compared
    compared_images: Optional[int] = None  # images whose slot (index, seed, prompt, size) the reference has
    psnr: Optional[float] = None  # dB, of the mean squared error over the compared images; Infinity: identical
    psnr_min: Optional[float] = None  # dB: the least faithful image's
    ssim_mean: Optional[float] = None  # mean SSIM, at most 1
    ssim_min: Optional[float] = None  # the least SSIM
    identical_images: Optional[int] = None  # compared images identical to their reference's
    metrics_s: Optional[float] = None  # s: all of the metrics
    non_finite_images: Optional[int] = None  # images with NaN or infinite pixels (written black)
    reference_label: Optional[str] = None  # a sweep's point compared with its reference point: that point's label
