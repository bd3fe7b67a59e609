"""The built-in models: random-weight pipelines the project builds itself, tiny ones for tests and
full-size ones for benchmarks.

* ``tiny-random`` / ``tiny-random-xl``: structurally complete SD 1.x / SDXL pipelines (CLIP BPE
  tokenizer(s), Flax CLIP text encoder(s), UNet with cross-attention, 8x VAE, the model's
  scheduler) small enough to run on a laptop CPU in seconds.
* ``sd-v1-arch`` / ``sdxl-arch``: the exact SD-1.x and SDXL-base shapes (859.5M and 2.57G UNet
  parameters) with random weights, so performance can be measured with no hub access.
* ``tiny-random-inpaint``: ``tiny-random`` as an inpainting model (a 9-channel UNet, the index of
  ``StableDiffusionInpaintPipeline``); ``tiny-random-controlnet``: a ControlNet for ``tiny-random``.
* ``tiny-random-flux``: a structurally complete FLUX.1 [dev] pipeline in diffusers' layout (CLIP tokenizer and
  text encoder, a T5 tokenizer and encoder, the flow-matching transformer with a guidance embedder, the
  16-channel VAE, FLUX.1-dev's scheduler config): the transformer and VAE as Flax weights of the runner's own
  modules (families/flux/models/), the text encoders in transformers' Flax layout, the T5 tokenizer a small unigram
  model built with the ``tokenizers`` library (no sentencepiece, no hub).
* ``tiny-random-clip``: a small random CLIP (text and vision towers, the CLIP tokenizer and image
  processor) for the CLIP score metric in tests and the smoke run.

Each is written once, in diffusers' and transformers' published layout (models/published_layout.py: the files
their ``save_pretrained`` wrote, byte for byte, with neither library), and afterwards loaded exactly like a hub
model, so the runner's real loading path is what the tests exercise. Everything is derived from fixed
seeds: two builds produce identical files.
"""

from __future__ import annotations

import collections
import itertools
import json
import logging
import math
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
    from sdjax_runner.models.clip_tokenizer import byte_alphabet

    return byte_alphabet()


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


def _write_tokenizer(directory: Path, pad_token: str = "<|endoftext|>", pad_as_text: bool = False) -> int:
    """Write a CLIP tokenizer (vocab.json, merges.txt and transformers' two JSON files) laid out like
    openai/clip's; its vocabulary size. ``pad_as_text``: published_layout.clip_tokenizer's (the FLUX.1 and SD 3
    built-ins' tokenizers were written so)."""
    from sdjax_runner.models import published_layout

    tokens, merges = _vocabulary()
    published_layout.clip_tokenizer(directory, tokens, merges, pad_token, pad_as_text=pad_as_text)
    return len(tokens)


def _random_params(shape_tree, seed: int, dtype=None, draw_dtype: str = "float64", fixed=None):
    """Weights for a tree of shapes from seeded NumPy generators.

    Kernels are fan-in scaled normals (LeCun), embeddings N(0, 0.02), norm
    scales one and biases zero: the activations stay finite through every
    block, and no JAX program has to be compiled to initialise the model.
    ``fixed``: {path: array} for parameters that are tables, not weights
    (SD 3's position embeddings). The tiny models draw every tensor from one
    generator in turn; the full-size (bfloat16) ones give each tensor its own
    generator, seeded by (``seed``, its place in the sorted tree), and draw them
    on every CPU at once (NumPy releases the GIL while it fills): FLUX.1's 17
    billion values were the part of its build that a 16-core machine spent
    minutes on, one core at a time.
    """
    import ml_dtypes
    import numpy as np
    from flax.traverse_util import flatten_dict, unflatten_dict

    leaves = sorted(flatten_dict(shape_tree).items())
    if dtype is not None and np.dtype(dtype) == np.dtype(ml_dtypes.bfloat16):
        from concurrent.futures import ThreadPoolExecutor

        def draw(numbered):
            number, (path, leaf) = numbered
            value = _random_value(np.random.default_rng([seed, number]), path, leaf.shape, draw_dtype, fixed)
            return path, value.astype(dtype)

        with ThreadPoolExecutor(max_workers=os.cpu_count() or 1) as pool:
            return unflatten_dict(dict(pool.map(draw, enumerate(leaves))))
    rng = np.random.default_rng(seed)
    return unflatten_dict({path: _random_value(rng, path, leaf.shape, draw_dtype, fixed).astype(dtype or np.float32)
                           for path, leaf in leaves})


def _random_value(rng, path: tuple, shape: tuple, draw_dtype: str, fixed):
    """One parameter's value: see _random_params."""
    import numpy as np

    name = path[-1]
    if fixed and path in fixed:
        return np.asarray(fixed[path]).reshape(shape)
    if name == "kernel":
        return rng.standard_normal(shape, dtype=draw_dtype) / np.sqrt(int(np.prod(shape[:-1])))
    if name in ("embedding", "class_embedding"):
        return 0.02 * rng.standard_normal(shape, dtype=draw_dtype)
    if name == "logit_scale":
        return np.full(shape, np.log(1 / 0.07))  # CLIP's initial temperature
    if name in ("scale", "weight"):  # "weight": T5's layer norms
        return np.ones(shape)
    if name == "bias":
        return np.zeros(shape)
    raise ValueError(f"unexpected parameter {'/'.join(path)}")


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
# FLUX.1 pipelines (families/flux/models/): each component's config.json, as diffusers writes them (the sizes of
# tests/fixtures/flux/tiny-flux-dev, the PyTorch reference's).
FLUX_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-flux": dict(
        transformer=dict(patch_size=1, in_channels=64, out_channels=None, num_layers=1, num_single_layers=2,
                         attention_head_dim=16, num_attention_heads=2, joint_attention_dim=32,
                         pooled_projection_dim=32, guidance_embeds=True, axes_dims_rope=[4, 6, 6]),
        vae=dict(in_channels=3, out_channels=3, down_block_types=["DownEncoderBlock2D"] * 4,
                 up_block_types=["UpDecoderBlock2D"] * 4, block_out_channels=[4, 8, 8, 8], layers_per_block=1,
                 act_fn="silu", latent_channels=16, norm_num_groups=2, sample_size=32, scaling_factor=0.3611,
                 shift_factor=0.1159, latents_mean=None, latents_std=None, force_upcast=True,
                 use_quant_conv=False, use_post_quant_conv=False, mid_block_add_attention=True),
        clip=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        t5=dict(d_model=32, d_kv=8, d_ff=64, num_layers=2, num_heads=4, feed_forward_proj="gated-gelu",
                relative_attention_num_buckets=32, relative_attention_max_distance=128),
        # FLUX.1-dev's scheduler config (black-forest-labs/FLUX.1-dev, scheduler/scheduler_config.json)
        scheduler=dict(num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True, base_shift=0.5,
                       max_shift=1.15, base_image_seq_len=256, max_image_seq_len=4096),
        save_dtype="float32",
    ),
}
# FLUX.1 [schnell]'s structure at toy size: no guidance embedder, and schnell's scheduler config
# (black-forest-labs/FLUX.1-schnell, scheduler/scheduler_config.json: shift 1, no dynamic shifting).
FLUX_SPECS["tiny-random-flux-schnell"] = dict(
    FLUX_SPECS["tiny-random-flux"],
    transformer=dict(FLUX_SPECS["tiny-random-flux"]["transformer"], guidance_embeds=False),
    scheduler=dict(num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False, base_shift=0.5, max_shift=1.15,
                   base_image_seq_len=256, max_image_seq_len=4096),
)
# FLUX.1 [dev]'s exact shapes (black-forest-labs/FLUX.1-dev's configs: an 11.9B-parameter transformer, CLIP-L,
# T5-XXL's 4.8B-parameter encoder, the 16-channel VAE), random weights in bfloat16 (about 34 GB written once):
# speed and memory on an accelerator with no hub.
FLUX_SPECS["flux-dev-arch"] = dict(
    FLUX_SPECS["tiny-random-flux"],
    transformer=dict(patch_size=1, in_channels=64, out_channels=None, num_layers=19, num_single_layers=38,
                     attention_head_dim=128, num_attention_heads=24, joint_attention_dim=4096,
                     pooled_projection_dim=768, guidance_embeds=True, axes_dims_rope=[16, 56, 56]),
    vae=dict(FLUX_SPECS["tiny-random-flux"]["vae"], block_out_channels=[128, 256, 512, 512], layers_per_block=2,
             norm_num_groups=32, sample_size=1024),
    clip=dict(CLIP_L, vocab_size=49408),
    t5=dict(d_model=4096, d_kv=64, d_ff=10240, num_layers=24, num_heads=64, feed_forward_proj="gated-gelu",
            relative_attention_num_buckets=32, relative_attention_max_distance=128, vocab_size=32128),
    save_dtype="bfloat16",
)
# SD 3 / 3.5 pipelines (families/sd3/models/): each component's config.json, as diffusers writes them (the sizes of
# tests/fixtures/sd3/tiny-sd3, the PyTorch reference's: SD 3.5 Medium's shape).
SD3_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-sd3": dict(
        transformer=dict(sample_size=16, patch_size=2, in_channels=16, num_layers=3, attention_head_dim=8,
                         num_attention_heads=4, joint_attention_dim=32, caption_projection_dim=32,
                         pooled_projection_dim=24, out_channels=16, pos_embed_max_size=16,
                         dual_attention_layers=[0, 1], qk_norm="rms_norm"),
        vae=dict(FLUX_SPECS["tiny-random-flux"]["vae"], scaling_factor=1.5305, shift_factor=0.0609),
        clip=dict(hidden_size=8, intermediate_size=16, num_hidden_layers=2, num_attention_heads=2,
                  hidden_act="quick_gelu", projection_dim=8),
        clip_2=dict(hidden_size=16, intermediate_size=32, num_hidden_layers=3, num_attention_heads=4,
                    hidden_act="gelu", projection_dim=16),
        t5=FLUX_SPECS["tiny-random-flux"]["t5"],
        # stabilityai/stable-diffusion-3.5-medium's scheduler/scheduler_config.json
        scheduler=dict(num_train_timesteps=1000, shift=3.0),
        save_dtype="float32",
    ),
}
# SD 3.5 Large's exact shapes (stabilityai/stable-diffusion-3.5-large's configs: an 8.06B-parameter MMDiT, CLIP-L,
# OpenCLIP bigG's text tower with its projection, T5-XXL's encoder, SD 3's VAE), random weights in bfloat16
# (about 28 GB written once): speed and memory on an accelerator with no hub (benchmarks/full_size.py, part H).
SD3_SPECS["sd3.5-large-arch"] = dict(
    SD3_SPECS["tiny-random-sd3"],
    transformer=dict(sample_size=128, patch_size=2, in_channels=16, num_layers=38, attention_head_dim=64,
                     num_attention_heads=38, joint_attention_dim=4096, caption_projection_dim=2432,
                     pooled_projection_dim=2048, out_channels=16, pos_embed_max_size=192, dual_attention_layers=[],
                     qk_norm="rms_norm"),
    vae=dict(SD3_SPECS["tiny-random-sd3"]["vae"], block_out_channels=[128, 256, 512, 512], layers_per_block=2,
             norm_num_groups=32, sample_size=1024),
    clip=dict(CLIP_L, vocab_size=49408, projection_dim=768),
    clip_2=dict(hidden_size=1280, intermediate_size=5120, num_hidden_layers=32, num_attention_heads=20,
                hidden_act="gelu", projection_dim=1280, vocab_size=49408),
    t5=FLUX_SPECS["flux-dev-arch"]["t5"],
    # stabilityai/stable-diffusion-3.5-large's scheduler/scheduler_config.json
    scheduler=dict(num_train_timesteps=1000, shift=3.0),
    save_dtype="bfloat16",
)
_BUILT = tuple(SPECS) + tuple(CLIP_SPECS) + tuple(CONTROLNET_SPECS) + tuple(FLUX_SPECS) + tuple(SD3_SPECS)
if _BUILT != BUILTIN_MODELS:  # config/schema.py names them
    raise RuntimeError(f"models/builtin.py builds {_BUILT}, config/schema.py lists {BUILTIN_MODELS}")


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
        elif name in FLUX_SPECS:
            _build_flux_into(staging, FLUX_SPECS[name])
        elif name in SD3_SPECS:
            _build_sd3_into(staging, SD3_SPECS[name])
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
        if not (pid.isascii() and pid.isdigit()) or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
        except PermissionError:
            pass
    return removed


def _clip_text_config(spec: dict, vocab_size: int) -> dict:
    """A CLIP text encoder's config.json keys (transformers' CLIPTextConfig) for the built-in tokenizer."""
    from sdjax_runner.models import published_layout

    return published_layout.clip_text_config({"vocab_size": vocab_size, "max_position_embeddings": 77, **spec,
                                              "bos_token_id": vocab_size - 2, "eos_token_id": vocab_size - 1,
                                              "pad_token_id": vocab_size - 1})


def _unet_config(spec: dict) -> dict:
    from sdjax_runner.families.sd.models.unet import CONFIG_DEFAULTS

    return dict(CONFIG_DEFAULTS, in_channels=9 if spec.get("inpaint") else 4, out_channels=4, **spec["unet"])


def _vae_config(spec: dict) -> dict:
    from sdjax_runner.models.nn.vae import CONFIG_DEFAULTS
    from sdjax_runner.models.published_layout import FLAX_VAE_KEYS

    return dict({key: CONFIG_DEFAULTS[key] for key in FLAX_VAE_KEYS}, in_channels=3, out_channels=3,
                latent_channels=4, down_block_types=("DownEncoderBlock2D",) * 4,
                up_block_types=("UpDecoderBlock2D",) * 4, **spec["vae"])


def _module(class_name: str, config: dict) -> tuple[Any, Any]:
    """(the runner's module for a component config, as the loader builds it -- models/loading.py's MODULE_KINDS --,
    its parameter shapes)."""
    import jax.numpy as jnp

    from sdjax_runner.models.checkpoints import param_shapes
    from sdjax_runner.models.loading import MODULE_KINDS

    kind = MODULE_KINDS[class_name]
    module = kind.build(config, jnp.float32)
    return module, param_shapes(module, kind.naming)


def _text_encoders(spec: dict) -> list[tuple[str, str, dict]]:
    """(component, published class, config) of an SD built-in's text encoders."""
    size = len(_vocabulary()[0])  # the tokenizer's ids end with <|startoftext|>, <|endoftext|>
    return [("text_encoder" if number == 0 else "text_encoder_2",
             "CLIPTextModelWithProjection" if spec["xl"] and number == 1 else "CLIPTextModel",
             _clip_text_config(text, size)) for number, text in enumerate(spec["text"])]


def architecture(name: str):
    """(the runner's modules of built-in ``name``'s pipeline, their parameter shapes), with no weights."""
    spec = SPECS[name]
    classes = {component: (cls, config) for component, cls, config in _text_encoders(spec)}
    classes["unet"] = ("UNet2DConditionModel", _unet_config(spec))
    classes["vae"] = ("AutoencoderKL", _vae_config(spec))
    built = {component: _module(cls, config) for component, (cls, config) in classes.items()}
    return ({component: module for component, (module, _) in built.items()},
            {component: shapes for component, (_, shapes) in built.items()})


def sd_weights(spec: dict, shapes: dict) -> dict:
    """An SD built-in's random weights for its components' ``shapes`` (architecture's), drawn from fixed seeds."""
    import ml_dtypes
    import numpy as np

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
    return params


def _build_into(directory: Path, spec: dict) -> None:
    from sdjax_runner.models import published_layout

    name = next(n for n, s in SPECS.items() if s is spec)
    _write_tokenizer(directory / "tokenizer")
    _, shapes = architecture(name)
    params = sd_weights(spec, shapes)
    for component, cls, config in _text_encoders(spec):
        published_layout.transformers_model(directory / component, cls, config, params[component])
    published_layout.diffusers_component(directory / "unet", "FlaxUNet2DConditionModel", _unet_config(spec),
                                         params["unet"])
    published_layout.diffusers_component(directory / "vae", "FlaxAutoencoderKL", _vae_config(spec), params["vae"])
    components: dict[str, list[Any]] = {"text_encoder": ["transformers", "FlaxCLIPTextModel"],
                                        "tokenizer": ["transformers", "CLIPTokenizer"],
                                        "unet": ["diffusers", "FlaxUNet2DConditionModel"],
                                        "vae": ["diffusers", "FlaxAutoencoderKL"]}
    if spec["xl"]:
        _write_tokenizer(directory / "tokenizer_2", pad_token="!")  # SDXL's second tokenizer pads with "!"
        published_layout.scheduler(directory / "scheduler", "FlaxEulerDiscreteScheduler", XL_SCHEDULER)
        components.update(scheduler=["diffusers", "FlaxEulerDiscreteScheduler"],
                          text_encoder_2=["transformers", "FlaxCLIPTextModelWithProjection"],
                          tokenizer_2=["transformers", "CLIPTokenizer"])
        pipeline = "FlaxStableDiffusionXLPipeline"
    else:
        published_layout.scheduler(directory / "scheduler", "FlaxPNDMScheduler", SD_SCHEDULER)
        components.update(scheduler=["diffusers", "FlaxPNDMScheduler"], safety_checker=[None, None],
                          feature_extractor=[None, None])
        pipeline = "FlaxStableDiffusionInpaintPipeline" if spec.get("inpaint") else "FlaxStableDiffusionPipeline"
    published_layout.model_index(directory, pipeline, components)


def _build_clip_into(directory: Path, spec: dict) -> None:
    from sdjax_runner.models import published_layout
    from sdjax_runner.models.checkpoints import param_shapes
    from sdjax_runner.models.nn.clip import CLIPModel

    size = _write_tokenizer(directory)
    text = dict(spec["text"], vocab_size=size, max_position_embeddings=77, bos_token_id=size - 2,
                eos_token_id=size - 1, pad_token_id=size - 1)
    config = published_layout.clip_model_config(text, spec["vision"], spec["projection_dim"])
    shapes = param_shapes(CLIPModel.from_config(config), "transformers")
    published_layout.transformers_model(directory, "CLIPModel", config, _random_params(shapes, SEED + 10))
    published_layout.clip_image_processor(directory, spec["vision"]["image_size"])


def _controlnet_config(name: str) -> dict:
    from sdjax_runner.families.sd.models.controlnet import CONFIG_DEFAULTS

    spec = CONTROLNET_SPECS[name]
    unet = SPECS[spec["base"]]["unet"]
    return dict(CONFIG_DEFAULTS, sample_size=unet["sample_size"], in_channels=4,
                down_block_types=unet["down_block_types"], block_out_channels=unet["block_out_channels"],
                layers_per_block=unet["layers_per_block"], attention_head_dim=unet["attention_head_dim"],
                cross_attention_dim=unet["cross_attention_dim"],
                conditioning_embedding_out_channels=spec["conditioning_embedding_out_channels"])


def controlnet_architecture(name: str):
    """(the runner's ControlNet module, its parameter shapes) of built-in ControlNet ``name``, with no weights."""
    return _module("ControlNetModel", _controlnet_config(name))


def _build_controlnet_into(directory: Path, spec: dict) -> None:
    from sdjax_runner.models import published_layout

    name = next(n for n, s in CONTROLNET_SPECS.items() if s is spec)
    _, shapes = controlnet_architecture(name)
    published_layout.diffusers_component(directory, "FlaxControlNetModel", _controlnet_config(name),
                                         _random_params(shapes, SEED + 20))


# --- FLUX.1 --------------------------------------------------------------------------------------

_T5_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2: T5's pad, end and unknown tokens


def _t5_pieces() -> list[tuple[str, float]]:
    """A unigram vocabulary in sentencepiece's form: the specials, "▁" + every word of the tokenizer corpus
    (as written and lowercased; more frequent words score higher), then single characters, which spell
    anything else."""
    words = collections.Counter(re.findall(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]", _CORPUS))
    for word, count in list(words.items()):
        words[word.lower()] += 0 if word.islower() else count
    pieces: dict[str, float] = {}
    total = sum(words.values())
    for word, count in sorted(words.items(), key=lambda item: (-item[1], item[0])):
        pieces.setdefault("\u2581" + word, math.log(count / total))
    characters = sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"()[]-_/&+=*#@%"))
    for char in ["\u2581", *characters]:
        pieces.setdefault(char, -20.0)
    return [(special, 0.0) for special in _T5_SPECIALS] + list(pieces.items())


def _write_t5_tokenizer(directory: Path) -> int:
    """A T5TokenizerFast laid out as the hub's FLUX.1 tokenizer_2/ (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json): sentencepiece's normalizer, Metaspace pre-tokenizer and an appended ``</s>``."""
    from sdjax_runner.models import published_layout

    tokenizer = t5_tokenizer_model()
    published_layout.t5_tokenizer(directory, tokenizer, _T5_SPECIALS)
    return tokenizer.get_vocab_size(with_added_tokens=False)


def t5_tokenizer_model() -> Any:
    """The built-in T5 tokenizer (a ``tokenizers.Tokenizer``): a unigram model of :func:`_t5_pieces` with
    sentencepiece's normalizer, the Metaspace pre-tokenizer and an appended ``</s>``, as T5TokenizerFast has it."""
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors

    pieces = _t5_pieces()
    tokenizer = Tokenizer(models.Unigram(pieces, unk_id=2, byte_fallback=False))
    tokenizer.normalizer = normalizers.Sequence([normalizers.Strip(left=False, right=True),
                                                 normalizers.Replace(Regex(" {2,}"), "\u2581")])
    tokenizer.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.decoder = decoders.Metaspace(replacement="\u2581", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                            special_tokens=[("</s>", 1)])
    return tokenizer


def _save_own(directory: Path, name: str, class_name: str, config: dict, params: Any) -> None:
    """One of the runner's own modules as diffusers' layout holds a Flax component: config.json and weights."""
    from flax.serialization import to_bytes

    (directory / name).mkdir()
    config = {"_class_name": class_name, "_diffusers_version": "0.39.0", **config}
    (directory / name / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (directory / name / "diffusion_flax_model.msgpack").write_bytes(to_bytes(params))


def _save_flow_scheduler(directory: Path, config: dict) -> None:
    (directory / "scheduler").mkdir()
    scheduler = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.39.0", **config}
    (directory / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler, indent=2), encoding="utf-8")


def _save_t5(directory: Path, name: str, config: dict, vocab_size: int, seed: int, dtype: Any, draw: str) -> None:
    """A T5 encoder (transformers' T5EncoderModel layout) with random weights, as a FLUX.1 or SD 3 folder holds it."""
    from sdjax_runner.models import published_layout

    t5 = published_layout.t5_config({"vocab_size": vocab_size, **config})
    published_layout.transformers_model(directory / name, "T5EncoderModel", t5,
                                        _random_params(_module("T5EncoderModel", t5)[1], seed, dtype, draw))


def _save_clip_text(directory: Path, name: str, cls: str, spec: dict, vocab_size: int, seed: int, dtype: Any,
                    draw: str) -> None:
    """A CLIP text encoder (transformers' layout for ``cls``) with random weights."""
    from sdjax_runner.models import published_layout

    config = _clip_text_config(spec, vocab_size)
    published_layout.transformers_model(directory / name, cls, config,
                                        _random_params(_module(cls, config)[1], seed, dtype, draw))


def _saved_dtypes(spec: dict) -> tuple[Any, str]:
    """(the weights' dtype, the dtype they are drawn in): full-size builds are bfloat16, drawn in float32 (a
    float64 draw of 17B numbers would take twice the memory); the tiny ones float32 drawn in float64."""
    import ml_dtypes
    import numpy as np

    if spec["save_dtype"] == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16), "float32"
    return np.dtype(np.float32), "float64"


def _build_flux_into(directory: Path, spec: dict) -> None:
    """A FLUX.1 folder in diffusers' layout: model_index.json, each component's config and weights."""
    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer
    from sdjax_runner.models.checkpoints import param_shapes

    _write_tokenizer(directory / "tokenizer", pad_as_text=True)
    clip_size = len(_vocabulary()[0])
    t5_size = _write_t5_tokenizer(directory / "tokenizer_2")
    dtype, draw = _saved_dtypes(spec)
    _save_clip_text(directory, "text_encoder", "CLIPTextModel", spec["clip"], clip_size, SEED + 40, dtype, draw)
    _save_t5(directory, "text_encoder_2", spec["t5"], t5_size, SEED + 41, dtype, draw)
    own: tuple[tuple[str, Any, str], ...] = (("transformer", FlaxFluxTransformer, "FluxTransformer2DModel"),
                                             ("vae", FlaxFluxAutoencoderKL, "AutoencoderKL"))
    for number, (name, cls, class_name) in enumerate(own):
        module = cls.from_config(spec[name])
        _save_own(directory, name, class_name, spec[name],
                  _random_params(param_shapes(module, "diffusers"), SEED + 42 + number, dtype, draw))
    _save_flow_scheduler(directory, spec["scheduler"])
    index = {"_class_name": "FluxPipeline", "_diffusers_version": "0.39.0",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModel"], "text_encoder_2": ["transformers", "T5EncoderModel"],
             "tokenizer": ["transformers", "CLIPTokenizer"], "tokenizer_2": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "FluxTransformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    (directory / "model_index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")


def _build_sd3_into(directory: Path, spec: dict) -> None:
    """An SD 3 folder in diffusers' layout: model_index.json, each component's config and weights (the
    transformer's position table the sine-cosine one diffusers saves, not random)."""
    from sdjax_runner.families.flux.models.autoencoder import FlaxFluxAutoencoderKL
    from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer, sincos_table
    from sdjax_runner.models.checkpoints import param_shapes

    _write_tokenizer(directory / "tokenizer", pad_as_text=True)
    _write_tokenizer(directory / "tokenizer_2", pad_as_text=True)
    clip_size = len(_vocabulary()[0])
    t5_size = _write_t5_tokenizer(directory / "tokenizer_3")
    dtype, draw = _saved_dtypes(spec)
    for number, (name, clip_spec) in enumerate((("text_encoder", spec["clip"]), ("text_encoder_2", spec["clip_2"]))):
        _save_clip_text(directory, name, "CLIPTextModelWithProjection", clip_spec, clip_size, SEED + 50 + number,
                        dtype, draw)
    _save_t5(directory, "text_encoder_3", spec["t5"], t5_size, SEED + 52, dtype, draw)
    own: tuple[tuple[str, Any, str], ...] = (("transformer", FlaxSD3Transformer, "SD3Transformer2DModel"),
                                             ("vae", FlaxFluxAutoencoderKL, "AutoencoderKL"))
    for number, (name, cls, class_name) in enumerate(own):
        module = cls.from_config(spec[name])
        tables = {("pos_embed", "pos_embed"): sincos_table(module.inner_dim, module.pos_embed_max_size,
                                                           module.sample_size // module.patch_size)
                  } if name == "transformer" else None
        _save_own(directory, name, class_name, spec[name],
                  _random_params(param_shapes(module, "diffusers"), SEED + 53 + number, dtype, draw, tables))
    _save_flow_scheduler(directory, spec["scheduler"])
    index = {"_class_name": "StableDiffusion3Pipeline", "_diffusers_version": "0.39.0",
             "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"],
             "text_encoder": ["transformers", "CLIPTextModelWithProjection"],
             "text_encoder_2": ["transformers", "CLIPTextModelWithProjection"],
             "text_encoder_3": ["transformers", "T5EncoderModel"], "tokenizer": ["transformers", "CLIPTokenizer"],
             "tokenizer_2": ["transformers", "CLIPTokenizer"], "tokenizer_3": ["transformers", "T5TokenizerFast"],
             "transformer": ["diffusers", "SD3Transformer2DModel"], "vae": ["diffusers", "AutoencoderKL"]}
    (directory / "model_index.json").write_text(json.dumps(index, indent=2), encoding="utf-8")
