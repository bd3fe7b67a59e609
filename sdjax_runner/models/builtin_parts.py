"""What the built-in models (models/builtin.py; each family's ``families/<name>/models/builtin.py``) are made of:
a CLIP BPE tokenizer learned from a fixed corpus, a T5 unigram tokenizer, random weights drawn from fixed seeds,
and the writers of the components the families share (CLIP and T5 text encoders, the runner's own modules, the
flow-matching scheduler) in the published layouts (models/published_layout.py). Everything is derived from
fixed seeds: two builds produce identical files."""

from __future__ import annotations

import collections
import itertools
import json
import math
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SEED = 0
CLIP_L = dict(hidden_size=768, intermediate_size=3072, num_hidden_layers=12, num_attention_heads=12,
              hidden_act="quick_gelu", projection_dim=768)


@dataclass(frozen=True)
class Builtin:
    """One built-in model as models/builtin.build_builtin builds it."""

    build: Callable[[Path], None]  # (an empty staging folder) -> the model written into it
    kind: str = "pipeline"  # "pipeline" (a model_index.json folder), "controlnet" or "clip" (one component)

    @property
    def marker(self) -> str:
        """The file whose presence says a build is complete (builds appear whole: staged, renamed)."""
        return "model_index.json" if self.kind == "pipeline" else "config.json"


# A small fixed corpus the tokenizer's BPE merges are learned from, so that
# ordinary English prompts tokenize into word pieces rather than single bytes.
CORPUS = """
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


def clip_vocabulary() -> tuple[list[str], list[tuple[str, str]]]:
    """The tokenizer's tokens (bytes, end-of-word bytes, merges, then start and end of text) and merges."""
    byte_chars = list(_bytes_to_unicode().values())
    merges = _learn_merges(CORPUS, _NUM_MERGES)
    tokens = byte_chars + [c + "</w>" for c in byte_chars] + ["".join(m) for m in merges]
    return tokens + ["<|startoftext|>", "<|endoftext|>"], merges


def write_clip_tokenizer(directory: Path, pad_token: str = "<|endoftext|>", pad_as_text: bool = False) -> int:
    """Write a CLIP tokenizer (vocab.json, merges.txt and transformers' two JSON files) laid out like
    openai/clip's; its vocabulary size. ``pad_as_text``: published_layout.clip_tokenizer's (the FLUX.1 and SD 3
    built-ins' tokenizers were written so)."""
    from sdjax_runner.models import published_layout

    tokens, merges = clip_vocabulary()
    published_layout.clip_tokenizer(directory, tokens, merges, pad_token, pad_as_text=pad_as_text)
    return len(tokens)


def random_params(shape_tree, seed: int, dtype=None, draw_dtype: str = "float64", fixed=None):
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
    """One parameter's value: see random_params."""
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


def clip_text_config(spec: dict, vocab_size: int) -> dict:
    """A CLIP text encoder's config.json keys (transformers' CLIPTextConfig) for the built-in tokenizer."""
    from sdjax_runner.models import published_layout

    return published_layout.clip_text_config({"vocab_size": vocab_size, "max_position_embeddings": 77, **spec,
                                              "bos_token_id": vocab_size - 2, "eos_token_id": vocab_size - 1,
                                              "pad_token_id": vocab_size - 1})


def module_and_shapes(class_name: str, config: dict) -> tuple[Any, Any]:
    """(the runner's module for a component config, as the loader builds it -- models/loading.py's MODULE_KINDS --,
    its parameter shapes)."""
    import jax.numpy as jnp

    from sdjax_runner.models.checkpoints import param_shapes
    from sdjax_runner.models.loading import MODULE_KINDS

    kind = MODULE_KINDS[class_name]
    module = kind.build(config, jnp.float32)
    return module, param_shapes(module, kind.naming)


T5_SPECIALS = ("<pad>", "</s>", "<unk>")  # ids 0, 1, 2: T5's pad, end and unknown tokens


def _t5_pieces() -> list[tuple[str, float]]:
    """A unigram vocabulary in sentencepiece's form: the specials, "▁" + every word of the tokenizer corpus
    (as written and lowercased; more frequent words score higher), then single characters, which spell
    anything else."""
    words = collections.Counter(re.findall(r"[A-Za-z0-9]+|[^\sA-Za-z0-9]", CORPUS))
    for word, count in list(words.items()):
        words[word.lower()] += 0 if word.islower() else count
    pieces: dict[str, float] = {}
    total = sum(words.values())
    for word, count in sorted(words.items(), key=lambda item: (-item[1], item[0])):
        pieces.setdefault("\u2581" + word, math.log(count / total))
    characters = sorted(set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789.,:;!?'\"()[]-_/&+=*#@%"))
    for char in ["\u2581", *characters]:
        pieces.setdefault(char, -20.0)
    return [(special, 0.0) for special in T5_SPECIALS] + list(pieces.items())


def write_t5_tokenizer(directory: Path) -> int:
    """A T5TokenizerFast laid out as the hub's FLUX.1 tokenizer_2/ (tokenizer.json, tokenizer_config.json,
    special_tokens_map.json): sentencepiece's normalizer, Metaspace pre-tokenizer and an appended ``</s>``."""
    from sdjax_runner.models import published_layout

    tokenizer = t5_tokenizer_model()
    published_layout.t5_tokenizer(directory, tokenizer, T5_SPECIALS)
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


def save_own(directory: Path, name: str, class_name: str, config: dict, params: Any) -> None:
    """One of the runner's own modules as diffusers' layout holds a Flax component: config.json and weights."""
    from flax.serialization import to_bytes

    (directory / name).mkdir()
    config = {"_class_name": class_name, "_diffusers_version": "0.39.0", **config}
    (directory / name / "config.json").write_text(json.dumps(config, indent=2), encoding="utf-8")
    (directory / name / "diffusion_flax_model.msgpack").write_bytes(to_bytes(params))


def save_flow_scheduler(directory: Path, config: dict) -> None:
    (directory / "scheduler").mkdir()
    scheduler = {"_class_name": "FlowMatchEulerDiscreteScheduler", "_diffusers_version": "0.39.0", **config}
    (directory / "scheduler" / "scheduler_config.json").write_text(json.dumps(scheduler, indent=2), encoding="utf-8")


def save_t5(directory: Path, name: str, config: dict, vocab_size: int, seed: int, dtype: Any, draw: str) -> None:
    """A T5 encoder (transformers' T5EncoderModel layout) with random weights, as a FLUX.1 or SD 3 folder holds it."""
    from sdjax_runner.models import published_layout

    t5 = published_layout.t5_config({"vocab_size": vocab_size, **config})
    published_layout.transformers_model(directory / name, "T5EncoderModel", t5,
                                        random_params(module_and_shapes("T5EncoderModel", t5)[1], seed, dtype, draw))


def save_clip_text(directory: Path, name: str, cls: str, spec: dict, vocab_size: int, seed: int, dtype: Any,
                    draw: str) -> None:
    """A CLIP text encoder (transformers' layout for ``cls``) with random weights."""
    from sdjax_runner.models import published_layout

    config = clip_text_config(spec, vocab_size)
    published_layout.transformers_model(directory / name, cls, config,
                                        random_params(module_and_shapes(cls, config)[1], seed, dtype, draw))


def saved_dtypes(spec: dict) -> tuple[Any, str]:
    """(the weights' dtype, the dtype they are drawn in): full-size builds are bfloat16, drawn in float32 (a
    float64 draw of 17B numbers would take twice the memory); the tiny ones float32 drawn in float64."""
    import ml_dtypes
    import numpy as np

    if spec["save_dtype"] == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16), "float32"
    return np.dtype(np.float32), "float64"
