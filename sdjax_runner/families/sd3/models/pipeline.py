"""A Stable Diffusion 3 / 3.5 pipeline folder in diffusers' published layout (``StableDiffusion3Pipeline``,
the hub's stabilityai/stable-diffusion-3.5-large, -large-turbo, -medium) -> its Flax modules and their weights
as host arrays, without torch -- read as FLUX.1's folders are (families/flux/models/pipeline.py, whose helpers this uses):

* ``transformer/`` (``SD3Transformer2DModel``): the runner's own MMDiT (:class:`~.transformer.FlaxSD3Transformer`)
  from its config.json, the PyTorch safetensors converted by FLUX.1's converter; ``vae/`` (``AutoencoderKL``, 16
  latent channels): FLUX.1's VAE module, SD 3's scaling and shift factors.
* ``text_encoder/`` and ``text_encoder_2/`` (``CLIPTextModelWithProjection``: CLIP-L and OpenCLIP bigG) and
  ``text_encoder_3/`` (``T5EncoderModel``): transformers' Flax classes, loaded as FLUX.1's are. A folder without
  ``text_encoder_3`` (absent from model_index.json, or ``[null, null]``) runs without T5, as diffusers allows:
  T5's part of the conditioning is zeros.
* ``tokenizer/``, ``tokenizer_2/`` (``CLIPTokenizer``) and ``tokenizer_3/`` (``T5TokenizerFast``, from its
  tokenizer.json, offline).
* ``scheduler/``: ``FlowMatchEulerDiscreteScheduler`` (its ``shift``, 3.0 in every published SD 3.5).

With a single-file checkpoint (``model.checkpoint``, families/sd3/models/single_file.py) the MMDiT's weights come from the
file, and the text encoders' and VAE's where the file holds them; the folder gives every config, the tokenizers,
the scheduler and the weights the file lacks.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.schema import DtypeConfig, ModelConfig
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.models import pipeline as flux
from sdjax_runner.models import loading, model_index

log = logging.getLogger("sdjax_runner")

FAMILY = "sd3"
WHAT = "SD 3"
COMPONENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "transformer": ("diffusers", ("SD3Transformer2DModel",)),
    "vae": ("diffusers", ("AutoencoderKL",)),
    "text_encoder": ("transformers", ("CLIPTextModelWithProjection",)),
    "text_encoder_2": ("transformers", ("CLIPTextModelWithProjection",)),
    "text_encoder_3": ("transformers", ("T5EncoderModel",)),
    "tokenizer": ("transformers", ("CLIPTokenizer", "CLIPTokenizerFast")),
    "tokenizer_2": ("transformers", ("CLIPTokenizer", "CLIPTokenizerFast")),
    "tokenizer_3": ("transformers", ("T5TokenizerFast", "T5Tokenizer")),
    "scheduler": ("diffusers", ("FlowMatchEulerDiscreteScheduler",)),
}
OPTIONAL = ("text_encoder_3", "tokenizer_3")  # T5: a folder may leave it out


def own_modules() -> dict[str, tuple[Any, Any, str]]:
    """SD 3's own modules: component -> (module from a config.json, converter, diffusers' class)."""
    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.flux.models.convert import convert_state_dict, convert_vae
    from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer

    def convert_transformer(state_dict: Any, module: Any, dtype: Any = None) -> dict:
        return convert_state_dict(state_dict, module, dtype, "the SD 3 transformer's weights")

    return {"transformer": (FlaxSD3Transformer.from_config, convert_transformer, "SD3Transformer2DModel"),
            "vae": (FlaxFluxAutoencoderKL.from_config, convert_vae, "AutoencoderKL")}


@dataclass
class SD3Pipeline:
    """A loaded SD 3 pipeline: its modules (weights are ``LoadedModel.host_weights``) and what the engine's
    stages (families/sd3/engine/stages.py) read of its configs.

    * ``transformer``: :class:`~.transformer.FlaxSD3Transformer` (activations dtype ``dtype``), NHWC latents.
    * ``vae``: FLUX.1's :class:`~sdjax_runner.families.flux.models.autoencoder.FlaxFluxAutoencoderKL`.
    * ``text_encoder`` / ``text_encoder_2``: ``FlaxCLIPTextModelWithProjection`` (CLIP-L, CLIP-G) built without
      weights; ``text_encoder_3``: ``FlaxT5EncoderModel``, or None (no T5 in the folder).
    * ``tokenizer`` / ``tokenizer_2`` (77 tokens each), ``tokenizer_3`` (T5's, or None).
    * ``scheduler_config``: the flow-matching scheduler's values (families/flux/models/pipeline.scheduler_config).
    * ``vae_scale_factor`` (8), ``scaling_factor`` and ``shift_factor`` (the VAE config's), ``dtype``.
    """

    transformer: Any
    vae: Any
    text_encoder: Any
    text_encoder_2: Any
    text_encoder_3: Optional[Any]
    tokenizer: Any
    tokenizer_2: Any
    tokenizer_3: Optional[Any]
    scheduler_config: dict[str, Any]
    vae_scale_factor: int
    scaling_factor: float
    shift_factor: float
    dtype: Any
    # an SD 3 ControlNet's module in controlnet mode (engine/reuse.py sets it for the job; its weights are the
    # program's params["controlnet"]; families/sd3/models/controlnet.py): a field, so the pipeline's copies keep it
    controlnet: Any = None

    @property
    def native_size(self) -> int:
        """diffusers' default height and width: the transformer's ``sample_size`` times the VAE's factor (1024)."""
        return int(self.transformer.sample_size) * self.vae_scale_factor

    @property
    def size_multiple(self) -> int:
        """Height and width must be multiples of this: the VAE's factor times the patch size (16)."""
        return self.vae_scale_factor * int(self.transformer.patch_size)


def has_t5(directory: Path, index: dict) -> bool:
    """Whether the folder's model_index.json names a T5 encoder (diffusers allows none: ``[null, null]``)."""
    return model_index.entry(directory, index, "text_encoder_3") is not None


def load_sd3(directory: Path, index: dict, model: ModelConfig, dtype: DtypeConfig, checkpoint: Any,
             checkpoint_sha256: Optional[str]) -> loading.LoadedModel:
    """An SD 3 pipeline folder read component by component (the module docstring), as
    :data:`sdjax_runner.models.loaders.LOADERS` calls a family's loader; with a single-file checkpoint
    (``model.checkpoint``, Stability AI's layout: families/sd3/models/single_file.py) the transformer's weights come from it,
    and the text encoders' and VAE's where the file holds them, the rest from the folder."""
    import jax.numpy as jnp

    from sdjax_runner.families.flux.models.t5 import t5_tokenizer

    if model.safety_checker:
        raise UserError("model.safety_checker", f"{directory} is an SD 3 pipeline, which has no safety checker",
                        "false")
    t5 = has_t5(directory, index) and model.t5  # model.t5=false: diffusers' text_encoder_3=None
    names = [name for name in COMPONENTS if t5 or name not in OPTIONAL]
    classes = {name: flux.component_class(directory, index, name, COMPONENTS, WHAT) for name in names}
    activations = getattr(jnp, dtype.activations_dtype.name)
    weights = loading.numpy_dtype(dtype.weights_dtype.name)
    from_file = from_checkpoint(checkpoint, t5)
    for name in ("transformer", "vae", "text_encoder", "text_encoder_2", "text_encoder_3"):
        if name in classes and name not in from_file:
            flux.check_weight_files(directory, name, COMPONENTS[name][0], model.variant)
    schedule = flux.scheduler_config(directory, WHAT)
    transformer, vae, params, files = own_components(directory, model, activations, weights, checkpoint, from_file)

    loaded: dict[str, Any] = {}
    formats = {name: "flax" if found[0].name == flux.FLAX_WEIGHTS else "safetensors" for name, found in files.items()}
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2"):
        if name not in classes:
            continue
        inside = name in from_file
        module, module_params, found = loading.load_component_or_say_why(
            directory, name, classes[name], model, activations, weights, checkpoint if inside else None,
            encoder_tensors(checkpoint, name) if inside else None)
        loaded[name] = module
        if module_params is not None:
            params[name], files[name], formats[name] = module_params, found.files, found.format
    for name in from_file:
        formats[name] = "single_file"
    if checkpoint is not None:
        flux.check_unchanged(checkpoint.path, checkpoint_sha256)
    if t5:
        try:
            loaded["tokenizer_3"] = t5_tokenizer(directory / "tokenizer_3")
        except Exception as exc:  # the folder is input: one line, never a traceback
            raise loading.unloadable(directory, "tokenizer_3", exc) from exc
    check_widths(directory, transformer, loaded)
    pipeline = SD3Pipeline(
        transformer=transformer, vae=vae, text_encoder=loaded["text_encoder"], text_encoder_2=loaded["text_encoder_2"],
        text_encoder_3=loaded.get("text_encoder_3"), tokenizer=loaded["tokenizer"], tokenizer_2=loaded["tokenizer_2"],
        tokenizer_3=loaded.get("tokenizer_3"), scheduler_config=schedule,
        vae_scale_factor=2 ** (len(vae.block_out_channels) - 1), scaling_factor=float(vae.scaling_factor),
        shift_factor=float(vae.shift_factor) if vae.shift_factor is not None else 0.0, dtype=activations)
    return loading.LoadedModel(pipeline, params, None, 0.0, str(directory), formats,
                               flux.variant_components(model.variant, files), FAMILY)


def from_checkpoint(checkpoint: Any, t5: bool) -> tuple[str, ...]:
    """The components whose weights a single-file checkpoint gives: its MMDiT, and the text encoders and VAE it
    holds (families/sd3/config.components_inside) -- T5 only where the base folder has one (its config and
    tokenizer come from there; otherwise the file's T5 is left unread, said in the log)."""
    from sdjax_runner.families.sd3.config import components_inside

    if checkpoint is None:
        return ()
    inside = components_inside(checkpoint.keys)
    if "text_encoder_3" in inside and not t5:
        log.info("load: %s holds a T5 encoder, which is not read: the base folder has no text_encoder_3 to give "
                 "its config and tokenizer", checkpoint.path.name)
    return ("transformer",) + tuple(name for name in inside if t5 or name != "text_encoder_3")


def own_components(directory: Path, model: ModelConfig, activations: Any, weights: np.dtype, checkpoint: Any,
                   from_file: tuple[str, ...]) -> tuple[Any, Any, dict[str, Any], dict[str, tuple[Path, ...]]]:
    """(transformer, VAE, their host params, the files read): the runner's own modules, from the folder or from the
    single file (``from_file``)."""
    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer

    modules = own_modules()
    if "transformer" in from_file:
        transformer, transformer_params, transformer_files = flux.transformer_from_checkpoint(
            directory, checkpoint, None, activations, weights, FlaxSD3Transformer.from_config, single_file_params, WHAT)
    else:
        transformer, transformer_params, transformer_files = flux.load_own(directory, "transformer", model.variant,
                                                                           activations, weights, modules, WHAT)
    vae_dtype = loading.component_dtype(directory, "vae", activations)
    vae_weights = np.dtype(np.float32) if vae_dtype != activations else weights
    if "vae" in from_file:
        vae, vae_params, vae_files = flux.transformer_from_checkpoint(
            directory, checkpoint, None, vae_dtype, vae_weights, FlaxFluxAutoencoderKL.from_config, single_file_vae,
            WHAT, name="vae")
    else:
        vae, vae_params, vae_files = flux.load_own(directory, "vae", model.variant, vae_dtype, vae_weights, modules,
                                                   WHAT)
    return (transformer, vae, {"transformer": transformer_params, "vae": vae_params},
            {"transformer": transformer_files, "vae": vae_files})


def check_widths(directory: Path, transformer: Any, loaded: dict[str, Any]) -> None:
    """The text encoders' widths fit the transformer (one line naming the folder otherwise): the two CLIPs'
    projections make its pooled input, their states fit (padded) in its joint width, T5's is that width."""
    clip_l, clip_g = loaded["text_encoder"].config, loaded["text_encoder_2"].config
    pooled = clip_l.projection_dim + clip_g.projection_dim
    states = clip_l.hidden_size + clip_g.hidden_size
    width = transformer.joint_attention_dim
    t5 = loaded.get("text_encoder_3")
    problems = []
    if pooled != transformer.pooled_projection_dim:
        problems.append(f"the CLIP projections ({clip_l.projection_dim} + {clip_g.projection_dim}) are not the "
                        f"transformer's pooled_projection_dim {transformer.pooled_projection_dim}")
    if states > width:
        problems.append(f"the CLIP states ({clip_l.hidden_size} + {clip_g.hidden_size}) are wider than the "
                        f"transformer's joint_attention_dim {width}")
    if t5 is not None and t5.config.d_model != width:
        problems.append(f"T5's width {t5.config.d_model} is not the transformer's joint_attention_dim {width}")
    if problems:
        raise UserError(flux.KEY, f"{directory}: {problems[0]}", "an SD 3 pipeline whose components belong together")


def single_file_params(module: Any, tensors: dict, weights: np.dtype, name: str) -> dict:
    """A Stability AI-layout file's MMDiT tensors renamed to diffusers' names (families/sd3/models/single_file.py), converted
    to the module's params (the file's text encoders and VAE left out: the base folder gives them)."""
    from sdjax_runner.families.flux.models.convert import convert_state_dict
    from sdjax_runner.families.sd3.models.single_file import diffusers_state_dict

    return convert_state_dict(diffusers_state_dict(tensors, name), module, weights, f"{name}'s MMDiT")


def single_file_vae(module: Any, tensors: dict, weights: np.dtype, name: str) -> dict:
    """A single file's VAE (``first_stage_model.*``, the LDM layout) under diffusers' names, converted to the
    module's params."""
    from sdjax_runner.families.flux.models.convert import convert_vae
    from sdjax_runner.families.sd3.models.single_file import vae_state_dict

    return convert_vae(vae_state_dict(tensors, len(module.block_out_channels), name), module, weights)


def encoder_tensors(checkpoint: Any, name: str) -> Any:
    """``tensors(module)`` for loading.load_from_checkpoint: text encoder ``name``'s tensors in the single file."""
    from sdjax_runner.families.sd3.models.single_file import encoder_tensors as inside
    from sdjax_runner.tensor_files import read_safetensors

    return lambda module: inside(read_safetensors(checkpoint.path), name, int(module.config.hidden_size))
