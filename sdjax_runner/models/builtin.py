"""The built-in models: random-weight pipelines the project builds itself, tiny ones for tests and
full-size ones for benchmarks.

* ``tiny-random`` / ``tiny-random-xl``: structurally complete SD 1.x / SDXL pipelines (CLIP BPE
  tokenizer(s), Flax CLIP text encoder(s), UNet with cross-attention, 8x VAE, the model's
  scheduler) small enough to run on a laptop CPU in seconds.
* ``sd-v1-arch`` / ``sdxl-arch``: the exact SD-1.x and SDXL-base shapes (859.5M and 2.57G UNet
  parameters) with random weights, so performance can be measured with no hub access.
* ``tiny-random-inpaint``: ``tiny-random`` as an inpainting model (a 9-channel UNet, the index of
  ``StableDiffusionInpaintPipeline``); ``tiny-random-controlnet``: a ControlNet for ``tiny-random``.
* ``tiny-random-clip``: a small random CLIP (text and vision towers, the CLIP tokenizer and image
  processor) for the CLIP score metric in tests and the smoke run.

Each is written once with ``save_pretrained`` and afterwards loaded exactly like a hub model,
so the runner's real loading path is what the tests exercise. Everything is derived from fixed
seeds: two builds produce identical files.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import os
import re
import shutil
import socket
import tempfile
from pathlib import Path
from typing import Any

from sdjax_runner.config.schema import BUILTIN_MODELS
from sdjax_runner.errors import UserError

log = logging.getLogger("sdjax_runner")
SEED = 0

# A small fixed corpus the tokenizer's BPE merges are learned from, so that
# ordinary English prompts tokenize into word pieces rather than single bytes.
_CORPUS = """
A cinematic film still of Morgan Freeman starring as Jimi Hendrix, portrait, 40mm lens,
shallow depth of field, close up, split lighting, cinematic
Labrador in the style of Hokusai. Painting of a squirrel skating in New York.
HAL-9000 in the style of Van Gogh. Times Square under water, with fish and a dolphin swimming around.
Ancient Roman fresco showing a man working on his laptop.
Close-up photograph of young black woman against urban background, high quality, bokeh.
Armchair in the shape of an avocado. Clown astronaut in space, with Earth in the background.
a photo of an astronaut riding a horse on mars, a painting of a cat, a red car, a blue sky,
blurry, low quality, ugly, watermark, text, landscape, mountain, river, sunset, city, night
"""
_NUM_MERGES = 400
# CLIP's own pre-tokenization pattern (simplified to ASCII classes).
_WORD_PATTERN = re.compile(r"'s|'t|'re|'ve|'m|'ll|'d|[a-z]+|[0-9]|[^\sa-z0-9]+")


def _bytes_to_unicode() -> dict[int, str]:
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    return bytes_to_unicode()


def _learn_merges(corpus: str, num_merges: int) -> list[tuple[str, str]]:
    """Greedy BPE over the corpus, CLIP-style (last symbol of a word ends in </w>)."""
    byte_encoder = _bytes_to_unicode()
    words = collections.Counter(_WORD_PATTERN.findall(corpus.lower()))
    vocab: dict[tuple[str, ...], int] = {}
    for word, count in words.items():
        letters = [byte_encoder[b] for b in word.encode("utf-8")]
        letters[-1] += "</w>"
        vocab[tuple(letters)] = count
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter = collections.Counter()
        for symbols, count in vocab.items():
            for pair in itertools.pairwise(symbols):
                pairs[pair] += count
        if not pairs:
            break
        # Most frequent pair; ties broken by the pair itself so the result is deterministic.
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged: dict[tuple[str, ...], int] = {}
        for symbols, count in vocab.items():
            out, i = [], 0
            while i < len(symbols):
                if i + 1 < len(symbols) and (symbols[i], symbols[i + 1]) == best:
                    out.append(symbols[i] + symbols[i + 1])
                    i += 2
                else:
                    out.append(symbols[i])
                    i += 1
            merged[tuple(out)] = count
        vocab = merged
    return merges


def _vocabulary() -> tuple[list[str], list[tuple[str, str]]]:
    """The tokenizer's tokens (bytes, end-of-word bytes, merges, then start and end of text) and merges."""
    byte_chars = list(_bytes_to_unicode().values())
    merges = _learn_merges(_CORPUS, _NUM_MERGES)
    tokens = byte_chars + [c + "</w>" for c in byte_chars] + ["".join(m) for m in merges]
    return tokens + ["<|startoftext|>", "<|endoftext|>"], merges


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




def _random_params(shape_tree, seed: int, dtype=None, draw_dtype: str = "float64"):
    """Weights for a tree of shapes from a seeded NumPy generator.

    Kernels are fan-in scaled normals (LeCun), embeddings N(0, 0.02), norm
    scales one and biases zero: the activations stay finite through every
    block, and no JAX program has to be compiled to initialise the model.
    """
    import numpy as np
    from flax.traverse_util import flatten_dict, unflatten_dict

    rng = np.random.default_rng(seed)
    params = {}
    for path, leaf in sorted(flatten_dict(shape_tree).items()):
        name, shape = path[-1], leaf.shape
        if name == "kernel":
            fan_in = int(np.prod(shape[:-1]))
            value = rng.standard_normal(shape, dtype=draw_dtype) / np.sqrt(fan_in)
        elif name in ("embedding", "class_embedding"):
            value = 0.02 * rng.standard_normal(shape, dtype=draw_dtype)
        elif name == "logit_scale":
            value = np.full(shape, np.log(1 / 0.07))  # CLIP's initial temperature
        elif name == "scale":
            value = np.ones(shape)
        elif name == "bias":
            value = np.zeros(shape)
        else:
            raise ValueError(f"unexpected parameter {'/'.join(path)}")
        params[path] = value.astype(dtype or np.float32)
    return unflatten_dict(params)


# --- the architectures -------------------------------------------------------------------------

# SD 1.x's scheduler settings (PNDM, as CompVis/stable-diffusion-v1-4 ships it).
SD_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                    skip_prk_steps=True, steps_offset=1, set_alpha_to_one=False)
# SDXL-base's (Euler, as stabilityai/stable-diffusion-xl-base-1.0 ships it).
XL_SCHEDULER = dict(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear", num_train_timesteps=1000,
                    timestep_spacing="leading", prediction_type="epsilon")

CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
              hidden_act="quick_gelu", projection_dim=768)
SD_VAE = dict(block_out_channels=(128, 256, 512, 512), layers_per_block=2, norm_num_groups=32)

SPECS: dict[str, dict[str, Any]] = {
    "tiny-random": dict(
        xl=False,
        text=[dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4)],
        # Same block structure as SD 1.x (cross-attention down/up blocks around a cross-attention
        # mid block), with 2 resolution levels and few channels.
        unet=dict(sample_size=8, down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                  up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), block_out_channels=(32, 64),
                  layers_per_block=1, attention_head_dim=8, cross_attention_dim=32),
        # Four levels = 8x spatial down-sampling, as in SD, so height/width mean the same thing.
        vae=dict(block_out_channels=(16, 16, 32, 32), layers_per_block=1, norm_num_groups=8, sample_size=64),
        save_dtype="float32",
    ),
    "tiny-random-xl": dict(
        xl=True,
        text=[dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
              dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                   hidden_act="gelu", projection_dim=32)],
        # SDXL's structure (no attention at the top level, several transformer layers deeper down,
        # linear projections, text_time added conditioning) at toy width.
        unet=dict(sample_size=8, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"), block_out_channels=(32, 64),
                  layers_per_block=1, attention_head_dim=(2, 4), transformer_layers_per_block=(1, 2),
                  cross_attention_dim=64, use_linear_projection=True, addition_embed_type="text_time",
                  addition_time_embed_dim=8, projection_class_embeddings_input_dim=32 + 6 * 8),
        vae=dict(block_out_channels=(16, 16, 32, 32), layers_per_block=1, norm_num_groups=8, sample_size=64,
                 scaling_factor=0.13025),
        save_dtype="float32",
    ),
    "sd-v1-arch": dict(
        xl=False,
        text=[dict(CLIP_L, vocab_size=49408)],
        unet=dict(sample_size=64, block_out_channels=(320, 640, 1280, 1280), layers_per_block=2,
                  attention_head_dim=8, cross_attention_dim=768),
        vae=dict(SD_VAE, sample_size=512),
        save_dtype="bfloat16",
    ),
    "sdxl-arch": dict(
        xl=True,
        text=[dict(CLIP_L, vocab_size=49408),
              dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                   hidden_act="gelu", projection_dim=1280, vocab_size=49408)],
        unet=dict(sample_size=128, down_block_types=("DownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D"),
                  up_block_types=("CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "UpBlock2D"),
                  block_out_channels=(320, 640, 1280), layers_per_block=2, attention_head_dim=(5, 10, 20),
                  transformer_layers_per_block=(1, 2, 10), cross_attention_dim=2048, use_linear_projection=True,
                  addition_embed_type="text_time", addition_time_embed_dim=256,
                  projection_class_embeddings_input_dim=2816),
        vae=dict(SD_VAE, sample_size=1024, scaling_factor=0.13025),
        save_dtype="bfloat16",
    ),
}
# tiny-random as an inpainting model: its UNet reads 9 channels (latents, mask, masked-image latents), as
# runwayml/stable-diffusion-inpainting's does, and its index names StableDiffusionInpaintPipeline.
SPECS["tiny-random-inpaint"] = dict(SPECS["tiny-random"], inpaint=True)
# A small CLIP (metrics/clip_score.py), with the SD models' tokenizer.
CLIP_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-clip": dict(
        text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                    patch_size=8),
        projection_dim=32,
    ),
}
# A ControlNet for a built-in model (controlnet.model=NAME): the down blocks and mid block of its UNet, and a
# conditioning embedding that brings the control image down 8x to the latents' size.
CONTROLNET_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-controlnet": dict(base="tiny-random", conditioning_embedding_out_channels=(16, 16, 32, 32)),
}
if tuple(SPECS) + tuple(CLIP_SPECS) + tuple(CONTROLNET_SPECS) != BUILTIN_MODELS:  # config/schema.py names them
    raise RuntimeError(f"models/builtin.py builds {tuple(SPECS) + tuple(CLIP_SPECS) + tuple(CONTROLNET_SPECS)}, "
                       f"config/schema.py lists {BUILTIN_MODELS}")


def build_builtin(name: str, target: Path) -> Path:
    """Create built-in model ``name`` at ``target`` (atomically; an existing build is kept)."""
    target = Path(target)
    single = name in CLIP_SPECS or name in CONTROLNET_SPECS
    marker = "config.json" if single else "model_index.json"  # builds appear whole (staged, renamed)
    if (target / marker).exists():
        return target
    if target.exists() and any(target.iterdir()):
        raise UserError("model.pretrained_model_name_or_path", f"{target} exists but is not a complete built-in "
                        f"model (no {marker}); remove it and run again to rebuild it")
    log.info("build: built-in model %s (random weights, once) into %s ...", name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(target)
    # Staged under a name that says who builds it: a build whose process died is found and removed.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.{socket.gethostname()}.{os.getpid()}.",
                                    dir=target.parent))
    try:
        if name in CLIP_SPECS:
            _build_clip_into(staging, CLIP_SPECS[name])
        elif name in CONTROLNET_SPECS:
            _build_controlnet_into(staging, CONTROLNET_SPECS[name])
        else:
            _build_into(staging, SPECS[name])
        try:
            os.rename(staging, target)
        except OSError:
            # Another process finished the same build first; theirs is identical.
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def remove_abandoned_builds(target: Path) -> list[Path]:
    """Staging folders of builds of ``target`` on this host whose process is gone (killed mid-build)."""
    removed = []
    for staging in target.parent.glob(f".{target.name}.{socket.gethostname()}.*"):
        pid = staging.name[len(f".{target.name}.{socket.gethostname()}."):].split(".", 1)[0]
        if not pid.isdigit() or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
        except PermissionError:
            pass
    return removed


def architecture(name: str):
    """(pipeline modules, their parameter shapes) of built-in ``name``, with no weights."""
    from diffusers import FlaxAutoencoderKL, FlaxUNet2DConditionModel
    from transformers import CLIPTextConfig, FlaxCLIPTextModel, FlaxCLIPTextModelWithProjection

    from sdjax_runner.models.checkpoints import param_shapes

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
        shapes[component] = param_shapes(encoder, "transformers")
    modules["unet"] = FlaxUNet2DConditionModel(in_channels=9 if spec.get("inpaint") else 4, out_channels=4,
                                               **spec["unet"])
    modules["vae"] = FlaxAutoencoderKL(in_channels=3, out_channels=3, latent_channels=4,
                                       down_block_types=("DownEncoderBlock2D",) * 4,
                                       up_block_types=("UpDecoderBlock2D",) * 4, **spec["vae"])
    for component in ("unet", "vae"):
        shapes[component] = param_shapes(modules[component], "diffusers")
    return modules, shapes


def _build_into(directory: Path, spec: dict) -> None:
    import ml_dtypes
    import numpy as np
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
    full_size = spec["save_dtype"] != "float32"
    dtype = np.dtype(ml_dtypes.bfloat16) if spec["save_dtype"] == "bfloat16" else np.dtype(np.float32)
    params = {
        component: _random_params(shapes[component], SEED + number, dtype, "float32" if full_size else "float64")
        for number, component in enumerate(["text_encoder", "unet", "vae", "text_encoder_2"]) if component in shapes
    }
    for number, component in enumerate(["text_encoder", "text_encoder_2"]):
        # CLIP's final layer norm has a bias; with none, every token's output would have mean zero, and so
        # would a chunk's -- which A1111's emphasis divides by (engine/encode.py: emphasis).
        if component in params:
            norm = params[component]["text_model"]["final_layer_norm"]
            norm["bias"] = (0.1 * np.random.default_rng(SEED + 30 + number).standard_normal(norm["bias"].shape)
                            ).astype(dtype)
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

    from sdjax_runner.models.checkpoints import param_shapes

    spec = CONTROLNET_SPECS[name]
    unet = SPECS[spec["base"]]["unet"]
    module = FlaxControlNetModel(
        sample_size=unet["sample_size"], in_channels=4, down_block_types=unet["down_block_types"],
        block_out_channels=unet["block_out_channels"], layers_per_block=unet["layers_per_block"],
        attention_head_dim=unet["attention_head_dim"], cross_attention_dim=unet["cross_attention_dim"],
        conditioning_embedding_out_channels=spec["conditioning_embedding_out_channels"])
    return module, param_shapes(module, "diffusers")


def _build_controlnet_into(directory: Path, spec: dict) -> None:
    name = next(n for n, s in CONTROLNET_SPECS.items() if s is spec)
    module, shapes = controlnet_architecture(name)
    module.save_pretrained(directory, params=_random_params(shapes, SEED + 20))
