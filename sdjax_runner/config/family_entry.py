"""Everything the config knows of one model family (:class:`FamilyEntry`), and what families share in making
theirs. Each family's package makes its own (``families/<name>/config.py``'s ``ENTRY``); config/families.py
gathers them and reads a run's family before its model loads."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config import caches, guiders, quantizers, samplers
from sdjax_runner.config.modes import MODES, start_step
from sdjax_runner.config.weight_files import Architecture
from sdjax_runner.errors import UserError

MAX_INDEX_BYTES = 1 << 20  # a model_index.json is a few hundred bytes; a larger one is left to the loader's checks


@dataclass(frozen=True)
class FamilyEntry:
    """Everything the config knows of one model family."""

    name: str  # the family's name in records and messages (model.family)
    title: str  # what it is, for people
    pipelines: tuple[str, ...]  # model_index.json's pipeline class names it runs (without diffusers' "Flax")
    tiny: str  # its tiny built-in model (model=NAME, random weights): what its CPU runs in the tests use
    modes: tuple[str, ...] = tuple(MODES)  # the modes (config/modes.py) it runs
    # (steps, strength or None) -> the step an img2img or inpaint run starts at: its diffusers pipelines' rule
    # (the SD family's Flax pipelines: config/modes.start_step; the flow families' PyTorch ones: flow_start_step)
    start_step: Callable[[int, Optional[float]], int] = start_step
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
    # whether its edit and inpaint modes read more reference images (reference_images: FLUX.2 [klein]'s)
    reference_images: bool = False
    refiner: bool = False  # model.refiner: an SDXL refiner taking over the last steps (config/refiner.py)
    guiders: tuple[str, ...] = (guiders.DEFAULT,)  # the guiders (config/guiders.py) its samplers run
    # guider.layers where a perturbing guider (pag, seg) is given none: diffusers' PAG pipeline's default pag_applied_layers
    perturbed_layers: tuple[str, ...] = ("mid",)
    caches: tuple[str, ...] = (caches.DEFAULT,)  # the step caches (config/caches.py) its denoiser runs
    # the quantizers (config/quantizers.py) its denoiser takes: every one where the denoiser is the runner's own Flax
    # modules (Qwix quantizes their matrix multiplications: models/quantize.py)
    quantizers: tuple[str, ...] = tuple(quantizers.QUANTIZERS)
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
    # model.checkpoint: the single-file architectures of the family, by the name records give them
    single_files: Mapping[str, Architecture] = field(default_factory=dict)
    # (a single file's tensor names, its file name) -> its architecture (a key of single_files), or None where the
    # file is no checkpoint of this family; a file of the family that the runner cannot run is a UserError
    # (config/families.open_checkpoint asks each family)
    architecture_of: Optional[Callable[[frozenset[str], str], Optional[str]]] = None
    # A1111 infotext (from_png, config/infotext.py): its name in the lines said ("FLUX.1"), the keys that mark a line
    # as the family's where its Model is none of the packaged ones (Forge's "Distilled CFG Scale" for FLUX.1), and
    # (the reading: its settings, numbers, use and skip) -> None, reading the keys only it writes
    short: str = ""
    infotext_keys: tuple[str, ...] = ()
    read_infotext: Optional[Callable[[Any], None]] = None



def read_as_written(config: Any, family: str, why_no_clip_skip: str) -> None:
    """A family that reads prompts as written (FLUX.1, SD 3): A1111's syntax and clip skip refused in one line."""
    prompts = config.prompts
    if prompts.syntax.name != "plain":
        raise UserError("prompts.syntax", f"{prompts.syntax.name}: A1111's emphasis and BREAK weigh the SD family's "
                        f"CLIP tokens; {config.model.name} ({family}) reads prompts as written", "plain")
    if prompts.clip_skip != 1:
        raise UserError("prompts.clip_skip", f"{prompts.clip_skip}: {why_no_clip_skip}", "1")
