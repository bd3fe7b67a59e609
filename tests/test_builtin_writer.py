"""The built-in models are written by the runner's own code (sdjax_runner/models/published_layout.py), byte for byte
the folders diffusers' and transformers' ``save_pretrained`` wrote for them (tests/helpers/library_builtin.py, the
libraries' Flax classes), and building one imports neither library (issue #60)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sdjax_runner.config.schema import BUILTIN_MODELS

# FLUX.2 [klein]'s built-ins are the runner's own throughout: no library writes a FLUX.2 folder in Flax (diffusers has no
# Flax FLUX.2, transformers no Flax Qwen3); their modules are checked against the PyTorch ones (tests/test_flux2.py) and
# their tokenizer folder against transformers' Qwen2TokenizerFast below.
OWN_ONLY = ("tiny-random-flux2", "tiny-random-flux2-base")
TINY = [name for name in BUILTIN_MODELS if "arch" not in name and name not in OWN_ONLY]


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY)
def test_each_tiny_builtin_is_the_folder_the_libraries_wrote(tmp_path, name):
    from helpers.library_builtin import build
    from sdjax_runner.models.builtin import build_builtin

    ours = files(build_builtin(name, tmp_path / "ours"))
    theirs = files(build(name, tmp_path / "theirs"))
    assert sorted(ours) == sorted(theirs)
    assert len(ours) >= 2 and any(n.endswith(".msgpack") for n in ours)  # configs and weights, compared
    different = [n for n in ours if ours[n] != theirs[n]]
    assert not different, different


def test_the_tiny_builtins_are_all_compared():
    """Every built-in but the full-size ones (minutes and tens of GB to write) is in the comparison above; the
    full-size ones are the same writers on other numbers."""
    assert set(TINY) == {"tiny-random", "tiny-random-xl", "tiny-random-inpaint", "tiny-random-clip",
                         "tiny-random-controlnet", "tiny-random-flux", "tiny-random-flux-schnell",
                         "tiny-random-flux-kontext", "tiny-random-flux-fill", "tiny-random-flux-control",
                         "tiny-random-flux-controlnet", "tiny-random-flux-controlnet-union", "tiny-random-sd3",
                         "tiny-random-sd3-controlnet", "tiny-random-sd3-controlnet-single",
                         "tiny-random-sd3-controlnet-inpaint"}
    assert set(OWN_ONLY) | set(TINY) == {name for name in BUILTIN_MODELS if "arch" not in name}


def test_the_flux2_builtins_tokenizer_folder_reads_as_transformers_reads_it(tmp_path):
    """tiny-random-flux2's tokenizer/ (written with the tokenizers library, laid out as Qwen2TokenizerFast saves it)
    gives transformers' Qwen2TokenizerFast's ids and masks, with the runner's own reader, on every line of the built-in
    corpus and the A1111-style prompts of the CLIP tokenizer's corpus as the chat text FLUX.2 reads, padded and cut."""
    from transformers import Qwen2TokenizerFast

    from sdjax_runner.families.flux2.models.builtin import write_tokenizer
    from sdjax_runner.models.builtin_parts import CORPUS
    from sdjax_runner.models.nn.qwen_tokenizer import QwenTokenizer, chat_text

    write_tokenizer(tmp_path / "tokenizer")
    theirs = Qwen2TokenizerFast.from_pretrained(tmp_path / "tokenizer")
    ours = QwenTokenizer.from_folder(tmp_path / "tokenizer")
    prompts = [line for line in CORPUS.splitlines() if line.strip()]
    prompts += ["(masterpiece:1.2), a cat <lora:x:0.5> BREAK neon", "caf\u00e9 \U0001f600 \u00fc\u00df", "", " two  spaces "]
    texts = [chat_text(prompt) for prompt in prompts]
    assert theirs.apply_chat_template([{"role": "user", "content": "a cat"}], tokenize=False,
                                      add_generation_prompt=True, enable_thinking=False) == chat_text("a cat")
    for length in (16, 64):
        mine = ours(texts, padding="max_length", max_length=length, truncation=True, return_tensors="np")
        reference = theirs(texts, padding="max_length", max_length=length, truncation=True, return_tensors="np")
        assert (mine.input_ids == reference["input_ids"]).all()
        assert (mine.attention_mask == reference["attention_mask"]).all()
    assert ours.pad_token_id == theirs.pad_token_id == ours.backend.token_to_id("<|endoftext|>")


def test_building_a_builtin_imports_no_diffusers_transformers_or_torch(tmp_path):
    code = ("import sys; from pathlib import Path; from sdjax_runner.models.builtin import build_builtin\n"
            f"for name in ('tiny-random-xl', 'tiny-random-clip', 'tiny-random-sd3'):\n"
            f"    build_builtin(name, Path({str(tmp_path)!r}) / name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'diffusers', 'transformers', 'torch'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "tiny-random-sd3" / "text_encoder_3" / "flax_model.msgpack").is_file()
