"""Qwen's tokenizer, our own: the ids and attention masks of transformers' ``Qwen2TokenizerFast`` (FLUX.2 [klein]'s
``tokenizer/``) from a published folder's ``tokenizer.json`` -- a byte-level BPE the ``tokenizers`` library runs --
and its ``tokenizer_config.json`` (the padding token, padding and truncation sides, the added tokens), with the call
(padding, truncation) as transformers 4.57 makes it (:class:`~.t5_tokenizer.T5Tokenizer`'s, which this extends).

The text a Qwen3 text encoder reads is a chat: :func:`chat_text` renders what Qwen3's chat template renders for one
user message with ``add_generation_prompt=True, enable_thinking=False`` (diffusers' Flux2KleinPipeline asks for
that), written here rather than run from the folder's Jinja template -- no template code from a folder runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Union

from sdjax_runner.models.nn.t5_tokenizer import VERY_LARGE_INTEGER, T5Tokenizer, _added_token, _token


def chat_text(prompt: str) -> str:
    """Qwen3's chat template for ``[{"role": "user", "content": prompt}]`` with the generation prompt and thinking
    off: the user turn, then the assistant's turn opened with an empty think block."""
    return f"<|im_start|>user\n{prompt}<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\n"


class QwenTokenizer(T5Tokenizer):
    """Qwen2TokenizerFast's ids (module docstring): build it with :meth:`from_folder`; call it as transformers'."""

    @classmethod
    def from_folder(cls, folder: Union[str, Path]) -> QwenTokenizer:
        """A ``tokenizer/`` folder as published: ``tokenizer.json`` and, where present, ``tokenizer_config.json``
        (its ``pad_token``, ``eos_token``, ``added_tokens_decoder``, sides and ``model_max_length``). ValueError for
        a folder it cannot read."""
        from tokenizers import Tokenizer

        folder = Path(folder)
        tokenizer_file, config_file = folder / "tokenizer.json", folder / "tokenizer_config.json"
        if not tokenizer_file.is_file():
            raise ValueError(f"{folder} has no tokenizer.json")
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        if not isinstance(config, dict):
            raise ValueError(f"{config_file} is not a JSON object")
        backend = Tokenizer.from_file(str(tokenizer_file))
        decoder = config.get("added_tokens_decoder") or {}
        added = [_added_token(token) for _, token in sorted((int(i), t) for i, t in decoder.items())]
        if added:  # (what tokenizer.json already holds keeps its id)
            backend.add_tokens(added)
        special: dict[str, Any] = {}
        for key in ("eos_token", "pad_token", "bos_token", "unk_token"):
            value = _token(config.get(key))
            if value is not None:
                special[key] = str(value)
        special.setdefault("pad_token", "<|endoftext|>")  # Qwen2TokenizerFast's default
        special["additional_special_tokens"] = [str(_token(t)) for t in config.get("additional_special_tokens") or []]
        if backend.token_to_id(special["pad_token"]) is None:
            raise ValueError(f"{folder}: the padding token {special['pad_token']!r} is not in its vocabulary")
        maximum = config.get("model_max_length", VERY_LARGE_INTEGER)
        return cls(backend, special,
                   model_max_length=int(maximum) if isinstance(maximum, (int, float)) else VERY_LARGE_INTEGER,
                   padding_side=config.get("padding_side") or "right",
                   truncation_side=config.get("truncation_side") or "right",
                   clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)))
