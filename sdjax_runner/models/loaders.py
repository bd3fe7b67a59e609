"""Model config -> a loaded model, whatever its family: the folder is resolved (a built-in model, a local path or
a hub snapshot: :mod:`.sources`), its ``model_index.json`` read as untrusted input (:mod:`.model_index`) and the
pipeline class it names routed to its family's loader (:data:`LOADERS`; config/families.py names the families):
the SD family's in :mod:`.sd.loading`, FLUX.1's in :mod:`.flux.pipeline`, SD 3's in :mod:`.sd3.pipeline`."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.config import families
from sdjax_runner.config.schema import DtypeConfig, ModelConfig
from sdjax_runner.models import model_index, sources
from sdjax_runner.models.flux import pipeline as flux
from sdjax_runner.models.flux.pipeline import load_flux
from sdjax_runner.models.loading import LoadedModel
from sdjax_runner.models.sd import loading as sd
from sdjax_runner.models.sd.loading import load_sd
from sdjax_runner.models.sd3.pipeline import load_sd3

log = logging.getLogger("sdjax_runner")



@dataclass(frozen=True)
class FamilyLoader:
    """How one model family (config/families.py) is read from disk."""

    # (folder, its model_index.json, model config, dtype, opened single-file checkpoint or None, its planned hash)
    # -> LoadedModel
    load: Callable[..., LoadedModel]
    # (a diffusers VAE folder, the activations dtype, the weights' NumPy dtype) -> (module, host weights): another
    # VAE for a loaded model, as a folder (model.vae: models/vae_swap.py)
    read_vae_folder: Callable[[Path, Any, np.dtype], tuple[Any, dict]]
    # (the model's own VAE module, a single file's tensors under diffusers' names, the weights' dtype, the file's
    # name) -> host weights: another VAE as one file
    vae_from_state: Callable[[Any, dict, np.dtype, str], dict]


LOADERS = {"sd": FamilyLoader(load_sd, sd.read_vae_folder, sd.vae_from_state),
           "flux": FamilyLoader(load_flux, flux.read_vae_folder, flux.vae_from_state),
           # SD 3's VAE is FLUX.1's module (16 latent channels, no quant convs), read alike
           "sd3": FamilyLoader(load_sd3, flux.read_vae_folder, flux.vae_from_state)}
if tuple(LOADERS) != tuple(families.FAMILIES):
    raise RuntimeError(f"models/loaders loads {tuple(LOADERS)}, config/families.py lists {tuple(families.FAMILIES)}")


def load_model(model: ModelConfig, dtype: DtypeConfig, checkpoint_sha256: Optional[str] = None) -> LoadedModel:
    """The pipeline (with the model's own scheduler) and its weights as host arrays, read by its family's
    loader (:data:`LOADERS`). ``checkpoint_sha256``: the plan's hash of ``model.checkpoint``; a file replaced
    since then is refused once its weights are read, so a run is never recorded under the hash of a file it
    did not read."""
    started = time.perf_counter()
    checkpoint = None
    if model.checkpoint:
        from sdjax_runner.config.weight_files import ARCHITECTURES, open_checkpoint

        checkpoint = open_checkpoint(Path(model.checkpoint).expanduser())
        log.info("load: %s (%s single-file checkpoint, %.1f GB) on the configs of %s", checkpoint.path.name,
                 ARCHITECTURES[checkpoint.architecture], checkpoint.path.stat().st_size / 1e9,
                 model.pretrained_model_name_or_path)
    directory = sources.resolve(model, model.allow_pickle, checkpoint)
    index = model_index.read(directory)  # untrusted: checked before anything is imported or loaded
    family = families.family_of(str(index["_class_name"]), directory)
    loaded = LOADERS[family.name].load(directory, index, model, dtype, checkpoint, checkpoint_sha256)
    loaded.load_s = time.perf_counter() - started
    return loaded
