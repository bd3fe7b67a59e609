"""The model families the runner runs, one :class:`FamilyEntry` each: which published pipelines (the
``_class_name`` of a model folder's ``model_index.json``) belong to it, which modes it runs, its defaults and
what it refuses before anything loads. How a family is loaded is models/'s (``loaders.LOADERS``), how it runs
engine/'s (``families.FAMILIES``); both registries are checked against this one when they are imported. A new
family (SD 3.5) is an entry here, its loader in models/ and its stages in engine/ -- docs/architecture.md,
"Where a new model family goes".

A run's family is known before its model loads (:func:`planned`): ``model.family`` when given, else the
folder's ``model_index.json`` when it is on disk (a local folder; a built-in model's own entry), else ``sd``.
The engine refuses a loaded model of another family in one line."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config import guiders, samplers, weight_files
from sdjax_runner.config.modes import MODES
from sdjax_runner.errors import UserError
from sdjax_runner.files import read_json

MODEL_KEY = "model.pretrained_model_name_or_path"
MAX_INDEX_BYTES = 1 << 20  # a model_index.json is a few hundred bytes; a larger one is left to the loader's checks


@dataclass(frozen=True)
class FamilyEntry:
    """Everything the config knows of one model family."""

    name: str  # the family's name in records and messages (model.family)
    title: str  # what it is, for people
    pipelines: tuple[str, ...]  # model_index.json's pipeline class names it runs (without diffusers' "Flax")
    tiny: str  # its tiny built-in model (model=NAME, random weights): what its CPU runs in the tests use
    modes: tuple[str, ...] = tuple(MODES)  # the modes (config/modes.py) it runs
    builtins: tuple[str, ...] = ()  # the built-in models (models/builtin.py) of the family
    steps: int = 50  # sampling.num_inference_steps when null: its diffusers pipeline's default
    guidance: float = 7.5  # sampling.guidance_scale when null: likewise
    # (RunConfig) -> None: what the family refuses before anything loads (settings it has no use for)
    check: Optional[Callable[[Any], None]] = None
    # (sampler, scheduler.name, steps, sampling.eta) -> config/samplers.Sampling: what steps
    sampling: Callable[..., samplers.Sampling] = samplers.resolve
    # prompts.max_sequence_length when null, for a family with a T5 encoder (None: it has none, and the key is
    # refused): its diffusers pipeline's default
    t5_tokens: Optional[int] = None
    t5_optional: bool = False  # whether it runs without its T5 encoder (model.t5=false; diffusers: SD 3's pipeline)
    # whether scheduler.config_overrides mean anything to it: the SD family's diffusers schedulers take them; the
    # flow families step on their own schedule, read from the model's scheduler_config.json (shift, dynamic shift)
    scheduler_settings: bool = True
    # what it takes that not every family does: sampling.true_cfg_scale (FLUX.1's true CFG with a negative prompt),
    # prompts.embeddings (textual inversion: the SD family's CLIP tokens), sampling.guidance_rescale (diffusers'
    # CFG rescale, the SD family's); a family without one refuses the key in one line
    true_cfg: bool = False
    embeddings: bool = False
    guidance_rescale: bool = False
    refiner: bool = False  # model.refiner: an SDXL refiner taking over the last steps (config/refiner.py)
    guiders: tuple[str, ...] = (guiders.DEFAULT,)  # the guiders (config/guiders.py) its samplers run
    # whether the sampler's scheduler replaces the scheduler group's whatever it says (FLUX.1 steps with its own
    # flow scheduler's config: config/plan.py; the records name it)
    sampler_names_scheduler: bool = False
    # whether it reads A1111's prompt syntax (emphasis, BREAK) on its CLIP tokens; one that reads prompts as written
    # (FLUX.1, SD 3: read_as_written) has its prompts written unescaped into the infotext (record/rundir.py)
    a1111_prompts: bool = True
    # (a single-file checkpoint's tensor names) -> the components whose weights it gives (model.checkpoint), the base
    # folder giving the rest; None: the whole pipeline's (the SD family's files: the base gives only configs)
    checkpoint_holds: Optional[Callable[[Any], tuple[str, ...]]] = None
    # (a model folder on disk) -> (the largest height/width it takes, why) or None: a size past it is one line
    # before anything loads (SD 3's position table; the engine checks the loaded model again)
    largest_side: Optional[Callable[[Path], Optional[tuple[int, str]]]] = None


def _flux_values(config: Any) -> None:
    """Settings FLUX.1 has no use for, each refused in one line rather than ignored."""
    prompts, true_cfg = config.prompts, config.sampling.true_cfg_scale
    if true_cfg is not None and not (math.isfinite(true_cfg) and true_cfg > 1):
        raise UserError("sampling.true_cfg_scale", f"{true_cfg}: true classifier-free guidance runs above 1",
                        "a number over 1 (with prompts.negative), or null")
    if prompts.negative is not None and true_cfg is None:
        raise UserError("prompts.negative", f"{config.model.name} is FLUX.1, which is guidance-distilled: it reads a "
                        "negative prompt only with true classifier-free guidance", "null, or with "
                        "sampling.true_cfg_scale=4 (say)")
    windowed = (config.guider.start, config.guider.stop) != (0.0, 1.0)
    if (config.guider.name != guiders.DEFAULT or windowed) and true_cfg is None:
        raise UserError("guider", f"{config.guider.name}{' with a window' if windowed else ''}: FLUX.1 combines two "
                        "predictions only with true CFG (its guidance is distilled)",
                        f"cfg, or {config.guider.name} with sampling.true_cfg_scale and prompts.negative")
    if true_cfg is not None and prompts.negative is None:
        raise UserError("sampling.true_cfg_scale", f"{true_cfg}: true classifier-free guidance needs a negative prompt",
                        "null, or with prompts.negative=TEXT")
    read_as_written(config, "FLUX.1", "FLUX.1 reads CLIP's pooled output, which has no layer to skip to")


def read_as_written(config: Any, family: str, why_no_clip_skip: str) -> None:
    """A family that reads prompts as written (FLUX.1, SD 3): A1111's syntax and clip skip refused in one line."""
    prompts = config.prompts
    if prompts.syntax.name != "plain":
        raise UserError("prompts.syntax", f"{prompts.syntax.name}: A1111's emphasis and BREAK weigh the SD family's "
                        f"CLIP tokens; {config.model.name} ({family}) reads prompts as written", "plain")
    if prompts.clip_skip != 1:
        raise UserError("prompts.clip_skip", f"{prompts.clip_skip}: {why_no_clip_skip}", "1")


def _sd3_values(config: Any) -> None:
    """Settings SD 3 has no use for (yet), each refused in one line rather than ignored."""
    read_as_written(config, "SD 3", "SD 3 reads its CLIP encoders' penultimate layer, as diffusers does")
    slg(config)


def slg(config: Any) -> Optional[tuple]:
    """SD 3's skip-layer guidance as the program takes it -- (layers, scale, start, stop) -- or None; each bad
    setting one line (sampling.slg_*)."""
    sampling = config.sampling
    layers = sampling.slg_layers
    if layers is None:
        return None
    if planned(config.model).name != "sd3":
        raise UserError("sampling.slg_layers", f"{list(layers)}: skip-layer guidance is SD 3.5's; {config.model.name} "
                        "is not an SD 3 model", "null")
    if not layers or len(set(layers)) != len(layers) or any(layer < 0 for layer in layers):
        raise UserError("sampling.slg_layers", f"{list(layers)}", "distinct transformer block numbers, e.g. [7, 8, 9] "
                        "(SD 3.5 Medium's card), or null")
    if not (math.isfinite(sampling.slg_scale) and math.isfinite(sampling.slg_start) and math.isfinite(sampling.slg_stop)
            and 0 <= sampling.slg_start < sampling.slg_stop <= 1):
        raise UserError("sampling.slg_start", f"{sampling.slg_start}..{sampling.slg_stop} with scale "
                        f"{sampling.slg_scale}", "0 <= slg_start < slg_stop <= 1 (fractions of the steps), a finite "
                        "slg_scale")
    sampler = config.sampler
    if samplers.resolve_flow(sampler, config.scheduler.name).sigmas is not None:
        raise UserError("sampling.slg_layers", f"{list(layers)} with sampler {sampler} and scheduler "
                        f"{config.scheduler.name}: skip-layer guidance counts the model's own schedule's steps",
                        "the flow-matching Euler on the model's schedule (sampler=euler, or null), or null")
    return tuple(layers), float(sampling.slg_scale), float(sampling.slg_start), float(sampling.slg_stop)


def _sd3_largest_side(folder: Path) -> Optional[tuple[int, str]]:
    """SD 3's transformer adds position embeddings cropped from a ``pos_embed_max_size`` square table of patches:
    latents larger than it have none (diffusers: a ValueError). None where the folder's configs cannot tell."""
    try:
        transformer = read_json(folder / "transformer" / "config.json", MAX_INDEX_BYTES)
        vae = read_json(folder / "vae" / "config.json", MAX_INDEX_BYTES)
        table, patch = int(transformer["pos_embed_max_size"]), int(transformer.get("patch_size", 2))
        factor = 2 ** (len(vae.get("block_out_channels", [0, 0, 0, 0])) - 1)
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
    return table * patch * factor, f"its transformer's position table is {table}x{table} patches of {patch}x{patch} latents"


def _registry(*entries: FamilyEntry) -> dict[str, FamilyEntry]:
    return {entry.name: entry for entry in entries}


FAMILIES = _registry(
    # An inpainting model's pipeline (runwayml/stable-diffusion-inpainting) holds the same components; its UNet
    # reads 9 channels (engine/modes/inpaint.py).
    FamilyEntry("sd", "Stable Diffusion 1.x, 2.x and XL: CLIP text encoder(s), UNet, VAE",
                ("StableDiffusionPipeline", "StableDiffusionInpaintPipeline", "StableDiffusionXLPipeline",
                 "StableDiffusionXLInpaintPipeline"), tiny="tiny-random",
                builtins=("tiny-random", "tiny-random-xl", "sd-v1-arch", "sdxl-arch", "tiny-random-inpaint"),
                embeddings=True, guidance_rescale=True, refiner=True, guiders=tuple(guiders.GUIDERS)),
    # diffusers' FluxPipeline defaults: 28 steps, guidance 3.5 ([schnell] reads none: its check is the engine's,
    # once the transformer's config says which it is).
    FamilyEntry("flux", "FLUX.1: CLIP-L and T5 text encoders, a flow-matching transformer, a 16-channel VAE",
                ("FluxPipeline",), tiny="tiny-random-flux", modes=("txt2img",), builtins=("tiny-random-flux", "tiny-random-flux-schnell",
                                                                        "flux-dev-arch"),
                steps=28, guidance=3.5, check=_flux_values, sampling=samplers.resolve_flow, t5_tokens=512,
                checkpoint_holds=lambda keys: ("transformer",), a1111_prompts=False, true_cfg=True,
                guiders=tuple(guiders.GUIDERS),  # on its true CFG (_flux_values)
                sampler_names_scheduler=True,
                scheduler_settings=False),
    # diffusers' StableDiffusion3Pipeline defaults: 28 steps, guidance 7.0, 256 T5 tokens.
    FamilyEntry("sd3", "Stable Diffusion 3 / 3.5: CLIP-L, CLIP-G and T5 text encoders, an MMDiT, a 16-channel VAE",
                ("StableDiffusion3Pipeline",), tiny="tiny-random-sd3", modes=("txt2img",),
                builtins=("tiny-random-sd3", "sd3.5-large-arch"), steps=28, guidance=7.0, check=_sd3_values,
                sampling=samplers.resolve_flow, t5_tokens=256, t5_optional=True, scheduler_settings=False,
                checkpoint_holds=lambda keys: ("transformer",) + weight_files.sd3_components_inside(keys),
                a1111_prompts=False, guiders=tuple(guiders.GUIDERS),
                largest_side=_sd3_largest_side),
)
DEFAULT = "sd"  # a model's family where nothing says another (planned); records name only another
PIPELINES = {pipeline: entry.name for entry in FAMILIES.values() for pipeline in entry.pipelines}
BUILTINS = {builtin: entry.name for entry in FAMILIES.values() for builtin in entry.builtins}
# The most T5 tokens a prompt may take (prompts.max_sequence_length): diffusers' bound for FLUX.1 and SD 3.
MAX_SEQUENCE_LENGTH = 512


def family_of(pipeline: str, directory: Path) -> FamilyEntry:
    """The family that runs the pipeline class ``pipeline`` (with or without "Flax"), read from ``directory``."""
    name = pipeline.removeprefix("Flax")
    if name not in PIPELINES:
        raise UserError(MODEL_KEY, f"{directory} holds a {name}, which this runner does not run", ", ".join(PIPELINES))
    return FAMILIES[PIPELINES[name]]


def runs_mode(family: FamilyEntry, mode: str, model_name: str) -> None:
    """``mode`` is one the family runs (before the model loads, and again once it is)."""
    if mode not in family.modes:
        raise UserError("mode", f"{mode}, but {model_name} is a {family.title} model, which runs "
                        f"{', '.join(family.modes)}", ", ".join(family.modes))


def _folder_family(path: Optional[str]) -> Optional[str]:
    """The family a local folder's ``model_index.json`` names, or None where it cannot tell (no such folder yet,
    a hub id, a file the loader will refuse with its own line)."""
    if not path or "://" in path:
        return None
    try:
        name = read_json(Path(path).expanduser() / "model_index.json", MAX_INDEX_BYTES).get("_class_name")
    except (OSError, ValueError, AttributeError):  # absent, too large, not JSON, not an object
        return None
    return PIPELINES.get(name.removeprefix("Flax")) if isinstance(name, str) else None


def planned(model: Any) -> FamilyEntry:
    """The family of ``model`` (a ModelConfig) before it loads: ``model.family``, a built-in's own, the folder's
    index, else sd (the module docstring)."""
    if model.family is not None:
        if model.family not in FAMILIES:
            raise UserError("model.family", f"unknown model family {model.family!r}", ", ".join(FAMILIES))
        return FAMILIES[model.family]
    if model.builtin is not None and model.builtin in BUILTINS:
        return FAMILIES[BUILTINS[model.builtin]]
    found = _folder_family(model.pretrained_model_name_or_path)
    checkpoint = getattr(model, "checkpoint", None)
    if found is None and checkpoint:  # no base on disk: the single-file checkpoint's architecture says it
        from sdjax_runner.config.weight_files import FAMILY_OF, open_checkpoint

        try:
            found = FAMILY_OF[open_checkpoint(Path(checkpoint).expanduser()).architecture]
        except UserError:  # not there, or no checkpoint: the plan says so in its own line (plan.checkpoint_record)
            found = None
    return FAMILIES[found or DEFAULT]


def with_defaults(config: Any) -> Any:
    """``config`` (a RunConfig) with its family named (``model.family``) and the family's defaults where the
    config leaves them null: the step count and the T5 sequence length (FLUX.1, SD 3); the family's own refusals made.
    Idempotent: records hold the values that ran. ``sampling.guidance_scale`` stays as given -- whether it was
    given matters to FLUX.1 [schnell], which reads none -- and the plan takes the family's where it is null
    (:func:`guidance`)."""
    family = planned(config.model)
    sampling, prompts = config.sampling, config.prompts
    length = prompts.max_sequence_length
    if not family.true_cfg and config.sampling.true_cfg_scale is not None:
        raise UserError("sampling.true_cfg_scale", f"{config.sampling.true_cfg_scale}: {config.model.name}'s "
                        "classifier-free guidance is sampling.guidance_scale", "null")
    if config.prompts.embeddings and not family.embeddings:
        raise UserError("prompts.embeddings", f"{len(config.prompts.embeddings)} path(s): textual-inversion embeddings "
                        f"are the SD family's CLIP tokens; {config.model.name} is a {family.name} model", "[]")
    rescale = config.sampling.guidance_rescale
    if rescale is not None and not family.guidance_rescale:
        raise UserError("sampling.guidance_rescale", f"{rescale}: CFG rescale is the SD family's (diffusers' "
                        f"guidance_rescale); {config.model.name} is a {family.name} model", "null")
    if rescale is not None and not (math.isfinite(rescale) and 0 <= rescale <= 1):
        raise UserError("sampling.guidance_rescale", f"{rescale}", "a number from 0 to 1 (0.7 in Lin et al.), or null")
    if not config.model.t5 and (family.t5_tokens is None or not family.t5_optional):
        raise UserError("model.t5", f"false: {config.model.name} is {family.title.split(':')[0]}, which "
                        + ("has no T5 encoder" if family.t5_tokens is None else "needs its T5 encoder"),
                        "true (false: SD 3 / 3.5 only)")
    if family.t5_tokens is None and length is not None:
        raise UserError("prompts.max_sequence_length", f"{length}: {config.model.name} has no T5 encoder (it is "
                        f"{family.title})", "null (FLUX.1 and SD 3 only)")
    if family.t5_tokens is not None:
        if length is None:
            length = family.t5_tokens
        elif not 1 <= length <= MAX_SEQUENCE_LENGTH:
            raise UserError("prompts.max_sequence_length", f"{length}: {family.title.split(':')[0]}'s T5 reads at "
                            f"most {MAX_SEQUENCE_LENGTH} tokens", f"1..{MAX_SEQUENCE_LENGTH} (null: {family.t5_tokens})")
    runs_mode(family, config.mode.name, config.model.name)
    if family.check is not None:
        family.check(config)
    return dataclasses.replace(
        config, model=dataclasses.replace(config.model, family=family.name),
        sampling=dataclasses.replace(sampling, num_inference_steps=family.steps
                                     if sampling.num_inference_steps is None else sampling.num_inference_steps),
        prompts=dataclasses.replace(prompts, max_sequence_length=length))


def check_side(config: Any, family: FamilyEntry, height: int, width: int) -> None:
    """A size the model cannot take is one line before it loads (where its folder is on disk to tell)."""
    path = config.model.pretrained_model_name_or_path
    if family.largest_side is None or not path or "://" in str(path) or not Path(str(path)).expanduser().is_dir():
        return
    found = family.largest_side(Path(str(path)).expanduser())
    if found is not None and max(height, width) > found[0]:
        key = "sampling.height" if height > found[0] else "sampling.width"
        raise UserError(key, f"{height}x{width}: {config.model.name} takes at most {found[0]}x{found[0]} ({found[1]})",
                        f"a height and width up to {found[0]}")


def guidance(config: Any) -> float:
    """The guidance value that runs: ``sampling.guidance_scale``, or the family's default where it is null."""
    given = config.sampling.guidance_scale
    return float(planned(config.model).guidance if given is None else given)
