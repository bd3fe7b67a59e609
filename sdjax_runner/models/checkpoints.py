"""Which weight files a pipeline component folder holds, and PyTorch safetensors -> Flax without torch.

A component folder (``unet/``, ``vae/``, ``text_encoder/`` ...) of a diffusers-format pipeline
holds Flax weights (``*.msgpack``), PyTorch weights as safetensors, or PyTorch pickles
(``.bin``/``.ckpt``, which can run code when unpickled). Flax weights are read by the
libraries' own ``from_pretrained``. Safetensors are read tensor by tensor into NumPy and
renamed/transposed to the Flax layout with the libraries' own renaming rules
(``diffusers`` for UNet/VAE, ``transformers`` for CLIP), checked against the module's
parameter shapes (from ``jax.eval_shape``: nothing is initialised), and cast to the weights
dtype as they are read -- so converting a component needs about one copy of its weights.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Iterable, Iterator, Optional

import numpy as np

# Flax and PyTorch file stems, by the library that defines the component.
FLAX_FILES = {"diffusers": "diffusion_flax_model.msgpack", "transformers": "flax_model.msgpack"}
PT_STEMS = {"diffusers": "diffusion_pytorch_model", "transformers": "model"}
PICKLE_SUFFIXES = (".bin", ".ckpt", ".pt", ".pth", ".pkl")


@dataclass(frozen=True)
class ComponentWeights:
    format: str  # "flax", "safetensors", "pickle" or "missing"
    files: tuple[Path, ...] = ()


def safetensors_files(folder: Path, library: str, variant: Optional[str]) -> list[Path]:
    """The component's safetensors file(s): the variant's if present, else the plain ones; shards via the index."""
    stem = PT_STEMS[library]
    for name in ([f"{stem}.{variant}"] if variant else []) + [stem]:
        index = folder / f"{name}.safetensors.index.json"
        if index.is_file():
            weight_map = json.loads(index.read_text(encoding="utf-8"))["weight_map"]
            return [folder / f for f in sorted(set(weight_map.values()))]
        if (folder / f"{name}.safetensors").is_file():
            return [folder / f"{name}.safetensors"]
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


# Where parameter shapes are kept across processes (set from compilation_cache.dir; None: not kept).
SHAPES_DIR: Optional[Path] = None


def param_shapes(module: Any, library: str) -> dict:
    """The module's parameter tree as shapes (jax.eval_shape: no memory, no compute). Tracing a UNet's
    initialisation takes a few hundred ms, so the result is kept in ``SHAPES_DIR`` under a hash of
    the module's class, config and the library versions."""
    import jax

    path = _shapes_path(module, library) if SHAPES_DIR is not None else None
    if path is not None and path.is_file():
        try:
            from flax.traverse_util import unflatten_dict

            stored = json.loads(path.read_text(encoding="utf-8"))
            return unflatten_dict({tuple(k.split("/")): jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))
                                   for k, (shape, dtype) in stored.items()})
        except (OSError, ValueError, TypeError, AttributeError):
            pass  # damaged: traced again and rewritten below
    key = jax.random.PRNGKey(0)
    if library == "transformers":  # CLIP text encoders take the token shape
        shapes = jax.eval_shape(lambda k: module.init_weights(k, (1, module.config.max_position_embeddings)), key)
    else:
        shapes = jax.eval_shape(module.init_weights, key)
    if path is not None:
        _keep_shapes(path, shapes)
    return shapes


def _shapes_path(module: Any, library: str) -> Optional[Path]:
    import hashlib

    from sdjax_runner.record.provenance import package_versions

    config = module.config.to_dict() if hasattr(module.config, "to_dict") else dict(module.config)
    facts = [type(module).__module__, type(module).__qualname__, library, str(getattr(module, "dtype", "")), config,
             package_versions()]
    try:
        digest = hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()
    except (TypeError, ValueError):
        return None
    return SHAPES_DIR / f"{digest}.json"


def _keep_shapes(path: Path, shapes: dict) -> None:
    import os

    from flax.traverse_util import flatten_dict

    flat = {"/".join(k): [list(v.shape), str(v.dtype)] for k, v in flatten_dict(shapes).items()}
    if any("/" in part for k in flatten_dict(shapes) for part in k):
        return  # not representable in this format
    tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_text(json.dumps(flat), encoding="utf-8")
        os.replace(tmp, path)
    except OSError:
        tmp.unlink(missing_ok=True)


def _flax_key(pt_key: str, tensor: np.ndarray, reference: dict, library: str, prefix: str) -> tuple[tuple, np.ndarray]:
    if library == "diffusers":
        from diffusers.models.modeling_flax_pytorch_utils import rename_key, rename_key_and_reshape_tensor

        return rename_key_and_reshape_tensor(tuple(rename_key(pt_key).split(".")), tensor, reference)
    from transformers.modeling_flax_pytorch_utils import rename_key_and_reshape_tensor

    return rename_key_and_reshape_tensor(tuple(pt_key.split(".")), tensor, reference, prefix)


def convert_tensors(tensors: Iterable[tuple[str, Callable[[], np.ndarray]]], module: Any, library: str,
                    dtype: np.dtype, source: str) -> dict:
    """Flax params for ``module`` from ``(PyTorch name, loader)`` pairs, as host arrays of ``dtype``
    (each tensor is loaded, renamed, checked and cast in turn).

    Raises ValueError naming the first tensor whose shape does not match, or the parameters
    ``source`` lacks."""
    from flax.traverse_util import flatten_dict, unflatten_dict

    reference = flatten_dict(param_shapes(module, library))
    prefix = getattr(module, "base_model_prefix", "")
    params: dict[tuple, np.ndarray] = {}
    for pt_key, load in tensors:
        key, value = _flax_key(pt_key, load(), reference, library, prefix)
        if key not in reference:
            continue  # buffers such as position_ids, or heads the Flax module does not have
        if value.shape != reference[key].shape:
            raise ValueError(f"{source}: {pt_key} has shape {value.shape}, the Flax model expects {reference[key].shape}")
        params[key] = np.ascontiguousarray(value, dtype=dtype)
    missing = sorted("/".join(k) for k in reference if k not in params)
    if missing:
        raise ValueError(f"{len(missing)} parameter(s) not in {source}, e.g. {', '.join(missing[:3])}")
    return unflatten_dict(params)


class WeightsMismatch(ValueError):
    """Weights that were read but do not fit the module's parameters."""


def read_flax(file: Path, module: Any, library: str) -> dict:
    """A Flax weights file (msgpack) as host arrays, checked against ``module``'s parameter shapes
    (WeightsMismatch). What diffusers' ``from_pretrained`` does, less the copy of every array onto a
    device and back."""
    from flax.serialization import msgpack_restore
    from flax.traverse_util import flatten_dict, unflatten_dict

    reference = flatten_dict(param_shapes(module, library))
    stored = flatten_dict(msgpack_restore(file.read_bytes()))
    params = {}
    for key, shape in reference.items():
        if key not in stored:
            missing = [k for k in reference if k not in stored]
            raise WeightsMismatch(f"{len(missing)} parameter(s) not in {file.name}, e.g. "
                             f"{', '.join('/'.join(k) for k in missing[:3])}")
        if stored[key].shape != shape.shape:
            raise WeightsMismatch(f"{file.name}: {'/'.join(key)} has shape {stored[key].shape}, the model expects {shape.shape}")
        params[key] = stored[key]
    return unflatten_dict(params)


def _file_tensors(files: tuple[Path, ...]) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    from safetensors import safe_open

    for file in files:
        with safe_open(str(file), framework="numpy") as tensors:
            for pt_key in tensors.keys():
                yield pt_key, (lambda tensors=tensors, pt_key=pt_key: tensors.get_tensor(pt_key))


def convert_safetensors(files: tuple[Path, ...], module: Any, library: str, dtype: np.dtype) -> dict:
    """Flax params for ``module`` from PyTorch-layout safetensors ``files``, as host arrays of ``dtype``."""
    return convert_tensors(_file_tensors(files), module, library, dtype, ", ".join(f.name for f in files))
