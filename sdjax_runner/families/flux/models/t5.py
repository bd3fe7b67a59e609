"""FLUX.1's and SD 3's T5 (``text_encoder_2/`` / ``text_encoder_3/``, ``tokenizer_2/`` / ``tokenizer_3/``) with the
runner's own modules (issue 60): the tokenizer (:func:`t5_tokenizer`, :mod:`sdjax_runner.models.nn.t5_tokenizer`)
and the encoder (:func:`t5_encoder`, :mod:`sdjax_runner.models.nn.t5`), both giving transformers 4.57's ids and
states. Nothing here imports transformers.
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any, Union

from sdjax_runner.models.nn.t5 import T5EncoderModel
from sdjax_runner.models.nn.t5_tokenizer import T5Tokenizer


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
