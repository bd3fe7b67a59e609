"""Make the PyTorch reference fixtures for FLUX.1 (issue #46) in ``tests/fixtures/flux/``.

The runner never imports torch. This script runs in a separate virtual environment that has torch and
diffusers' PyTorch FLUX classes, builds two tiny random-weight FLUX.1 pipelines with those classes
(``tiny-flux-dev``: guidance-distilled transformer, FLUX.1-dev's scheduler; ``tiny-flux-schnell``: no
guidance embedder, FLUX.1-schnell's scheduler), saves them in the published diffusers layout and records
what diffusers computes with them, module by module and for whole pipeline calls, as ``.npz`` files the
JAX implementation is compared with. No hub is used: the weights come from a fixed torch seed, the CLIP
tokenizer is the one the project's built-in tiny models use (``sdjax_runner/models/builtin_parts.py``, its code
read from that file, so the runner's package need not be importable here) and the T5 tokenizer's
sentencepiece model is trained here on a small fixed corpus. Running it twice writes identical files.

The environment (exact versions; the script records the versions it ran with in ``VERSIONS.json``)::

    python3.12 -m venv /work/refvenv
    /work/refvenv/bin/pip install torch==2.14.1 diffusers==0.39.0 transformers==4.57.6 tokenizers==0.22.2 \\
        huggingface_hub==0.36.2 safetensors==0.8.0 sentencepiece==0.2.3 protobuf==7.36.2 accelerate==1.15.0 \\
        numpy==2.5.5 pillow==13.0.0 jax==0.12.0.1 jaxlib==0.12.0.1

(torch from PyPI: its CUDA build runs on the CPU here, and the fixtures were made with 2.14.1+cu130 on
x86_64; jax, CPU, at the project's version: the pipeline references start from the runner's own noise, drawn
with ``jax.random``; protobuf: transformers needs it to turn ``spiece.model`` into ``tokenizer.json``.)

Run from the checkout's root::

    /work/refvenv/bin/python tests/helpers/make_flux_reference.py            # writes tests/fixtures/flux/
    /work/refvenv/bin/python tests/helpers/make_flux_reference.py --out DIR  # somewhere else

It ends by loading each saved folder back with ``FluxPipeline.from_pretrained`` (offline) and checking
that it reproduces the recorded images. ``tests/fixtures/flux/README.md`` (written by this script)
describes every file and key.
"""

from __future__ import annotations

import argparse
import ast
import collections
import importlib.metadata
import io
import itertools
import json
import os
import platform
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")
os.environ.setdefault("JAX_PLATFORMS", "cpu")

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
BUILTIN = ROOT / "sdjax_runner" / "models" / "builtin_parts.py"
DEFAULT_OUT = ROOT / "tests" / "fixtures" / "flux"
SEED = 0

PROMPT = "a red cube on a table"
HEIGHT = WIDTH = 32
NUM_DEVICES = 2
MAX_SEQUENCE_LENGTH = 32
# FluxPipeline's true classifier-free guidance ([dev] with a negative prompt and true_cfg_scale > 1).
NEGATIVE_PROMPT = "blurry"
TRUE_CFG_SCALE = 4.0
MODULE_TIMESTEP = 0.7  # as passed to the transformer's forward (the pipeline passes t / 1000)
MODULE_GUIDANCE = 3.5  # as passed to forward (the pipeline passes guidance_scale unscaled)
MODULE_TEXT_TOKENS = 8
# The transformer is saved in shards, as the hub's FLUX.1 folders ship it (transformer/ in 3 files), and
# so is the T5 encoder (text_encoder_2/ in 2 files on the hub).
TRANSFORMER_SHARD = "150KB"
T5_SHARD = "100KB"

# The published scheduler_config.json of black-forest-labs/FLUX.1-dev and FLUX.1-schnell (less the
# _class_name and _diffusers_version keys).
FLUX_DEV_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                          num_train_timesteps=1000, shift=3.0, use_dynamic_shifting=True)
FLUX_SCHNELL_SCHEDULER = dict(base_image_seq_len=256, base_shift=0.5, max_image_seq_len=4096, max_shift=1.15,
                              num_train_timesteps=1000, shift=1.0, use_dynamic_shifting=False)

# FLUX.1's transformer at toy size: 2 heads of 16 (= 4 + 6 + 6, the rotary axes), one double-stream block,
# two single-stream blocks; 2x2-patchified 16-channel latents in (64), T5 width (32) and CLIP pooled width (32).
TRANSFORMER = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=2, attention_head_dim=16,
                   num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32,
                   axes_dims_rope=(4, 6, 6))
# FLUX.1's VAE (ae.safetensors in diffusers' layout): 16 latent channels, no quant convs, its scaling and
# shift factors; four levels (8x down-sampling, as the real one; the width grows once, like its 128, 256, 512,
# 512) at toy width.
VAE = dict(in_channels=3, out_channels=3, latent_channels=16, down_block_types=("DownEncoderBlock2D",) * 4,
           up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(4, 8, 8, 8), layers_per_block=1,
           norm_num_groups=2, act_fn="silu", sample_size=32, scaling_factor=0.3611, shift_factor=0.1159,
           use_quant_conv=False, use_post_quant_conv=False, force_upcast=True, mid_block_add_attention=True)
# openai/clip-vit-large-patch14's text tower (CLIPTextModel, quick_gelu) at toy width; the vocabulary and
# special ids are the built-in tokenizer's (set in _clip_config).
CLIP = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
            hidden_act="quick_gelu", projection_dim=32, max_position_embeddings=77)
# google/t5-v1_1-xxl's encoder (T5EncoderModel: gated-GELU feed-forward, untied embeddings, relative
# position buckets) at toy width; vocab_size is set from the trained tokenizer (_t5_config).
T5 = dict(d_model=32, d_kv=8, num_heads=4, d_ff=64, num_layers=2, num_decoder_layers=2,
          feed_forward_proj="gated-gelu", relative_attention_num_buckets=32, relative_attention_max_distance=128,
          layer_norm_epsilon=1e-6, dropout_rate=0.1, tie_word_embeddings=False, is_encoder_decoder=True,
          pad_token_id=0, eos_token_id=1, decoder_start_token_id=0)
T5_VOCAB = 160  # the sentencepiece model's pieces; the tokenizer adds T5's 100 <extra_id_N> tokens

VARIANTS = {
    "dev": dict(folder="tiny-flux-dev", guidance_embeds=True, scheduler=FLUX_DEV_SCHEDULER, steps=4,
                guidance_scale=3.5),
    "schnell": dict(folder="tiny-flux-schnell", guidance_embeds=False, scheduler=FLUX_SCHNELL_SCHEDULER, steps=2,
                    guidance_scale=0.0),
}
# The torch seed each component's weights are drawn with (the same in both variants: like the real
# FLUX.1-dev and -schnell, the two share their VAE and text encoders; the transformers differ).
COMPONENT_SEEDS = dict(transformer=SEED, vae=SEED + 1, text_encoder=SEED + 2, text_encoder_2=SEED + 3)
PACKAGES = ("torch", "diffusers", "transformers", "tokenizers", "huggingface_hub", "safetensors", "sentencepiece", "protobuf",
            "accelerate", "numpy", "pillow", "jax", "jaxlib")

# The T5 tokenizer's training text: plain English of the kind prompts are made of.
T5_CORPUS = """\
a red cube on a table
a blue sphere next to a green pyramid
a photo of an astronaut riding a horse on the moon
a painting of a cat sitting on a wooden chair
a small house in the mountains under a starry night sky
a bowl of fruit on a kitchen table, soft morning light
a portrait of an old man with a white beard, oil painting
a city street at night with neon signs and rain on the ground
a sailing boat on a calm lake at sunset
a yellow car parked in front of a brick building
a dog running across a field of flowers
a cup of coffee and a book on a table by the window
a forest path in autumn with orange and red leaves
a castle on a hill surrounded by clouds
a robot reading a newspaper in a park
a glass of water on a white table, studio lighting
a black and white photograph of a train station
a watercolor painting of a garden with roses
a close up of a butterfly on a purple flower
a snowy village with wooden houses and smoke from the chimneys
three apples and a lemon on a plate
a lighthouse on a rocky coast during a storm
a bird sitting on a branch in the morning
a mountain river flowing through a green valley
the sun rises over the sea and the sky turns orange
an owl in the dark forest looks at the moon
children playing football on the beach
a bicycle leaning against a blue door
a plate of pasta with tomato sauce and basil
a cozy room with a fireplace, a sofa and a sleeping cat
a high quality photo, detailed, sharp focus, beautiful colors
blurry, low quality, ugly, watermark, text
"""


# --- small helpers --------------------------------------------------------------------------------


def _builtin_tokenizer_code() -> dict:
    """The built-in models' CLIP tokenizer code (``write_clip_tokenizer`` and what it uses), read from
    ``sdjax_runner/models/builtin_parts.py`` -- the same vocabulary and merges as ``tiny-random``'s tokenizer,
    without importing the runner's package (it needs Hydra, which this environment does not have)."""
    wanted = {"CORPUS", "_NUM_MERGES", "_WORD_PATTERN", "_bytes_to_unicode", "_learn_merges", "clip_vocabulary",
              "write_clip_tokenizer"}
    tree = ast.parse(BUILTIN.read_text(encoding="utf-8"))
    body = [node for node in tree.body
            if (isinstance(node, ast.FunctionDef) and node.name in wanted)
            or (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id in wanted for t in node.targets))]
    namespace: dict = {"collections": collections, "itertools": itertools, "json": json, "re": re, "Path": Path}
    exec(compile(ast.Module(body=body, type_ignores=[]), str(BUILTIN), "exec"), namespace)
    missing = wanted - namespace.keys()
    if missing:
        raise RuntimeError(f"{BUILTIN} no longer defines {sorted(missing)}")
    return namespace


def _save_npz(path: Path, arrays: dict[str, np.ndarray]) -> None:
    """``np.savez`` with fixed zip timestamps (np.savez stamps each member with the current time, so two
    runs would differ); ``np.load`` reads it as usual."""
    with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as archive:
        for key, value in arrays.items():
            buffer = io.BytesIO()
            np.lib.format.write_array(buffer, np.asarray(value), allow_pickle=False)
            archive.writestr(zipfile.ZipInfo(f"{key}.npy", date_time=(1980, 1, 1, 0, 0, 0)), buffer.getvalue())


def _np(tensor) -> np.ndarray:
    return tensor.detach().cpu().numpy().copy()


def _versions() -> dict:
    import torch

    versions = {"python": platform.python_version(), "machine": platform.machine()}
    for package in PACKAGES:
        try:
            versions[package] = importlib.metadata.version(package)
        except importlib.metadata.PackageNotFoundError:
            versions[package] = None
    versions["torch_build"] = torch.__version__
    return versions


def write_reference(folder: Path, name: str, arrays: dict, readme: str, script: str) -> None:
    """A reference folder: ``NAME.npz`` (:func:`_save_npz`), ``VERSIONS.json`` (the packages, and ``script``, the maker
    that wrote it) and ``README.md``."""
    import json

    folder.mkdir(parents=True, exist_ok=True)
    _save_npz(folder / f"{name}.npz", arrays)
    versions = dict(_versions(), script=script)
    (folder / "VERSIONS.json").write_text(json.dumps(versions, indent=2, sort_keys=True) + "\n")
    (folder / "README.md").write_text(readme)
    print(f"wrote {folder}/{name}.npz")


# --- the components ---------------------------------------------------------------------------------


def _clip_tokenizer(staging: Path):
    from transformers import CLIPTokenizer

    size = _builtin_tokenizer_code()["write_clip_tokenizer"](staging / "clip_tokenizer")
    return CLIPTokenizer.from_pretrained(staging / "clip_tokenizer"), size


def _t5_tokenizer(staging: Path):
    """A T5 tokenizer (google/t5-v1_1-xxl's kind: unigram sentencepiece, <pad>=0, </s>=1, <unk>=2, no
    <s>, 100 <extra_id_N> tokens after the pieces) from a sentencepiece model trained here.

    The real spiece.model normalizes with nmt_nfkc, whose character map alone is ~240 KB (and again in
    tokenizer.json); this one uses the identity rule (the same pieces for ASCII prompts) to keep the fixture
    small. transformers 4.57 converts spiece.model to a fast tokenizer whose Metaspace never prepends
    "\u2581" unless add_prefix_space=True is passed (then "always", as the hub's T5 tokenizer.json has, and as
    sentencepiece itself does); but a tokenizer_config.json that sets add_prefix_space makes every later
    from_pretrained re-convert from spiece.model, which needs sentencepiece and protobuf. So the converted
    backend is wrapped in a tokenizer that leaves it unset."""
    import sentencepiece as spm
    from transformers import T5TokenizerFast

    folder = staging / "t5_tokenizer"
    folder.mkdir()
    model = io.BytesIO()  # (trained from an iterator into memory: the model records no file paths)
    spm.set_random_generator_seed(SEED)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(T5_CORPUS.splitlines()), model_writer=model, model_type="unigram",
        vocab_size=T5_VOCAB, pad_id=0, eos_id=1, unk_id=2, bos_id=-1, character_coverage=1.0, num_threads=1,
        shuffle_input_sentence=False, input_sentence_size=0, seed_sentencepiece_size=1_000_000,
        normalization_rule_name="identity", hard_vocab_limit=True, minloglevel=2)
    (folder / "spiece.model").write_bytes(model.getvalue())
    vocab_file = str(folder / "spiece.model")
    converted = T5TokenizerFast(vocab_file=vocab_file, extra_ids=100, legacy=True, add_prefix_space=True)
    tokenizer = T5TokenizerFast(vocab_file=vocab_file, tokenizer_object=converted.backend_tokenizer, extra_ids=100,
                                model_max_length=512, legacy=True)
    processor = spm.SentencePieceProcessor(model_file=vocab_file)
    for text in (PROMPT, *T5_CORPUS.splitlines()):
        if tokenizer(text).input_ids != processor.encode(text) + [tokenizer.eos_token_id]:
            raise RuntimeError(f"the fast T5 tokenizer and sentencepiece disagree on {text!r}")
    return tokenizer


def _clip_config(size: int):
    from transformers import CLIPTextConfig

    # The built-in tokenizer's ids end with <|startoftext|>, <|endoftext|> (pad is <|endoftext|>).
    return CLIPTextConfig(vocab_size=size, bos_token_id=size - 2, eos_token_id=size - 1, pad_token_id=size - 1,
                          **CLIP)


def _t5_config(tokenizer):
    from transformers import T5Config

    # Like the real 32128 for 32100 tokens: the embedding has a few rows past the tokenizer's ids.
    vocab = -(-len(tokenizer) // 16) * 16
    return T5Config(vocab_size=vocab, **T5)


def _build(variant: str, staging: Path):
    import torch
    from diffusers import AutoencoderKL, FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel, T5EncoderModel

    spec = VARIANTS[variant]
    clip_tokenizer, size = _clip_tokenizer(staging / variant)
    t5_tokenizer = _t5_tokenizer(staging / variant)
    torch.manual_seed(COMPONENT_SEEDS["transformer"])
    transformer = FluxTransformer2DModel(guidance_embeds=spec["guidance_embeds"], **TRANSFORMER)
    torch.manual_seed(COMPONENT_SEEDS["vae"])
    vae = AutoencoderKL(**VAE)
    torch.manual_seed(COMPONENT_SEEDS["text_encoder"])
    text_encoder = CLIPTextModel(_clip_config(size))
    torch.manual_seed(COMPONENT_SEEDS["text_encoder_2"])
    text_encoder_2 = T5EncoderModel(_t5_config(t5_tokenizer))
    scheduler = FlowMatchEulerDiscreteScheduler(**spec["scheduler"])
    pipeline = FluxPipeline(scheduler=scheduler, vae=vae, text_encoder=text_encoder, tokenizer=clip_tokenizer,
                            text_encoder_2=text_encoder_2, tokenizer_2=t5_tokenizer, transformer=transformer)
    for module in (transformer, vae, text_encoder, text_encoder_2):
        module.eval()
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def _save(pipeline, folder: Path) -> None:
    pipeline.save_pretrained(folder, safe_serialization=True)
    for component, shard, stem in (("transformer", TRANSFORMER_SHARD, "diffusion_pytorch_model"),
                                   ("text_encoder_2", T5_SHARD, "model")):
        shutil.rmtree(folder / component)
        getattr(pipeline, component).save_pretrained(folder / component, safe_serialization=True,
                                                     max_shard_size=shard)
        if not (folder / component / f"{stem}.safetensors.index.json").is_file():
            raise RuntimeError(f"{component} was not sharded at {shard}: lower its shard size")


# --- module references --------------------------------------------------------------------------------


def _module_references(pipeline, guidance_embeds: bool) -> dict[str, np.ndarray]:
    import torch
    from diffusers import FluxPipeline

    rng = np.random.RandomState(0)
    latent_h, latent_w = HEIGHT // pipeline.vae_scale_factor, WIDTH // pipeline.vae_scale_factor
    seq = (latent_h // 2) * (latent_w // 2)
    hidden = rng.standard_normal((1, seq, TRANSFORMER["in_channels"])).astype(np.float32)
    encoder_hidden = rng.standard_normal((1, MODULE_TEXT_TOKENS, TRANSFORMER["joint_attention_dim"])).astype(np.float32)
    pooled = rng.standard_normal((1, TRANSFORMER["pooled_projection_dim"])).astype(np.float32)
    latents = rng.standard_normal((1, VAE["latent_channels"], latent_h, latent_w)).astype(np.float32)
    image = rng.uniform(-1.0, 1.0, (1, 3, HEIGHT, WIDTH)).astype(np.float32)
    wide_latents = rng.standard_normal((1, VAE["latent_channels"], latent_h, 2 * latent_w)).astype(np.float32)

    out: dict[str, np.ndarray] = {}
    img_ids = FluxPipeline._prepare_latent_image_ids(1, latent_h // 2, latent_w // 2, "cpu", torch.float32)
    txt_ids = torch.zeros(MODULE_TEXT_TOKENS, 3)
    timestep = torch.tensor([MODULE_TIMESTEP], dtype=torch.float32)
    guidance = torch.tensor([MODULE_GUIDANCE], dtype=torch.float32) if guidance_embeds else None
    with torch.no_grad():
        sample = pipeline.transformer(
            hidden_states=torch.from_numpy(hidden), encoder_hidden_states=torch.from_numpy(encoder_hidden),
            pooled_projections=torch.from_numpy(pooled), timestep=timestep, img_ids=img_ids, txt_ids=txt_ids,
            guidance=guidance, return_dict=True).sample
        out.update({"transformer.hidden_states": hidden, "transformer.encoder_hidden_states": encoder_hidden,
                    "transformer.pooled_projections": pooled, "transformer.timestep": _np(timestep)})
        if guidance is not None:
            out["transformer.guidance"] = _np(guidance)
        out.update({"transformer.img_ids": _np(img_ids), "transformer.txt_ids": _np(txt_ids),
                    "transformer.out": _np(sample)})

        vae = pipeline.vae
        out["vae.latents"] = latents
        out["vae.decoded"] = _np(vae.decode(torch.from_numpy(latents)).sample)
        out["vae.image"] = image
        posterior = vae.encode(torch.from_numpy(image)).latent_dist
        out["vae.encode_mean"] = _np(posterior.mean)
        out["vae.encode_logvar"] = _np(posterior.logvar)

        ids = pipeline.tokenizer(PROMPT, padding="max_length", max_length=pipeline.tokenizer.model_max_length,
                                 truncation=True, return_tensors="pt").input_ids
        clip = pipeline.text_encoder(ids, output_hidden_states=False)
        out["clip.input_ids"] = _np(ids).astype(np.int32)
        out["clip.pooled"] = _np(clip.pooler_output)
        out["clip.last_hidden_state"] = _np(clip.last_hidden_state)

        ids = pipeline.tokenizer_2(PROMPT, padding="max_length", max_length=MAX_SEQUENCE_LENGTH, truncation=True,
                                   return_tensors="pt").input_ids
        out["t5.input_ids"] = _np(ids).astype(np.int32)
        out["t5.last_hidden_state"] = _np(pipeline.text_encoder_2(ids, output_hidden_states=False)[0])

    # Packing at a non-square size (latents 4 x 8, i.e. a 32 x 64 image: 2 x 4 tokens), where a height/width
    # mix-up in the 2x2 patches or the position ids shows.
    packed = FluxPipeline._pack_latents(torch.from_numpy(wide_latents), 1, VAE["latent_channels"], latent_h,
                                        2 * latent_w)
    out["pack.latents"] = wide_latents
    out["pack.packed"] = _np(packed)
    out["pack.img_ids"] = _np(FluxPipeline._prepare_latent_image_ids(1, latent_h // 2, latent_w, "cpu",
                                                                      torch.float32))
    unpacked = FluxPipeline._unpack_latents(packed, HEIGHT, 2 * WIDTH, pipeline.vae_scale_factor)
    if not np.array_equal(_np(unpacked), wide_latents):
        raise RuntimeError("_unpack_latents does not invert _pack_latents")
    return out


# --- pipeline references --------------------------------------------------------------------------------


def runner_noise() -> np.ndarray:
    """The runner's initial latents for seed SEED on NUM_DEVICES devices, one image each: device i draws
    ``jax.random.normal(split(PRNGKey(seed), num_devices)[i], (1, 16, H/8, W/8), float32)``
    (sdjax_runner/engine/generate.py: batch_keys; engine/modes/txt2img.py: noise)."""
    import jax
    import jax.numpy as jnp

    keys = jax.random.split(jax.random.PRNGKey(SEED), NUM_DEVICES)
    shape = (1, VAE["latent_channels"], HEIGHT // 8, WIDTH // 8)
    return np.concatenate([np.asarray(jax.random.normal(key, shape, dtype=jnp.float32)) for key in keys])


def _call_pipeline(pipeline, spec: dict, latents_unpacked: np.ndarray, record: list | None = None) -> np.ndarray:
    import torch

    batch, channels, h, w = latents_unpacked.shape
    packed = pipeline._pack_latents(torch.from_numpy(latents_unpacked), batch, channels, h, w)
    handle = None
    if record is not None:
        def hook(module, args, kwargs, output):
            record.append({name: None if kwargs.get(name) is None else _np(kwargs[name])
                           for name in ("hidden_states", "timestep", "guidance", "encoder_hidden_states",
                                        "pooled_projections", "img_ids", "txt_ids")} | {"out": _np(output[0])})
        handle = pipeline.transformer.register_forward_hook(hook, with_kwargs=True)
    try:
        with torch.no_grad():
            images = pipeline(prompt=[PROMPT] * batch, height=HEIGHT, width=WIDTH,
                              num_inference_steps=spec["steps"], guidance_scale=spec["guidance_scale"],
                              max_sequence_length=MAX_SEQUENCE_LENGTH, latents=packed, output_type="np").images
    finally:
        if handle is not None:
            handle.remove()
    return np.asarray(images, dtype=np.float32)


def _pipeline_steps(pipeline, spec: dict, latents_unpacked: np.ndarray) -> dict[str, np.ndarray]:
    """FluxPipeline.__call__'s text-to-image path (no true CFG, no IP-adapter), call by call with the
    pipeline's own components, keeping every intermediate value."""
    import torch
    from diffusers.pipelines.flux.pipeline_flux import calculate_shift, retrieve_timesteps

    out: dict[str, np.ndarray] = {}
    batch, channels, h, w = latents_unpacked.shape
    with torch.no_grad():
        prompt_embeds, pooled, text_ids = pipeline.encode_prompt(
            prompt=[PROMPT] * batch, prompt_2=None, device=torch.device("cpu"), num_images_per_prompt=1,
            max_sequence_length=MAX_SEQUENCE_LENGTH)
        packed = pipeline._pack_latents(torch.from_numpy(latents_unpacked), batch, channels, h, w)
        latents, image_ids = pipeline.prepare_latents(batch, pipeline.transformer.config.in_channels // 4, HEIGHT,
                                                      WIDTH, prompt_embeds.dtype, torch.device("cpu"), None, packed)
        sigmas_in = np.linspace(1.0, 1 / spec["steps"], spec["steps"])
        config = pipeline.scheduler.config
        seq_len = latents.shape[1]
        mu = calculate_shift(seq_len, config.get("base_image_seq_len", 256), config.get("max_image_seq_len", 4096),
                             config.get("base_shift", 0.5), config.get("max_shift", 1.15))
        timesteps, _ = retrieve_timesteps(pipeline.scheduler, spec["steps"], torch.device("cpu"), sigmas=sigmas_in,
                                          mu=mu)
        guidance = (torch.full([1], spec["guidance_scale"], dtype=torch.float32).expand(batch)
                    if pipeline.transformer.config.guidance_embeds else None)
        out.update({"prompt_embeds": _np(prompt_embeds), "pooled_prompt_embeds": _np(pooled),
                    "text_ids": _np(text_ids), "latent_image_ids": _np(image_ids), "latents_packed": _np(latents),
                    "image_seq_len": np.asarray(seq_len, dtype=np.int64), "mu": np.asarray(mu, dtype=np.float64),
                    "sigmas_unshifted": np.asarray(sigmas_in, dtype=np.float64),
                    "sigmas": _np(pipeline.scheduler.sigmas), "timesteps": _np(timesteps)})
        if guidance is not None:
            out["guidance"] = _np(guidance)
        step_latents, step_timestep, step_noise = [], [], []
        pipeline.scheduler.set_begin_index(0)
        for t in timesteps:
            timestep = t.expand(batch).to(latents.dtype) / 1000
            noise_pred = pipeline.transformer(hidden_states=latents, timestep=timestep, guidance=guidance,
                                              pooled_projections=pooled, encoder_hidden_states=prompt_embeds,
                                              txt_ids=text_ids, img_ids=image_ids, joint_attention_kwargs={},
                                              return_dict=False)[0]
            step_latents.append(_np(latents))
            step_timestep.append(_np(timestep))
            step_noise.append(_np(noise_pred))
            latents = pipeline.scheduler.step(noise_pred, t, latents, return_dict=False)[0]
        out.update({"step_latents": np.stack(step_latents), "step_timestep": np.stack(step_timestep),
                    "step_noise_pred": np.stack(step_noise), "final_latents_packed": _np(latents)})
        latents = pipeline._unpack_latents(latents, HEIGHT, WIDTH, pipeline.vae_scale_factor)
        out["final_latents"] = _np(latents)
        latents = latents / pipeline.vae.config.scaling_factor + pipeline.vae.config.shift_factor
        out["vae_input"] = _np(latents)
        decoded = pipeline.vae.decode(latents, return_dict=False)[0]
        out["decoded"] = _np(decoded)
        out["images"] = np.asarray(pipeline.image_processor.postprocess(decoded, output_type="np"), dtype=np.float32)
    return out


def _pipeline_references(pipeline, variant: str) -> dict[str, np.ndarray]:
    spec = VARIANTS[variant]
    latents_unpacked = runner_noise()
    calls: list = []
    images = _call_pipeline(pipeline, spec, latents_unpacked, calls)
    steps = _pipeline_steps(pipeline, spec, latents_unpacked)
    if not np.array_equal(images, steps["images"]):
        raise RuntimeError(f"{variant}: the step-by-step loop does not reproduce FluxPipeline's images")
    if len(calls) != spec["steps"]:
        raise RuntimeError(f"{variant}: FluxPipeline called the transformer {len(calls)} times")
    for i, call in enumerate(calls):
        for name, value in (("hidden_states", steps["step_latents"][i]), ("timestep", steps["step_timestep"][i]),
                            ("out", steps["step_noise_pred"][i]), ("encoder_hidden_states", steps["prompt_embeds"]),
                            ("pooled_projections", steps["pooled_prompt_embeds"]),
                            ("img_ids", steps["latent_image_ids"]), ("txt_ids", steps["text_ids"]),
                            ("guidance", steps.get("guidance"))):
            if not ((call[name] is None and value is None) or np.array_equal(call[name], value)):
                raise RuntimeError(f"{variant}: step {i}'s transformer {name} differs from FluxPipeline's")
    out = {"latents_unpacked": latents_unpacked, "images": images, "prompt": np.asarray(PROMPT),
           "steps": np.asarray(spec["steps"], dtype=np.int64),
           "guidance_scale": np.asarray(spec["guidance_scale"], dtype=np.float64),
           "height": np.asarray(HEIGHT, dtype=np.int64), "width": np.asarray(WIDTH, dtype=np.int64),
           "max_sequence_length": np.asarray(MAX_SEQUENCE_LENGTH, dtype=np.int64),
           "seed": np.asarray(SEED, dtype=np.int64), "num_devices": np.asarray(NUM_DEVICES, dtype=np.int64)}
    out.update({key: value for key, value in steps.items() if key != "images"})
    return out


def _true_cfg_reference(pipeline) -> dict[str, np.ndarray]:
    """[dev] with true classifier-free guidance: FluxPipeline called with a negative prompt and true_cfg_scale,
    from the runner's noise (its transformer runs on the prompt and on the negative prompt, mixed as
    ``neg + true_cfg_scale * (pos - neg)``)."""
    import torch

    spec = VARIANTS["dev"]
    latents_unpacked = runner_noise()
    batch, channels, h, w = latents_unpacked.shape
    packed = pipeline._pack_latents(torch.from_numpy(latents_unpacked), batch, channels, h, w)
    with torch.no_grad():
        images = pipeline(prompt=[PROMPT] * batch, negative_prompt=[NEGATIVE_PROMPT] * batch,
                          true_cfg_scale=TRUE_CFG_SCALE, height=HEIGHT, width=WIDTH,
                          num_inference_steps=spec["steps"], guidance_scale=spec["guidance_scale"],
                          max_sequence_length=MAX_SEQUENCE_LENGTH, latents=packed, output_type="np").images
    return {"latents_unpacked": latents_unpacked, "images": np.asarray(images, dtype=np.float32),
            "prompt": np.asarray(PROMPT), "negative_prompt": np.asarray(NEGATIVE_PROMPT),
            "true_cfg_scale": np.asarray(TRUE_CFG_SCALE, dtype=np.float64),
            "steps": np.asarray(spec["steps"], dtype=np.int64),
            "guidance_scale": np.asarray(spec["guidance_scale"], dtype=np.float64),
            "height": np.asarray(HEIGHT, dtype=np.int64), "width": np.asarray(WIDTH, dtype=np.int64),
            "max_sequence_length": np.asarray(MAX_SEQUENCE_LENGTH, dtype=np.int64),
            "seed": np.asarray(SEED, dtype=np.int64), "num_devices": np.asarray(NUM_DEVICES, dtype=np.int64)}


# --- the README ------------------------------------------------------------------------------------------

KEY_NOTES = {
    "transformer.hidden_states": "packed latent tokens in (RandomState(0) normal): a 32x32 image's (H/16)*(W/16) tokens",
    "transformer.encoder_hidden_states": "T5-width text tokens in (normal)",
    "transformer.pooled_projections": "CLIP-pooled-width vector in (normal)",
    "transformer.timestep": f"{MODULE_TIMESTEP}, exactly as passed to forward (forward multiplies by 1000)",
    "transformer.guidance": f"{MODULE_GUIDANCE}, exactly as passed to forward (forward multiplies by 1000); dev only",
    "transformer.img_ids": "FluxPipeline._prepare_latent_image_ids: (0, row, column) per token, row-major",
    "transformer.txt_ids": "zeros, 2-D (no batch axis), as FluxPipeline.encode_prompt makes them",
    "transformer.out": "FluxTransformer2DModel.forward(...).sample",
    "vae.latents": "VAE latents in (normal)",
    "vae.decoded": "vae.decode(vae.latents).sample: raw, no scaling/shift factor applied, not clipped",
    "vae.image": "image in, uniform in [-1, 1], NCHW",
    "vae.encode_mean": "vae.encode(vae.image).latent_dist.mean (no scaling/shift factor)",
    "vae.encode_logvar": "vae.encode(vae.image).latent_dist.logvar (clamped to [-30, 20] by diffusers)",
    "clip.input_ids": f"tokenizer({PROMPT!r}, padding='max_length', max_length=77, truncation=True), int32",
    "clip.pooled": "text_encoder(ids).pooler_output: the final-layer-normed state at the first <|endoftext|>",
    "clip.last_hidden_state": "text_encoder(ids).last_hidden_state",
    "t5.input_ids": f"tokenizer_2({PROMPT!r}, padding='max_length', max_length=32, truncation=True), int32",
    "t5.last_hidden_state": "text_encoder_2(ids)[0] (no attention mask, as FluxPipeline calls it)",
    "pack.latents": "(normal) latents of a 32 (H) x 64 (W) image",
    "pack.packed": "FluxPipeline._pack_latents of them: 2x2 patches, channel-major inside a patch (c, dy, dx)",
    "pack.img_ids": "_prepare_latent_image_ids for that 2 x 4 token grid",
    "latents_unpacked": "the runner's noise: device i: jax.random.normal(split(PRNGKey(seed), num_devices)[i], (1,16,H/8,W/8))",
    "images": "FluxPipeline(...).images with output_type='np': (decoded / 2 + 0.5) clipped to [0, 1], NHWC",
    "prompt": "the prompt of both images",
    "negative_prompt": "the negative prompt of both images (true CFG)",
    "true_cfg_scale": "true_cfg_scale passed to FluxPipeline (true CFG: neg + scale * (pos - neg))",
    "steps": "num_inference_steps",
    "guidance_scale": "guidance_scale passed to FluxPipeline",
    "height": "image height", "width": "image width",
    "max_sequence_length": "T5 tokens (max_sequence_length)",
    "seed": "the runner's seed", "num_devices": "devices (one image each)",
    "prompt_embeds": "T5 last hidden state per image (encode_prompt)",
    "pooled_prompt_embeds": "CLIP pooler_output per image (encode_prompt)",
    "text_ids": "zeros (T, 3) passed as txt_ids",
    "latent_image_ids": "img_ids passed to the transformer",
    "latents_packed": "latents_unpacked packed: the transformer's first hidden_states",
    "image_seq_len": "packed tokens per image (what mu is computed from)",
    "mu": "calculate_shift(image_seq_len, base_image_seq_len, max_image_seq_len, base_shift, max_shift) "
          "(computed for schnell too, where the scheduler ignores it)",
    "sigmas_unshifted": "np.linspace(1, 1/steps, steps), what FluxPipeline passes to set_timesteps",
    "sigmas": "scheduler.sigmas after set_timesteps: shifted, float32, a final 0 appended",
    "timesteps": "scheduler.timesteps = shifted sigmas * 1000 (the transformer gets timesteps / 1000)",
    "guidance": "the guidance tensor passed to the transformer (dev only): guidance_scale per image, not scaled",
    "step_latents": "hidden_states the transformer got at each step",
    "step_timestep": "timestep the transformer got at each step (t / 1000, per image)",
    "step_noise_pred": "the transformer's output at each step (velocity)",
    "final_latents_packed": "latents after the last Euler step (x += (sigma_next - sigma) * v)",
    "final_latents": "final_latents_packed unpacked to (B, 16, H/8, W/8)",
    "vae_input": "final_latents / scaling_factor + shift_factor: what vae.decode gets",
    "decoded": "vae.decode(vae_input).sample, raw (before the image processor)",
}


def _describe(folder: Path) -> str:
    lines = []
    for name in sorted(p.name for p in folder.glob("*.npz")):
        lines += [f"### `{name}`", "", "| key | shape | dtype | meaning |", "| --- | --- | --- | --- |"]
        with np.load(folder / name) as data:
            for key in data.files:
                value = data[key]
                lines.append(f"| `{key}` | {tuple(value.shape)} | {value.dtype} | {KEY_NOTES[key]} |")
        lines.append("")
    return "\n".join(lines)


def _readme(folder: Path, versions: dict, schedules: dict) -> str:
    tree = []
    for path in sorted(folder.rglob("*")):
        if path.is_file() and path.name != "README.md":
            tree.append(f"    {path.relative_to(folder)}  ({path.stat().st_size} bytes)")
    schedule_lines = []
    for variant, values in schedules.items():
        schedule_lines.append(f"* {variant} ({VARIANTS[variant]['steps']} steps): mu = {values['mu']!r}, "
                              f"sigmas = {values['sigmas']}, timesteps = {values['timesteps']}")
    config_lines = [f"* transformer: `FluxTransformer2DModel({', '.join(f'{k}={v!r}' for k, v in TRANSFORMER.items())}, "
                    "guidance_embeds=True (dev) / False (schnell))`",
                    f"* vae: `AutoencoderKL({', '.join(f'{k}={v!r}' for k, v in VAE.items())})`",
                    f"* text_encoder: `CLIPTextModel(CLIPTextConfig({', '.join(f'{k}={v!r}' for k, v in CLIP.items())}))`"
                    ", vocabulary and special ids of the built-in tiny models' CLIP tokenizer",
                    f"* text_encoder_2: `T5EncoderModel(T5Config({', '.join(f'{k}={v!r}' for k, v in T5.items())}))`"
                    f", vocab_size: the T5 tokenizer's length rounded up to 16",
                    f"* scheduler: `FlowMatchEulerDiscreteScheduler`, dev: `{FLUX_DEV_SCHEDULER}`, "
                    f"schnell: `{FLUX_SCHNELL_SCHEDULER}` (the published FLUX.1 scheduler_config.json values)",
                    f"* tokenizer_2: `T5TokenizerFast` (extra_ids=100, legacy=True, model_max_length=512) of a "
                    f"{T5_VOCAB}-piece unigram sentencepiece model trained by the script (identity normalization, "
                    "not T5's nmt_nfkc: its character map would add ~0.5 MB per folder; ASCII prompts tokenize "
                    "the same). tokenizer.json's Metaspace prepends \u2581 ('always'), as sentencepiece does, and "
                    "tokenizer_config.json leaves add_prefix_space null, so loading needs neither sentencepiece "
                    "nor protobuf",
                    "* tokenizer: the built-in tiny models' CLIPTokenizer (sdjax_runner/models/builtin_parts.py: "
                    "_write_tokenizer), pad <|endoftext|>, model_max_length 77"]
    return "\n".join([
        "# FLUX.1 PyTorch references (issue #46)",
        "",
        "Written by `tests/helpers/make_flux_reference.py` (do not edit by hand); made with",
        "",
        "    /work/refvenv/bin/python tests/helpers/make_flux_reference.py",
        "",
        "in a separate virtual environment with torch (the script's docstring says how to make it). The runner "
        "never imports torch: these files are what its JAX FLUX implementation is compared with. All weights are "
        "random (fixed torch seeds), so the images are noise-like; what matters is that JAX reproduces them. "
        "Everything ran in float32 on CPU with one torch thread. Running the script again writes identical files. "
        "Loaded back with `from_pretrained`, the folders reproduce every array bit for bit once the parameters are "
        "copied to fresh (aligned) memory; as loaded (memory-mapped safetensors at unaligned addresses) torch's CPU "
        "kernels sum in another order and results can differ by an ulp or so. Compare with a tolerance.",
        "",
        "## Versions",
        "",
        "```json",
        json.dumps(versions, indent=2),
        "```",
        "",
        "## Files",
        "",
        "* `tiny-flux-dev/`, `tiny-flux-schnell/`: `FluxPipeline.save_pretrained` folders (the published "
        "diffusers layout; model_index.json `_class_name` FluxPipeline). `transformer/` and `text_encoder_2/` "
        "are sharded (`*-0000i-of-0000N.safetensors` + `*.safetensors.index.json`) as on the hub. The two "
        "variants share the VAE, both text encoders and both tokenizers (same seeds), like the real models.",
        "* `modules_dev.npz`, `modules_schnell.npz`: one call of each module on fixed inputs, drawn from one "
        "`numpy.random.RandomState(0)` in this order: `transformer.hidden_states`, "
        "`transformer.encoder_hidden_states`, `transformer.pooled_projections`, `vae.latents` (standard normal), "
        "`vae.image` (uniform in [-1, 1]), `pack.latents` (standard normal) -- the same inputs in both files. "
        "The VAE, CLIP and T5 entries are equal in the two files (shared weights); the transformer's differ.",
        "* `pipeline_dev.npz`, `pipeline_schnell.npz`: a whole `FluxPipeline` call from the runner's noise "
        f"(seed {SEED}, {NUM_DEVICES} devices, one image each, {HEIGHT}x{WIDTH}) and every intermediate value.",
        "* `pipeline_dev_true_cfg.npz`: [dev] called with true classifier-free guidance (`negative_prompt="
        f"{NEGATIVE_PROMPT!r}`, `true_cfg_scale={TRUE_CFG_SCALE}`) from the same noise: its `images` and settings.",
        "* `VERSIONS.json`: the versions above.",
        "",
        "```",
        *tree,
        "```",
        "",
        "## Components",
        "",
        *config_lines,
        "",
        "## Schedules",
        "",
        *schedule_lines,
        "",
        "## Keys",
        "",
        _describe(folder),
        "## Notes on diffusers' FluxPipeline",
        "",
        "* The pipeline passes `timestep = t / 1000` (t = sigma * 1000 from the scheduler) and the transformer "
        "multiplies it by 1000 again before the sinusoidal embedding (256 channels, flip_sin_to_cos, shift 0). "
        "Guidance is passed unscaled (3.5) and also multiplied by 1000 inside.",
        "* Schnell (guidance_embeds=False) gets `guidance=None`; guidance_scale is then unused.",
        "* `txt_ids` (zeros) and `img_ids` are 2-D, without a batch axis. The rotary embedding is computed in "
        "float64 on CPU (theta 10000, axes 4/6/6 over the id columns).",
        "* Decoding: latents are unpacked, then `latents / scaling_factor + shift_factor` goes into `vae.decode`; "
        "the image processor maps [-1, 1] to [0, 1] with clipping.",
        "* `mu` is computed for both variants; schnell's scheduler (use_dynamic_shifting=False, shift=1) ignores it.",
        "* The FlowMatch Euler step is `x + (sigma_next - sigma) * v`, the sigmas shifted in float32 NumPy by "
        "`exp(mu) / (exp(mu) + (1 / sigma - 1))` (dev).",
        "",
    ])


# --- main ------------------------------------------------------------------------------------------------


def _check_saved(folder: Path, variant: str, modules: dict[str, np.ndarray], images: np.ndarray) -> float:
    """Load ``folder`` back (offline) and reproduce the references. Bit for bit once the parameters are copied
    to fresh memory: torch's CPU kernels take other reduction orders for the memory-mapped tensors that
    from_pretrained leaves at unaligned addresses (safetensors offsets are 8-byte aligned), a difference of an
    ulp or so. Returns the largest image difference of the pipeline as from_pretrained leaves it."""
    import torch
    from diffusers import FluxPipeline
    from transformers import CLIPTokenizer, T5TokenizerFast

    T5TokenizerFast.from_pretrained(folder / "tokenizer_2", local_files_only=True)
    CLIPTokenizer.from_pretrained(folder / "tokenizer", local_files_only=True)
    loaded = FluxPipeline.from_pretrained(folder, local_files_only=True)
    loaded.set_progress_bar_config(disable=True)
    as_loaded = float(np.abs(_call_pipeline(loaded, VARIANTS[variant], runner_noise()) - images).max())
    if as_loaded > 1e-5:
        raise RuntimeError(f"{folder}: loaded back, the pipeline gives other images (max difference {as_loaded})")
    with torch.no_grad():
        for component in ("transformer", "vae", "text_encoder", "text_encoder_2"):
            for tensor in itertools.chain(getattr(loaded, component).parameters(),
                                          getattr(loaded, component).buffers()):
                tensor.data = tensor.data.clone()
    again = _module_references(loaded, VARIANTS[variant]["guidance_embeds"])
    for key, value in modules.items():
        if not np.array_equal(again[key], value):
            raise RuntimeError(f"{folder}: loaded back, {key} differs (max {np.abs(again[key] - value).max()})")
    again_images = _call_pipeline(loaded, VARIANTS[variant], runner_noise())
    if not np.array_equal(again_images, images):
        raise RuntimeError(f"{folder}: loaded back, the pipeline gives other images "
                           f"(max difference {np.abs(again_images - images).max()})")
    return as_loaded


def load_aligned(class_name: str, folder: Path):
    """diffusers' pipeline ``class_name`` from ``folder`` (offline, float32), every module's parameters copied to
    aligned memory (the README: from_pretrained's unaligned arrays are an ulp off otherwise), no progress bars."""
    import diffusers
    import torch

    pipeline = getattr(diffusers, class_name).from_pretrained(folder, torch_dtype=torch.float32, local_files_only=True)
    for component in pipeline.components.values():
        if isinstance(component, torch.nn.Module):
            for parameter in component.parameters():
                parameter.data = parameter.data.clone()
    pipeline.set_progress_bar_config(disable=True)
    return pipeline


def quiet_deterministic_torch() -> None:
    """diffusers' and transformers' logging and progress bars off; torch on one thread, deterministic (every reference
    maker's start)."""
    import torch
    from diffusers.utils import logging as diffusers_logging
    from transformers.utils import logging as transformers_logging

    diffusers_logging.set_verbosity_error()
    diffusers_logging.disable_progress_bar()
    transformers_logging.set_verbosity_error()
    transformers_logging.disable_progress_bar()
    torch.set_num_threads(1)
    torch.use_deterministic_algorithms(True)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help="the fixture folder (replaced)")
    args = parser.parse_args(argv)

    quiet_deterministic_torch()
    out: Path = args.out.resolve()
    out.parent.mkdir(parents=True, exist_ok=True)
    versions = _versions()
    schedules = {}
    with tempfile.TemporaryDirectory(prefix="flux-reference-") as temp:
        staging, result = Path(temp) / "staging", Path(temp) / "flux"
        staging.mkdir()
        result.mkdir()
        modules, images = {}, {}
        for variant, spec in VARIANTS.items():
            pipeline = _build(variant, staging)
            _save(pipeline, result / spec["folder"])
            modules[variant] = _module_references(pipeline, spec["guidance_embeds"])
            _save_npz(result / f"modules_{variant}.npz", modules[variant])
            references = _pipeline_references(pipeline, variant)
            _save_npz(result / f"pipeline_{variant}.npz", references)
            images[variant] = references["images"]
            if variant == "dev":
                _save_npz(result / "pipeline_dev_true_cfg.npz", _true_cfg_reference(pipeline))
            schedules[variant] = {"mu": float(references["mu"]), "sigmas": references["sigmas"].tolist(),
                                  "timesteps": references["timesteps"].tolist()}
        for variant, spec in VARIANTS.items():
            difference = _check_saved(result / spec["folder"], variant, modules[variant], images[variant])
            print(f"{variant}: loaded back, reproduced bit for bit (images as from_pretrained leaves the "
                  f"weights: within {difference:.3g})")
        (result / "VERSIONS.json").write_text(json.dumps(versions, indent=2) + "\n", encoding="utf-8")
        (result / "README.md").write_text(_readme(result, versions, schedules), encoding="utf-8")
        for path in result.rglob("*"):  # (some writers leave 0600 files)
            path.chmod(0o755 if path.is_dir() else 0o644)
        if out.exists():
            shutil.rmtree(out)
        shutil.move(str(result), str(out))
    total = sum(p.stat().st_size for p in out.rglob("*") if p.is_file())
    print(f"wrote {out} ({total} bytes)")
    for variant, values in schedules.items():
        print(f"{variant}: mu={values['mu']!r} sigmas={values['sigmas']} timesteps={values['timesteps']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
