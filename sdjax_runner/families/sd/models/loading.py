"""The SD family's loader (SD 1.x, 2.x, XL; their inpainting pipelines): a pipeline folder read component by
component into :class:`~sdjax_runner.families.sd.models.pipeline.SDPipeline` / ``SDXLPipeline`` with the folder's own
scheduler, as models/loaders.py's ``LOADERS["sd"]`` calls it; the components come through models/loading.py
(the runner's own modules, weights in any published format); a single-file checkpoint (``model.checkpoint``, the
LDM layout: models/single_file.py) gives the weights of :data:`CHECKPOINT_COMPONENTS`, the folder their configs.
Also how another VAE is read for an SD model (``model.vae``) and how a run's scheduler replaces the folder's."""

from __future__ import annotations

import functools
import logging
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.schema import DtypeConfig, ModelConfig, SchedulerConfig
from sdjax_runner.errors import UserError
from sdjax_runner.models import model_index, sources
from sdjax_runner.models.loading import (
    READABLE_CLASSES,
    LoadedModel,
    WeightChoice,
    component_dtype,
    load_component,
    load_component_or_say_why,
    numpy_dtype,
    read_config,
    to_host,
    unloadable,
)
from sdjax_runner.models.schedulers import build_scheduler

log = logging.getLogger("sdjax_runner")

# Components a single-file checkpoint (model.checkpoint) holds the weights of.
CHECKPOINT_COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2")
# model_index.json's pipeline class (with or without "Flax") of the SD family (config/families.py) -> whether it is
# SDXL's (two text encoders). An inpainting model's pipeline (runwayml/stable-diffusion-inpainting) holds the same
# components: the runner reads its modules and runs its own program (engine/modes/inpaint.py).
PIPELINES = {"StableDiffusionPipeline": False, "StableDiffusionInpaintPipeline": False,
             "StableDiffusionXLPipeline": True, "StableDiffusionXLInpaintPipeline": True}
# The components of an SD pipeline the runner reads (the scheduler is built apart: models/schedulers.py).
SD_COMPONENTS = ("unet", "vae", "text_encoder", "tokenizer", "safety_checker", "feature_extractor")
SDXL_COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2")


def read_vae_folder(path: Path, activations: Any, weights: np.dtype) -> tuple[Any, dict]:
    """(module, host weights) of a diffusers VAE folder as an SD model's VAE (``model.vae``): its own module
    from its config.json, in ``activations``, its weights (Flax or PyTorch safetensors) in ``weights``."""
    module, params, _ = load_component(path, "AutoencoderKL", WeightChoice(), activations, weights)
    return module, params


def vae_from_state(module: Any, state: dict, weights: np.dtype, source: str) -> dict:
    """Host weights for an SD model's own VAE ``module`` from a single file's tensors under diffusers' names."""
    from sdjax_runner.models.checkpoints import convert_tensors

    params = convert_tensors(lambda: ((name, functools.partial(np.array, array)) for name, array in state.items()),
                             module, "diffusers", weights, source)
    return to_host(params, weights)




def load_sd(directory: Path, index: dict, model: ModelConfig, dtype: DtypeConfig, checkpoint: Any,
            checkpoint_sha256: Optional[str]) -> LoadedModel:
    """An SD 1.x/2.x/XL pipeline folder read component by component; ``checkpoint``: the opened single-file
    checkpoint whose weights replace the folder's (model.checkpoint), or None."""
    import jax.numpy as jnp

    from sdjax_runner.families.sd.models.pipeline import SDPipeline, SDXLPipeline

    if checkpoint is not None:
        from sdjax_runner.models import single_file

        checkpoint = single_file.on_base(checkpoint, directory)
        extra = single_file.unrecognised(checkpoint)
        if extra:
            log.warning("model.checkpoint: %d tensor(s) of %s are not weights of this pipeline and are not "
                        "used, e.g. %s", len(extra), checkpoint.path.name, ", ".join(extra[:3]))
    xl = PIPELINES[index["_class_name"].removeprefix("Flax")]
    activations = getattr(jnp, dtype.activations_dtype.name)
    weights = numpy_dtype(dtype.weights_dtype.name)
    modules: dict[str, Any] = {}
    params: dict[str, Any] = {}
    formats: dict[str, str] = {}
    variant_components = []
    for name in SDXL_COMPONENTS if xl else SD_COMPONENTS:
        if name in ("safety_checker", "feature_extractor") and not model.safety_checker:
            continue
        spec = model_index.entry(directory, index, name)
        if spec is None:
            if name == "safety_checker":
                raise UserError("model.safety_checker", f"{directory} has no safety checker", "false")
            if name == "feature_extractor":
                continue
            raise UserError(sources.KEY, f"{directory / model_index.FILE} names no {name!r} component",
                            "a complete pipeline folder")
        class_name = model_index.component_class(directory, name, *spec, READABLE_CLASSES)
        in_file = checkpoint if name in CHECKPOINT_COMPONENTS else None
        module, module_params, found = load_component_or_say_why(directory, name, class_name, model,
                                                                 component_dtype(directory, name, activations),
                                                                 weights, in_file)
        modules[name] = module
        if module_params is not None:
            params[name], formats[name] = module_params, found.format
            if model.variant and any(f".{model.variant}." in f.name for f in found.files):
                variant_components.append(name)
    scheduler = own_scheduler(directory, index)
    if checkpoint is not None and checkpoint_sha256 is not None:
        from sdjax_runner.files import file_sha256

        now = file_sha256(checkpoint.path)
        if now != checkpoint_sha256:
            raise UserError("model.checkpoint", f"{checkpoint.path} changed since the run was planned (sha256 "
                            f"{checkpoint_sha256[:12]} -> {now[:12]}); it is not run under the old file's hash",
                            "run again")
    if xl:  # what an empty negative prompt means (engine/encode.py)
        modules["force_zeros_for_empty_prompt"] = bool(model_index.setting(index, "force_zeros_for_empty_prompt",
                                                                           True))
    pipeline = (SDXLPipeline if xl else SDPipeline)(**modules, scheduler=scheduler, dtype=activations)
    safety = params.pop("safety_checker", None)
    return LoadedModel(pipeline, params, safety, 0.0, str(directory), formats, tuple(variant_components), "sd")


def own_scheduler(directory: Path, index: dict) -> Any:
    """The scheduler the folder names (families/sd/models/schedulers; a run replaces it with its scheduler.name's,
    :func:`with_scheduler`): what the loaded model's training schedule is read from (the refiner's cutoff)."""
    from sdjax_runner.families.sd.models.schedulers import SCHEDULER_CLASSES

    spec = model_index.entry(directory, index, "scheduler")
    if spec is None:
        raise UserError(sources.KEY, f"{directory / model_index.FILE} names no scheduler", "a complete pipeline folder")
    class_name = model_index.component_class(directory, "scheduler", *spec, tuple(SCHEDULER_CLASSES))
    try:
        return SCHEDULER_CLASSES[class_name].from_config(read_config(directory / "scheduler",
                                                                     "scheduler_config.json"))
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise unloadable(directory, "scheduler", exc) from exc


def with_scheduler(loaded: LoadedModel, scheduler: SchedulerConfig, prediction_type: Any = None,
                   attention: str = "default"):
    """A pipeline sharing ``loaded``'s modules (the UNet set up for ``attention``) with the configured
    scheduler, and the scheduler's float32 state."""
    overrides = dict(scheduler.config_overrides)
    if prediction_type is not None and "prediction_type" not in overrides:
        overrides["prediction_type"] = getattr(prediction_type, "name", prediction_type)
    sched, state = build_scheduler(scheduler.name, overrides, loaded.path)
    pipeline = loaded.pipeline.with_modules(unet=loaded.pipeline.unet.clone(attention=attention), scheduler=sched)
    return pipeline, to_host(state, np.dtype(np.float32))  # the scheduler state is never cast
