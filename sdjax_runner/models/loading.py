"""A pipeline folder's components -> the runner's modules and their params as host arrays, whatever format the
weights are in; every family's loader (families/sd/models/loading.py, families/flux/models/pipeline.py, families/sd3/models/pipeline.py) reads
its components with these.

Each component folder is read as diffusers' and transformers' ``from_pretrained`` read it: the published class its
``model_index.json`` names becomes the runner's own module (:data:`MODULE_KINDS`) from its ``config.json``; Flax
weights are read whole or in shards, components that only have PyTorch safetensors are converted without torch
(:mod:`.checkpoints`), one at a time; pickles are refused unless ``model.allow_pickle``. Params come back as host
(NumPy) arrays in the requested weights dtype -- ready to be placed from host memory. :class:`LoadedModel` is what a
family's loader returns.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from sdjax_runner.config.families import MODEL_KEY
from sdjax_runner.config.schema import ModelConfig
from sdjax_runner.console import error_line
from sdjax_runner.errors import UserError
from sdjax_runner.models.checkpoints import (
    ComponentWeights,
    WeightsMismatch,
    convert_safetensors,
    convert_tensors,
    find_weights,
    read_flax,
)
from sdjax_runner.models.clip_tokenizer import ClipTokenizer

log = logging.getLogger("sdjax_runner")
# Components whose weight files are at least this big get a line before they load (a full-size UNet is 3.4 GB).
ANNOUNCE_BYTES = 200_000_000
# The CLIP tokenizer classes a folder's model_index.json may name: read with ours (models/clip_tokenizer.py)
CLIP_TOKENIZERS = ("CLIPTokenizer", "CLIPTokenizerFast")



@dataclass(frozen=True)
class ModuleKind:
    """How a published model class is read: ``build(config.json as a dict, dtype)`` makes the runner's own module
    (models/nn, families/sd/models); ``naming``: whose file names and PyTorch parameter names its folder holds (diffusers'
    or transformers', models/nn/pytorch_names.py); ``float32``: it computes in float32 whatever the activations
    dtype (transformers' classes, as diffusers' Flax pipelines load them: only their weights are cast)."""

    build: Callable[[dict, Any], Any]
    naming: str
    float32: bool = False
    computes: str = ""  # what a config it refuses could be instead (the one line's allowed values)


def _unet(config: dict, dtype: Any) -> Any:
    from sdjax_runner.families.sd.models.unet import UNet2DConditionModel, saved_sample_size

    return UNet2DConditionModel.from_config(dict(config, sample_size=saved_sample_size(config)), dtype=dtype)


def _controlnet(config: dict, dtype: Any) -> Any:
    from sdjax_runner.families.sd.models.controlnet import ControlNetModel

    return ControlNetModel.from_config(config, dtype=dtype)


def _vae(config: dict, dtype: Any) -> Any:
    from sdjax_runner.models.nn.vae import AutoencoderKL

    return AutoencoderKL.from_config(config, dtype=dtype)


def _clip_text(with_projection: bool) -> Callable[[dict, Any], Any]:
    def build(config: dict, dtype: Any) -> Any:
        from sdjax_runner.models.nn.clip import CLIPTextModel

        return CLIPTextModel.from_config(config, with_projection=with_projection, dtype=dtype)

    return build


def _t5(config: dict, dtype: Any) -> Any:
    from sdjax_runner.models.nn.t5 import T5EncoderModel

    return T5EncoderModel.from_config(config, dtype=dtype)


def _safety_checker(config: dict, dtype: Any) -> Any:
    from sdjax_runner.families.sd.models.safety_checker import SafetyChecker

    return SafetyChecker.from_config(config, dtype=dtype)


# The published model classes a component may be (model_index.json's name, without "Flax") -> how it is read.
MODULE_KINDS: dict[str, ModuleKind] = {
    "UNet2DConditionModel": ModuleKind(_unet, "diffusers", computes=(
        "a Stable Diffusion 1.x / 2.x / XL UNet (an LCM model's own UNet does not run yet: its LoRA, LCM-LoRA, on the "
        "base model does)")),
    "ControlNetModel": ModuleKind(_controlnet, "diffusers"),
    "AutoencoderKL": ModuleKind(_vae, "diffusers"),
    "CLIPTextModel": ModuleKind(_clip_text(False), "transformers", float32=True),
    "CLIPTextModelWithProjection": ModuleKind(_clip_text(True), "transformers", float32=True),
    "T5EncoderModel": ModuleKind(_t5, "transformers", float32=True),
    "StableDiffusionSafetyChecker": ModuleKind(_safety_checker, "transformers", float32=True),
}
# The other classes a component may be: tokenizers and the safety checker's image preprocessing.
T5_TOKENIZERS = ("T5TokenizerFast", "T5Tokenizer")
IMAGE_PROCESSORS = ("CLIPImageProcessor", "CLIPFeatureExtractor")
READABLE_CLASSES = (*MODULE_KINDS, *CLIP_TOKENIZERS, *T5_TOKENIZERS, *IMAGE_PROCESSORS)


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
    formats: dict[str, str] = field(default_factory=dict)  # component -> "flax", "safetensors", "pickle", "single_file"
    variant_components: tuple[str, ...] = ()  # components whose weights came from model.variant's files
    family: str = "sd"  # its family (config/families.py): how the engine runs it (engine/families.py)

    @property
    def native_size(self) -> int:
        """The height and width the model was made for (its pipeline says: SD's UNet sample size times the VAE's
        factor, FLUX.1's and SD 3's their transformer's)."""
        return int(self.pipeline.native_size)

    @property
    def size_multiple(self) -> int:
        """Height/width must be multiples of this (its pipeline says: the VAE's factor times the UNet's
        down-sampling, or times a transformer's patch size)."""
        return int(self.pipeline.size_multiple)


# The exponent bits of each float format, as an unsigned integer of its width: all set is inf or NaN.
_EXPONENTS = {("float32", 4): 0x7F800000, ("float16", 2): 0x7C00, ("bfloat16", 2): 0x7F80, ("float64", 8): 0x7FF0000000000000}


def non_finite_weights(tree: Any) -> list[str]:
    """The paths (``unet/down_blocks_0/.../kernel``) of the leaves of ``tree`` (host arrays) holding NaN or inf:
    black images would follow, blamed on the guidance. Read as integers (an exponent of all ones), each leaf on a
    thread of its own: a full-size model's gigabytes in about a second."""
    from concurrent.futures import ThreadPoolExecutor

    from flax.traverse_util import flatten_dict

    def bad(leaf: Any) -> bool:
        array = np.asarray(leaf)
        mask = _EXPONENTS.get((array.dtype.name, array.dtype.itemsize))
        if mask is None or array.size == 0:
            return False
        bits = np.ascontiguousarray(array).reshape(-1).view(f"<u{array.dtype.itemsize}")
        magnitude = np.array(~(1 << (8 * array.dtype.itemsize - 1)) & ((1 << 8 * array.dtype.itemsize) - 1), bits.dtype)
        chunk = 1 << 24  # the sign bit cleared, chunk by chunk: inf and NaN are the largest magnitudes
        return any((bits[start:start + chunk] & magnitude).max() >= mask for start in range(0, bits.size, chunk))

    flat = flatten_dict(tree) if isinstance(tree, dict) else {(): tree}
    with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
        flags = list(pool.map(bad, flat.values()))
    return ["/".join(map(str, path)) for path, flag in zip(flat, flags, strict=True) if flag]


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


def read_config(folder: Path, file: str = "config.json") -> dict:
    """A component's JSON config as a dict (ValueError where it is not one: said as the component's)."""
    config = json.loads((folder / file).read_text(encoding="utf-8"))
    if not isinstance(config, dict):
        raise ValueError(f"{folder.name}/{file} is not a JSON object")
    return config


def build_module(folder: Path, class_name: str, activations) -> Any:
    """The runner's module for component ``folder`` (``class_name``: :data:`MODULE_KINDS`), no weights: a config it
    cannot compute is one line."""
    import jax.numpy as jnp

    kind = MODULE_KINDS[class_name]
    config = read_config(folder)
    try:
        return kind.build(config, jnp.float32 if kind.float32 else activations)
    except ValueError as exc:
        raise UserError(MODEL_KEY, f"{folder.name}/config.json: {exc}",
                        kind.computes or f"a {class_name} config the runner computes") from None


def component_dtype(directory: Path, name: str, activations):
    """The dtype component ``name`` computes in: the activations dtype, except a VAE whose config says
    ``force_upcast`` (SDXL's: its decoder overflows float16) decodes in float32 when the activations are
    float16 -- as diffusers' PyTorch pipelines upcast it (``needs_upcasting = self.vae.dtype ==
    torch.float16 and self.vae.config.force_upcast``); bfloat16 is left as it is there too."""
    import jax.numpy as jnp

    if name != "vae" or activations != jnp.float16:
        return activations
    try:
        config = json.loads((directory / name / "config.json").read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return activations  # the component's own load says what is wrong with it
    return jnp.float32 if isinstance(config, dict) and config.get("force_upcast") is True else activations


class WeightChoice(NamedTuple):
    """What load_component reads of a ModelConfig (which weight files it may read), for a component that
    is not one of the model's (a ControlNet)."""

    variant: Optional[str] = None
    allow_pickle: bool = False


def load_component(folder: Path, class_name: str, model: Union[ModelConfig, WeightChoice], activations,
                   weights: np.dtype):
    """(module, host params or None, the weight files read) for one component folder; ``class_name``: the
    published class model_index.json names (without "Flax"), one of :data:`READABLE_CLASSES`."""
    if class_name in CLIP_TOKENIZERS:  # ours: transformers' CLIPTokenizer's ids (models/clip_tokenizer.py)
        return ClipTokenizer.from_folder(folder), None, ComponentWeights("")
    if class_name in T5_TOKENIZERS:  # ours: T5TokenizerFast's ids (models/nn/t5_tokenizer.py)
        from sdjax_runner.models.nn.t5_tokenizer import T5Tokenizer

        return T5Tokenizer.from_folder(folder), None, ComponentWeights("")
    if class_name in IMAGE_PROCESSORS:  # ours: CLIPImageProcessor's pixels (models/nn/clip.py)
        from sdjax_runner.models.nn.clip import CLIPImagePreprocessor

        return (CLIPImagePreprocessor.from_config(read_config(folder, "preprocessor_config.json")), None,
                ComponentWeights(""))
    module = build_module(folder, class_name, activations)
    naming = MODULE_KINDS[class_name].naming
    found = find_weights(folder, naming, model.variant)
    size = sum(f.stat().st_size for f in found.files if f.is_file())
    if size >= ANNOUNCE_BYTES:  # seconds or more: say so before it starts
        log.info("load: %s/ (%.1f GB of %s weights%s) ...", folder.name, size / 1e9, found.format,
                 ", converting to Flax" if found.format == "safetensors" else "")
    try:
        params = _read_weights(folder, found, module, naming, model, weights)
    except WeightsMismatch as exc:
        raise UserError(MODEL_KEY, f"{folder.name}/ does not match its config.json: {exc}") from None
    return module, to_host(params, weights), found


def _read_weights(folder: Path, found: ComponentWeights, module: Any, naming: str,
                  model: Union[ModelConfig, WeightChoice], weights: np.dtype) -> Any:
    """The weights ``found`` in ``folder`` as Flax params of ``module`` (checked against its shapes); PyTorch
    tensors cast to ``weights`` as they are read."""
    if found.format == "flax":
        return read_flax(found.files[0], module, naming)
    if found.format == "safetensors":
        return convert_safetensors(found.files, module, naming, weights)
    if found.format == "pickle":
        names = ", ".join(f.name for f in found.files)
        if not model.allow_pickle:
            raise UserError("model.allow_pickle", f"{folder.name}/ has only pickle weights ({names}); unpickling "
                            "can run code, so they are not loaded", "true to read their tensors anyway: nothing "
                            "in the file is imported or run")
        return convert_tensors(lambda: _pickled_tensors(folder, found.files), module, naming, weights, names)
    raise UserError(MODEL_KEY, f"{folder} has no weights (looked for Flax .msgpack, PyTorch .safetensors "
                    "and, with model.allow_pickle, .bin files)", "a complete diffusers-format pipeline")


def _pickled_tensors(folder: Path, files: tuple[Path, ...]) -> Iterable[tuple[str, Callable[[], np.ndarray]]]:
    """(name, loader) of PyTorch pickles' tensors -- model.allow_pickle=true, the user's choice -- read by
    :mod:`.torch_pickle`, which imports nothing the file names (no torch either)."""
    from sdjax_runner.models import torch_pickle

    try:
        yield from torch_pickle.pickled_tensors(files)
    except torch_pickle.NotAStateDict as exc:
        raise UserError("model.allow_pickle", f"{folder.name}/ is not read: {exc}",
                        "false, with the weights as safetensors") from None


def load_from_checkpoint(folder: Path, name: str, class_name: str, checkpoint, activations,
                         weights: np.dtype, tensors: Optional[Callable[[Any], Iterable]] = None):
    """(module, host params, the checkpoint) for component ``name``: its config from the base model's
    ``folder``, its weights from the single-file ``checkpoint``: ``tensors(module)`` gives its (PyTorch name,
    loader) pairs -- by default the LDM layout's (:mod:`.single_file`)."""
    from sdjax_runner.config import weight_files
    from sdjax_runner.models import single_file

    module = build_module(folder, class_name, activations)
    base = folder.parent
    named = tensors or (lambda module: single_file.component_tensors(checkpoint, name))
    try:
        params = convert_tensors(lambda: named(module), module, MODULE_KINDS[class_name].naming, weights,
                                 f"{checkpoint.path.name} ({name})")
    except ValueError as exc:
        raise UserError(weight_files.KEY, f"does not fit the base model {base} "
                        f"({checkpoint.title} checkpoint): {exc}",
                        "a checkpoint of the base model's architecture (set model.pretrained_model_name_or_path "
                        "to a matching base)") from None
    return module, to_host(params, weights), ComponentWeights("single_file", (checkpoint.path,))


def unloadable(directory: Path, name: str, exc: BaseException) -> UserError:
    """One line for a component folder that cannot be loaded: truncated weights, a config that is
    not JSON, a missing file."""
    detail = error_line(exc, 200)
    return UserError(MODEL_KEY, f"{directory / name}/: cannot be loaded ({type(exc).__name__}: {detail})",
                     "a complete diffusers-format component folder")


def load_component_or_say_why(directory: Path, name: str, class_name: str, model: ModelConfig, activations,
                              weights: np.dtype, checkpoint=None, tensors=None):
    """load_component, or load_from_checkpoint where a single-file ``checkpoint`` gives the component (the family's
    loader passes it for those: ``tensors``, its reader of the file's tensors; by default the LDM layout's)."""
    try:
        if checkpoint is not None:
            return load_from_checkpoint(directory / name, name, class_name, checkpoint, activations, weights,
                                        tensors)
        return load_component(directory / name, class_name, model, activations, weights)
    except UserError:
        raise
    except Exception as exc:  # the folder is input: whatever it holds is one line, never a traceback
        raise unloadable(directory, name, exc) from exc
