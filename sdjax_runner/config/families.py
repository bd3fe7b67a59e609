"""The model families the runner runs, one :class:`FamilyEntry` each: which published pipelines (the
``_class_name`` of a model folder's ``model_index.json``) belong to it and which modes it runs. How a family
is loaded is models/'s (``loading.LOADERS``), how it runs engine/'s (``families.FAMILIES``); both registries
are checked against this one when they are imported. A new family (FLUX.1, SD 3.5) is an entry here, its
loader in models/ and its stages in engine/ -- docs/architecture.md, "Where a new model family goes"."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from sdjax_runner.config.modes import MODES
from sdjax_runner.errors import UserError

MODEL_KEY = "model.pretrained_model_name_or_path"


@dataclass(frozen=True)
class FamilyEntry:
    """Everything the config knows of one model family."""

    name: str  # the family's name in records and messages
    title: str  # what it is, for people
    pipelines: tuple[str, ...]  # model_index.json's pipeline class names it runs (without diffusers' "Flax")
    tiny: str  # its tiny built-in model (model=NAME, random weights): what its CPU runs in the tests use
    modes: tuple[str, ...] = tuple(MODES)  # the modes (config/modes.py) it runs


def _registry(*entries: FamilyEntry) -> dict[str, FamilyEntry]:
    return {entry.name: entry for entry in entries}


FAMILIES = _registry(
    # An inpainting model's pipeline (runwayml/stable-diffusion-inpainting) holds the same components; its UNet
    # reads 9 channels (engine/modes/inpaint.py).
    FamilyEntry("sd", "Stable Diffusion 1.x, 2.x and XL: CLIP text encoder(s), UNet, VAE",
                ("StableDiffusionPipeline", "StableDiffusionInpaintPipeline", "StableDiffusionXLPipeline",
                 "StableDiffusionXLInpaintPipeline"), tiny="tiny-random"),
)
PIPELINES = {pipeline: entry.name for entry in FAMILIES.values() for pipeline in entry.pipelines}


def family_of(pipeline: str, directory: Path) -> FamilyEntry:
    """The family that runs the pipeline class ``pipeline`` (with or without "Flax"), read from ``directory``."""
    name = pipeline.removeprefix("Flax")
    if name not in PIPELINES:
        raise UserError(MODEL_KEY, f"{directory} holds a {name}, which this runner does not run", ", ".join(PIPELINES))
    return FAMILIES[PIPELINES[name]]


def runs_mode(family: FamilyEntry, mode: str, model_name: str) -> None:
    """Once the model is loaded: ``mode`` is one its family runs."""
    if mode not in family.modes:
        raise UserError("mode", f"{mode}, but {model_name} is a {family.title} model, which runs "
                        f"{', '.join(family.modes)}", ", ".join(family.modes))
