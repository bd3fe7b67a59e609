"""Load a pipeline and its params the way the guide does, through from_pretrained.

Built-in models are first built into the cache; every model then takes the
same path a hub model takes. Params come back as host (NumPy) arrays in the
requested weights dtype -- ready to be replicated from host memory -- and the
scheduler state stays float32.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from omegaconf import DictConfig

from sdjax_runner.errors import UserError
from sdjax_runner.schedulers import build_scheduler
from sdjax_runner.tiny_model import TINY_RANDOM, build_tiny_pipeline

MODEL_PARAM_GROUPS = ("unet", "vae", "text_encoder", "safety_checker")


@dataclass
class LoadedModel:
    pipeline: Any
    params: dict  # host arrays of unet, vae, text_encoder (and safety_checker); no scheduler state
    load_s: float
    path: str

    @property
    def weights(self) -> dict:
        """The params the generate function takes (the safety checker runs apart, on the host)."""
        return {k: v for k, v in self.params.items() if k != "safety_checker"}

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


def resolve_path(model: DictConfig) -> str:
    path = str(model.pretrained_model_name_or_path)
    if model.builtin == TINY_RANDOM:
        return str(build_tiny_pipeline(Path(path).expanduser()))
    return str(Path(path).expanduser()) if path.startswith("~") else path


def load_model(model: DictConfig, dtype: DictConfig) -> LoadedModel:
    """The pipeline (with the model's own scheduler) and its weights as host arrays."""
    import jax.numpy as jnp
    from diffusers import FlaxStableDiffusionPipeline

    started = time.perf_counter()
    path = resolve_path(model)
    kwargs: dict[str, Any] = {"dtype": getattr(jnp, dtype.activations_dtype.name)}
    if model.revision:
        kwargs["revision"] = model.revision
    if model.variant:
        kwargs["variant"] = model.variant
    if not model.safety_checker:
        kwargs.update(safety_checker=None, feature_extractor=None)
    try:
        pipeline, params = FlaxStableDiffusionPipeline.from_pretrained(path, **kwargs)
    except ValueError as exc:
        if "safety_checker" in str(exc) and model.safety_checker:
            raise UserError("model.safety_checker", f"{path} has no safety checker", "false") from None
        raise
    weights = numpy_dtype(dtype.weights_dtype.name)
    host_params = {name: to_host(tree, weights) for name, tree in params.items() if name in MODEL_PARAM_GROUPS}
    return LoadedModel(pipeline, host_params, time.perf_counter() - started, path)


def with_scheduler(loaded: LoadedModel, scheduler: DictConfig, revision: str | None):
    """A pipeline sharing ``loaded``'s modules with the configured scheduler, and its float32 state."""
    sched, state = build_scheduler(scheduler.name, dict(scheduler.config_overrides), loaded.path, revision)
    p = loaded.pipeline
    pipeline = type(p)(vae=p.vae, text_encoder=p.text_encoder, tokenizer=p.tokenizer, unet=p.unet, scheduler=sched,
                       safety_checker=p.safety_checker, feature_extractor=p.feature_extractor, dtype=p.dtype)
    return pipeline, to_host(state, np.dtype(np.float32))  # the scheduler state is never cast
