"""Our CLIP tokenizer (sdjax_runner/models/clip_tokenizer.py) gives transformers' CLIPTokenizer's ids and decoded
text, on over 5,000 prompts of what users type: A1111's syntax (emphasis, weights, BREAK, alternation), unicode,
emoji, mojibake that ftfy mends, HTML entities, odd whitespace, digits, contractions, the special tokens' text
itself, and prompts past 77 tokens -- with a vocabulary of several thousand merges trained here on the project's
own docs (no hub), SDXL's second tokenizer (it pads with ``!``), and the tiny models' folder."""

from __future__ import annotations

import json
import random
import re
from pathlib import Path

import pytest

from sdjax_runner.models.clip_tokenizer import ClipTokenizer, byte_alphabet

ROOT = Path(__file__).resolve().parents[1]
FRAGMENTS = ["(masterpiece:1.2)", "((best quality))", "[blurry]", "(a:0.5)", "BREAK", "[cat|dog]", "[a:b:0.5]",
             "<lora:name:0.8>", "embedding:foo", "\\(escaped\\)", "8k", "1girl", "don't", "it's", "we're", "I'm",
             "they've", "you'll", "he'd", "ROCK'N'ROLL", "C3PO", "3.14159", "1,000,000", "x-ray", "e-mail",
             "café", "naïve", "Ærøskøbing", "東京タワー", "서울", "Москва", "القاهرة", "עברית", "ελληνικά", "🙂", "🐱‍👤",
             "👍🏽", "❤️", "🇯🇵", "cafÃ©", "â€œquotedâ€\x9d", "Ã¼ber", "&amp;", "&lt;tag&gt;", "&quot;hi&quot;",
             "&#39;", "<|endoftext|>", "<|startoftext|>", "<|ENDOFTEXT|>", "a<|endoftext|>b", "!<|endoftext|>",
             "</w>", "  ", "\t", "\n", "\u00a0", "\u3000", "...", "!!!", "?!", "--", "__init__", "#hashtag",
             "@user", "$100", "50%", "a+b=c", "İstanbul", "ß", "ﬁnance", "Å", "e\u0301", "½", "²", "Ⅻ", "٣"]


def words_of_the_docs() -> list[str]:
    text = " ".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").rglob("*.md")))
    return re.findall(r"[A-Za-z][A-Za-z'-]{1,14}", text)


def prompts(count: int, seed: int = 0) -> list[str]:
    rng = random.Random(seed)
    words = words_of_the_docs()
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.choice([1, 3, 8, 20, 40, 90])):  # up to well past 77 tokens
            parts.append(rng.choice(FRAGMENTS) if rng.random() < 0.3 else rng.choice(words))
            if rng.random() < 0.2:
                parts[-1] = parts[-1].upper() if rng.random() < 0.5 else parts[-1].capitalize()
        separators = [" ", ", ", ",", "  ", " | "]
        out.append(rng.choice(["", " ", "\n"]) + "".join(p + rng.choice(separators) for p in parts).rstrip(", |"))
    return out + FRAGMENTS + ["", " ", "<|endoftext|>", "a" * 300, "🙂" * 100]


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory) -> Path:
    """A CLIP-layout tokenizer folder with ~4,000 merges learnt from the docs by the tokenizers library (CLIP's
    pieces, bytes mapped to GPT-2's alphabet, ``</w>`` at word ends), saved through transformers' CLIPTokenizer."""
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers
    from transformers import CLIPTokenizer

    alphabet = list(byte_alphabet().values())
    tokenizer = Tokenizer(models.BPE(end_of_word_suffix="</w>", continuing_subword_prefix=""))
    tokenizer.normalizer = normalizers.Lowercase()
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(r"""'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""),
                             behavior="removed", invert=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    trainer = trainers.BpeTrainer(vocab_size=len(alphabet) * 2 + 4000, initial_alphabet=alphabet,
                                  end_of_word_suffix="</w>", show_progress=False, special_tokens=[])
    tokenizer.train_from_iterator([" ".join(words_of_the_docs()), *FRAGMENTS * 3], trainer)
    merges = json.loads(tokenizer.to_str())["model"]["merges"]
    merges = [tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in merges]
    tokens = alphabet + [c + "</w>" for c in alphabet]
    tokens += [t for t in dict.fromkeys("".join(m) for m in merges) if t not in set(tokens)]
    tokens += ["<|startoftext|>", "<|endoftext|>"]
    folder = tmp_path_factory.mktemp("trained") / "tokenizer"
    folder.mkdir()
    (folder / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(tokens)}), encoding="utf-8")
    (folder / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n",
                                       encoding="utf-8")
    CLIPTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"), model_max_length=77).save_pretrained(folder)
    assert len(merges) > 3000
    return folder


def padded_with_bang(folder: Path, tmp_path: Path) -> Path:
    """SDXL's tokenizer_2: the same files, padding with "!"."""
    from transformers import CLIPTokenizer

    theirs = CLIPTokenizer.from_pretrained(folder, pad_token="!")
    theirs.save_pretrained(tmp_path / "tokenizer_2")
    return tmp_path / "tokenizer_2"


def compare(folder: Path, texts: list[str]) -> list[str]:
    """Every difference between ours and transformers' CLIPTokenizer on ``texts``: ids with and without the special
    tokens, the pipelines' padded and truncated batch call, and decoding (with and without the special tokens)."""
    import numpy as np
    from transformers import CLIPTokenizer

    theirs, ours = CLIPTokenizer.from_pretrained(folder), ClipTokenizer.from_folder(folder)
    assert (ours.bos_token_id, ours.eos_token_id, ours.pad_token_id, ours.model_max_length) == \
        (theirs.bos_token_id, theirs.eos_token_id, theirs.pad_token_id, theirs.model_max_length)
    assert ours.get_vocab() == theirs.get_vocab() and ours.bpe_ranks == theirs.bpe_ranks
    differences = []
    for text in texts:
        expected = theirs(text).input_ids
        if ours(text).input_ids != expected:
            differences.append(f"ids of {text!r}")
        elif ours(text, add_special_tokens=False, truncation=False).input_ids != \
                theirs(text, add_special_tokens=False, truncation=False).input_ids:
            differences.append(f"ids without specials of {text!r}")
        elif ours.decode(expected) != theirs.decode(expected) or \
                ours.decode(expected, skip_special_tokens=True) != theirs.decode(expected, skip_special_tokens=True):
            differences.append(f"decoded {text!r}: {ours.decode(expected)!r} vs {theirs.decode(expected)!r}")
    batch = texts[:64]
    for kwargs in (dict(padding="max_length", max_length=77, truncation=True),
                   dict(padding="max_length", max_length=154, truncation=True), dict(padding=True)):
        if not np.array_equal(ours(batch, return_tensors="np", **kwargs).input_ids,
                              theirs(batch, return_tensors="np", **kwargs).input_ids):
            differences.append(f"the batch call with {kwargs}")
    return differences


def test_the_byte_alphabet_is_gpt2s_as_transformers_has_it():
    from transformers.models.clip.tokenization_clip import bytes_to_unicode

    assert byte_alphabet() == bytes_to_unicode() and len(set(byte_alphabet().values())) == 256


@pytest.mark.slow
def test_ids_and_text_are_clip_tokenizers_on_5000_prompts(trained_folder):
    texts = prompts(5000)
    assert len(texts) > 5000
    assert compare(trained_folder, texts) == []


@pytest.mark.slow
def test_sdxl_second_tokenizer_pads_with_its_own_token_and_reads_a_bang_as_transformers_does(trained_folder,
                                                                                              tmp_path):
    folder = padded_with_bang(trained_folder, tmp_path)
    ours = ClipTokenizer.from_folder(folder)
    assert ours.pad_token == "!" and ours.pad_token_id == ours.get_vocab()["!"]
    assert compare(folder, prompts(600, seed=1) + ["wow!", "hi ! there", "!!", "a!b"]) == []


@pytest.mark.slow
def test_sd2s_published_tokenizer_pads_as_its_special_tokens_map_says(trained_folder, tmp_path):
    """stabilityai/stable-diffusion-2-1's tokenizer/: a config of transformers' old format (no added_tokens_decoder)
    padding with "<|endoftext|>", and a special_tokens_map.json padding with "!" -- which transformers reads."""
    import shutil

    from helpers.published import PUBLISHED

    folder = tmp_path / "tokenizer"
    folder.mkdir()
    for name in ("vocab.json", "merges.txt"):
        shutil.copy(trained_folder / name, folder / name)
    for name in ("tokenizer_config.json", "special_tokens_map.json"):
        (folder / name).write_text(json.dumps(PUBLISHED["sd21"][f"tokenizer/{name}"]), encoding="utf-8")
    assert ClipTokenizer.from_folder(folder).pad_token == "!"
    assert compare(folder, prompts(300, seed=3) + ["wow!", "a ! b"]) == []


def test_the_tiny_models_tokenizer_folder_reads_the_same(tiny_model_dir):
    assert compare(tiny_model_dir / "tokenizer", prompts(300, seed=2)) == []
