"""Build the project's tiny random-weight Stable Diffusion pipeline.

The pipeline is structurally complete -- CLIP BPE tokenizer, Flax CLIP text
encoder, Flax UNet with cross-attention, Flax VAE (8x down-sampling, like SD)
and a PNDM scheduler -- but small enough to run on a laptop CPU in seconds.
It is written once with ``save_pretrained`` and afterwards loaded through
``FlaxStableDiffusionPipeline.from_pretrained`` exactly like a hub model, so
the runner's real loading path is what the tests exercise.

Everything is derived from fixed seeds: two builds produce identical files.
"""

from __future__ import annotations

import collections
import json
import os
import re
import shutil
import tempfile
from pathlib import Path

TINY_RANDOM = "tiny-random"
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
    vocab = {}
    for word, count in words.items():
        symbols = [byte_encoder[b] for b in word.encode("utf-8")]
        symbols[-1] += "</w>"
        vocab[tuple(symbols)] = count
    merges: list[tuple[str, str]] = []
    for _ in range(num_merges):
        pairs: collections.Counter = collections.Counter()
        for symbols, count in vocab.items():
            for pair in zip(symbols, symbols[1:]):
                pairs[pair] += count
        if not pairs:
            break
        # Most frequent pair; ties broken by the pair itself so the result is deterministic.
        best = min(pairs, key=lambda p: (-pairs[p], p))
        merges.append(best)
        merged = {}
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


def _write_tokenizer(directory: Path) -> int:
    """Write a CLIP tokenizer (vocab.json, merges.txt) laid out like openai/clip's."""
    from transformers import CLIPTokenizer

    byte_chars = list(_bytes_to_unicode().values())
    merges = _learn_merges(_CORPUS, _NUM_MERGES)
    tokens = byte_chars + [c + "</w>" for c in byte_chars] + ["".join(m) for m in merges]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    directory.mkdir(parents=True)
    (directory / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8")
    merges_text = "#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n"
    (directory / "merges.txt").write_text(merges_text, encoding="utf-8")
    # Round-trip through CLIPTokenizer so tokenizer_config.json etc. are the library's own.
    tokenizer = CLIPTokenizer(
        str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=77, pad_token="<|endoftext|>"
    )
    tokenizer.save_pretrained(directory)
    return len(tokens)


def build_tiny_pipeline(target: Path) -> Path:
    """Create the tiny pipeline at ``target`` (atomically; an existing build is kept)."""
    target = Path(target)
    if (target / "model_index.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent))
    try:
        _build_into(staging)
        try:
            os.rename(staging, target)
        except OSError:
            # Another process finished the same build first; theirs is identical.
            if not (target / "model_index.json").exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def _random_params(shape_tree, seed: int):
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
            value = rng.standard_normal(shape) / np.sqrt(fan_in)
        elif name == "embedding":
            value = 0.02 * rng.standard_normal(shape)
        elif name == "scale":
            value = np.ones(shape)
        elif name == "bias":
            value = np.zeros(shape)
        else:
            raise ValueError(f"unexpected parameter {'/'.join(path)}")
        params[path] = value.astype(np.float32)
    return unflatten_dict(params)


def _build_into(directory: Path) -> None:
    import jax
    from diffusers import FlaxAutoencoderKL, FlaxPNDMScheduler, FlaxStableDiffusionPipeline, FlaxUNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTokenizer, FlaxCLIPTextModel

    vocab_size = _write_tokenizer(directory / "_tokenizer")
    tokenizer = CLIPTokenizer.from_pretrained(directory / "_tokenizer")
    key = jax.random.PRNGKey(0)  # only shapes are derived from it

    text_config = CLIPTextConfig(
        vocab_size=vocab_size,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=4,
        max_position_embeddings=77,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    text_encoder = FlaxCLIPTextModel(text_config, _do_init=False)
    text_shapes = jax.eval_shape(lambda k: text_encoder.init_weights(k, (1, 77)), key)

    # Same block structure as SD 1.x (cross-attention down/up blocks around a
    # cross-attention mid block), with 2 resolution levels and few channels.
    unet = FlaxUNet2DConditionModel(
        sample_size=8,
        in_channels=4,
        out_channels=4,
        down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
        up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
        block_out_channels=(32, 64),
        layers_per_block=1,
        attention_head_dim=8,
        cross_attention_dim=32,
    )

    # Four levels = 8x spatial down-sampling, as in SD, so height/width mean the same thing.
    vae = FlaxAutoencoderKL(
        in_channels=3,
        out_channels=3,
        down_block_types=("DownEncoderBlock2D",) * 4,
        up_block_types=("UpDecoderBlock2D",) * 4,
        block_out_channels=(16, 16, 32, 32),
        layers_per_block=1,
        norm_num_groups=8,
        latent_channels=4,
        sample_size=64,
    )

    # SD 1.x's scheduler settings.
    scheduler = FlaxPNDMScheduler(
        beta_start=0.00085,
        beta_end=0.012,
        beta_schedule="scaled_linear",
        num_train_timesteps=1000,
        skip_prk_steps=True,
        steps_offset=1,
        set_alpha_to_one=False,
    )

    pipeline = FlaxStableDiffusionPipeline(
        vae=vae,
        text_encoder=text_encoder,
        tokenizer=tokenizer,
        unet=unet,
        scheduler=scheduler,
        safety_checker=None,
        feature_extractor=None,
    )
    params = {
        "text_encoder": _random_params(text_shapes, SEED),
        "unet": _random_params(jax.eval_shape(unet.init_weights, key), SEED + 1),
        "vae": _random_params(jax.eval_shape(vae.init_weights, key), SEED + 2),
    }
    pipeline.save_pretrained(directory, params=params)
    shutil.rmtree(directory / "_tokenizer")
