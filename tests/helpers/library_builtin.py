"""The built-in tiny models written as they were before issue #60, with diffusers' and transformers' own Flax
classes and ``save_pretrained`` (diffusers 0.39, transformers 4.57): the reference the runner's own writer
(sdjax_runner/models/published_layout.py) must equal byte for byte (tests/test_builtin_writer.py). A test helper:
the runtime imports neither library. The specs, seeds and random draws are the runner's (models/builtin.py, models/builtin_parts.py and the families' builtin.py); what
is here is only how the libraries lay the files out."""

from __future__ import annotations

import importlib
import inspect
import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from sdjax_runner.families.flux.models.builtin import FLUX_CONTROLNET_SPECS, FLUX_SPECS, build_flux_controlnet_into
from sdjax_runner.families.sd.models.builtin import CONTROLNET_SPECS, SD_SCHEDULER, SPECS, XL_SCHEDULER, sd_weights
from sdjax_runner.families.sd3.models.builtin import SD3_CONTROLNET_SPECS, SD3_SPECS, build_sd3_controlnet_into
from sdjax_runner.models.builtin import CLIP_SPECS
from sdjax_runner.models.builtin_parts import SEED, t5_tokenizer_model
from sdjax_runner.models.builtin_parts import clip_vocabulary as _vocabulary
from sdjax_runner.models.builtin_parts import random_params as _random_params
from sdjax_runner.models.builtin_parts import saved_dtypes as _saved_dtypes
from sdjax_runner.models.nn.t5 import relative_position_bucket


def compatible_flax_t5() -> None:
    """transformers 4.57's ``FlaxT5EncoderModel`` calls ``jnp.clip(x, a_max=...)``, a keyword JAX removed in 0.10:
    where the installed JAX lacks it, ``FlaxT5Attention._relative_position_bucket`` becomes the runner's
    :func:`relative_position_bucket` (the same buckets, bit for bit: tests/test_t5_modules.py). Idempotent."""
    import jax.numpy as jnp

    if "a_max" in inspect.signature(jnp.clip).parameters:
        return
    attention = importlib.import_module("transformers.models.t5.modeling_flax_t5").FlaxT5Attention
    attention._relative_position_bucket = staticmethod(relative_position_bucket)


def _library_shapes(module: Any, library: str) -> Any:
    """The parameter shapes of one of diffusers' or transformers' Flax modules (their own init, traced)."""
    import jax

    key = jax.random.PRNGKey(0)
    if hasattr(module, "input_shape"):  # transformers' classes: their input's shape
        return jax.eval_shape(lambda k: module.init_weights(k, module.input_shape), key)
    return jax.eval_shape(module.init_weights, key)


def build(name: str, target: Path) -> Path:
    """Built-in ``name`` written with the libraries into ``target`` (a new folder)."""
    compatible_flax_t5()
    staging = Path(tempfile.mkdtemp(dir=Path(target).parent))
    try:
        # (a FLUX.1 or SD 3 ControlNet is the runner's own module, as their transformers: diffusers has no Flax class
        # of either; their folders are checked against diffusers' PyTorch modules in tests/test_flow_image_modes.py)
        writers = ((CLIP_SPECS, _build_clip_into), (CONTROLNET_SPECS, _build_controlnet_into),
                   (FLUX_SPECS, _build_flux_into), (FLUX_CONTROLNET_SPECS, build_flux_controlnet_into),
                   (SD3_SPECS, _build_sd3_into), (SD3_CONTROLNET_SPECS, build_sd3_controlnet_into),
                   (SPECS, _build_into))
        specs, write = next((specs, write) for specs, write in writers if name in specs)
        write(staging, specs[name])
        staging.rename(target)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Path(target)


def _write_tokenizer(directory: Path, pad_token: str = "<|endoftext|>") -> int:
    """Write a CLIP tokenizer (vocab.json, merges.txt) laid out like openai/clip's."""
    from transformers import CLIPTokenizer

    tokens, merges = _vocabulary()
    directory.mkdir(parents=True)
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n"
    (directory / "merges.txt").write_text(merges_text, encoding="utf-8")
    # Round-trip through CLIPTokenizer so tokenizer_config.json etc. are the library's own.
    tokenizer = CLIPTokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=77, pad_token=pad_token
    )
    tokenizer.save_pretrained(directory)
    return len(tokens)


def architecture(name: str):
    """(pipeline modules, their parameter shapes) of built-in ``name``, with no weights."""
    from diffusers import FlaxAutoencoderKL, FlaxUNet2DConditionModel
    from transformers import CLIPTextConfig, FlaxCLIPTextModel, FlaxCLIPTextModelWithProjection


    spec = SPECS[name]
    size = len(_vocabulary()[0])  # the tokenizer's ids end with <|startoftext|>, <|endoftext|>
    modules: dict[str, Any] = {}
    shapes: dict[str, Any] = {}
    for number, text in enumerate(spec["text"]):
        config = CLIPTextConfig(**{"vocab_size": size, "max_position_embeddings": 77, **text},
                                bos_token_id=size - 2, eos_token_id=size - 1, pad_token_id=size - 1)
        cls = FlaxCLIPTextModelWithProjection if spec["xl"] and number == 1 else FlaxCLIPTextModel
        encoder = cls(config, _do_init=False)
        component = "text_encoder" if number == 0 else "text_encoder_2"
        modules[component] = encoder
        shapes[component] = _library_shapes(encoder, "transformers")
    modules["unet"] = FlaxUNet2DConditionModel(in_channels=9 if spec.get("inpaint") else 4, out_channels=4,
                                               **spec["unet"])
    modules["vae"] = FlaxAutoencoderKL(in_channels=3, out_channels=3, latent_channels=4,
                                       down_block_types=("DownEncoderBlock2D",) * 4,
                                       up_block_types=("UpDecoderBlock2D",) * 4, **spec["vae"])
    for component in ("unet", "vae"):
        shapes[component] = _library_shapes(modules[component], "diffusers")
    return modules, shapes


def _build_into(directory: Path, spec: dict) -> None:
    from diffusers import (
        FlaxEulerDiscreteScheduler,
        FlaxPNDMScheduler,
        FlaxStableDiffusionInpaintPipeline,
        FlaxStableDiffusionPipeline,
        FlaxStableDiffusionXLPipeline,
    )
    from transformers import CLIPTokenizer

    name = next(n for n, s in SPECS.items() if s is spec)
    _write_tokenizer(directory / "_tokenizer")
    tokenizer = CLIPTokenizer.from_pretrained(directory / "_tokenizer")
    modules, shapes = architecture(name)
    params = sd_weights(spec, shapes)  # the runner's seeded draws: what is compared is how the files are laid out
    if spec["xl"]:
        _write_tokenizer(directory / "_tokenizer_2", pad_token="!")  # SDXL's second tokenizer pads with "!"
        pipeline = FlaxStableDiffusionXLPipeline(
            text_encoder=modules["text_encoder"], text_encoder_2=modules["text_encoder_2"], vae=modules["vae"],
            tokenizer=tokenizer, tokenizer_2=CLIPTokenizer.from_pretrained(directory / "_tokenizer_2"),
            unet=modules["unet"], scheduler=FlaxEulerDiscreteScheduler(**XL_SCHEDULER))
    else:
        pipeline = (FlaxStableDiffusionInpaintPipeline if spec.get("inpaint") else FlaxStableDiffusionPipeline)(
            vae=modules["vae"], text_encoder=modules["text_encoder"], tokenizer=tokenizer, unet=modules["unet"],
            scheduler=FlaxPNDMScheduler(**SD_SCHEDULER), safety_checker=None, feature_extractor=None)
    pipeline.save_pretrained(directory, params=params)
    for staging in directory.glob("_tokenizer*"):
        shutil.rmtree(staging)


def _build_clip_into(directory: Path, spec: dict) -> None:
    import jax
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPTokenizer, FlaxCLIPModel

    _write_tokenizer(directory / "_tokenizer")
    size = len(_vocabulary()[0])
    text = dict(spec["text"], vocab_size=size, max_position_embeddings=77, bos_token_id=size - 2,
                eos_token_id=size - 1, pad_token_id=size - 1)
    config = CLIPConfig(text_config=text, vision_config=spec["vision"], projection_dim=spec["projection_dim"])
    module = FlaxCLIPModel(config, _do_init=False)
    shapes = jax.eval_shape(lambda key: module.init_weights(key, module.input_shape), jax.random.PRNGKey(0))
    module.save_pretrained(directory, params=_random_params(shapes, SEED + 10))
    CLIPTokenizer.from_pretrained(directory / "_tokenizer").save_pretrained(directory)
    image_size = spec["vision"]["image_size"]
    CLIPImageProcessor(size={"shortest_edge": image_size},
                       crop_size={"height": image_size, "width": image_size}).save_pretrained(directory)
    shutil.rmtree(directory / "_tokenizer")


def controlnet_architecture(name: str):
    """(FlaxControlNetModel, its parameter shapes) of built-in ControlNet ``name``, with no weights."""
    from diffusers import FlaxControlNetModel


    spec = CONTROLNET_SPECS[name]
    unet = SPECS[spec["base"]]["unet"]
    module = FlaxControlNetModel(
        sample_size=unet["sample_size"], in_channels=4, down_block_types=unet["down_block_types"],
        block_out_channels=unet["block_out_channels"], layers_per_block=unet["layers_per_block"],
        attention_head_dim=unet["attention_head_dim"], cross_attention_dim=unet["cross_attention_dim"],
        conditioning_embedding_out_channels=spec["conditioning_embedding_out_channels"])
    return module, _library_shapes(module, "diffusers")


def _build_controlnet_into(directory: Path, spec: dict) -> None:
    name = next(n for n, s in CONTROLNET_SPECS.items() if s is spec)
    module, shapes = controlnet_architecture(name)
    module.save_pretrained(directory, params=_random_params(shapes, SEED + 20))


def _write_t5_tokenizer(directory: Path) -> int:
    """A T5TokenizerFast laid out as the hub's FLUX.1 tokenizer_2/ (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json): sentencepiece's normalizer, Metaspace pre-tokenizer and an appended ``</s>``."""
    from transformers import T5TokenizerFast

    tokenizer = t5_tokenizer_model()  # the runner's tokenizer model; what is compared is how it is saved
    pieces = tokenizer.get_vocab_size(with_added_tokens=False)
    fast = T5TokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                           extra_ids=0, model_max_length=512)
    fast.save_pretrained(directory)
    return pieces


def _save_t5(directory: Path, name: str, config: dict, vocab_size: int, seed: int, dtype: Any, draw: str) -> None:
    """A T5 encoder (transformers' Flax class) with random weights, as a FLUX.1 or SD 3 folder holds it."""
    from transformers import FlaxT5EncoderModel, T5Config


    t5 = FlaxT5EncoderModel(T5Config(**{"vocab_size": vocab_size, **config}, pad_token_id=0, eos_token_id=1,
                                     decoder_start_token_id=0, is_encoder_decoder=False, use_cache=False),
                            _do_init=False)
    t5.save_pretrained(directory / name, params=_random_params(_library_shapes(t5, "transformers"), seed, dtype, draw))


def _build_flux_into(directory: Path, spec: dict) -> None:
    """A FLUX.1 folder: its transformer, VAE, scheduler and model_index.json were the runner's own before issue
    #60 too (models/builtin.py writes them); the text encoders and tokenizers, transformers' save_pretrained."""
    from transformers import CLIPTextConfig, CLIPTokenizer, FlaxCLIPTextModel

    from sdjax_runner.families.flux.models.builtin import build_flux_into

    build_flux_into(directory, spec)
    for name in ("text_encoder", "text_encoder_2", "tokenizer", "tokenizer_2"):
        shutil.rmtree(directory / name)
    _write_tokenizer(directory / "tokenizer")
    clip_size = len(_vocabulary()[0])
    t5_size = _write_t5_tokenizer(directory / "tokenizer_2")
    dtype, draw = _saved_dtypes(spec)
    clip_config = {"vocab_size": clip_size, "max_position_embeddings": 77, **spec["clip"]}
    clip = FlaxCLIPTextModel(CLIPTextConfig(**clip_config, bos_token_id=clip_size - 2, eos_token_id=clip_size - 1,
                                            pad_token_id=clip_size - 1), _do_init=False)
    clip.save_pretrained(directory / "text_encoder",
                         params=_random_params(_library_shapes(clip, "transformers"), SEED + 40, dtype, draw))
    _save_t5(directory, "text_encoder_2", spec["t5"], t5_size, SEED + 41, dtype, draw)
    CLIPTokenizer.from_pretrained(directory / "tokenizer")  # the tokenizer reads back


def _build_sd3_into(directory: Path, spec: dict) -> None:
    """An SD 3 folder: its MMDiT, VAE, scheduler and model_index.json were the runner's own before issue #60 too;
    the text encoders and tokenizers, transformers' save_pretrained."""
    from transformers import CLIPTextConfig, FlaxCLIPTextModelWithProjection

    from sdjax_runner.families.sd3.models.builtin import build_sd3_into

    build_sd3_into(directory, spec)
    for name in ("text_encoder", "text_encoder_2", "text_encoder_3", "tokenizer", "tokenizer_2", "tokenizer_3"):
        shutil.rmtree(directory / name)
    _write_tokenizer(directory / "tokenizer")
    _write_tokenizer(directory / "tokenizer_2")
    clip_size = len(_vocabulary()[0])
    t5_size = _write_t5_tokenizer(directory / "tokenizer_3")
    dtype, draw = _saved_dtypes(spec)
    for number, (name, clip_spec) in enumerate((("text_encoder", spec["clip"]), ("text_encoder_2", spec["clip_2"]))):
        clip_config = CLIPTextConfig(**{"vocab_size": clip_size, "max_position_embeddings": 77, **clip_spec},
                                     bos_token_id=clip_size - 2, eos_token_id=clip_size - 1,
                                     pad_token_id=clip_size - 1)
        clip = FlaxCLIPTextModelWithProjection(clip_config, _do_init=False)
        clip.save_pretrained(directory / name,
                             params=_random_params(_library_shapes(clip, "transformers"), SEED + 50 + number, dtype,
                                                   draw))
    _save_t5(directory, "text_encoder_3", spec["t5"], t5_size, SEED + 52, dtype, draw)
