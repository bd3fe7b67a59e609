"""The config's registry of model families: each family's package makes its own :class:`FamilyEntry`
(``sdjax_runner/families/<name>/config.py``'s ``ENTRY``: which published pipelines -- the ``_class_name`` of a
model folder's ``model_index.json`` -- belong to it, which modes it runs, its defaults and what it refuses before
anything loads), gathered here for the names ``sdjax_runner.families.NAMES`` lists. How a family is loaded is
models/'s registry (``loaders.LOADERS``), how it runs engine/'s (``families.FAMILIES``); all three read the same
names. A new family is one package (docs/architecture.md, "Where a new model family goes").

A run's family is known before its model loads (:func:`planned`): ``model.family`` when given, else the
folder's ``model_index.json`` when it is on disk (a local folder; a built-in model's own entry), else ``sd``.
The engine refuses a loaded model of another family in one line."""

from __future__ import annotations

import dataclasses
import math
from importlib import import_module
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config import weight_files
from sdjax_runner.config.family_entry import MAX_INDEX_BYTES, FamilyEntry
from sdjax_runner.errors import UserError
from sdjax_runner.families import NAMES
from sdjax_runner.files import read_json

MODEL_KEY = "model.pretrained_model_name_or_path"


# Each family's entry is a module of the config layer inside its package (families/<name>/config.py)
FAMILIES: dict[str, FamilyEntry] = {name: import_module(f"sdjax_runner.families.{name}.config").ENTRY
                                    for name in NAMES}
DEFAULT = NAMES[0]  # a model's family where nothing says another (planned); records name only another
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


def takes_references(family: FamilyEntry, config: Any) -> None:
    """reference_images, where the mode reads them (config/modes.py: edit, inpaint), on a family that takes more
    reference images (FamilyEntry.reference_images: FLUX.2 [klein]); one line for another."""
    from sdjax_runner.config.modes import MODES, REFERENCES

    given = config.reference_images not in (None, "", [])
    if given and REFERENCES in MODES[config.mode.name].optional_images and not family.reference_images:
        raise UserError("reference_images", f"given, but {config.model.name} is a {family.title} model, which reads no "
                        "more reference images (FLUX.2 [klein]'s editing and inpainting do)",
                        "null (the init image alone), or a FLUX.2 [klein] model")


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


def open_checkpoint(path: Path) -> weight_files.Checkpoint:
    """A single-file checkpoint (model.checkpoint) known from its header alone (milliseconds): its tensor names,
    and the family and architecture whose entry knows them (``FamilyEntry.architecture_of``)."""
    keys = weight_files.checkpoint_keys(path)
    names = frozenset(keys)
    for entry in FAMILIES.values():
        architecture = entry.architecture_of(names, path.name) if entry.architecture_of else None
        if architecture is not None:
            known = entry.single_files[architecture]
            return weight_files.Checkpoint(path, architecture, keys, family=entry.name, title=known.title,
                                           base=known.base)
    titles = [known.title for entry in FAMILIES.values() for known in entry.single_files.values()]
    raise UserError(weight_files.KEY, f"{path.name} has no tensors of a model this runner runs, in its original "
                    "single-file layout",
                    f"a single-file checkpoint of {', '.join(titles)}")


def architecture(name: str) -> tuple[FamilyEntry, weight_files.Architecture]:
    """The family whose single files have architecture ``name`` (a record's, ``CheckpointEntry.architecture``),
    and what its entry says of it."""
    return next((entry, entry.single_files[name]) for entry in FAMILIES.values() if name in entry.single_files)


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
        try:
            found = open_checkpoint(Path(checkpoint).expanduser()).family
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
    takes_references(family, config)
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
