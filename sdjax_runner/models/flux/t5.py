"""FLUX.1's and SD 3's T5 (``text_encoder_2/`` / ``text_encoder_3/``, ``tokenizer_2/`` / ``tokenizer_3/``) with the
runner's own modules (issue 60): the tokenizer (:func:`t5_tokenizer`, :mod:`sdjax_runner.models.nn.t5_tokenizer`)
and the encoder (:func:`t5_encoder`, :mod:`sdjax_runner.models.nn.t5`), both giving transformers 4.57's ids and
states.

:func:`compatible_flax_t5` is the one remaining touch of transformers, for as long as a loader still builds
transformers' ``FlaxT5EncoderModel`` (models/loading.py does, for the FLUX.1 and SD 3 pipelines, and
models/builtin.py writes the built-in models with it): it gives that class the relative-position buckets current
JAX can compute -- the encoder's own, bit for bit the same. Once those build :class:`T5EncoderModel` instead, it
and its calls go.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from sdjax_runner.models.nn.t5 import T5EncoderModel, relative_position_bucket
from sdjax_runner.models.nn.t5_tokenizer import T5Tokenizer

FLAX_T5 = "transformers.models.t5.modeling_flax_t5"  # the module compatible_flax_t5 mends


def t5_tokenizer(folder: Union[str, Path]) -> T5Tokenizer:
    """``tokenizer_2/`` (FLUX.1) or ``tokenizer_3/`` (SD 3): T5TokenizerFast's ids and masks from its
    ``tokenizer.json``, offline, without transformers or sentencepiece (:class:`T5Tokenizer`). ValueError for a
    folder it cannot read as transformers would."""
    return T5Tokenizer.from_folder(folder)


def t5_encoder(config: Mapping[str, Any], **kwargs: Any) -> T5EncoderModel:
    """``text_encoder_2/`` (FLUX.1) or ``text_encoder_3/`` (SD 3) as a flax module from its config.json (a dict);
    ``kwargs``: ``dtype``. Its parameter tree is transformers' ``FlaxT5EncoderModel``'s. ValueError for a config
    it cannot run."""
    return T5EncoderModel.from_config(config, **kwargs)


def compatible_flax_t5() -> None:
    """transformers 4.57's ``FlaxT5EncoderModel`` calls ``jnp.clip(x, a_max=...)``, a keyword JAX removed in 0.10:
    every call of it fails (``clip() got an unexpected keyword argument 'a_max'``). Where the installed JAX lacks
    the keyword, ``FlaxT5Attention._relative_position_bucket`` becomes :func:`relative_position_bucket` -- the
    same buckets, bit for bit. Transitional (module docstring): it imports transformers' Flax T5. Idempotent."""
    import importlib
    import inspect

    import jax.numpy as jnp

    if "a_max" in inspect.signature(jnp.clip).parameters:
        return
    attention = importlib.import_module(FLAX_T5).FlaxT5Attention
    if attention.__dict__.get("_relative_position_bucket") is not _MENDED:
        attention._relative_position_bucket = _MENDED


_MENDED = staticmethod(relative_position_bucket)
