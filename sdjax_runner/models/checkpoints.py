"""Which weight files a pipeline component folder holds, and PyTorch safetensors -> Flax without torch.

A component folder (``unet/``, ``vae/``, ``text_encoder/`` ...) of a diffusers-format pipeline
holds Flax weights (``*.msgpack``), PyTorch weights as safetensors, or PyTorch pickles
(``.bin``/``.ckpt``, which can run code when unpickled). Flax weights are read by the
libraries' own ``from_pretrained``. Safetensors are read tensor by tensor into NumPy and
renamed/transposed to the Flax layout by the libraries' naming rules, written down in
:mod:`.nn.pytorch_names` (``diffusers`` for UNet/VAE, ``transformers`` for CLIP), checked against the module's
parameter shapes (from ``jax.eval_shape``: nothing is initialised), and cast to the weights
dtype as they are read -- so converting a component needs about one copy of its weights.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.folder_files import read_index
from sdjax_runner.files import untrusted
from sdjax_runner.tensor_files import read_safetensors

# Flax and PyTorch file stems, by the library that defines the component.
FLAX_FILES = {"diffusers": "diffusion_flax_model.msgpack", "transformers": "flax_model.msgpack"}
PT_STEMS = {"diffusers": "diffusion_pytorch_model", "transformers": "model"}
MODEL_KEY = "model.pretrained_model_name_or_path"
PICKLE_SUFFIXES = (".bin", ".ckpt", ".pt", ".pth", ".pkl")
# Every weights file a model folder may hold (what the size check and inputs.json count as weights).
WEIGHT_SUFFIXES = (".msgpack", ".safetensors", *PICKLE_SUFFIXES, ".onnx", ".pb", ".h5")
# Memory to read a weights file, as a multiple of its size: a Flax msgpack file is read whole and
# decoded with copies (measured: 2x for the UNet/VAE files this runner reads; transformers' loader held
# 4.3x a text-encoder file at its peak, 2 GB -> 8.6 GB); safetensors are memory-mapped, read per tensor.
MEMORY_FACTORS = {FLAX_FILES["diffusers"]: 2, FLAX_FILES["transformers"]: 4}


@dataclass(frozen=True)
class ComponentWeights:
    format: str  # "flax", "safetensors", "pickle" or "missing"
    files: tuple[Path, ...] = ()


def safetensors_names(library: str, variant: Optional[str]) -> list[tuple[str, str]]:
    """(single file, shard index) names of a component's safetensors, the variant's first. diffusers and
    transformers put the variant before the last suffix: ``diffusion_pytorch_model.fp16.safetensors``,
    ``model.safetensors.index.fp16.json`` (with shards ``model.fp16-00001-of-00002.safetensors``)."""
    stem = PT_STEMS[library]
    names = [(f"{stem}.{variant}.safetensors", f"{stem}.safetensors.index.{variant}.json")] if variant else []
    return names + [(f"{stem}.safetensors", f"{stem}.safetensors.index.json")]


def safetensors_files(folder: Path, library: str, variant: Optional[str]) -> list[Path]:
    """The component's safetensors file(s): the variant's if present, else the plain ones; shards via the index."""
    for single, index in safetensors_names(library, variant):
        if (folder / index).is_file():  # each shard a file beside the index (config/folder_files.py)
            return read_index(folder / index, MODEL_KEY, "a model folder as diffusers and transformers write it")
        if (folder / single).is_file():
            return [folder / single]
    return []


def find_weights(folder: Path, library: str, variant: Optional[str]) -> ComponentWeights:
    """What the component folder offers, in order of preference: Flax, safetensors, pickle."""
    flax = folder / FLAX_FILES[library]
    if flax.is_file() or (folder / f"{FLAX_FILES[library]}.index.json").is_file():
        return ComponentWeights("flax", (flax,))
    tensors = safetensors_files(folder, library, variant)
    if tensors:
        return ComponentWeights("safetensors", tuple(tensors))
    pickles = sorted(p for p in folder.glob("*") if p.suffix in PICKLE_SUFFIXES) if folder.is_dir() else []
    if pickles:
        return ComponentWeights("pickle", tuple(pickles))
    return ComponentWeights("missing")


def shapes_dir() -> Optional[Path]:
    """Where parameter shapes are kept across processes (the process's, from compilation_cache.dir: the
    engine sets it per job; None: not kept)."""
    from sdjax_runner import process

    return process.current().shapes_dir


def param_shapes(module: Any, library: str) -> dict:
    """The module's parameter tree as shapes (jax.eval_shape: no memory, no compute). Tracing a UNet's
    initialisation takes a few hundred ms, so the result is kept in :func:`shapes_dir` under a hash of
    the module's class, config and the library versions."""
    import jax

    folder = shapes_dir()
    path = _shapes_path(module, library)
    if path is not None and folder is not None and os.path.lexists(path) and untrusted(path, folder.parent):
        path.unlink(missing_ok=True)  # another user could have written it: traced again and rewritten below
    if path is not None and path.is_file():
        try:
            from flax.traverse_util import unflatten_dict

            stored = json.loads(path.read_text(encoding="utf-8"))
            return unflatten_dict({tuple(k.split("/")): jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))
                                   for k, (shape, dtype) in stored.items()})
        except (OSError, ValueError, TypeError, AttributeError):
            pass  # damaged: traced again and rewritten below
    shapes = jax.eval_shape(module.init_weights, jax.random.PRNGKey(0))
    if path is not None:
        _keep_shapes(path, shapes)
    return shapes


def config_dict(module: Any) -> Any:
    """A module's config as a plain dict (transformers' or diffusers' config), or None."""
    config = getattr(module, "config", None)
    if config is None:
        return None
    return config.to_dict() if hasattr(config, "to_dict") else dict(config)


def _shapes_path(module: Any, library: str) -> Optional[Path]:
    folder = shapes_dir()
    if folder is None:
        return None
    import hashlib

    from sdjax_runner.versions import package_versions

    facts = [type(module).__module__, type(module).__qualname__, library, str(getattr(module, "dtype", "")),
             config_dict(module), package_versions()]
    try:
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()
    except (TypeError, ValueError):
        return None
    return folder / f"{digest}.json"


def _keep_shapes(path: Path, shapes: dict) -> None:
    from flax.traverse_util import flatten_dict

    from sdjax_runner.files import private_folder, write_private

    flat = flatten_dict(shapes)
    if any("/" in part for key in flat for part in key):
        return  # not representable in this format
    try:
        private_folder(path.parent)
        write_private(path, json.dumps({"/".join(k): [list(v.shape), str(v.dtype)] for k, v in flat.items()}).encode())
    except OSError:
        pass  # not kept: the next process traces again


class WeightsMismatch(ValueError):
    """Weights that were read but do not fit the module's parameters."""


def _fitted(reference: dict, tensors: Iterable[tuple[tuple, np.ndarray, str]], source: str,
            dtype: Optional[np.dtype] = None) -> dict:
    """``(Flax path, array, name in the file)`` items checked against the module's ``reference``
    shapes (flattened), cast to ``dtype`` if given; items the module has no parameter for are
    skipped (buffers such as position_ids, heads the Flax module does not have). Raises
    WeightsMismatch naming the first tensor whose shape does not fit, or the parameters ``source`` lacks."""
    from flax.traverse_util import unflatten_dict

    params: dict[tuple, np.ndarray] = {}
    for key, value, name in tensors:
        if key not in reference:
            continue
        if value.shape != reference[key].shape:
            raise WeightsMismatch(f"{source}: {name} has shape {value.shape}, the Flax model expects "
                                  f"{reference[key].shape}")
        # (np.asarray, not np.ascontiguousarray: that one makes a 0-d array -- CLIP's logit_scale -- 1-d)
        params[key] = value if dtype is None else np.asarray(value, dtype=dtype, order="C")
    missing = sorted("/".join(k) for k in reference if k not in params)
    if missing:
        raise WeightsMismatch(f"{len(missing)} parameter(s) not in {source}, e.g. {', '.join(missing[:3])}")
    return unflatten_dict(params)


def _against_shapes(module: Any, library: str, use: Callable[[dict], Any]) -> Any:
    """``use(reference)`` with the module's flattened parameter shapes. Where they came from a stored shape
    record and the weights do not fit, the record is dropped and the shapes traced again, once: a record
    that is valid but wrong is the cache's fault, and must not be blamed on the model."""
    from flax.traverse_util import flatten_dict

    path = _shapes_path(module, library)
    from_record = path is not None and path.is_file()
    try:
        return use(flatten_dict(param_shapes(module, library)))
    except ValueError:
        if not from_record or path is None:
            raise
        path.unlink(missing_ok=True)
        return use(flatten_dict(param_shapes(module, library)))


def convert_tensors(tensors: Callable[[], Iterable[tuple[str, Callable[[], np.ndarray]]]], module: Any, library: str,
                    dtype: np.dtype, source: str) -> dict:
    """Flax params for ``module`` from ``(PyTorch name, loader)`` pairs (``tensors()`` gives them), as host
    arrays of ``dtype`` (each tensor is loaded, renamed, checked and cast in turn; WeightsMismatch if they
    do not fit)."""
    from sdjax_runner.models.nn.pytorch_names import PARAM_RULES

    rule = PARAM_RULES[library]

    def use(reference: dict) -> dict:
        renamed = ((*rule(pt_key, load(), reference), pt_key) for pt_key, load in tensors())
        return _fitted(reference, renamed, source, dtype)

    return _against_shapes(module, library, use)


def check_flax_size(file: Path, reference: dict) -> None:
    """A msgpack file is read whole (and decoded with copies): one far larger than the parameters of
    ``reference`` (flattened shapes) describe is refused unread (WeightsMismatch). (Transformers'
    own loader, for text encoders, is bounded by model_index.check_sizes alone.)"""
    expected = sum(int(np.prod(shape.shape)) * 4 for shape in reference.values())  # as float32
    size = file.stat().st_size
    if size > 2 * expected + 2**24:  # float64 at most, and msgpack's few bytes per array
        raise WeightsMismatch(f"{file.name} has {size} bytes, far more than the {expected} bytes of float32 "
                              "parameters the config describes; it is not read")


def read_flax(file: Path, module: Any, library: str) -> dict:
    """A Flax weights file (msgpack; or, where ``file`` is absent, the shards its ``.index.json`` lists, as
    transformers writes a large model's) as host arrays, checked against ``module``'s parameter shapes
    (WeightsMismatch). What the libraries' ``from_pretrained`` does, less the copy of every array onto a device
    and back."""
    from flax.serialization import msgpack_restore
    from flax.traverse_util import flatten_dict

    index = file.with_name(file.name + ".index.json")
    shards = [file] if file.is_file() or not index.is_file() else \
        read_index(index, MODEL_KEY, "a model folder as transformers writes it")

    def use(reference: dict) -> dict:
        stored: dict[tuple, Any] = {}
        for shard in shards:  # transformers' shards hold "a/b/c" keys, whole files nested ones: both flattened
            check_flax_size(shard, reference)
            for key, value in flatten_dict(msgpack_restore(shard.read_bytes())).items():
                stored[tuple(part for name in key for part in str(name).split("/"))] = value
        return _fitted(reference, ((key, value, "/".join(key)) for key, value in stored.items()), file.name)

    return _against_shapes(module, library, use)


def _file_tensors(files: tuple[Path, ...]) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(PyTorch name, loader) of every tensor of ``files``, memory-mapped: a tensor is read (copied into memory)
    when its loader is called; bfloat16 files too (sdjax_runner/tensor_files.py)."""
    for file in files:
        for pt_key, view in read_safetensors(file).items():
            yield pt_key, functools.partial(np.array, view)


def convert_safetensors(files: tuple[Path, ...], module: Any, library: str, dtype: np.dtype) -> dict:
    """Flax params for ``module`` from PyTorch-layout safetensors ``files``, as host arrays of ``dtype``."""
    return convert_tensors(lambda: _file_tensors(files), module, library, dtype, ", ".join(f.name for f in files))
