"""FLUX.1's T5 (``text_encoder_2/``, ``tokenizer_2/``) with transformers 4.57's Flax classes: the tokenizer read
offline from its ``tokenizer.json`` (:func:`t5_tokenizer`) and the one fix current JAX needs in
``FlaxT5EncoderModel`` (:func:`compatible_flax_t5`)."""

from __future__ import annotations

import inspect
import json
from pathlib import Path
from typing import Any, Optional


def _metaspace_scheme(tokenizer_json: Path) -> Optional[str]:
    """The ``prepend_scheme`` of the Metaspace pre-tokenizer in a ``tokenizer.json`` (None: none found)."""
    def find(node: Any) -> Optional[str]:
        if isinstance(node, dict):
            if node.get("type") == "Metaspace":
                scheme = node.get("prepend_scheme")
                if scheme is None and "add_prefix_space" in node:  # tokenizers < 0.14 wrote a bool
                    scheme = "always" if node["add_prefix_space"] else "never"
                return scheme if isinstance(scheme, str) else None
            return next((s for s in map(find, node.get("pretokenizers", [])) if s is not None), None)
        return None

    return find(json.loads(tokenizer_json.read_text(encoding="utf-8")).get("pre_tokenizer"))


def t5_tokenizer(folder: Path):
    """``tokenizer_2/`` as transformers' ``T5TokenizerFast``, from its ``tokenizer.json``: offline, with neither
    sentencepiece nor the ``spiece.model`` (the hub download fetches the JSON files only). A
    ``tokenizer_config.json`` that sets ``add_prefix_space`` (the hub's FLUX.1 does) makes transformers rebuild
    the tokenizer from the slow one, which needs both; where ``tokenizer.json``'s Metaspace pre-tokenizer already
    does what that setting asks (``prepend_scheme`` "always" for true with legacy on -- what the conversion
    writes), the setting is left out and the file read as it is: the same ids."""
    from transformers import T5TokenizerFast

    kwargs: dict[str, Any] = {}
    config_file, tokenizer_json = folder / "tokenizer_config.json", folder / "tokenizer.json"
    if config_file.is_file() and tokenizer_json.is_file():
        config = json.loads(config_file.read_text(encoding="utf-8"))
        prefix = config.get("add_prefix_space") if isinstance(config, dict) else None
        if prefix is not None:
            # transformers' convert_slow_tokenizer._get_prepend_scheme
            wanted = ("always" if config.get("legacy", True) is not False else "first") if prefix else "never"
            if _metaspace_scheme(tokenizer_json) == wanted:
                kwargs["add_prefix_space"] = None
    return T5TokenizerFast.from_pretrained(folder, **kwargs)


def compatible_flax_t5() -> None:
    """transformers 4.57's ``FlaxT5EncoderModel`` calls ``jnp.clip(x, a_max=...)``, a keyword JAX removed in 0.10:
    every T5 call fails (``clip() got an unexpected keyword argument 'a_max'``), and upstream's Flax classes are
    frozen. Where the installed JAX lacks the keyword, ``FlaxT5Attention._relative_position_bucket`` (a
    staticmethod) is replaced by the same computation with ``jnp.minimum`` -- the same buckets, bit for bit.
    Idempotent; nothing else of transformers is touched."""
    import jax.numpy as jnp
    from transformers.models.t5 import modeling_flax_t5

    attention = modeling_flax_t5.FlaxT5Attention
    if "a_max" in inspect.signature(jnp.clip).parameters or getattr(attention, "_sdjax_compatible", False):
        return

    def relative_position_bucket(relative_position, bidirectional=True, num_buckets=32, max_distance=128):
        relative_buckets: Any = 0
        if bidirectional:
            num_buckets //= 2
            relative_buckets += (relative_position > 0) * num_buckets
            relative_position = jnp.abs(relative_position)
        else:
            relative_position = -jnp.minimum(relative_position, 0)
        max_exact = num_buckets // 2
        is_small = relative_position < max_exact
        if_large = max_exact + (jnp.log(relative_position / max_exact) / jnp.log(max_distance / max_exact)
                                * (num_buckets - max_exact))
        if_large = jnp.minimum(if_large, num_buckets - 1)
        relative_buckets += jnp.where(is_small, relative_position, if_large)
        return relative_buckets.astype("i4")

    setattr(attention, "_relative_position_bucket", staticmethod(relative_position_bucket))  # noqa: B010
    setattr(attention, "_sdjax_compatible", True)  # noqa: B010
