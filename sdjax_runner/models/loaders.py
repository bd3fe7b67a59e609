"""Model config -> a loaded model, whatever its family: the folder is resolved (a built-in model, a local path or
a hub snapshot: :mod:`.sources`), its ``model_index.json`` read as untrusted input (:mod:`.model_index`) and the
pipeline class it names routed to its family's loader (:data:`LOADERS`, each family's package's own:
``families/<name>/models/entry.py``)."""

from __future__ import annotations

import logging
import time
from importlib import import_module
from pathlib import Path
from typing import Optional

from sdjax_runner.config import families
from sdjax_runner.config.schema import DtypeConfig, ModelConfig
from sdjax_runner.families import NAMES
from sdjax_runner.models import model_index, sources
from sdjax_runner.models.family_loader import FamilyLoader
from sdjax_runner.models.loading import LoadedModel

log = logging.getLogger("sdjax_runner")

# Each family's loader is a module of the models layer inside its package (families/<name>/models/entry.py)
LOADERS: dict[str, FamilyLoader] = {name: import_module(f"sdjax_runner.families.{name}.models.entry").LOADER
                                    for name in NAMES}


def load_model(model: ModelConfig, dtype: DtypeConfig, checkpoint_sha256: Optional[str] = None) -> LoadedModel:
    """The pipeline (with the model's own scheduler) and its weights as host arrays, read by its family's
    loader (:data:`LOADERS`). ``checkpoint_sha256``: the plan's hash of ``model.checkpoint``; a file replaced
    since then is refused once its weights are read, so a run is never recorded under the hash of a file it
    did not read."""
    started = time.perf_counter()
    checkpoint = None
    if model.checkpoint:
        checkpoint = families.open_checkpoint(Path(model.checkpoint).expanduser())
        log.info("load: %s (%s single-file checkpoint, %.1f GB) on the configs of %s", checkpoint.path.name,
                 checkpoint.title, checkpoint.path.stat().st_size / 1e9,
                 model.pretrained_model_name_or_path)
    directory = sources.resolve(model, model.allow_pickle, checkpoint)
    index = model_index.read(directory)  # untrusted: checked before anything is imported or loaded
    family = families.family_of(str(index["_class_name"]), directory)
    loaded = LOADERS[family.name].load(directory, index, model, dtype, checkpoint, checkpoint_sha256)
    loaded.load_s = time.perf_counter() - started
    return loaded
