"""A FLUX.2 [klein] pipeline folder in diffusers' published layout (``Flux2KleinPipeline.save_pretrained``, the
hub's black-forest-labs/FLUX.2-klein-4B, -9B and their -base-* twins) -> its Flax modules and their weights as host
arrays, without torch, read as FLUX.1's folders are (families/flux/models/pipeline.py, whose helpers this uses):

* ``transformer/`` (``Flux2Transformer2DModel``) and ``vae/`` (``AutoencoderKLFlux2``): the runner's own modules
  (:class:`~.transformer.FlaxFlux2Transformer`, :class:`~.autoencoder.FlaxFlux2AutoencoderKL`) from their
  config.json, the PyTorch safetensors converted by FLUX.1's converter (the VAE's batch-norm statistics with it), or
  our Flax file where a built-in wrote one.
* ``text_encoder/`` (``Qwen3ForCausalLM``): the runner's Qwen3 (models/nn/qwen3.py) from its config.json, its
  safetensors (one file or shards) converted; it computes in float32, as the other families' text encoders do.
* ``tokenizer/`` (``Qwen2TokenizerFast``): its tokenizer.json through ``tokenizers`` (models/nn/qwen_tokenizer.py).
* ``scheduler/``: ``FlowMatchEulerDiscreteScheduler``'s config, read as FLUX.1's.

The index's ``is_distilled`` (diffusers' pipeline config) says whether the model guides: a distilled [klein] runs
without classifier-free guidance, a base one with it.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.schema import DtypeConfig, ModelConfig
from sdjax_runner.console import error_line
from sdjax_runner.errors import UserError
from sdjax_runner.families.flux.models import pipeline as flux
from sdjax_runner.models import loading
from sdjax_runner.models.checkpoints import WeightsMismatch, read_flax, safetensors_files

FAMILY = "flux2"
WHAT = "FLUX.2"
COMPONENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "transformer": ("diffusers", ("Flux2Transformer2DModel",)),
    "vae": ("diffusers", ("AutoencoderKLFlux2",)),
    "text_encoder": ("transformers", ("Qwen3ForCausalLM", "Qwen3Model")),
    "tokenizer": ("transformers", ("Qwen2TokenizerFast", "Qwen2Tokenizer")),
    "scheduler": ("diffusers", ("FlowMatchEulerDiscreteScheduler",)),
}
DEFAULT_SAMPLE_SIZE = 128  # Flux2KleinPipeline.default_sample_size: 1024 pixels with the VAE's factor 8
OUT_LAYERS = (9, 18, 27)  # Flux2KleinPipeline's text_encoder_out_layers: the Qwen3 hidden states it stacks
QWEN3_FLAX = "flax_model.msgpack"  # transformers' Flax weights file name (the built-in models write the runner's own)


@dataclass
class Flux2Pipeline:
    """A loaded FLUX.2 [klein] pipeline: its modules (weights are ``LoadedModel.host_weights``) and what the engine's
    stages (families/flux2/engine/stages.py) read of its configs.

    * ``transformer``: :class:`~.transformer.FlaxFlux2Transformer` (activations dtype ``dtype``).
    * ``vae``: :class:`~.autoencoder.FlaxFlux2AutoencoderKL` (float32 where the activations are float16 and its config
      says ``force_upcast``), with its batch norm's statistics.
    * ``text_encoder``: the runner's :class:`~sdjax_runner.models.nn.qwen3.Qwen3TextModel` (float32); ``tokenizer``:
      :class:`~sdjax_runner.models.nn.qwen_tokenizer.QwenTokenizer`.
    * ``scheduler_config``: the flow-matching scheduler's values (FLUX.1's reading).
    * ``vae_scale_factor`` (8), ``distilled`` (the index's ``is_distilled``: no classifier-free guidance), ``dtype``.
    """

    transformer: Any
    vae: Any
    text_encoder: Any
    tokenizer: Any
    scheduler_config: dict[str, Any]
    vae_scale_factor: int
    distilled: bool
    dtype: Any
    out_layers: tuple[int, ...] = OUT_LAYERS

    @property
    def native_size(self) -> int:
        """diffusers' default height and width: ``default_sample_size * vae_scale_factor`` (1024)."""
        return DEFAULT_SAMPLE_SIZE * self.vae_scale_factor

    @property
    def size_multiple(self) -> int:
        """Height and width must be multiples of this: the VAE's factor times the 2x2 patches (16)."""
        return self.vae_scale_factor * 2


def own_modules() -> dict[str, tuple[Any, Any, str]]:
    """FLUX.2's own diffusers modules: component -> (module from a config.json, converter, diffusers' class)."""
    from sdjax_runner.families.flux.models.convert import convert_state_dict
    from sdjax_runner.families.flux2.models.autoencoder import FlaxFlux2AutoencoderKL
    from sdjax_runner.families.flux2.models.transformer import FlaxFlux2Transformer

    def convert_transformer(state_dict: Any, module: Any, dtype: Any = None) -> dict:
        return convert_state_dict(state_dict, module, dtype, "the FLUX.2 transformer's weights")

    def convert_vae(state_dict: Any, module: Any, dtype: Any = None) -> dict:
        kept = {name: array for name, array in state_dict.items() if name != "bn.num_batches_tracked"}
        return convert_state_dict(kept, module, dtype, "the FLUX.2 VAE's weights")

    return {"transformer": (FlaxFlux2Transformer.from_config, convert_transformer, "Flux2Transformer2DModel"),
            "vae": (FlaxFlux2AutoencoderKL.from_config, convert_vae, "AutoencoderKLFlux2")}


def load_flux2(directory: Path, index: dict, model: ModelConfig, dtype: DtypeConfig, checkpoint: Any,
               checkpoint_sha256: Optional[str]) -> loading.LoadedModel:
    """A FLUX.2 [klein] folder read component by component (the module docstring), as
    :data:`sdjax_runner.models.loaders.LOADERS` calls a family's loader; with a single-file checkpoint
    (``model.checkpoint``: a transformer in BFL's layout) the transformer's weights come from it, the rest from the
    folder."""
    import jax.numpy as jnp

    if model.safety_checker:
        raise UserError("model.safety_checker", f"{directory} is a {WHAT} pipeline, which has no safety checker",
                        "false")
    for name in COMPONENTS:
        flux.component_class(directory, index, name, COMPONENTS, WHAT)
    activations = getattr(jnp, dtype.activations_dtype.name)
    weights = loading.numpy_dtype(dtype.weights_dtype.name)
    for name in ("transformer", "vae") if checkpoint is None else ("vae",):
        flux.check_weight_files(directory, name, "diffusers", model.variant)
    schedule = flux.scheduler_config(directory, WHAT)
    modules = own_modules()
    if checkpoint is not None:  # a transformer in BFL's layout (families/flux2/models/single_file.py), the rest the folder's
        transformer, transformer_params, transformer_files = flux.transformer_from_checkpoint(
            directory, checkpoint, checkpoint_sha256, activations, weights, _transformer, _single_file_params, WHAT)
    else:
        transformer, transformer_params, transformer_files = flux.load_own(directory, "transformer", model.variant,
                                                                           activations, weights, modules, WHAT)
    vae_dtype = loading.component_dtype(directory, "vae", activations)
    vae_weights = np.dtype(np.float32) if vae_dtype != activations else weights
    vae, vae_params, vae_files = flux.load_own(directory, "vae", model.variant, vae_dtype, vae_weights, modules, WHAT)
    text_encoder, text_params, text_files = load_qwen3(directory, model.variant, weights)
    try:
        from sdjax_runner.models.nn.qwen_tokenizer import QwenTokenizer

        tokenizer = QwenTokenizer.from_folder(directory / "tokenizer")
    except Exception as exc:  # the folder is input: one line, never a traceback
        raise loading.unloadable(directory, "tokenizer", exc) from exc
    check_widths(directory, transformer, vae, text_encoder)
    files = {"transformer": transformer_files, "vae": vae_files, "text_encoder": text_files}
    formats = {name: "flax" if found[0].name in (flux.FLAX_WEIGHTS, QWEN3_FLAX) else "safetensors"
               for name, found in files.items()}
    if checkpoint is not None:
        formats["transformer"] = "single_file"
    pipeline = Flux2Pipeline(transformer=transformer, vae=vae, text_encoder=text_encoder, tokenizer=tokenizer,
                             scheduler_config=schedule, vae_scale_factor=2 ** (len(vae.block_out_channels) - 1),
                             distilled=bool(index.get("is_distilled", False)), dtype=activations)
    params = {"transformer": transformer_params, "vae": vae_params, "text_encoder": text_params}
    return loading.LoadedModel(pipeline, params, None, 0.0, str(directory), formats,
                               flux.variant_components(model.variant, files), FAMILY)


def _transformer(config: dict, dtype: Any) -> Any:
    from sdjax_runner.families.flux2.models.transformer import FlaxFlux2Transformer

    return FlaxFlux2Transformer.from_config(config, dtype=dtype)


def _single_file_params(module: Any, tensors: dict, weights: np.dtype, name: str) -> dict:
    """A BFL-layout file's tensors renamed to diffusers' names, converted to the transformer's params."""
    from sdjax_runner.families.flux.models.convert import convert_state_dict
    from sdjax_runner.families.flux2.models.single_file import diffusers_state_dict

    return convert_state_dict(diffusers_state_dict(tensors, name), module, weights, f"{name}'s FLUX.2 transformer")


def load_qwen3(directory: Path, variant: Optional[str], weights: np.dtype) -> tuple[Any, dict, tuple[Path, ...]]:
    """(module, host params, the files read) of ``text_encoder/``: the runner's Qwen3 from its config.json (float32
    activations), transformers' safetensors (one file or shards, ``model.variant``'s first) converted, or the
    runner's own Flax file."""
    import jax.numpy as jnp

    from sdjax_runner.families.flux.models.convert import convert_state_dict, load_safetensors
    from sdjax_runner.models.nn.qwen3 import Qwen3TextModel, torch_names

    folder = directory / "text_encoder"
    config = flux.read_config(directory, "text_encoder")
    try:
        module = Qwen3TextModel.from_config(config, dtype=jnp.float32)
    except (ValueError, TypeError) as exc:
        raise UserError(flux.KEY, f"{folder / 'config.json'} is not a Qwen3 config: {exc}",
                        f"a {WHAT} text_encoder folder (Qwen3)") from None
    try:
        if (folder / QWEN3_FLAX).is_file():
            return module, loading.to_host(read_flax(folder / QWEN3_FLAX, module, "diffusers"), weights), \
                (folder / QWEN3_FLAX,)
        files = tuple(safetensors_files(folder, "transformers", variant))
        if not files or not all(file.is_file() for file in files):
            raise UserError(flux.KEY, f"{folder}/ has no model.safetensors weights (nor shards with their index)",
                            "PyTorch safetensors as transformers saves them")
        tensors: dict[str, np.ndarray] = {}
        for file in files:
            tensors.update(load_safetensors(file))
        params = convert_state_dict(torch_names(tensors), module, weights, "the Qwen3 text encoder's weights")
    except WeightsMismatch as exc:
        raise UserError(flux.KEY, f"{folder}/ does not match its config.json: {error_line(exc, 200)}",
                        "weights saved with that config") from None
    except UserError:
        raise
    except Exception as exc:  # the folder is input: one line, never a traceback
        raise loading.unloadable(directory, "text_encoder", exc) from exc
    return module, flux.in_memory(params), files


def check_widths(directory: Path, transformer: Any, vae: Any, text_encoder: Any) -> None:
    """The components fit each other (one line naming the folder otherwise): three Qwen3 layers' width is the
    transformer's joint width, the VAE's patchified latents its input channels."""
    problems = []
    if len(OUT_LAYERS) * text_encoder.hidden_size != transformer.joint_attention_dim:
        problems.append(f"{len(OUT_LAYERS)} Qwen3 layers of width {text_encoder.hidden_size} are not the "
                        f"transformer's joint_attention_dim {transformer.joint_attention_dim}")
    if max(OUT_LAYERS) > text_encoder.num_hidden_layers:
        problems.append(f"the text encoder has {text_encoder.num_hidden_layers} layers; the pipeline reads hidden "
                        f"states {OUT_LAYERS}")
    if 4 * vae.latent_channels != transformer.in_channels:
        problems.append(f"the VAE's {vae.latent_channels} latent channels, patchified 2x2, are not the transformer's "
                        f"in_channels {transformer.in_channels}")
    if problems:
        raise UserError(flux.KEY, f"{directory}: {problems[0]}", f"a {WHAT} pipeline whose components belong together")


def read_vae_folder(path: Path, activations: Any, weights: np.dtype) -> tuple[Any, dict]:
    """(module, host weights) of a diffusers ``AutoencoderKLFlux2`` folder as the model's VAE (``model.vae``)."""
    modules = {path.name: own_modules()["vae"]}
    module, params, _ = flux.load_own(path.parent, path.name, None, activations, weights, modules, "VAE")
    return module, params


def vae_from_state(module: Any, state: dict, weights: np.dtype, source: str) -> dict:
    """Host weights for the model's own VAE ``module`` from a single file's tensors under diffusers' names."""
    return flux.in_memory(own_modules()["vae"][1](state, module, weights))


def index_json(pipeline_class: str = "Flux2KleinPipeline", distilled: bool = True) -> str:
    """A FLUX.2 [klein] folder's model_index.json, as diffusers 0.39 writes it (the built-in models' writer)."""
    return json.dumps({"_class_name": pipeline_class, "_diffusers_version": "0.39.0", "is_distilled": distilled,
                       "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
                       "text_encoder": ["transformers", "Qwen3ForCausalLM"],
                       "tokenizer": ["transformers", "Qwen2TokenizerFast"],
                       "transformer": ["diffusers", "Flux2Transformer2DModel"],
                       "vae": ["diffusers", "AutoencoderKLFlux2"]}, indent=2)
