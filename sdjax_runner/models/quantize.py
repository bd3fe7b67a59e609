"""Quantized weights (``quantize=NAME``, config/quantizers.py) by Qwix, Google's JAX quantization library:
post-training quantization (``qwix.PtqProvider``) of a denoiser made of the runner's own Flax modules.

* :func:`quantized_module`: the module whose matrix multiplications (``dot_general``/``einsum``) Qwix intercepts --
  a weight arriving quantized (a ``WithAux`` of a ``QArray``: int8 or fp8 values and their scales) is multiplied
  as such; with activations quantized too (``int8_dynamic``) each call's inputs are quantized by their absmax.
* :func:`quantized_weights`: the host weights with every weight such a multiplication reads quantized, one scale
  per output channel (absmax calibration; Qwix learns from a trace of one call which axes those are), the rest
  (convolutions, norms, biases, embeddings tables) as they were. Done on the host's CPU, one top-level module at a
  time, so the full-precision weights never reach a device.

Qwix quantizes symmetrically: ``scale = absmax / bound`` per channel (127.5 for int8 -- ``iinfo.max + 0.5``, the
top bucket used whole, values saturated to [-128, 127] --, 448 for fp8 e4m3) and ``q = round(w / scale)`` (int8;
fp8 rounds to its nearest value), in the weights' dtype; tests/test_quantize.py checks that against a NumPy
transcription."""

from __future__ import annotations

from typing import Any

import numpy as np

from sdjax_runner.config.quantizers import QUANTIZERS


def rules(name: str) -> list:
    """Qwix's rules for quantizer ``name``: every matrix multiplication of the module (convolutions stay as
    they are: Qwix quantizes a convolution's weights only with its inputs)."""
    import jax.numpy as jnp
    import qwix

    entry = QUANTIZERS[name]
    assert entry.weights is not None, name  # quantize=none quantizes nothing: no module is made for it
    activations = getattr(jnp, entry.activations) if entry.activations else None
    return [qwix.QuantizationRule(module_path=".*", op_names=("dot_general", "einsum"),
                                  weight_qtype=getattr(jnp, entry.weights), act_qtype=activations)]


def quantized_module(module: Any, name: str) -> Any:
    """``module`` (a flax.linen Module) with its matrix multiplications run by Qwix's post-training provider."""
    import qwix

    return qwix.quantize_model(module, qwix.PtqProvider(rules(name)))


def quantized_weights(module: Any, weights: dict, args: tuple, kwargs: dict) -> dict:
    """``weights`` (host arrays of ``module``, the unquantized module) with every weight a matrix multiplication
    reads quantized as quantizer-wrapped ``module`` (:func:`quantized_module`) wants it, learnt from one abstract
    call on ``args``/``kwargs`` (ShapeDtypeStructs); NumPy leaves, computed on the host's CPU."""
    import jax
    import qwix

    cpu = jax.local_devices(backend="cpu")[0]
    with jax.default_device(cpu):
        abstract = jax.eval_shape(lambda a, k: module.init(jax.random.key(0), *a, **k), args, kwargs)["params"]
        out = {}
        for key, subtree in weights.items():  # one top-level module at a time: a copy of it alone on the CPU
            on_cpu = jax.tree_util.tree_map(lambda leaf: jax.device_put(leaf, cpu), subtree)
            quantized = qwix.quantize_params({key: on_cpu}, {key: abstract[key]})[key]
            out[key] = jax.tree_util.tree_map(np.asarray, quantized)
    return out
