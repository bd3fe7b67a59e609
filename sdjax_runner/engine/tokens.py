"""Prompt texts -> the program's token ids, on the host (before stage 1, :mod:`.encode`).

``prompts.syntax=plain`` is the guide's tokenization: ``pipeline.prepare_inputs`` (each encoder's
tokenizer, padded and cut at 77 tokens); ids ``(batch, 77)``, SDXL ``(batch, 2, 77)``.

``prompts.syntax=a1111`` is A1111's (config/prompt_syntax.py): each prompt parsed for emphasis and BREAK,
its tokens laid out in chunks of 77, every token with its weight. A run's prompts and its negative prompt
are padded with empty-prompt chunks to the chunk count of the longest of them (A1111 pads a batch's
prompts, and the prompt and negative, the same way), so one program (:class:`.program.Spec`'s
``prompt_chunks``) serves them all: ids ``(batch, chunks * 77)``, SDXL ``(batch, 2, chunks * 77)`` (each
encoder's own tokenizer; they differ in their padding token), weights of the same shape, float32.
"""

from __future__ import annotations

import logging
from typing import Any, Optional

import numpy as np

from sdjax_runner.config.prompt_syntax import CHUNK, chunks

log = logging.getLogger("sdjax_runner")

TOKENS = CHUNK + 2  # one chunk as the text encoder reads it: start, 75, end


def tokenizers(pipeline: Any) -> list:
    return [pipeline.tokenizer] + ([pipeline.tokenizer_2] if hasattr(pipeline, "text_encoder_2") else [])


class PromptTokens:
    """The token ids (and weights) of prompts, for one pipeline and one ``prompts.syntax``."""

    def __init__(self, pipeline: Any, syntax: str, embeddings: Optional[Any] = None):
        """``embeddings``: textual-inversion embeddings (models/embeddings.Embeddings) whose names a prompt's
        tokens are matched against, or None."""
        self.pipeline, self.syntax, self.embeddings = pipeline, syntax, embeddings
        self.tokenizers = tokenizers(pipeline)
        # A1111's comma_token: ",</w>" (None: no backtracking at commas); get_vocab copies the vocabulary.
        self.commas = [t.get_vocab().get(",</w>") for t in self.tokenizers] if syntax == "a1111" else []
        self._chunks: dict[tuple[int, str], list] = {}  # (tokenizer, text) -> its chunks

    def chunk_list(self, which: int, text: str) -> list:
        key = (which, text)
        if key not in self._chunks:
            tokenizer = self.tokenizers[which]

            def tokenize(texts: list[str]) -> list[list[int]]:
                ids = tokenizer(texts, truncation=False, add_special_tokens=False).input_ids
                return [self.embeddings.replace(which, row) for row in ids] if self.embeddings else ids

            self._chunks[key] = chunks(text, tokenize, tokenizer.bos_token_id, tokenizer.eos_token_id,
                                       tokenizer.pad_token_id, self.commas[which])
        return self._chunks[key]

    def chunk_count(self, texts) -> int:
        """The program's ``prompt_chunks`` for ``texts`` (every prompt and the negative): 0 for the plain
        syntax, else the most chunks any of them takes."""
        if self.syntax != "a1111":
            return 0
        return max(self.chunks_of(text) for text in dict.fromkeys(texts))

    def chunks_of(self, text: str) -> int:
        """How many chunks ``text`` takes (A1111's syntax; SDXL: the more of its two tokenizers')."""
        return max(len(self.chunk_list(which, text)) for which in range(len(self.tokenizers)))

    def __call__(self, texts: list[str], count: int) -> tuple[np.ndarray, Optional[np.ndarray]]:
        """``texts``' ids and (A1111's syntax, ``count`` chunks) weights; the plain syntax has no weights."""
        if not count:
            if self.embeddings is None:
                return np.asarray(self.pipeline.prepare_inputs(texts)), None
            return self.plain_with_embeddings(texts), None
        ids, weights = [], []
        for which in range(len(self.tokenizers)):
            empty = self.chunk_list(which, "")[0]
            rows = []
            for text in texts:
                laid = self.chunk_list(which, text)
                rows.append(laid + [empty] * (count - len(laid)))
            ids.append(np.array([[t for chunk in row for t in chunk.tokens] for row in rows], np.int32))
            weights.append(np.array([[w for chunk in row for w in chunk.weights] for row in rows], np.float32))
        if len(ids) == 1:
            return ids[0], weights[0]
        return np.stack(ids, axis=1), np.stack(weights, axis=1)

    def plain_with_embeddings(self, texts: list[str]) -> np.ndarray:
        """The plain syntax's ids -- each tokenizer's, started, ended, cut at 77 and padded as ``prepare_inputs``
        makes them -- with the embeddings' names replaced by their placeholder ids before the cut."""
        assert self.embeddings is not None
        ids = []
        for which, tokenizer in enumerate(self.tokenizers):
            rows = []
            for number, row in enumerate(tokenizer(list(texts), truncation=False, add_special_tokens=False).input_ids):
                replaced = self.embeddings.replace(which, row)
                if which == 0 and len(replaced) > TOKENS - 2 >= len(row):  # the embeddings' vectors pushed it past
                    log.warning("prompts.embeddings: prompt %d takes %d tokens with its embeddings' vectors, past the "
                                "%d a CLIP prompt holds: its last %d dropped (prompts.syntax=a1111 chunks a longer "
                                "prompt)", number, len(replaced), TOKENS - 2, len(replaced) - (TOKENS - 2))
                kept = replaced[:TOKENS - 2]
                laid = [tokenizer.bos_token_id, *kept, tokenizer.eos_token_id]
                rows.append(laid + [tokenizer.pad_token_id] * (TOKENS - len(laid)))
            ids.append(np.array(rows, np.int32))
        return ids[0] if len(ids) == 1 else np.stack(ids, axis=1)
