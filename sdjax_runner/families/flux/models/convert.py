"""diffusers' PyTorch FLUX weights -> the Flax parameter trees of :mod:`.transformer` and :mod:`.autoencoder`,
with NumPy only (no torch).

The input is a flat ``{PyTorch state-dict name: NumPy array}`` dict, as ``safetensors.numpy.load_file`` reads a
diffusers folder's ``diffusion_pytorch_model*.safetensors`` (:func:`read_safetensors` reads a folder, shards
through their ``.index.json``, with :func:`load_safetensors`: safetensors' NumPy reader does not know bfloat16,
the dtype every published FLUX.1 checkpoint is in). Both modules keep diffusers' module names, so one rule converts both -- the
generic PyTorch -> Flax renaming the runner already uses for SD's UNet and VAE
(:func:`sdjax_runner.models.checkpoints.convert_tensors`, with diffusers' ``rename_key`` /
``rename_key_and_reshape_tensor``): ``name.N`` -> ``name_N``, a Linear's ``weight`` -> ``kernel`` transposed, a
convolution's ``weight`` -> ``kernel`` as HWIO, a norm's ``weight`` -> ``scale``, the VAE attention's ``to_q``
... ``to_out.0`` -> ``query`` ... ``proj_attn``. Unlike ``convert_tensors`` alone (which skips names the module
has no parameter for), these converters refuse a state dict with any unexpected name, as well as missing
parameters and shape mismatches: ``checkpoints.WeightsMismatch`` (a ValueError) naming them.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.models.checkpoints import WeightsMismatch, convert_tensors, param_shapes, safetensors_names
from sdjax_runner.models.nn.pytorch_names import diffusers_param
from sdjax_runner.tensor_files import UnreadableTensors
from sdjax_runner.tensor_files import read_safetensors as read_safetensors_file


def load_safetensors(file: Path) -> dict[str, np.ndarray]:
    """One ``.safetensors`` file as ``{name: array}``, memory-mapped, bfloat16 included
    (:func:`sdjax_runner.tensor_files.read_safetensors`); WeightsMismatch for a file that is not one."""
    try:
        return read_safetensors_file(file)
    except UnreadableTensors as exc:
        raise WeightsMismatch(str(exc)) from None


def read_safetensors(folder: Path, variant: Optional[str] = None) -> dict[str, np.ndarray]:
    """A diffusers component folder's PyTorch safetensors as one flat ``{name: array}`` dict: every shard its
    ``diffusion_pytorch_model.safetensors.index.json`` lists (the variant's first, as diffusers picks them), or
    the single ``diffusion_pytorch_model.safetensors``. With an index, the shards must hold exactly the names of
    its ``weight_map``, each once (WeightsMismatch otherwise). FileNotFoundError if the folder has neither."""
    folder = Path(folder)
    for single, index in safetensors_names("diffusers", variant):
        if (folder / index).is_file():
            weight_map = json.loads((folder / index).read_text(encoding="utf-8"))["weight_map"]
            tensors: dict[str, np.ndarray] = {}
            for shard in sorted(set(weight_map.values())):
                for name, array in load_safetensors(folder / shard).items():
                    if name in tensors:
                        raise WeightsMismatch(f"{folder.name}/: {name} is in more than one shard")
                    tensors[name] = array
            if set(tensors) != set(weight_map):
                missing, extra = set(weight_map) - set(tensors), set(tensors) - set(weight_map)
                raise WeightsMismatch(f"{folder.name}/: the shards do not hold what {index} lists ({len(missing)} "
                                      f"missing, {len(extra)} not listed, e.g. {sorted(missing | extra)[0]})")
            return tensors
        if (folder / single).is_file():
            return load_safetensors(folder / single)
    raise FileNotFoundError(f"{folder} has no diffusion_pytorch_model safetensors")


def _flax_key(name: str, array: np.ndarray, reference: Mapping[tuple, Any], source: str) -> tuple:
    """Where diffusers' generic renaming puts PyTorch ``name`` in a Flax tree with ``reference``'s keys (the same
    rule as checkpoints.convert_tensors uses); WeightsMismatch if it lands on a parameter of another shape."""
    key, value = diffusers_param(name, array, reference)
    if key in reference and tuple(value.shape) != tuple(reference[key].shape):
        raise WeightsMismatch(f"{source}: {name} has shape {tuple(array.shape)}, which as {'/'.join(key)} is "
                              f"{tuple(value.shape)}; the Flax model expects {tuple(reference[key].shape)}")
    return key


def convert_state_dict(state_dict: Mapping[str, np.ndarray], module: Any, dtype: Optional[Any] = None,
                       source: str = "the state dict") -> dict:
    """Flax params for ``module`` (a :class:`FlaxFluxTransformer` or :class:`FlaxFluxAutoencoderKL`) from a flat
    PyTorch ``state_dict``, as host NumPy arrays of ``dtype`` (default: the module's ``param_dtype``, float32
    for the VAE). WeightsMismatch, naming them, for unexpected names (with no parameter of the module), names
    that map to the same parameter, missing parameters or shapes that differ."""
    from flax.traverse_util import flatten_dict

    reference = flatten_dict(param_shapes(module, "diffusers"))
    unexpected: list[str] = []
    seen: dict[tuple, str] = {}
    for name, array in state_dict.items():
        key = _flax_key(name, np.asarray(array), reference, source)
        if key not in reference:
            unexpected.append(name)
        elif key in seen:
            raise WeightsMismatch(f"{source}: {seen[key]} and {name} are both {'/'.join(key)}")
        else:
            seen[key] = name
    if unexpected:
        raise WeightsMismatch(f"{source} has {len(unexpected)} name(s) the Flax model has no parameter for, e.g. "
                              f"{', '.join(sorted(unexpected)[:3])}")
    target = np.dtype(dtype if dtype is not None else getattr(module, "param_dtype", np.float32))

    def tensors():
        return ((name, functools.partial(np.asarray, array)) for name, array in state_dict.items())

    return convert_tensors(tensors, module, "diffusers", target, source)


def convert_transformer(state_dict: Mapping[str, np.ndarray], module: Any, dtype: Optional[Any] = None) -> dict:
    """Flax params for a :class:`~.transformer.FlaxFluxTransformer` from diffusers' ``FluxTransformer2DModel``
    state dict (:func:`convert_state_dict`)."""
    return convert_state_dict(state_dict, module, dtype, "the FLUX transformer's weights")


def convert_vae(state_dict: Mapping[str, np.ndarray], module: Any, dtype: Optional[Any] = None) -> dict:
    """Flax params for a :class:`~.autoencoder.FlaxFluxAutoencoderKL` from diffusers' ``AutoencoderKL`` state
    dict (no quant_conv / post_quant_conv: a state dict that has them is refused as unexpected names)."""
    return convert_state_dict(state_dict, module, dtype, "the FLUX VAE's weights")
