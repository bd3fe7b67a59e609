"""CLIP's tokenizer, our own: the ids of transformers' ``CLIPTokenizer`` (the one diffusers' pipelines load) from the
files a published ``tokenizer/`` folder holds (``vocab.json``, ``merges.txt``, ``tokenizer_config.json``), with the
``tokenizers`` library's BPE doing the merges (issue 60: no transformers at runtime).

What the text goes through, as ``CLIPTokenizer`` (transformers 4.57, ``tokenization_clip.py``) does it:

1. split at the special tokens' exact text (``<|startoftext|>``, ``<|endoftext|>``): each is its own id;
2. each other part: ``ftfy.fix_text`` (mojibake, NFC), runs of whitespace to one space, stripped, lowercased
   (Python's ``str.lower``);
3. cut into pieces by CLIP's pattern (the special tokens' text again -- a lowercased ``<|ENDOFTEXT|>`` is the
   special token --, the English contractions, letter runs, single digits, runs of other non-space characters);
4. each piece's UTF-8 bytes mapped to GPT-2's printable byte alphabet, its last symbol marked ``</w>``, and
   merged by ``merges.txt``'s ranks (``tokenizers.models.BPE``); an unknown symbol is the unknown token's id.

``__call__`` pads and truncates as transformers' does for these calls (start, at most ``max_length - 2`` tokens, end,
then the padding token), so the pipelines' ``tokenizer(texts, padding="max_length", max_length=77,
truncation=True)`` reads the same; ``decode`` gives the same text back. ``tests/test_clip_tokenizer.py`` checks
ids and decoded text against ``CLIPTokenizer`` on over 5,000 prompts.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

START, END = "<|startoftext|>", "<|endoftext|>"
# CLIP's pattern (tokenization_clip.py), case-insensitive as there
PIECES = r"""<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[\p{L}]+|[\p{N}]|[^\s\p{L}\p{N}]+"""
# transformers' clean_up_tokenization: the spaces BPE's word ends leave before punctuation and contractions
CLEAN_UP = ((" .", "."), (" ?", "?"), (" !", "!"), (" ,", ","), (" ' ", "'"), (" n't", "n't"), (" 'm", "'m"),
            (" 's", "'s"), (" 've", "'ve"), (" 're", "'re"))


@functools.cache
def byte_alphabet() -> dict[int, str]:
    """GPT-2's map of the 256 byte values to printable characters (CLIP's too): printable Latin-1 to itself, the
    rest to code points from 256 up, in byte order."""
    kept = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    alphabet, extra = {}, 0
    for byte in range(256):
        if byte in kept:
            alphabet[byte] = chr(byte)
        else:
            alphabet[byte] = chr(256 + extra)
            extra += 1
    return alphabet


@dataclass
class Encoded:
    """What a call gives, as transformers' ``BatchEncoding`` does for these fields (``.input_ids`` and ``["..."]``):
    lists of ids, or arrays with ``return_tensors="np"``."""

    input_ids: Any
    attention_mask: Any

    def __getitem__(self, name: str) -> Any:
        return getattr(self, name)


def _token_text(value: Any) -> Optional[str]:
    """A special token as tokenizer_config.json gives it: a string or an AddedToken's dict."""
    if isinstance(value, dict):
        return value.get("content")
    return value


class ClipTokenizer:
    """CLIP's BPE tokenizer (module docstring)."""

    def __init__(self, vocab: dict[str, int], merges: list[tuple[str, str]], *, bos_token: str = START,
                 eos_token: str = END, pad_token: str = END, unk_token: str = END, model_max_length: int = 77,
                 clean_up_tokenization_spaces: bool = False):
        import regex
        from tokenizers.models import BPE

        self.vocab = dict(vocab)
        self.ids_to_tokens = {i: t for t, i in self.vocab.items()}
        self.bpe_ranks = {tuple(pair): rank for rank, pair in enumerate(merges)}
        self.bos_token, self.eos_token, self.pad_token, self.unk_token = bos_token, eos_token, pad_token, unk_token
        self.model_max_length = model_max_length
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        # transformers splits a text at each of these first (its added tokens), the padding token among them
        self.specials = [token for token in dict.fromkeys((START, END, bos_token, eos_token, unk_token, pad_token))
                         if token in self.vocab]
        self._special_split = re.compile("(" + "|".join(re.escape(t) for t in self.specials) + ")") \
            if self.specials else None
        self._pieces = regex.compile(PIECES, regex.IGNORECASE)
        self._bpe = BPE(self.vocab, [tuple(m) for m in merges], end_of_word_suffix="</w>",
                        continuing_subword_prefix="", unk_token=unk_token, fuse_unk=False)
        self._bytes = byte_alphabet()
        self._from_bytes = {c: b for b, c in self._bytes.items()}
        self._piece_ids: dict[str, list[int]] = {}

    @classmethod
    def from_folder(cls, folder: Union[str, Path]) -> ClipTokenizer:
        """A ``tokenizer/`` folder as published (openai/clip-vit-large-patch14's, SD's, SD 2.x's and SDXL's
        ``tokenizer_2/`` with their ``!`` padding): ``vocab.json``, ``merges.txt`` and, where present,
        ``tokenizer_config.json`` and ``special_tokens_map.json``."""
        folder = Path(folder)
        vocab = json.loads((folder / "vocab.json").read_text(encoding="utf-8"))
        # As CLIPTokenizer reads it: stripped, the first line (#version) skipped, then at most 49152 - 256 - 2 + 1
        lines = (folder / "merges.txt").read_text(encoding="utf-8").strip().split("\n")[1:49152 - 256 - 2 + 1]
        merges = [(pair[0], pair[1]) for pair in (line.split() for line in lines) if len(pair) == 2]
        config_file, special_file = folder / "tokenizer_config.json", folder / "special_tokens_map.json"
        config = json.loads(config_file.read_text(encoding="utf-8")) if config_file.is_file() else {}
        if "added_tokens_decoder" not in config and special_file.is_file():
            # a config saved before transformers 4.34 (SD 1.x/2.x's as published): special_tokens_map.json's tokens
            # win, as transformers reads them -- SD 2.x's pads with "!" there, "<|endoftext|>" in tokenizer_config
            config.update(json.loads(special_file.read_text(encoding="utf-8")))
        specials: dict[str, str] = {}
        for name in ("bos_token", "eos_token", "pad_token", "unk_token"):
            token = _token_text(config.get(name))
            if token is not None:
                specials[name] = token
        maximum = config.get("model_max_length", 77)
        return cls(vocab, merges, **specials, model_max_length=int(maximum) if maximum < 1e6 else 77,
                   clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)))

    # ids of the special tokens, as transformers names them
    @property
    def bos_token_id(self) -> int:
        return self.vocab[self.bos_token]

    @property
    def eos_token_id(self) -> int:
        return self.vocab[self.eos_token]

    @property
    def pad_token_id(self) -> int:
        return self.vocab[self.pad_token]

    @property
    def unk_token_id(self) -> int:
        return self.vocab[self.unk_token]

    def get_vocab(self) -> dict[str, int]:
        return dict(self.vocab)

    def __len__(self) -> int:
        return len(self.vocab)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text``; with the start and end tokens around them where ``add_special_tokens``."""
        ids: list[int] = []
        parts = self._special_split.split(text) if self._special_split else [text]
        for number, part in enumerate(parts):
            if number % 2:  # a special token's exact text
                ids.append(self.vocab[part])
            elif part:
                ids.extend(self._part_ids(part))
        return [self.bos_token_id, *ids, self.eos_token_id] if add_special_tokens else ids

    def _part_ids(self, text: str) -> list[int]:
        import ftfy

        cleaned = re.sub(r"\s+", " ", ftfy.fix_text(text)).strip().lower()
        ids: list[int] = []
        for piece in self._pieces.findall(cleaned):
            if piece in (START, END):  # the special tokens' text, lowercased: theirs (CLIPTokenizer's bpe cache)
                ids.append(self.vocab.get(piece, self.unk_token_id))
                continue
            found = self._piece_ids.get(piece)
            if found is None:
                mapped = "".join(self._bytes[b] for b in piece.encode("utf-8"))
                found = [token.id for token in self._bpe.tokenize(mapped)]
                if len(self._piece_ids) < 100_000:
                    self._piece_ids[piece] = found
            ids.extend(found)
        return ids

    def __call__(self, text: Union[str, list[str]], padding: Union[bool, str] = False,
                 max_length: Optional[int] = None, truncation: bool = False, add_special_tokens: bool = True,
                 return_tensors: Optional[str] = None) -> Encoded:
        """transformers' call for what the runner asks of it: one text or a batch; ``padding`` "max_length" (to
        ``max_length``, else the model's 77), True / "longest" (to the batch's longest) or False; ``truncation``
        at ``max_length`` (the model's where None), the start and end tokens kept; ``return_tensors="np"``."""
        texts = [text] if isinstance(text, str) else list(text)
        limit = max_length if max_length is not None else self.model_max_length
        extra = 2 if add_special_tokens else 0
        rows = []
        for one in texts:
            ids = self.encode(one, add_special_tokens=False)
            if truncation:
                ids = ids[:max(limit - extra, 0)]
            rows.append([self.bos_token_id, *ids, self.eos_token_id] if add_special_tokens else ids)
        width = None  # padding False: each row as long as it is
        if padding == "max_length":
            width = limit
        elif padding in (True, "longest"):
            width = max(map(len, rows), default=0)
        masks = [[1] * len(row) for row in rows]
        if width is not None:
            masks = [mask + [0] * (width - len(row)) for mask, row in zip(masks, rows, strict=True)]
            rows = [row + [self.pad_token_id] * (width - len(row)) for row in rows]
        if return_tensors == "np":
            return Encoded(np.asarray(rows, dtype=np.int64), np.asarray(masks, dtype=np.int64))
        if return_tensors is not None:
            raise ValueError(f"return_tensors={return_tensors!r}: only 'np' or None")
        if isinstance(text, str):
            return Encoded(rows[0], masks[0])
        return Encoded(rows, masks)

    def decode(self, ids, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``, as transformers' decode gives it: the tokens' bytes joined, word ends as spaces,
        special tokens as their text (or left out), and clean_up_tokenization where the folder's config asks."""
        tokens = [self.ids_to_tokens.get(int(i), "") for i in np.asarray(ids).reshape(-1).tolist()]
        if skip_special_tokens:
            tokens = [token for token in tokens if token not in self.specials]
        data = bytearray(self._from_bytes[c] for c in "".join(tokens) if c in self._from_bytes)
        text = data.decode("utf-8", errors="replace").replace("</w>", " ").strip()
        if self.clean_up_tokenization_spaces:
            for before, after in CLEAN_UP:
                text = text.replace(before, after)
        return text
