"""Quantized weights: the denoiser's weights stored in fewer bits (``quantize=NAME``), one :class:`QuantizerEntry`
each. Post-training and weight-only by default (int8 or fp8 values, one scale per output channel, absmax
calibration), done by Google's Qwix library (``qwix.PtqProvider``) on the model's own Flax modules: the weights are
quantized once on the host and placed so, so each device holds the quantized copy (timings.json's
``param_bytes_per_device``), and the program multiplies by the quantized weights (models/quantize.py).

What is quantized is the matrix multiplications of the family's denoiser -- every ``dot_general``/``einsum`` whose
right-hand side is a weight (Dense layers: attention projections, feed-forwards, embeddings' projections) --
after LoRA merging and VAE swaps; convolutions, norms, biases, the text encoders and the VAE keep the weights'
dtype. The name shapes the program (another structure); a sweep over it loads the model once.

A new quantizer is an entry here (docs/architecture.md, "Where a new piece goes").
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Optional

from sdjax_runner.config import choices

DEFAULT = "none"


@dataclass(frozen=True)
class QuantizerEntry:
    """What the config knows of one quantizer."""

    name: str  # quantize=NAME
    title: str  # what it is, for people (the plan line, the docs)
    weights: Optional[str] = None  # the weights' quantized type, a jax.numpy dtype name (None: not quantized)
    activations: Optional[str] = None  # the activations' type where they are quantized too (dynamic range, per call)
    reads: tuple[str, ...] = ()  # settings it reads (none yet: config/choices.py's registries share the field)


QUANTIZERS = {entry.name: entry for entry in (
    QuantizerEntry("none", "the weights as loaded (dtype.weights_dtype)"),
    QuantizerEntry("int8", "int8 weights, one scale per output channel (weight-only)", "int8"),
    QuantizerEntry("fp8", "fp8 (e4m3) weights, one scale per output channel (weight-only)", "float8_e4m3fn"),
    # Qwix's dynamic-range quantization: each call's inputs of the matrix multiplications quantized to int8 as well
    # (scales from their absmax per token), so the products run in int8 where the backend has such kernels
    QuantizerEntry("int8_dynamic", "int8 weights and int8 activations (dynamic range) in the denoiser's matrix "
                   "multiplications", "int8", "int8"),
)}


def check(config: Any, family: Any) -> str:
    """The run's quantizer (``config.quantize``) for a model of ``family`` (config/families.FamilyEntry); raises
    UserError naming the key and what is allowed."""
    name = str(config.quantize)
    choices.chosen("quantize", name, QUANTIZERS, family.quantizers, config, family)
    return name
