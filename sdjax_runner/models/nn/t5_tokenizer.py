"""T5's tokenizer, our own: the ids and attention masks of transformers' ``T5TokenizerFast`` (what FLUX.1's
``tokenizer_2/`` and SD 3's ``tokenizer_3/`` are loaded as) from a published folder's ``tokenizer.json``, with the
``tokenizers`` library doing the tokenizing (issue 60: no transformers at runtime).

``T5TokenizerFast`` is a thin layer over a ``tokenizers.Tokenizer`` read from ``tokenizer.json`` (its normalizer,
Metaspace pre-tokenizer, unigram model, and the post-processor that appends ``</s>``). What the layer adds, and
this module does as transformers 4.57 does it (``tokenization_utils_fast.py``, ``tokenization_t5_fast.py``):

1. the special tokens: ``eos_token`` (``</s>``), ``unk_token`` (``<unk>``), ``pad_token`` (``<pad>``) and the
   additional ones -- ``extra_ids`` (default 100) sentinels ``<extra_id_N>`` unless ``additional_special_tokens``
   lists some -- from ``tokenizer_config.json`` (and, for a config saved before transformers 4.34, without
   ``added_tokens_decoder``, ``special_tokens_map.json`` over it). The config's ``added_tokens_decoder`` and any
   special token the ``tokenizer.json`` lacks are added to the backend as transformers adds them: a sentinel
   missing there gets the next free id, text matching a special token becomes its id;
2. the call: ``padding`` (``"max_length"``, ``True`` / ``"longest"``), ``truncation`` (the end token kept),
   ``max_length`` (default: ``model_max_length``, and a ``max_length`` alone truncates), set on the backend as
   transformers sets them before it encodes the batch; the padding token's id and a mask of 1s then 0s;
3. ``add_prefix_space`` in the config (the hub's FLUX.1 sets it): transformers then rebuilds the tokenizer from
   ``spiece.model`` with sentencepiece. Where ``tokenizer.json``'s Metaspace already prepends as that setting asks
   (``prepend_scheme`` "always" for true with legacy on: what that conversion writes), the file is read as it is:
   the same ids. Otherwise, and for a folder with ``spiece.model`` but no ``tokenizer.json``, a ValueError says so
   (reading sentencepiece's model needs sentencepiece).

``tests/test_t5_modules.py`` checks ids and masks against ``T5TokenizerFast`` on thousands of prompts and several
folder layouts.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any, Optional, Union

import numpy as np

from sdjax_runner.models.clip_tokenizer import CLEAN_UP, Encoded

# transformers' SpecialTokensMixin.SPECIAL_TOKENS_ATTRIBUTES, in its order (which is the order tokens are added)
SPECIAL_TOKENS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")
# T5TokenizerFast.__init__'s defaults
T5_DEFAULTS = {"eos_token": "</s>", "unk_token": "<unk>", "pad_token": "<pad>"}
VERY_LARGE_INTEGER = int(1e30)  # transformers' model_max_length where a config has none
LARGE_INTEGER = int(1e20)  # above it, transformers treats model_max_length as none


def metaspace_scheme(tokenizer_json: dict) -> Optional[str]:
    """The ``prepend_scheme`` of the Metaspace pre-tokenizer of a ``tokenizer.json`` (its parsed dict; None: none
    found). tokenizers < 0.14 wrote ``add_prefix_space`` (a bool) instead."""

    def find(node: Any) -> Optional[str]:
        if isinstance(node, dict):
            if node.get("type") == "Metaspace":
                scheme = node.get("prepend_scheme")
                if scheme is None and "add_prefix_space" in node:
                    scheme = "always" if node["add_prefix_space"] else "never"
                return scheme if isinstance(scheme, str) else None
            return next((s for s in map(find, node.get("pretokenizers") or []) if s is not None), None)
        return None

    return find(tokenizer_json.get("pre_tokenizer"))


def _read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))


def _added_token(value: dict, special: Optional[bool] = None) -> Any:
    """A tokenizers ``AddedToken`` of a config's dict (transformers' serialisation, with or without its
    ``__type`` key); ``special`` forces the flag (special_tokens_map.json's entries are special)."""
    from tokenizers import AddedToken

    fields = {k: v for k, v in value.items()
              if k in ("content", "single_word", "lstrip", "rstrip", "normalized", "special")}
    if special is not None:
        fields["special"] = special
    return AddedToken(**fields)


def _token(value: Any, special: Optional[bool] = None) -> Any:
    """A special token as a config gives it: a string, or an AddedToken's dict (-> AddedToken); None stays None."""
    if isinstance(value, dict):
        return _added_token(value, special)
    return value


class T5Tokenizer:
    """T5's tokenizer (module docstring): build it with :meth:`from_folder`."""

    def __init__(self, backend: Any, special: dict[str, Any], *, model_max_length: int = VERY_LARGE_INTEGER,
                 padding_side: str = "right", truncation_side: str = "right",
                 clean_up_tokenization_spaces: bool = False):
        """``backend``: the ``tokenizers.Tokenizer`` with every added token in place; ``special``: the special
        tokens' text by transformers' attribute name (``eos_token`` ...; ``additional_special_tokens`` a list)."""
        self.backend = backend
        self.special = special
        self.model_max_length = model_max_length
        self.padding_side, self.truncation_side = padding_side, truncation_side
        self.clean_up_tokenization_spaces = clean_up_tokenization_spaces
        self._lock = threading.Lock()  # the backend's truncation and padding are set per call

    @classmethod
    def from_folder(cls, folder: Union[str, Path]) -> T5Tokenizer:
        """A ``tokenizer_2/`` (FLUX.1) or ``tokenizer_3/`` (SD 3) folder as published: ``tokenizer.json`` and,
        where present, ``tokenizer_config.json`` and ``special_tokens_map.json``. ValueError for a folder this
        cannot read as transformers would (the module docstring's point 3)."""
        from tokenizers import AddedToken, Tokenizer

        folder = Path(folder)
        tokenizer_file = folder / "tokenizer.json"
        if not tokenizer_file.is_file():
            if (folder / "spiece.model").is_file():
                raise ValueError(f"{folder} has spiece.model but no tokenizer.json: reading a sentencepiece model "
                                 "needs sentencepiece; save the tokenizer with transformers' T5TokenizerFast "
                                 "(save_pretrained writes tokenizer.json)")
            raise ValueError(f"{folder} has no tokenizer.json")
        serialized = _read_json(tokenizer_file)
        config_file, map_file = folder / "tokenizer_config.json", folder / "special_tokens_map.json"
        config = _read_json(config_file) if config_file.is_file() else {}
        if not isinstance(config, dict) or not isinstance(serialized, dict):
            raise ValueError(f"{folder}: tokenizer_config.json or tokenizer.json is not a JSON object")

        prefix = config.get("add_prefix_space")
        if prefix is not None:  # transformers' convert_slow_tokenizer._get_prepend_scheme
            wanted = ("always" if config.get("legacy", True) is not False else "first") if prefix else "never"
            found = metaspace_scheme(serialized)
            if found != wanted:
                raise ValueError(f"{config_file} sets add_prefix_space {prefix!r}, which transformers builds from "
                                 f"spiece.model with sentencepiece (a Metaspace prepending {wanted!r}); "
                                 f"tokenizer.json's prepends {found!r}")

        # transformers' from_pretrained: the added tokens and the special tokens' values
        values = {key: _token(config.get(key)) for key in SPECIAL_TOKENS if key in config}
        additional = [_token(t) for t in config.get("additional_special_tokens") or []]
        if "added_tokens_decoder" in config:
            decoder = {int(i): _added_token(t) for i, t in config["added_tokens_decoder"].items()}
        else:  # a config saved before transformers 4.34: special_tokens_map.json wins, tokenizer.json's added tokens
            special_map = _read_json(map_file) if map_file.is_file() else {}
            for key, value in (special_map.items() if isinstance(special_map, dict) else ()):
                if key == "additional_special_tokens" and isinstance(value, list):
                    for token in (_token(t, special=True) for t in value):
                        if token not in additional:
                            additional.append(token)
                elif key in SPECIAL_TOKENS:
                    values[key] = _token(value, special=True)
            decoder = {int(t["id"]): _added_token(t) for t in serialized.get("added_tokens") or []}
        by_text = {str(token): token for token in decoder.values()}
        for key, value in values.items():
            if value is not None and by_text:
                values[key] = by_text.get(str(value), value)
        for key, default in T5_DEFAULTS.items():
            values.setdefault(key, default)

        # T5TokenizerFast.__init__: the sentinels
        extra_ids = config.get("extra_ids", 100)
        sentinels = [t for t in additional if "<extra_id_" in str(t)]
        if not sentinels:
            additional += [f"<extra_id_{i}>" for i in range(extra_ids)]
        elif extra_ids > 0 and extra_ids != len(sentinels):
            raise ValueError(f"{config_file}: extra_ids {extra_ids} but {len(sentinels)} <extra_id_N> tokens in "
                             "additional_special_tokens (transformers refuses this too)")

        backend = Tokenizer.from_str(json.dumps(serialized))
        padding = backend.padding  # a tokenizer.json that pads: transformers takes its token and side as defaults
        if padding is not None and "pad_token" not in config:
            values["pad_token"] = padding["pad_token"]

        # PreTrainedTokenizerFast.__init__: every entry of the config's added_tokens_decoder is added again
        # (transformers compares them by the hash of the dict's keys, which never match), then each special token
        # the backend's added tokens lack, all flagged special where they are special tokens
        extended: list[Any] = []
        seen: set[str] = set()
        for value in [values.get(key) for key in SPECIAL_TOKENS] + [additional]:
            for token in value if isinstance(value, list) else [value] if value else []:
                if str(token) not in seen:
                    seen.add(str(token))
                    extended.append(token)
        to_add = [token for _, token in sorted(decoder.items())]
        present = [t.content for t in backend.get_added_tokens_decoder().values()] + [str(t) for t in to_add]
        for token in extended:
            if (isinstance(token, str) and token in present) or token in to_add:
                continue
            to_add.append(token)
        specials = {str(token) for token in extended}
        tokens = []
        for token in to_add:
            if isinstance(token, str):
                token = AddedToken(token, special=token in specials)
            else:
                token.special = token.special or str(token) in specials
            tokens.append(token)
        if tokens:
            backend.add_tokens(tokens)
        backend.encode_special_tokens = bool(config.get("split_special_tokens", False))

        special: dict[str, Any] = {key: str(value) for key, value in values.items() if value is not None}
        special["additional_special_tokens"] = [str(t) for t in additional]
        maximum = config.get("model_max_length", VERY_LARGE_INTEGER)
        return cls(backend, special,
                   model_max_length=int(maximum) if isinstance(maximum, (int, float)) else VERY_LARGE_INTEGER,
                   padding_side=config.get("padding_side") or (padding or {}).get("direction") or "right",
                   truncation_side=config.get("truncation_side") or "right",
                   clean_up_tokenization_spaces=bool(config.get("clean_up_tokenization_spaces", False)))

    def __getstate__(self) -> dict[str, Any]:  # copied or pickled without its lock
        return {k: v for k, v in self.__dict__.items() if k != "_lock"}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()

    # the special tokens' text and ids, as transformers names them (None: the tokenizer has no such token)
    def _id(self, name: str) -> Optional[int]:
        token = self.special.get(name)
        if token is None:
            return None
        found = self.backend.token_to_id(token)
        if found is None and name != "unk_token":
            return self._id("unk_token")
        return found

    @property
    def eos_token(self) -> Optional[str]:
        return self.special.get("eos_token")

    @property
    def pad_token(self) -> Optional[str]:
        return self.special.get("pad_token")

    @property
    def unk_token(self) -> Optional[str]:
        return self.special.get("unk_token")

    @property
    def bos_token_id(self) -> Optional[int]:
        return self._id("bos_token")

    @property
    def eos_token_id(self) -> Optional[int]:
        return self._id("eos_token")

    @property
    def pad_token_id(self) -> Optional[int]:
        return self._id("pad_token")

    @property
    def unk_token_id(self) -> Optional[int]:
        return self._id("unk_token")

    @property
    def all_special_tokens(self) -> list[str]:
        return list(dict.fromkeys([self.special[k] for k in SPECIAL_TOKENS if k in self.special]
                                  + self.special["additional_special_tokens"]))

    def get_vocab(self) -> dict[str, int]:
        """Token -> id, the added tokens included."""
        return self.backend.get_vocab(with_added_tokens=True)

    def __len__(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """The ids of ``text`` (with the end token where ``add_special_tokens``), neither cut nor padded."""
        return self(text, add_special_tokens=add_special_tokens).input_ids

    def __call__(self, text: Union[str, list[str]], padding: Union[bool, str] = False,
                 max_length: Optional[int] = None, truncation: Union[bool, str, None] = None,
                 add_special_tokens: bool = True, return_tensors: Optional[str] = None) -> Encoded:
        """transformers' call for what the runner asks of it: one text or a batch; ``padding`` "max_length" (to
        ``max_length``, else ``model_max_length``), True / "longest" (to the batch's longest) or False;
        ``truncation`` True / "longest_first" at ``max_length`` (``model_max_length`` where None; a ``max_length``
        with neither padding nor truncation given truncates), the end token kept; ``return_tensors="np"``."""
        texts = [text] if isinstance(text, str) else list(text)
        if max_length is not None and padding is False and truncation is None:
            truncation = True
        pad = {False: None, "do_not_pad": None, True: "longest", "longest": "longest",
               "max_length": "max_length"}.get(padding, "invalid")
        if pad == "invalid":
            raise ValueError(f"padding={padding!r}: one of False, True, 'longest', 'max_length', 'do_not_pad'")
        if truncation not in (None, False, True, "do_not_truncate", "longest_first", "only_first"):
            raise ValueError(f"truncation={truncation!r}: a bool, 'longest_first' or 'do_not_truncate'")
        cut = truncation not in (None, False, "do_not_truncate")
        if max_length is None:
            large = self.model_max_length > LARGE_INTEGER  # no length to pad or cut to: transformers does neither
            if pad == "max_length":
                pad, max_length = (None, None) if large else (pad, self.model_max_length)
            if cut:
                cut, max_length = (False, max_length) if large else (True, self.model_max_length)
        pad_id = self.pad_token_id
        if pad is not None and (self.pad_token is None or pad_id is None or pad_id < 0):
            raise ValueError("padding asked, but the tokenizer has no padding token")
        with self._lock:
            if cut:
                self.backend.enable_truncation(max_length, stride=0, strategy="longest_first",
                                               direction=self.truncation_side)
            else:
                self.backend.no_truncation()
            if pad is not None:
                self.backend.enable_padding(length=max_length if pad == "max_length" else None,
                                            direction=self.padding_side, pad_id=pad_id, pad_type_id=0,
                                            pad_token=self.pad_token, pad_to_multiple_of=None)
            else:
                self.backend.no_padding()
            encodings = self.backend.encode_batch(texts, add_special_tokens=add_special_tokens)
        rows = [list(e.ids) for e in encodings]
        masks = [list(e.attention_mask) for e in encodings]
        if return_tensors == "np":
            return Encoded(np.asarray(rows, dtype=np.int64), np.asarray(masks, dtype=np.int64))
        if return_tensors is not None:
            raise ValueError(f"return_tensors={return_tensors!r}: only 'np' or None")
        if isinstance(text, str):
            return Encoded(rows[0], masks[0])
        return Encoded(rows, masks)

    def decode(self, ids: Any, skip_special_tokens: bool = False) -> str:
        """The text of ``ids``, as transformers' decode gives it (the backend's decoder; special tokens as their
        text or left out; clean_up_tokenization where the folder's config asks)."""
        text = self.backend.decode([int(i) for i in np.asarray(ids).reshape(-1).tolist()],
                                   skip_special_tokens=skip_special_tokens)
        if self.clean_up_tokenization_spaces:
            for before, after in CLEAN_UP:
                text = text.replace(before, after)
        return text
