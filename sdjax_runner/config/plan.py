"""Config -> plan: every value checked, the run's settings typed, and its images laid out on batches and devices.

Nothing here loads a model or touches a device, so bad input fails in milliseconds. A job
reads only its :class:`Plan`. The layout follows the Diffusers JAX guide: a batch is
``num_devices x per_device_batch_size`` images; the prompt list is cycled across the image
slots of all batches in order (slot ``i`` gets prompt ``i % len(prompts)``), so eight prompts
on eight devices give one batch with one prompt per device, and one prompt is repeated on
every device.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional

from omegaconf import DictConfig, OmegaConf

from sdjax_runner.config import caches, checks, families, guiders, hires, inert, modes, quantizers, refiner, samplers
from sdjax_runner.config.caches import Cache
from sdjax_runner.config.folder_files import bounded_weights
from sdjax_runner.config.guiders import Guider
from sdjax_runner.config.hires import Hires
from sdjax_runner.config.input_images import ModeInputs, read_mode_inputs
from sdjax_runner.config.prompts import check_syntax, check_text, load_prompts, prompt_names, set_prompts
from sdjax_runner.config.refiner import Refiner
from sdjax_runner.config.samplers import Sampling
from sdjax_runner.config.schema import (
    CompilationCacheConfig,
    DtypeConfig,
    MetricsConfig,
    ModelConfig,
    OutputConfig,
    RunConfig,
    SchedulerConfig,
    TrackingConfig,
    field_types,
)
from sdjax_runner.config.weight_files import (
    VAE_KEY,
    embedding_files,
    lora_header,
    vae_files,
    vae_kind,
)
from sdjax_runner.errors import UserError
from sdjax_runner.files import file_sha256, not_a_file


class LoraEntry(NamedTuple):
    """A LoRA adapter of the run (``lora[N]``), as the plan read it."""

    path: str  # the adapter's .safetensors file, its user part expanded
    scale: float  # lora[N].scale: the factor its update is merged with
    sha256: str  # the file's content hash when the run was planned (every record of the run names it)


class CheckpointEntry(NamedTuple):
    """``model.checkpoint``: a single-file checkpoint, as the plan read it."""

    path: str  # the .safetensors file, its user part expanded
    sha256: str  # the file's content hash when the run was planned (the weights loaded must still have it)
    architecture: str  # what its tensor names say it is: "sd1", "sd2" or "sdxl" (config/weight_files.py)


class EmbeddingEntry(NamedTuple):
    """A textual-inversion embedding of ``prompts.embeddings``, as the plan read it."""

    name: str  # what a prompt calls it: the file's stem
    path: str
    sha256: str  # the file's content hash when the run was planned


class VaeEntry(NamedTuple):
    """``model.vae``: another VAE, as the plan read it."""

    path: str  # a diffusers VAE folder or a .safetensors file, its user part expanded
    sha256: str  # its weights' content hash when the run was planned (one file's, or of its shards' hashes)
    kind: str  # "folder" or "single_file" (config/weight_files.vae_kind)


@dataclass(frozen=True)
class ImageSlot:
    index: int  # position in the run (batch-major, then device, then per-device slot)
    batch: int
    device: int
    slot: int
    prompt: str
    kept: bool  # False for padding images that are generated but not written
    prompt_index: int = 0  # which prompt (and which paired input image: config/input_images.py)


@dataclass(frozen=True)
class Plan:
    # What runs: the model, its dtype, the scheduler, the attention and the parallel mode.
    model: ModelConfig
    dtype: DtypeConfig
    scheduler: SchedulerConfig  # the diffusers scheduler the model is loaded with
    sampling: Sampling  # what steps: a k sampler on its sigma schedule, or that scheduler (config/samplers.py)
    attention: str
    mode: str  # "pmap" or "sharded"
    # The images: prompts, layout on devices and batches, sampling.
    prompts: tuple[str, ...]
    negative: Optional[str]
    num_devices: int
    per_device_batch_size: int
    num_batches: int
    images: tuple[ImageSlot, ...]
    seed: int
    num_inference_steps: int
    guidance_scale: float
    height: Optional[int]  # None: the model's native size, resolved once it is loaded
    width: Optional[int]
    repeats: int
    max_extra_share: Optional[float]  # timing.max_extra_share: the bound on timing re-runs (engine/generate.py)
    # How the images are judged, where results go and what a process keeps.
    metrics: MetricsConfig
    run_name: str
    experiment: Optional[str]
    output: OutputConfig
    tracking: TrackingConfig
    output_root: str
    compilation_cache: CompilationCacheConfig
    peak_tflops_per_device: Optional[float]
    profile: bool  # one more batch under JAX's profiler (engine/profiling.py)
    max_models: int
    params: dict  # the resolved config, flattened, as the tracker logs it
    lora: tuple[LoraEntry, ...] = ()  # the adapters, in the order given
    checkpoint: Optional[CheckpointEntry] = None  # model.checkpoint, if one is given
    vae: Optional[VaeEntry] = None  # model.vae, if one is given (engine/reuse.py swaps it in)
    embeddings: tuple = ()  # prompts.embeddings: EmbeddingEntry per file (models/embeddings.py)
    # What the sampler starts from and is steered by (config/modes.py, engine/modes/).
    generation: str = "txt2img"
    strength: Optional[float] = None  # img2img / inpaint
    start_step: int = 0  # the step the sampler starts at (from strength)
    inputs: ModeInputs = field(default_factory=ModeInputs)  # the mode's images, read and checked
    resize_mode: str = "stretch"
    controlnet: Optional[str] = None  # controlnet.model
    conditioning_scale: float = 1.0  # controlnet.conditioning_scale
    control_mode: Optional[int] = None  # controlnet.control_mode (a union ControlNet's)
    control_window: tuple[float, float] = (0.0, 1.0)  # controlnet.guidance_start, guidance_end
    cache_dir: str = ""  # paths.cache_dir: where built-in models are
    clip_skip: int = 1  # prompts.clip_skip
    syntax: str = "plain"  # prompts.syntax (engine/tokens.py)
    family: str = "sd"  # the model's family, as planned (config/families.py); the engine refuses another
    max_sequence_length: int = 0  # FLUX.1: T5 tokens per prompt (prompts.max_sequence_length); 0 for SD
    guidance_given: bool = True  # sampling.guidance_scale was given (FLUX.1 [schnell] reads none: refused)
    params_placement: str = "replicated"  # parallelism.params (engine/sharded.py)
    true_cfg_scale: Optional[float] = None  # FLUX.1's true classifier-free guidance (sampling.true_cfg_scale)
    guidance_rescale: Optional[float] = None  # SD: CFG rescale (sampling.guidance_rescale)
    guider: Guider = field(default_factory=Guider)  # guider=NAME and its settings (config/guiders.py)
    cache: Cache = field(default_factory=Cache)  # cache=NAME and its settings (config/caches.py)
    quantize: str = "none"  # quantize=NAME: the denoiser's weights quantized (config/quantizers.py)
    hires: Optional[Hires] = None  # A1111's Hires. fix: the second pass (sampling.hires.*, config/hires.py)
    refiner: Optional[Refiner] = None  # SDXL's refiner (model.refiner, sampling.refiner_switch; config/refiner.py)
    prompt_names: tuple[str, ...] = ()  # the key naming each prompt in an error (config/prompts.py: prompt_names)

    @property
    def images_per_batch(self) -> int:
        return self.num_devices * self.per_device_batch_size

    def batch_prompts(self, batch: int) -> list[str]:
        start = batch * self.images_per_batch
        return [s.prompt for s in self.images[start : start + self.images_per_batch]]

    @property
    def kept_images(self) -> list[ImageSlot]:
        return [s for s in self.images if s.kept]


def flatten_params(config: RunConfig, max_chars: int = 500) -> dict[str, str]:
    """Scalar config values as ``{"sampling.num_inference_steps": "4", ...}``; lists (prompt texts)
    and values longer than ``max_chars`` are left to the config artifact."""
    out: dict[str, str] = {}

    def walk(prefix: str, node) -> None:
        if isinstance(node, dict):
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        elif not isinstance(node, list):
            text = "null" if node is None else str(node)
            if len(text) <= max_chars:
                out[prefix] = text

    # ``config`` is resolved already: a value reading "${...}" now is text (a prompt), never resolved again.
    walk("", OmegaConf.to_container(OmegaConf.structured(config), resolve=False, enum_to_str=True))
    return out


def admit(cfg: DictConfig) -> RunConfig:
    """The door: Hydra's composed config as the schema's typed dataclasses, every key one the schema
    defines (Hydra's ``+key=value`` can add one it lacks: refused here). The only read of the Hydra
    config; everything after reads what this returns, then the Plan made from it."""
    checks.known_keys(cfg, RunConfig)
    # Field by field: a sweep's job config also holds Hydra's own node, which is not the run's to read.
    values = {key: cfg[key] for key in field_types(RunConfig)}
    fields: dict[str, Any] = {key: OmegaConf.to_object(value) if OmegaConf.is_config(value) else value
                              for key, value in values.items()}
    config = RunConfig(**fields)
    checks.lists_are_lists(config)
    return families.with_defaults(config)


def lora_record(index: int, spec) -> LoraEntry:
    """(path, scale, content hash) of adapter ``index``; the hash goes into every record of the run."""
    path = Path(str(spec.path)).expanduser()
    missing = not_a_file(path)
    if missing:
        raise UserError(f"lora.{index}.path", f"{missing}: {path}", "a LoRA .safetensors file")
    lora_header(path, f"lora.{index}.path")  # (a file that is none: its header's line, whatever its size)
    bounded_weights([path], "lora", f"lora.{index}.path")
    return LoraEntry(str(path), float(spec.scale), file_sha256(path))


def lora_params(adapters: tuple[LoraEntry, ...]) -> dict[str, str]:
    """The adapters as tracker params (lists are not flattened into params otherwise)."""
    out = {}
    for index, adapter in enumerate(adapters):
        out.update({f"lora.{index}.path": adapter.path, f"lora.{index}.scale": str(adapter.scale),
                    f"lora.{index}.sha256": adapter.sha256})
    return out


def checkpoint_record(model: ModelConfig) -> Optional[CheckpointEntry]:
    """(path, content hash, architecture) of ``model.checkpoint``; a null base becomes the standard
    base of that architecture, so the record names the configs the weights ran on."""
    if not model.checkpoint:
        return None
    checkpoint = families.open_checkpoint(Path(model.checkpoint).expanduser())
    if model.pretrained_model_name_or_path is None:
        model.pretrained_model_name_or_path = checkpoint.base
    return CheckpointEntry(str(checkpoint.path), file_sha256(checkpoint.path), checkpoint.architecture)


def embedding_records(paths) -> tuple[EmbeddingEntry, ...]:
    """``prompts.embeddings``' files, each named by its stem; two files of one name are one line."""
    entries: dict[str, EmbeddingEntry] = {}
    for path in bounded_weights(embedding_files(paths), "embedding", "prompts.embeddings"):
        name = path.stem
        if name in entries:
            raise UserError("prompts.embeddings", f"two embeddings are named {name!r}: {entries[name].path} and {path}",
                            "one file per name (the file stem is what a prompt calls)")
        entries[name] = EmbeddingEntry(name, str(path), file_sha256(path))
    return tuple(entries.values())


def vae_record(model: ModelConfig) -> Optional[VaeEntry]:
    """(path, content hash, kind) of ``model.vae``, or None; A1111's "VAE hash" is the first 10 of a file's."""
    if not model.vae:
        return None
    path = Path(model.vae).expanduser()
    return VaeEntry(str(path), vae_sha256(path), vae_kind(path))


def vae_sha256(path: Path) -> str:
    """A VAE's content hash: its one weights file's, or of its shards' names and hashes."""
    import hashlib

    files = bounded_weights(vae_files(path), "vae", VAE_KEY)
    if len(files) == 1:
        return file_sha256(files[0])
    return hashlib.sha256("".join(f"{f.name}:{file_sha256(f)}\n" for f in files).encode()).hexdigest()


def checkpoint_params(model: ModelConfig, checkpoint: Optional[CheckpointEntry]) -> dict[str, str]:
    if checkpoint is None:
        return {}
    return {"model.pretrained_model_name_or_path": str(model.pretrained_model_name_or_path),
            "model.checkpoint_sha256": checkpoint.sha256, "model.checkpoint_architecture": checkpoint.architecture}


@dataclass(frozen=True)
class Checked:
    """What the checks read: the prompts, and the mode's images."""

    prompts: list[str]
    inputs: ModeInputs
    names: tuple[str, ...]  # each prompt's key in an error: prompts.texts[i], prompts.file (prompt n), prompts.set ...


def check_values(config: RunConfig) -> Checked:
    """Every check of ``config`` that needs neither devices nor a model (so the runner makes them before
    JAX and the model libraries start: bad input is refused in well under a second); the prompts and
    the mode's images, read."""
    config = families.with_defaults(config)
    checks.run_values(config)
    from_set = set_prompts(config.prompts)
    prompts = load_prompts(list(config.prompts.texts), config.prompts.file, from_set)
    texts = len(config.prompts.texts)
    names = prompt_names(texts, len(prompts) - texts - len(from_set), len(from_set), config.prompts.set)
    if config.prompts.negative:
        check_text("prompts.negative", str(config.prompts.negative))
    if config.prompts.syntax.name == "a1111":
        check_syntax(prompts, names, config.prompts.negative)
    inputs = read_mode_inputs(config.mode.name, config.init_image, config.mask_image, config.controlnet.image,
                              len(prompts), config.reference_images)
    return Checked(prompts, inputs, names)


def make_plan(config: RunConfig, available_devices: int, checked: Optional[Checked] = None) -> Plan:
    """Validate ``config`` (what :func:`admit` returned) and lay out its images; raises UserError naming
    the first bad key. ``checked``: what :func:`check_values` returned, if the caller has made those
    checks already."""
    given_guidance = config.sampling.guidance_scale is not None
    config = families.with_defaults(config)
    family = families.FAMILIES[str(config.model.family)]
    steps = config.sampling.num_inference_steps
    assert steps is not None  # with_defaults filled it in
    if checked is None:
        checked = check_values(config)
    prompts = checked.prompts
    par = config.parallelism
    layout = image_layout(config, prompts, available_devices)
    sampling = family.sampling(config.sampler, config.scheduler.name, config.sampling.num_inference_steps,
                               config.sampling.eta)
    scheduler = stepping_scheduler(config.scheduler, family, sampling)
    guidance = families.guidance(config)
    adapters = tuple(lora_record(i, spec) for i, spec in enumerate(config.lora))
    inert.zero_scale_adapters(adapters)
    inert.same_size_hires(config.sampling.hires.scale)
    strength = modes.strength(config.mode.name, config.strength)
    model = dataclasses.replace(config.model)  # the checkpoint's base may be filled in: the caller's stays as given
    checkpoint = checkpoint_record(model)
    vae = vae_record(model)
    refining = refiner.check(config, family)
    check_checkpoint_family(checkpoint, model, family)
    steered = "controlnet.model" in modes.MODES[config.mode.name].needs  # a ControlNet runs
    inert.said_control_window(steered, config.mode.name, steps, config.controlnet.guidance_start,
                              config.controlnet.guidance_end)
    return Plan(
        model=model,
        dtype=config.dtype,
        scheduler=scheduler,
        sampling=sampling,
        attention=config.performance.attention.name,
        mode=par.mode.name,
        prompts=tuple(prompts),
        negative=config.prompts.negative,  # "" is a negative prompt for SDXL (engine/encode.py: negative_prompt)
        num_devices=layout.num_devices,
        per_device_batch_size=par.per_device_batch_size,
        num_batches=layout.num_batches,
        images=layout.slots,
        seed=config.seed,
        num_inference_steps=steps,
        guidance_scale=guidance,
        height=config.sampling.height,
        width=config.sampling.width,
        repeats=config.timing.repeats,
        max_extra_share=config.timing.max_extra_share,
        metrics=config.metrics,
        run_name=config.run_name,
        experiment=config.experiment,
        output=config.output,
        tracking=config.tracking,
        output_root=config.paths.output_root,
        compilation_cache=config.compilation_cache,
        peak_tflops_per_device=config.performance.peak_tflops_per_device,
        profile=config.performance.profile,
        max_models=config.reuse.max_models,
        params=recorded_params(config, family, sampling, adapters, model, checkpoint, vae, refining, strength,
                               guidance),
        lora=adapters,
        checkpoint=checkpoint,
        vae=vae,
        embeddings=inert.used_embeddings(embedding_records(config.prompts.embeddings), prompts,
                                         config.prompts.negative),
        generation=config.mode.name,
        strength=strength,
        start_step=family.start_step(steps, strength),
        inputs=checked.inputs,
        resize_mode=config.resize_mode.name,
        controlnet=config.controlnet.model if steered else None,
        conditioning_scale=float(config.controlnet.conditioning_scale),
        control_mode=config.controlnet.control_mode if steered else None,
        control_window=(float(config.controlnet.guidance_start), float(config.controlnet.guidance_end)),
        cache_dir=config.paths.cache_dir,
        clip_skip=config.prompts.clip_skip,
        syntax=config.prompts.syntax.name,
        family=family.name,
        max_sequence_length=config.prompts.max_sequence_length or 0,
        guidance_given=given_guidance,
        params_placement=par.params.name,
        true_cfg_scale=config.sampling.true_cfg_scale,
        guidance_rescale=inert.acting_rescale(config.sampling.guidance_rescale, guidance),
        guider=inert.acting_skip_layer(guiders.check(config, family), steps, guidance),
        cache=caches.check(config, family, own_sampler=sampling.sigmas is None),
        quantize=quantizers.check(config, family),
        hires=hires.check(config, family, sampling.sampler, checks.MAX_SIZE),
        refiner=refining,
        prompt_names=checked.names,
    )


@dataclass(frozen=True)
class ImageLayout:
    """How a run's images lie on devices and batches (make_plan)."""

    num_devices: int
    num_batches: int
    slots: tuple[ImageSlot, ...]


def image_layout(config: RunConfig, prompts: list[str], available_devices: int) -> ImageLayout:
    """Every image's slot: batch, device and place on it, its prompt, and whether it is kept (``prompts.fill=pad``
    keeps only whole copies of the prompt list; ``cycle`` every slot); the layout checked (UserError)."""
    par = config.parallelism
    num_devices = par.num_devices or available_devices
    per_batch = num_devices * par.per_device_batch_size
    needed = math.ceil(len(prompts) / per_batch)
    num_batches = par.num_batches or needed
    checks.layout(num_devices, available_devices, num_batches, needed, per_batch, len(prompts))
    total = num_batches * per_batch
    kept = total if config.prompts.fill.name == "cycle" else len(prompts) * (total // len(prompts))
    slots = []
    for i in range(total):
        batch, within = divmod(i, per_batch)
        device, slot = divmod(within, par.per_device_batch_size)
        slots.append(ImageSlot(i, batch, device, slot, prompts[i % len(prompts)], i < kept, i % len(prompts)))
    checks.grid(config.output.grid_rows, config.output.grid_cols, kept)
    return ImageLayout(num_devices, num_batches, tuple(slots))


def stepping_scheduler(scheduler: SchedulerConfig, family: families.FamilyEntry, sampling: Sampling) -> SchedulerConfig:
    """The diffusers scheduler the model is loaded with for ``sampling``: the family's own where its sampler names
    it (FLUX.1: families/flux/engine/); DDIM / PLMS where sampler= names them; for a k sampler's sigma schedule the model's
    training schedule, read through diffusers' Euler scheduler (which steps nothing here) with zero terminal SNR
    kept (the k samplers' sigmas read it); else ``scheduler`` as configured."""
    if family.sampler_names_scheduler:
        return SchedulerConfig(name=sampling.scheduler, config_overrides={})
    if scheduler.name != sampling.scheduler or scheduler.name in samplers.SCHEDULES:
        name = sampling.scheduler if sampling.scheduler not in samplers.SCHEDULES else "euler"
        zero_snr = scheduler.config_overrides.get(checks.ZERO_SNR_KEY) is True
        return SchedulerConfig(name=name, config_overrides={checks.ZERO_SNR_KEY: True} if zero_snr else {})
    return scheduler


def check_checkpoint_family(checkpoint: Any, model: ModelConfig, family: families.FamilyEntry) -> None:
    """A single-file checkpoint must be of its base model's family (UserError naming model.checkpoint)."""
    if checkpoint is None:
        return
    owner, known = families.architecture(checkpoint.architecture)
    if owner.name != family.name:
        raise UserError("model.checkpoint", f"{Path(checkpoint.path).name} is a {known.title} "
                        f"checkpoint, but its base {model.pretrained_model_name_or_path} is {family.title}",
                        f"a base of its family (model.pretrained_model_name_or_path=null: {known.base})")


def recorded_params(config: RunConfig, family: families.FamilyEntry, sampling: Sampling, adapters: tuple, model: ModelConfig,
                    checkpoint: Any, vae: Any, refining: Any, strength: Optional[float], guidance: Any) -> dict:
    """The run's parameters as the tracker and the records hold them: the config flattened, plus what was resolved
    (adapter, checkpoint, VAE and refiner hashes, the strength, the guidance where the family's default applied, the
    scheduler FLUX.1 steps with, the sampler as A1111 spells it)."""
    return dict(flatten_params(config), **lora_params(adapters), **checkpoint_params(model, checkpoint),
                **({"model.vae_sha256": vae.sha256} if vae else {}),
                **({"model.refiner_sha256": refining.sha256} if refining else {}),
                **({"strength": str(strength)} if strength is not None else {}),
                **{"sampling.guidance_scale": str(guidance)},  # the family's default where null
                # FLUX.1 steps with its own scheduler whatever the (default) scheduler group says
                **({"scheduler.name": sampling.scheduler}
                   if family.sampler_names_scheduler and sampling.sigmas is None else {}),
                sampler=sampling.label)  # what ran, as A1111 spells it (the config's value is in its artifact)
