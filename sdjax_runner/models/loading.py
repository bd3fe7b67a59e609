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

import importlib.util
import inspect
import json
import logging
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple, Optional, Union

import numpy as np

from sdjax_runner.config.schema import DtypeConfig, ModelConfig, SchedulerConfig
from sdjax_runner.console import error_line
from sdjax_runner.errors import UserError
from sdjax_runner.models import model_index, sources
from sdjax_runner.models.checkpoints import (
    ComponentWeights,
    WeightsMismatch,
    convert_safetensors,
    convert_tensors,
    find_weights,
    read_flax,
)
from sdjax_runner.models.clip_tokenizer import ClipTokenizer
from sdjax_runner.models.schedulers import build_scheduler

log = logging.getLogger("sdjax_runner")
# Components whose weight files are at least this big get a line before they load (a full-size UNet is 3.4 GB).
ANNOUNCE_BYTES = 200_000_000
# The CLIP tokenizer classes a folder's model_index.json may name: read with ours (models/clip_tokenizer.py)
CLIP_TOKENIZERS = ("CLIPTokenizer", "CLIPTokenizerFast")

# The components a single-file checkpoint (model.checkpoint) holds the weights of.
CHECKPOINT_COMPONENTS = ("unet", "vae", "text_encoder", "text_encoder_2")
# model_index.json's pipeline class (with or without "Flax") -> the Flax pipeline that runs it, for the SD
# family (config/families.py). An inpainting model's pipeline (runwayml/stable-diffusion-inpainting) holds the
# same components: the runner reads its modules and runs its own program (engine/modes/inpaint.py).
PIPELINES = {"StableDiffusionPipeline": "FlaxStableDiffusionPipeline",
             "StableDiffusionInpaintPipeline": "FlaxStableDiffusionPipeline",
             "StableDiffusionXLPipeline": "FlaxStableDiffusionXLPipeline",
             "StableDiffusionXLInpaintPipeline": "FlaxStableDiffusionXLPipeline"}


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
        """The height and width the model was made for: an SD UNet's sample_size x the VAE's factor; a
        pipeline of the runner's own (FLUX.1's) says its own."""
        if self.family != "sd":
            return int(self.pipeline.native_size)
        return self.pipeline.unet.config.sample_size * self.pipeline.vae_scale_factor

    @property
    def size_multiple(self) -> int:
        """Height/width must be multiples of this: VAE factor x the UNet's down-sampling (FLUX.1: x its 2x2
        packing)."""
        if self.family != "sd":
            return int(self.pipeline.size_multiple)
        levels = len(self.pipeline.unet.config.block_out_channels)
        return self.pipeline.vae_scale_factor * 2 ** (levels - 1)


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


def pipeline_class(directory: Path, index: dict):
    """The Flax pipeline class that runs an SD-family folder (config/families.py checked the name)."""
    import diffusers

    return getattr(diffusers, PIPELINES[index["_class_name"].removeprefix("Flax")])


def component_kinds() -> tuple[type, ...]:
    """What a pipeline component may be: a Flax model (diffusers' or transformers'), a tokenizer, a
    feature extractor or image processor, or a scheduler."""
    from diffusers import FlaxModelMixin
    from diffusers.schedulers.scheduling_utils_flax import FlaxSchedulerMixin
    from transformers import FlaxPreTrainedModel, PreTrainedTokenizerBase
    from transformers.feature_extraction_utils import FeatureExtractionMixin
    from transformers.image_processing_base import ImageProcessingMixin

    return (FlaxModelMixin, FlaxPreTrainedModel, PreTrainedTokenizerBase, FeatureExtractionMixin,
            ImageProcessingMixin, FlaxSchedulerMixin)


def from_config(cls, folder: Path, activations):
    """``cls`` built from ``folder``'s config, no weights (they come from a file read apart)."""
    from diffusers import FlaxModelMixin

    if issubclass(cls, FlaxModelMixin):
        return cls.from_config(cls.load_config(folder), dtype=activations)
    return cls(cls.config_class.from_pretrained(folder), _do_init=False)


def check_unet_config(folder: Path, cls) -> None:
    """A UNet config the Flax UNet would run wrongly -- settings it ignores, weights it would drop -- is one line
    (models/unet_config.py). Other components: nothing to check."""
    from sdjax_runner.models.unet_config import unsupported

    if cls.__name__ != "FlaxUNet2DConditionModel":
        return
    found = unsupported(cls.load_config(folder))
    if found:
        raise UserError(sources.KEY, f"{folder.name}/config.json sets {found[0]}, which the Flax UNet does not compute"
                        + (f" (and {len(found) - 1} more)" if len(found) > 1 else ""),
                        "a Stable Diffusion 1.x / 2.x / XL UNet (an LCM model's own UNet does not run yet: its LoRA, "
                        "LCM-LoRA, on the base model does)")


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


def load_component(folder: Path, library: str, cls, model: Union[ModelConfig, WeightChoice], activations,
                   weights: np.dtype):
    """(module, host params or None, the weight files read) for one component folder."""
    from diffusers import FlaxModelMixin
    from transformers import FlaxPreTrainedModel

    is_diffusers = issubclass(cls, FlaxModelMixin)
    if cls.__name__ in CLIP_TOKENIZERS:  # ours: transformers' CLIPTokenizer's ids (models/clip_tokenizer.py)
        return ClipTokenizer.from_folder(folder), None, ComponentWeights("")
    if not (is_diffusers or issubclass(cls, FlaxPreTrainedModel)):
        return cls.from_pretrained(folder), None, ComponentWeights("")  # a feature extractor, T5's tokenizer
    check_unet_config(folder, cls)
    found = find_weights(folder, "diffusers" if is_diffusers else "transformers", model.variant)
    size = sum(f.stat().st_size for f in found.files if f.is_file())
    if size >= ANNOUNCE_BYTES:  # seconds or more: say so before it starts
        log.info("load: %s/ (%.1f GB of %s weights%s) ...", folder.name, size / 1e9, found.format,
                 ", converting to Flax" if found.format == "safetensors" else "")
    if found.format == "flax" and is_diffusers and found.files[0].is_file():  # one file, not shards
        module = from_config(cls, folder, activations)
        try:
            params = read_flax(found.files[0], module, "diffusers")
        except WeightsMismatch as exc:
            raise UserError(sources.KEY, f"{folder.name}/ does not match its config.json: {exc}") from None
    elif found.format == "flax":
        # As diffusers' FlaxDiffusionPipeline.from_pretrained does: transformers models keep their own dtype.
        module, params = (cls.from_pretrained(folder, dtype=activations) if is_diffusers
                          else cls.from_pretrained(folder, _do_init=False))
    elif found.format == "safetensors":
        module = from_config(cls, folder, activations)
        try:
            params = convert_safetensors(found.files, module, "diffusers" if is_diffusers else "transformers", weights)
        except ValueError as exc:
            raise UserError(sources.KEY, f"{folder.name}/ does not match its config.json: {exc}") from None
    elif found.format == "pickle":
        names = ", ".join(f.name for f in found.files)
        if not model.allow_pickle:
            raise UserError("model.allow_pickle", f"{folder.name}/ has only pickle weights ({names}); unpickling "
                            "can run code, so they are not loaded", "true to load them anyway (needs torch)")
        if importlib.util.find_spec("torch") is None:
            raise UserError("model.allow_pickle", f"loading {folder.name}/{names} needs torch, which is not installed",
                            "pip install torch, or convert the weights to safetensors")
        if is_diffusers:
            module, params = cls.from_pretrained(folder, dtype=activations, from_pt=True)
        else:
            module = cls.from_pretrained(folder, from_pt=True)
            params = module.params
    else:
        raise UserError(sources.KEY, f"{folder} has no weights (looked for Flax .msgpack, PyTorch .safetensors "
                        "and, with model.allow_pickle, .bin files)", "a complete diffusers-format pipeline")
    return module, to_host(params, weights), found


def load_from_checkpoint(folder: Path, name: str, library: str, cls, checkpoint, activations,
                         weights: np.dtype, tensors: Optional[Callable[[Any], Iterable]] = None):
    """(module, host params, the checkpoint) for component ``name``: its config from the base model's
    ``folder``, its weights from the single-file ``checkpoint``: ``tensors(module)`` gives its (PyTorch name,
    loader) pairs -- by default the LDM layout's (:mod:`.single_file`)."""
    from diffusers import FlaxModelMixin

    from sdjax_runner.config import weight_files
    from sdjax_runner.models import single_file

    is_diffusers = issubclass(cls, FlaxModelMixin)
    check_unet_config(folder, cls)
    module = from_config(cls, folder, activations)
    base = folder.parent
    named = tensors or (lambda module: single_file.component_tensors(checkpoint, name))
    try:
        params = convert_tensors(lambda: named(module), module,
                                 "diffusers" if is_diffusers else "transformers", weights,
                                 f"{checkpoint.path.name} ({name})")
    except ValueError as exc:
        raise UserError(weight_files.KEY, f"does not fit the base model {base} "
                        f"({weight_files.ARCHITECTURES[checkpoint.architecture]} checkpoint): {exc}",
                        "a checkpoint of the base model's architecture (set model.pretrained_model_name_or_path "
                        "to a matching base)") from None
    return module, to_host(params, weights), ComponentWeights("single_file", (checkpoint.path,))


def unloadable(directory: Path, name: str, exc: BaseException) -> UserError:
    """One line for a component folder that cannot be loaded: truncated weights, a config that is
    not JSON, a missing file."""
    detail = error_line(exc, 200)
    return UserError(sources.KEY, f"{directory / name}/: cannot be loaded ({type(exc).__name__}: {detail})",
                     "a complete diffusers-format component folder")


def load_component_or_say_why(directory: Path, name: str, library: str, cls, model: ModelConfig, activations,
                              weights: np.dtype, checkpoint=None, tensors=None):
    """load_component, or load_from_checkpoint where a single-file ``checkpoint`` gives the component (SD's: by
    :data:`CHECKPOINT_COMPONENTS`; another family passes ``tensors``, its reader of the file's tensors)."""
    try:
        if checkpoint is not None and (tensors is not None or name in CHECKPOINT_COMPONENTS):
            return load_from_checkpoint(directory / name, name, library, cls, checkpoint, activations, weights,
                                        tensors)
        return load_component(directory / name, library, cls, model, activations, weights)
    except UserError:
        raise
    except Exception as exc:  # the folder is input: whatever it holds is one line, never a traceback
        raise unloadable(directory, name, exc) from exc


def load_sd(directory: Path, index: dict, model: ModelConfig, dtype: DtypeConfig, checkpoint: Any,
            checkpoint_sha256: Optional[str]) -> LoadedModel:
    """An SD 1.x/2.x/XL pipeline folder read component by component; ``checkpoint``: the opened single-file
    checkpoint whose weights replace the folder's (model.checkpoint), or None."""
    import jax.numpy as jnp

    if checkpoint is not None:
        from sdjax_runner.models import single_file

        checkpoint = single_file.on_base(checkpoint, directory)
        extra = single_file.unrecognised(checkpoint)
        if extra:
            log.warning("model.checkpoint: %d tensor(s) of %s are not weights of this pipeline and are not "
                        "used, e.g. %s", len(extra), checkpoint.path.name, ", ".join(extra[:3]))
    cls = pipeline_class(directory, index)
    kinds = component_kinds()
    accepted = inspect.signature(cls.__init__).parameters
    activations = getattr(jnp, dtype.activations_dtype.name)
    weights = numpy_dtype(dtype.weights_dtype.name)
    modules: dict[str, Any] = {}
    params: dict[str, Any] = {}
    formats: dict[str, str] = {}
    variant_components = []
    for name in accepted:
        if name in ("self", "dtype", "scheduler"):
            continue
        if name in ("safety_checker", "feature_extractor") and not model.safety_checker:
            modules[name] = None
            continue
        spec = model_index.entry(directory, index, name)
        if spec is None:
            if name == "safety_checker":
                raise UserError("model.safety_checker", f"{directory} has no safety checker", "false")
            modules[name] = None
            continue
        component = model_index.component_class(directory, name, *spec, kinds)
        if name == "safety_checker":  # diffusers' own fails on current JAX (models/safety_checker.py)
            from sdjax_runner.models.safety_checker import REPLACEMENTS

            component = REPLACEMENTS.get(component, component)
        module, module_params, found = load_component_or_say_why(directory, name, spec[0], component, model,
                                                                 component_dtype(directory, name, activations),
                                                                 weights, checkpoint)
        modules[name] = module
        if module_params is not None:
            params[name], formats[name] = module_params, found.format
            if model.variant and any(f".{model.variant}." in f.name for f in found.files):
                variant_components.append(name)
    spec = model_index.entry(directory, index, "scheduler")
    if spec is None:
        raise UserError(sources.KEY, f"{directory / model_index.FILE} names no scheduler", "a complete pipeline folder")
    scheduler_class = model_index.component_class(directory, "scheduler", *spec, kinds)
    try:
        scheduler, _ = scheduler_class.from_pretrained(directory, subfolder="scheduler")
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise unloadable(directory, "scheduler", exc) from exc
    if checkpoint is not None and checkpoint_sha256 is not None:
        from sdjax_runner.files import file_sha256

        now = file_sha256(checkpoint.path)
        if now != checkpoint_sha256:
            raise UserError("model.checkpoint", f"{checkpoint.path} changed since the run was planned (sha256 "
                            f"{checkpoint_sha256[:12]} -> {now[:12]}); it is not run under the old file's hash",
                            "run again")
    pipeline = cls(**modules, scheduler=scheduler, dtype=activations)
    _keep_config_readable(pipeline.unet)
    if "text_encoder_2" in modules:  # SDXL: what an empty negative prompt means (engine/encode.py)
        pipeline.register_to_config(force_zeros_for_empty_prompt=bool(
            model_index.setting(index, "force_zeros_for_empty_prompt", True)))
    safety = params.pop("safety_checker", None)
    return LoadedModel(pipeline, params, safety, 0.0, str(directory), formats, tuple(variant_components), "sd")


def _keep_config_readable(unet) -> None:
    """diffusers' Flax SD pipeline rewrites the config of a UNet saved before diffusers 0.9 with a
    ``sample_size`` under 64 (``new_config["sample_size"] = 64``, as its PyTorch pipeline does) but stores
    it as Flax's FrozenDict, whose keys are no attributes: ``unet.config.in_channels`` then fails in its
    own generate function. Keep the rewritten values, in diffusers' config dict."""
    from diffusers.configuration_utils import FrozenDict

    if not isinstance(unet._internal_dict, FrozenDict):
        unet._internal_dict = FrozenDict(unet._internal_dict)


def with_scheduler(loaded: LoadedModel, scheduler: SchedulerConfig, prediction_type: Any = None,
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
    if "force_zeros_for_empty_prompt" in p.config:
        pipeline.register_to_config(force_zeros_for_empty_prompt=p.config["force_zeros_for_empty_prompt"])
    return pipeline, to_host(state, np.dtype(np.float32))  # the scheduler state is never cast
