"""Model config -> pipeline modules and their params as host arrays, whatever format the weights are in.

The model's directory (a built-in model, a local path or a hub snapshot, see
:mod:`.sources`) is read component by component, each as diffusers' Flax
``from_pretrained`` reads it: Flax weights with the libraries' own loaders; components that
only have PyTorch safetensors are converted without torch (:mod:`.checkpoints`),
one at a time. Pickles are refused unless ``model.allow_pickle``. SD 1.x/2.x and SDXL
pipelines are told apart by ``model_index.json``. Params come back as host (NumPy) arrays in
the requested weights dtype -- ready to be replicated from host memory -- and the scheduler
state stays float32.
"""

from __future__ import annotations

import importlib
import inspect
import json
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sdjax_runner.errors import UserError
from sdjax_runner.models import sources
from sdjax_runner.models.checkpoints import convert_safetensors, find_weights
from sdjax_runner.models.schedulers import build_scheduler

# model_index.json's pipeline class (with or without "Flax") -> the Flax pipeline that runs it.
PIPELINES = {"StableDiffusionPipeline": "FlaxStableDiffusionPipeline",
             "StableDiffusionXLPipeline": "FlaxStableDiffusionXLPipeline"}


@dataclass
class LoadedModel:
    """A model in host memory. *Weights* are a model's arrays -- ``host_weights`` here, ``placed_weights``
    once on devices (:mod:`sdjax_runner.engine.reuse`); the generate function's *params* are the placed
    weights plus the scheduler's state."""

    pipeline: Any  # with the model's own scheduler; see with_scheduler
    host_weights: dict  # NumPy arrays of unet, vae, text encoder(s): what the generate function takes
    safety_weights: Any  # the safety checker's (it runs apart, on the host), or None
    load_s: float
    path: str
    formats: dict[str, str] = field(default_factory=dict)  # component -> "flax", "safetensors" or "pickle"

    @property
    def native_size(self) -> int:
        return self.pipeline.unet.config.sample_size * self.pipeline.vae_scale_factor

    @property
    def size_multiple(self) -> int:
        """Height/width must be multiples of this: VAE factor x the UNet's down-sampling."""
        levels = len(self.pipeline.unet.config.block_out_channels)
        return self.pipeline.vae_scale_factor * 2 ** (levels - 1)


def numpy_dtype(name: str):
    if name == "bfloat16":
        import ml_dtypes

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def to_host(tree, dtype: np.dtype):
    """Every leaf as a NumPy array; floating leaves cast to ``dtype``."""
    import jax

    def convert(leaf):
        array = np.asarray(leaf)
        if np.issubdtype(array.dtype, np.floating) or array.dtype == numpy_dtype("bfloat16"):
            return array if array.dtype == dtype else array.astype(dtype)
        return array

    return jax.tree_util.tree_map(convert, tree)


def pipeline_class(directory: Path):
    import diffusers

    name = json.loads((directory / "model_index.json").read_text(encoding="utf-8"))["_class_name"]
    name = name.removeprefix("Flax")
    if name not in PIPELINES:
        raise UserError(sources.KEY, f"{directory} holds a {name}, which this runner does not run",
                        ", ".join(PIPELINES))
    return getattr(diffusers, PIPELINES[name])


def component_class(library: str, class_name: str):
    """The Flax class diffusers' loader would use for a model_index.json entry."""
    from diffusers.pipelines.pipeline_flax_utils import import_flax_or_no_model

    module = importlib.import_module(f"diffusers.pipelines.{library}" if library == "stable_diffusion" else library)
    return import_flax_or_no_model(module, class_name.removeprefix("Flax"))


def load_component(folder: Path, library: str, cls, model: DictConfig, activations, weights: np.dtype):
    """(module, host params or None, weights format) for one component folder."""
    from diffusers import FlaxModelMixin
    from transformers import FlaxPreTrainedModel

    is_diffusers = issubclass(cls, FlaxModelMixin)
    if not (is_diffusers or issubclass(cls, FlaxPreTrainedModel)):
        return cls.from_pretrained(folder), None, ""  # a tokenizer or feature extractor
    found = find_weights(folder, "diffusers" if is_diffusers else "transformers", model.variant)
    if found.format == "flax":
        # As diffusers' FlaxDiffusionPipeline.from_pretrained does: transformers models keep their own dtype.
        module, params = (cls.from_pretrained(folder, dtype=activations) if is_diffusers
                          else cls.from_pretrained(folder, _do_init=False))
    elif found.format == "safetensors":
        module = (cls.from_config(cls.load_config(folder), dtype=activations) if is_diffusers
                  else cls(cls.config_class.from_pretrained(folder), _do_init=False))
        try:
            params = convert_safetensors(found.files, module, "diffusers" if is_diffusers else "transformers", weights)
        except ValueError as exc:
            raise UserError(sources.KEY, f"{folder.name}/ does not match its config.json: {exc}") from None
    elif found.format == "pickle":
        names = ", ".join(f.name for f in found.files)
        if not model.allow_pickle:
            raise UserError("model.allow_pickle", f"{folder.name}/ has only pickle weights ({names}); unpickling "
                            "can run code, so they are not loaded", "true to load them anyway (needs torch)")
        try:
            import torch  # noqa: F401
        except ImportError:
            raise UserError("model.allow_pickle", f"loading {folder.name}/{names} needs torch, which is not installed",
                            "pip install torch, or convert the weights to safetensors") from None
        if is_diffusers:
            module, params = cls.from_pretrained(folder, dtype=activations, from_pt=True)
        else:
            module = cls.from_pretrained(folder, from_pt=True)
            params = module.params
    else:
        raise UserError(sources.KEY, f"{folder} has no weights (looked for Flax .msgpack, PyTorch .safetensors "
                        "and, with model.allow_pickle, .bin files)", "a complete diffusers-format pipeline")
    return module, to_host(params, weights), found.format


def load_model(model: DictConfig, dtype: DictConfig) -> LoadedModel:
    """The pipeline (with the model's own scheduler) and its weights as host arrays."""
    import jax.numpy as jnp

    started = time.perf_counter()
    directory = sources.resolve(model, model.allow_pickle)
    cls = pipeline_class(directory)
    index = json.loads((directory / "model_index.json").read_text(encoding="utf-8"))
    accepted = inspect.signature(cls.__init__).parameters
    activations = getattr(jnp, dtype.activations_dtype.name)
    weights = numpy_dtype(dtype.weights_dtype.name)
    modules: dict[str, Any] = {}
    params: dict[str, Any] = {}
    formats: dict[str, str] = {}
    for name in accepted:
        spec = index.get(name)
        if name in ("self", "dtype", "scheduler"):
            continue
        if name in ("safety_checker", "feature_extractor") and not model.safety_checker:
            modules[name] = None
            continue
        if not isinstance(spec, list) or spec[0] is None:
            if name == "safety_checker":
                raise UserError("model.safety_checker", f"{directory} has no safety checker", "false")
            modules[name] = None
            continue
        module, module_params, fmt = load_component(directory / name, spec[0], component_class(*spec), model,
                                                    activations, weights)
        modules[name] = module
        if module_params is not None:
            params[name], formats[name] = module_params, fmt
    scheduler_class = component_class(*index["scheduler"])
    scheduler, _ = scheduler_class.from_pretrained(directory, subfolder="scheduler")
    pipeline = cls(**modules, scheduler=scheduler, dtype=activations)
    safety = params.pop("safety_checker", None)
    return LoadedModel(pipeline, params, safety, time.perf_counter() - started, str(directory), formats)


def with_scheduler(loaded: LoadedModel, scheduler: DictConfig, prediction_type: Any = None,
                   attention: str = "default"):
    """A pipeline sharing ``loaded``'s modules (the UNet set up for ``attention``) with the configured
    scheduler, and the scheduler's float32 state."""
    from sdjax_runner.models.attention import configure_unet

    overrides = dict(scheduler.config_overrides)
    if prediction_type is not None and "prediction_type" not in overrides:
        overrides["prediction_type"] = getattr(prediction_type, "name", prediction_type)
    sched, state = build_scheduler(scheduler.name, overrides, loaded.path)
    p = loaded.pipeline
    names = [n for n in inspect.signature(type(p).__init__).parameters if n not in ("self", "scheduler", "dtype")]
    modules = {n: getattr(p, n, None) for n in names}
    modules["unet"] = configure_unet(p.unet, attention)
    pipeline = type(p)(**modules, scheduler=sched, dtype=p.dtype)
    return pipeline, to_host(state, np.dtype(np.float32))  # the scheduler state is never cast
