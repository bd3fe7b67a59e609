"""A FLUX.1 pipeline folder in diffusers' published layout (``FluxPipeline.save_pretrained``, the hub's
black-forest-labs/FLUX.1-dev and -schnell) -> its Flax modules and their weights as host arrays, without torch.

The folder's ``model_index.json`` names seven components, each read as follows:

* ``transformer/`` (``FluxTransformer2DModel``) and ``vae/`` (``AutoencoderKL``): diffusers has them only in
  PyTorch; the modules are the runner's own (:class:`~.transformer.FlaxFluxTransformer`,
  :class:`~.autoencoder.FlaxFluxAutoencoderKL`) built from the folder's ``config.json``, their PyTorch
  safetensors -- one file or shards through their ``.index.json``, model.variant's first -- converted by
  :mod:`.convert`, which refuses any name, shape or missing parameter that does not fit. A folder whose
  component holds Flax weights of these modules instead (``diffusion_flax_model.msgpack``, diffusers' Flax
  file name: the built-in ``tiny-random-flux`` is written so) has them read and checked against the shapes.
* ``text_encoder/`` (``CLIPTextModel``) and ``text_encoder_2/`` (``T5EncoderModel``): the runner's own modules
  (models/nn), loaded as the SD family loads its CLIP text encoders (:func:`sdjax_runner.models.loading.
  load_component`: Flax weights read and checked against the module's shapes, PyTorch safetensors -- sharded T5
  included -- converted with transformers' naming by :mod:`sdjax_runner.models.checkpoints`). They compute in float32 whatever the activations
  dtype, as the SD family's text encoders do (their weights are cast to the weights dtype).
* ``tokenizer/`` (``CLIPTokenizer``) and ``tokenizer_2/`` (``T5TokenizerFast``, read from ``tokenizer.json``,
  offline and without sentencepiece: :func:`t5_tokenizer`).
* ``scheduler/``: only ``FlowMatchEulerDiscreteScheduler``, whose config the engine's flow-matching sampler reads
  (:func:`scheduler_config`); no diffusers scheduler object is built.

The index may carry ``image_encoder`` / ``feature_extractor`` as ``[null, null]`` (diffusers 0.39 writes them) or
not at all (the hub's); neither is loaded. With a single-file checkpoint (``model.checkpoint``, flux1-dev.safetensors)
the transformer's weights come from it (Black Forest Labs' layout, :mod:`.single_file`) and the rest from the folder.
Whatever is wrong with the folder is one line naming ``model.pretrained_model_name_or_path``.
"""

from __future__ import annotations

import json
import logging
import mmap
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.schema import DtypeConfig, ModelConfig
from sdjax_runner.console import error_line
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.models.t5 import t5_tokenizer
from sdjax_runner.models import loading, model_index, sources
from sdjax_runner.models.checkpoints import WeightsMismatch, read_flax, safetensors_files, safetensors_names

log = logging.getLogger("sdjax_runner")

KEY = sources.KEY
FAMILY = "flux"
# A FLUX.1 pipeline's components: name -> (library, the classes model_index.json may name, without "Flax").
COMPONENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "transformer": ("diffusers", ("FluxTransformer2DModel",)),
    "vae": ("diffusers", ("AutoencoderKL",)),
    "text_encoder": ("transformers", ("CLIPTextModel",)),
    "text_encoder_2": ("transformers", ("T5EncoderModel",)),
    "tokenizer": ("transformers", ("CLIPTokenizer", "CLIPTokenizerFast")),
    # T5Tokenizer (slow) needs sentencepiece; its folder's tokenizer.json is read as T5TokenizerFast, the same ids.
    "tokenizer_2": ("transformers", ("T5TokenizerFast", "T5Tokenizer")),
    "scheduler": ("diffusers", ("FlowMatchEulerDiscreteScheduler",)),
}
WEIGHTED = ("transformer", "vae", "text_encoder", "text_encoder_2")
SCHEDULER = "FlowMatchEulerDiscreteScheduler"
# The scheduler config keys the engine's flow-matching sampler reads, with diffusers 0.39's defaults
# (FlowMatchEulerDiscreteScheduler.__init__) for a config that leaves one out, and the types each may have.
SCHEDULER_KEYS: dict[str, tuple[Any, tuple[type, ...]]] = {
    "num_train_timesteps": (1000, (int,)),
    "shift": (1.0, (int, float)),
    "use_dynamic_shifting": (False, (bool,)),
    "base_shift": (0.5, (int, float)),
    "max_shift": (1.15, (int, float)),
    "base_image_seq_len": (256, (int,)),
    "max_image_seq_len": (4096, (int,)),
}
# Options of the scheduler that change its sigmas; the sampler runs their defaults (every published FLUX.1
# config's values), so a config that sets another value is refused rather than run on a different schedule.
SCHEDULER_DEFAULTS_ONLY: dict[str, Any] = {
    "use_karras_sigmas": False,
    "use_exponential_sigmas": False,
    "use_beta_sigmas": False,
    "invert_sigmas": False,
    "shift_terminal": None,
    "stochastic_sampling": False,
    "time_shift_type": "exponential",
}
# diffusers' FluxPipeline.default_sample_size: its default height/width is this times vae_scale_factor (1024).
DEFAULT_SAMPLE_SIZE = 128
FLAX_WEIGHTS = "diffusion_flax_model.msgpack"  # diffusers' Flax weights file name


@dataclass
class FluxPipeline:
    """A loaded FLUX.1 pipeline: its modules (no weights: those are ``LoadedModel.host_weights``, by component)
    and what the engine's stages (families/flux/engine/stages.py) read of its configs. Every module is called with its
    params passed in, so a jitted function can take them as arguments:

    * ``transformer``: :class:`~.transformer.FlaxFluxTransformer` (activations dtype ``dtype``):
      ``transformer.apply({"params": p}, hidden_states, encoder_hidden_states, pooled_projections, timestep,
      img_ids, txt_ids, guidance)``.
    * ``vae``: :class:`~.autoencoder.FlaxFluxAutoencoderKL` (``vae.dtype``: float32 where the activations are
      float16 and its config says ``force_upcast``, else ``dtype``): ``vae.apply({"params": p}, latents,
      method=vae.decode)``.
    * ``text_encoder``: the runner's CLIP text encoder (:class:`~sdjax_runner.models.nn.clip.CLIPTextModel`):
      ``text_encoder.apply({"params": p}, input_ids).pooler_output`` is diffusers' ``pooled_prompt_embeds``.
    * ``text_encoder_2``: the runner's T5 encoder (:class:`~sdjax_runner.models.nn.t5.T5EncoderModel`):
      ``text_encoder_2.apply({"params": p}, input_ids).last_hidden_state`` is ``prompt_embeds`` (no attention
      mask, as FluxPipeline calls it).
    * ``tokenizer``: the ``CLIPTokenizer`` (77 tokens); ``tokenizer_2``: the ``T5TokenizerFast``.
    * ``scheduler_config``: the ``FlowMatchEulerDiscreteScheduler`` config's ``num_train_timesteps``, ``shift``,
      ``use_dynamic_shifting``, ``base_shift``, ``max_shift``, ``base_image_seq_len``, ``max_image_seq_len``
      (diffusers' defaults where the file leaves one out).
    * ``vae_scale_factor``: ``2 ** (len(vae.block_out_channels) - 1)`` (8), as diffusers' FluxPipeline.
    * ``scaling_factor``, ``shift_factor``: the VAE config's; the VAE decodes ``latents / scaling_factor +
      shift_factor``.
    * ``guidance_embeds``: the transformer config's: True for FLUX.1 [dev] (guidance-distilled: it takes the
      guidance value), False for [schnell].
    * ``dtype``: the activations dtype (a ``jax.numpy`` dtype) the transformer computes in.
    * ``kontext``: FLUX.1 Kontext, whose index names ``FluxKontextPipeline`` (the same architecture as [dev]; it reads
      an input image's tokens beside the noise's: mode=edit).
    * ``control``: FLUX.1 Canny [dev] or Depth [dev], whose index names ``FluxControlPipeline`` (its transformer
      reads a control image's packed latents after the packed latents: 128 channels in, 64 out; mode=control).
    """

    transformer: Any
    vae: Any
    text_encoder: Any
    text_encoder_2: Any
    tokenizer: Any
    tokenizer_2: Any
    scheduler_config: dict[str, Any]
    vae_scale_factor: int
    scaling_factor: float
    shift_factor: float
    guidance_embeds: bool
    dtype: Any
    kontext: bool = False  # FLUX.1 Kontext (its index names FluxKontextPipeline): it edits an input image (mode=edit)
    control: bool = False  # FLUX.1 Canny/Depth [dev] (its index names FluxControlPipeline): mode=control
    # a FLUX.1 ControlNet's module in controlnet mode (engine/reuse.py sets it for the job; its weights are the
    # program's params["controlnet"]): a field, so the pipeline's copies (the sharded path's) keep it
    controlnet: Any = None

    @property
    def native_size(self) -> int:
        """diffusers' default height and width: ``default_sample_size * vae_scale_factor`` (1024)."""
        return DEFAULT_SAMPLE_SIZE * self.vae_scale_factor

    @property
    def fill(self) -> bool:
        """FLUX.1 Fill (diffusers' FluxFillPipeline): its transformer reads, after the packed latents, the masked
        image's packed latents and the mask's pixels -- more input channels than it predicts (as FLUX.1 Canny/Depth
        read their control image's: told apart by the index, :attr:`control`)."""
        more = self.transformer.in_channels > (self.transformer.out_channels or self.transformer.in_channels)
        return more and not self.control

    @property
    def size_multiple(self) -> int:
        """Height and width must be multiples of this: the VAE's factor times the 2x2 packing (16)."""
        return self.vae_scale_factor * 2


def load_flux(directory: Path, index: dict, model: ModelConfig, dtype: DtypeConfig, checkpoint: Any,
              checkpoint_sha256: Optional[str]) -> loading.LoadedModel:
    """A FLUX.1 pipeline folder read component by component (the module docstring), as
    :data:`sdjax_runner.models.loaders.LOADERS` calls a family's loader: ``index`` is the folder's checked
    ``model_index.json``; ``checkpoint`` (a single-file checkpoint) is refused. Host weights by component, in
    the weights dtype -- the VAE's float32 where it computes in float32 (:func:`loading.component_dtype`)."""
    import jax.numpy as jnp

    if model.safety_checker:
        raise UserError("model.safety_checker", f"{directory} is a FLUX.1 pipeline, which has no safety checker",
                        "false")
    classes = {name: component_class(directory, index, name) for name in COMPONENTS}
    activations = getattr(jnp, dtype.activations_dtype.name)
    weights = loading.numpy_dtype(dtype.weights_dtype.name)
    for name in WEIGHTED:
        if not (checkpoint is not None and name == "transformer"):
            check_weight_files(directory, name, COMPONENTS[name][0], model.variant)
    schedule = scheduler_config(directory)

    if checkpoint is not None:
        transformer, transformer_params, transformer_files = transformer_from_checkpoint(
            directory, checkpoint, checkpoint_sha256, activations, weights)
    else:
        transformer, transformer_params, transformer_files = load_own(directory, "transformer", model.variant,
                                                                       activations, weights)
    vae_dtype = loading.component_dtype(directory, "vae", activations)
    vae_weights = np.dtype(np.float32) if vae_dtype != activations else weights  # upcast: float32 throughout
    vae, vae_params, vae_files = load_own(directory, "vae", model.variant, vae_dtype, vae_weights)

    modules: dict[str, Any] = {}
    params: dict[str, Any] = {"transformer": transformer_params, "vae": vae_params}
    files: dict[str, tuple[Path, ...]] = {"transformer": transformer_files, "vae": vae_files}
    formats = {name: "flax" if found[0].name == FLAX_WEIGHTS else "safetensors" for name, found in files.items()}
    if checkpoint is not None:
        formats["transformer"] = "single_file"
    for name in ("text_encoder", "text_encoder_2", "tokenizer"):
        module, module_params, found = loading.load_component_or_say_why(directory, name, classes[name], model,
                                                                         activations, weights)
        modules[name] = module
        if module_params is not None:
            params[name], files[name], formats[name] = module_params, found.files, found.format
    try:
        modules["tokenizer_2"] = t5_tokenizer(directory / "tokenizer_2")
    except Exception as exc:  # the folder is input: one line, never a traceback
        raise loading.unloadable(directory, "tokenizer_2", exc) from exc

    variant = model.variant
    components = variant_components(variant, {name: files[name] for name in WEIGHTED})
    pipeline = FluxPipeline(
        transformer=transformer, vae=vae, text_encoder=modules["text_encoder"],
        text_encoder_2=modules["text_encoder_2"], tokenizer=modules["tokenizer"], tokenizer_2=modules["tokenizer_2"],
        scheduler_config=schedule, vae_scale_factor=2 ** (len(vae.block_out_channels) - 1),
        scaling_factor=float(vae.scaling_factor),
        shift_factor=float(vae.shift_factor) if vae.shift_factor is not None else 0.0,
        guidance_embeds=bool(transformer.guidance_embeds), dtype=activations,
        kontext=index.get("_class_name") == "FluxKontextPipeline",
        control=index.get("_class_name") == "FluxControlPipeline")
    return loading.LoadedModel(pipeline, params, None, 0.0, str(directory), formats, components, FAMILY)


def component_class(directory: Path, index: dict, name: str, components: Optional[dict] = None,
                    what: str = "FLUX.1") -> str:
    """The class model_index.json names for component ``name`` (without "Flax") of a ``what`` pipeline, checked
    against ``components`` (the family's table; :data:`COMPONENTS`), whose folder must be there."""
    components = COMPONENTS if components is None else components
    library, allowed = components[name]
    spec = model_index.entry(directory, index, name)
    if spec is None:
        raise UserError(KEY, f"{directory / model_index.FILE} names no {name!r} component; a {what} pipeline has "
                        f"{', '.join(components)}", f"a complete {what} pipeline folder (diffusers' layout)")
    class_name = spec[1].removeprefix("Flax")
    if spec[0] != library or class_name not in allowed:
        raise UserError(KEY, f"{directory / model_index.FILE}: component {name!r} is {spec[1]} ({spec[0]}), not a "
                        f"{what} pipeline's", f"{' or '.join(allowed)} ({library})")
    if not (directory / name).is_dir():
        raise UserError(KEY, f"{directory / name}/ is missing ({model_index.FILE} names a {class_name} there)",
                        f"a complete {what} pipeline folder (diffusers' layout)")
    return class_name


def read_config(directory: Path, name: str, file: str = "config.json") -> dict:
    """A component's JSON config as a dict (one line where it is not one)."""
    path = directory / name / file
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise loading.unloadable(directory, name, exc) from exc
    if not isinstance(config, dict):
        raise UserError(KEY, f"{path} is not a JSON object", "a diffusers-format config")
    return config


def check_weight_files(directory: Path, name: str, library: str, variant: Optional[str]) -> None:
    """Refuse, before anything is read, a component whose weights are not all there: a shard its index lists
    that is missing, or no safetensors at all (a Flax text encoder passes: transformers' own loader reads it)."""
    folder = directory / name
    if library == "diffusers" and (folder / FLAX_WEIGHTS).is_file():
        return
    for single, index in safetensors_names(library, variant):
        if (folder / index).is_file():
            try:
                files = safetensors_files(folder, library, variant)
            except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
                raise UserError(KEY, f"{folder / index}: not a shard index ({type(exc).__name__})",
                                "the index.json diffusers/transformers write beside the shards") from None
            missing = [f.name for f in files if not f.is_file()]
            if missing:
                raise UserError(KEY, f"{folder / index} lists {missing[0]}, which is missing"
                                f"{f' (and {len(missing) - 1} more)' if len(missing) > 1 else ''}",
                                "every shard its index lists")
            return
        if (folder / single).is_file():
            return
    if library == "transformers" and (folder / "flax_model.msgpack").is_file():
        return
    stem = safetensors_names(library, None)[0][0].removesuffix(".safetensors")
    raise UserError(KEY, f"{folder}/ has no {stem}{f'.{variant}' if variant else ''}.safetensors weights "
                    "(nor shards with their index)", "PyTorch safetensors as diffusers' pipelines save them")


def own_modules() -> dict[str, tuple[Any, Any, str]]:
    """FLUX.1's own modules: component -> (its module from a config.json, its converter, diffusers' class)."""
    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.flux.models.convert import convert_transformer, convert_vae
    from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer

    return {"transformer": (FlaxFluxTransformer.from_config, convert_transformer, "FluxTransformer2DModel"),
            "vae": (FlaxFluxAutoencoderKL.from_config, convert_vae, "AutoencoderKL")}


def load_own(directory: Path, name: str, variant: Optional[str], activations: Any, weights: np.dtype,
             modules: Optional[dict] = None, what: str = "FLUX.1") -> tuple[Any, dict, tuple[Path, ...]]:
    """(module, host params, the files read) for ``transformer/`` or ``vae/`` of a ``what`` pipeline: the
    runner's own module from its config.json (``modules``: the family's table in :func:`own_modules`'s form),
    the PyTorch safetensors converted by :mod:`.convert`."""
    from sdjax_runner.families.flux.models.convert import read_safetensors

    build, convert, expected = (own_modules() if modules is None else modules)[name]
    folder = directory / name
    config = read_config(directory, name)
    class_name = config.get("_class_name", expected)
    if class_name != expected:
        raise UserError(KEY, f"{folder / 'config.json'} is a {str(class_name)[:80]}'s config, not a {what} {name}'s "
                        f"({expected})", f"a {what} {name} folder")
    flax_file = folder / FLAX_WEIGHTS
    files = (flax_file,) if flax_file.is_file() else tuple(safetensors_files(folder, "diffusers", variant))
    size = sum(f.stat().st_size for f in files)
    if size >= loading.ANNOUNCE_BYTES:  # seconds or more: say so before it starts
        log.info("load: %s/ (%.1f GB of safetensors weights, converting to Flax) ...", name, size / 1e9)
    try:
        try:
            module = build(config, dtype=activations)
        except (ValueError, TypeError) as exc:
            raise UserError(KEY, f"{folder / 'config.json'} is not a {what} {name} config: {exc}",
                            f"a {what} {name} folder") from None
        if flax_file.is_file():
            return module, flax_weights(flax_file, module, weights), files
        try:
            state_dict = read_safetensors(folder, variant)
        except (WeightsMismatch, OSError) as exc:  # not safetensors, or shards that are not what their index says
            raise UserError(KEY, f"{folder}/: its weights cannot be read: {error_line(exc, 200)}",
                            "safetensors files as diffusers saves them") from None
        try:
            params = convert(state_dict, module, weights)
        except WeightsMismatch as exc:
            raise UserError(KEY, f"{folder}/ does not match its config.json: {exc}",
                            "weights saved with that config") from None
    except UserError:
        raise
    except Exception as exc:  # the folder is input: one line, never a traceback
        raise loading.unloadable(directory, name, exc) from exc
    return module, in_memory(params), files


def transformer_from_checkpoint(directory: Path, checkpoint: Any, checkpoint_sha256: Optional[str], activations: Any,
                                weights: np.dtype, build: Any = None, to_params: Any = None, what: str = "FLUX.1",
                                name: str = "transformer") -> tuple[Any, dict, tuple[Path, ...]]:
    """(module, host params, the file) for the transformer -- or another of the family's own modules, ``name`` --
    of a single-file checkpoint (``model.checkpoint``), on the base folder's ``{name}/config.json``: ``build``
    (config, dtype) -> the module, ``to_params`` (module, the file's tensors, weights dtype, the file's name) -> its
    Flax params -- FLUX.1's transformer by default, Black Forest Labs' layout (families/flux/models/single_file.py); SD 3
    passes its own (families/sd3/models/). A checkpoint that does not fit is one line; a file replaced since the run was
    planned (``checkpoint_sha256``; None: the caller checks, :func:`check_unchanged`) is refused once read."""
    from sdjax_runner.config import weight_files
    from sdjax_runner.families.flux.models.convert import load_safetensors

    path = checkpoint.path
    config = read_config(directory, name)
    try:
        module = (build or _flux_transformer)(config, dtype=activations)
    except (ValueError, TypeError) as exc:
        raise UserError(KEY, f"{directory / name / 'config.json'} is not a {what} {name} config: {exc}",
                        f"a {what} {name} folder") from None
    try:
        params = (to_params or _flux_params)(module, load_safetensors(path), weights, path.name)
    except WeightsMismatch as exc:
        raise UserError(weight_files.KEY, f"does not fit the base model {directory} "
                        f"({checkpoint.title} checkpoint): {exc}",
                        "a checkpoint of the base model's variant (set model.pretrained_model_name_or_path to a "
                        "matching base)") from None
    check_unchanged(path, checkpoint_sha256)
    return module, in_memory(params), (path,)


def check_unchanged(path: Path, checkpoint_sha256: Optional[str]) -> None:
    """A single file replaced since the run was planned is refused (after reading it: the hash is of what was
    read); None: nothing to check."""
    from sdjax_runner.config import weight_files
    from sdjax_runner.files import file_sha256

    if checkpoint_sha256 is not None and file_sha256(path) != checkpoint_sha256:
        raise UserError(weight_files.KEY, f"{path} changed since the run was planned; it is not run under the old "
                        "file's hash", "run again")


def _flux_transformer(config: dict, dtype: Any) -> Any:
    from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer

    return FlaxFluxTransformer.from_config(config, dtype=dtype)


def _flux_params(module: Any, tensors: dict, weights: np.dtype, name: str) -> dict:
    """A Black Forest Labs-layout file's tensors renamed to diffusers' names, converted to the module's params."""
    from sdjax_runner.families.flux.models.convert import convert_transformer
    from sdjax_runner.families.flux.models.single_file import diffusers_state_dict

    width = module.num_attention_heads * module.attention_head_dim
    return convert_transformer(diffusers_state_dict(tensors, width, name), module, weights)


def variant_components(variant: Optional[str], files: dict[str, tuple[Path, ...]]) -> tuple[str, ...]:
    """The components whose weight files are ``variant``'s (``*.fp16.safetensors``, ``*.fp16-00001-of-...``)."""
    return tuple(name for name, found in files.items()
                 if variant and any(f".{variant}." in f.name or f".{variant}-" in f.name for f in found))


def flax_weights(file: Path, module: Any, weights: np.dtype) -> dict:
    """A component's Flax weights file as host arrays of ``weights`` (checked against the module's shapes)."""
    try:
        params = read_flax(file, module, "diffusers")
    except WeightsMismatch as exc:
        raise UserError(KEY, f"{file.parent}/ does not match its config.json: {exc}",
                        "weights saved with that config") from None
    return loading.to_host(params, weights)


def read_vae_folder(path: Path, activations: Any, weights: np.dtype) -> tuple[Any, dict]:
    """(module, host weights) of a diffusers VAE folder as a flow model's VAE (``model.vae``; FLUX.1's and SD 3's
    alike): the runner's own module from its config.json, the PyTorch safetensors converted."""
    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.flux.models.convert import convert_vae

    modules = {path.name: (FlaxFluxAutoencoderKL.from_config, convert_vae, "AutoencoderKL")}
    module, params, _ = load_own(path.parent, path.name, None, activations, weights, modules, "VAE")
    return module, params


def vae_from_state(module: Any, state: dict, weights: np.dtype, source: str) -> dict:
    """Host weights for a flow model's own VAE ``module`` from a single file's tensors under diffusers' names."""
    from sdjax_runner.families.flux.models.convert import convert_vae

    return in_memory(convert_vae(state, module, weights))


def in_memory(tree: Any) -> Any:
    """``tree`` with every array that still views a memory-mapped weights file copied into memory: the
    converter casts in place where the dtype already fits, and a host weight must not change (or fault) when the
    file does."""
    import jax

    def mapped(array: np.ndarray) -> bool:
        base: Any = array
        while base is not None:
            if isinstance(base, (np.memmap, mmap.mmap)):
                return True
            base = getattr(base, "base", None)
        return False

    return jax.tree_util.tree_map(lambda a: np.array(a) if mapped(a) else a, tree)


def scheduler_config(directory: Path, what: str = "FLUX.1") -> dict[str, Any]:
    """``scheduler/scheduler_config.json``'s values the flow-matching sampler reads (:data:`SCHEDULER_KEYS`),
    checked: the class must be FlowMatchEulerDiscreteScheduler, each value of its type (a count a positive
    integer), and the options that would change the sigmas (:data:`SCHEDULER_DEFAULTS_ONLY`) their defaults."""
    path = directory / "scheduler" / "scheduler_config.json"
    config = read_config(directory, "scheduler", "scheduler_config.json")
    class_name = config.get("_class_name")
    if class_name != SCHEDULER:
        raise UserError(KEY, f"{path}: the scheduler is {str(class_name)[:80]}; {what} runs {SCHEDULER} only",
                        SCHEDULER)
    values: dict[str, Any] = {}
    for key, (default, types) in SCHEDULER_KEYS.items():
        value = config.get(key, default)
        if (isinstance(value, bool) and bool not in types) or not isinstance(value, types):
            raise UserError(KEY, f"{path}: {key} is {json.dumps(value)[:80]}, not a "
                            f"{' or '.join(t.__name__ for t in types)}", f"the scheduler's {key}")
        values[key] = value
    for key, default in SCHEDULER_DEFAULTS_ONLY.items():
        if config.get(key, default) != default:
            raise UserError(KEY, f"{path}: {key} is {json.dumps(config[key])[:80]}; the {what} sampler runs "
                            f"{json.dumps(default)} only", json.dumps(default))
    counts = ("num_train_timesteps", "base_image_seq_len", "max_image_seq_len")
    if any(values[key] < 1 for key in counts) or values["max_image_seq_len"] <= values["base_image_seq_len"]:
        raise UserError(KEY, f"{path}: num_train_timesteps {values['num_train_timesteps']}, base_image_seq_len "
                        f"{values['base_image_seq_len']}, max_image_seq_len {values['max_image_seq_len']}",
                        "positive counts, max_image_seq_len above base_image_seq_len")
    if not values["shift"] > 0:
        raise UserError(KEY, f"{path}: shift is {values['shift']}", "a positive shift")
    return values
