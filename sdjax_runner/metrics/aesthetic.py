"""The LAION aesthetic predictor: how much people like each image on average, on AVA's 1-10 scale, in JAX.

The predictor (christophschuhmann/improved-aesthetic-predictor; ``sac+logos+ava1-l14-linearMSE``, the one
LAION-Aesthetics was filtered with) reads the CLIP ViT-L/14 image embedding, divided by its L2 norm (a zero vector left
as it is), through five linear layers -- 768 -> 1024 -> 128 -> 64 -> 16 -> 1, with no activation between them; the
published module's dropouts do nothing at inference. Its ``simple_inference.py`` computes exactly that; here the CLIP
is the runner's (models/nn/clip.py, transformers' CLIPModel number for number, on ``metrics.aesthetic.clip``, whose
image processor prepares the images as the reference's ``clip.load`` preprocessing does) and the layers a jitted
function of the predictor's weights.

The weights are published as a PyTorch pickle (``.pth``), which the runner never unpickles while judging: they are
read from a safetensors file (``metrics.aesthetic.model``), made once from the ``.pth`` by the runner's restricted
reader (docs/guides/comparing.md: the conversion; models/torch_pickle.py). Checked against the published code on a
tiny CLIP and predictor (tests/helpers/make_aesthetic_reference.py).
"""

from __future__ import annotations

import logging
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any, Optional

import numpy as np

from sdjax_runner.console import one_line
from sdjax_runner.records import Quality

log = logging.getLogger("sdjax_runner")
LAYERS = (0, 2, 4, 6, 7)  # the published nn.Sequential's Linear layers (1, 3 and 5 are its dropouts)


class PredictorFileError(ValueError):
    """The predictor's weights file is not one this reader takes (the message says why)."""


def read_predictor(path: Path) -> dict[str, np.ndarray]:
    """The predictor's weights from a safetensors file, checked: the published layer names, each layer's input the
    width of the one before, one output. PredictorFileError otherwise (a pickle names the one-time conversion)."""
    from sdjax_runner.models.checkpoints import PICKLE_SUFFIXES
    from sdjax_runner.tensor_files import UnreadableTensors, read_safetensors

    if path.suffix in PICKLE_SUFFIXES:
        raise PredictorFileError(f"{path.name} is a PyTorch pickle, which is not read here; convert it to "
                                 "safetensors once (docs/guides/comparing.md, Aesthetic score)")
    try:
        tensors = {name: np.asarray(array, dtype=np.float32) for name, array in read_safetensors(path).items()}
    except (OSError, UnreadableTensors, ValueError) as exc:
        raise PredictorFileError(f"{path} cannot be read as safetensors ({one_line(exc, 120)})") from None
    expected = {f"layers.{i}.{kind}" for i in LAYERS for kind in ("weight", "bias")}
    if set(tensors) != expected:
        raise PredictorFileError(f"{path.name} holds {', '.join(sorted(tensors)[:6])}, not the predictor's "
                                 f"{', '.join(sorted(expected))}")
    width = tensors["layers.0.weight"].shape[1]
    for i in LAYERS:
        weight, bias = tensors[f"layers.{i}.weight"], tensors[f"layers.{i}.bias"]
        if weight.ndim != 2 or weight.shape[1] != width or bias.shape != (weight.shape[0],):
            raise PredictorFileError(f"{path.name}: layers.{i} is {weight.shape} with bias {bias.shape}, after a "
                                     f"layer of width {width}")
        width = weight.shape[0]
    if width != 1:
        raise PredictorFileError(f"{path.name}: the last layer gives {width} values, not one score")
    return tensors


def predictions(scorer: Any, predictor: dict[str, np.ndarray], images: list) -> np.ndarray:
    """Each image's predicted score: ``scorer``'s CLIP (metrics/clip_score.ClipScorer) embeds it, the predictor's
    layers read the normalised embedding. Sharded over the scorer's devices; compiled once per process and shape."""
    import jax

    from sdjax_runner.metrics.clip_score import place_batch

    pixels = scorer.processor([image.convert("RGB") for image in images]).astype(np.float32)
    width = predictor["layers.0.weight"].shape[1]
    key = ("aesthetic", pixels.shape[1:], width)
    if key not in scorer.programs:
        scorer.programs[key] = jax.jit(_predict(scorer.module))
    [placed] = place_batch(scorer.devices, pixels)
    return np.asarray(scorer.programs[key](scorer.params, predictor, placed))[:len(images)]


def _predict(module: Any):
    import jax.numpy as jnp

    def predict(clip_params: Any, predictor: dict, pixel_values: Any) -> Any:
        embedding = module.apply({"params": clip_params}, pixel_values, method="image_features")
        norm = jnp.linalg.norm(embedding, axis=-1, keepdims=True)
        x = embedding / jnp.where(norm == 0, 1.0, norm)  # simple_inference.py's normalized()
        for i in LAYERS:
            x = x @ predictor[f"layers.{i}.weight"].T + predictor[f"layers.{i}.bias"]
        return x[:, 0]

    return predict


def score_run(config: Any, images: list, texts: Optional[list[str]] = None, executables: Optional[str] = None
              ) -> tuple[Optional[np.ndarray], Quality]:
    """(each image's aesthetic score or None, the run-level quality fields) for an AestheticConfig; ``texts`` and
    ``executables`` (the registry's call, metrics/evaluate.py) are not read: the score is the image's alone. Never
    raises: a predictor or CLIP that cannot be had is one warning and ``aesthetic_error``."""
    import jax

    from sdjax_runner.config.messages import describe
    from sdjax_runner.metrics.clip_score import load_scorer

    started = time.perf_counter()
    try:
        if not config.model:
            raise PredictorFileError("metrics.aesthetic.model is not set: give the predictor's weights as a "
                                     ".safetensors file")
        predictor = read_predictor(Path(str(config.model)).expanduser())
        clip = SimpleNamespace(model=config.clip, builtin=None, revision=None)
        scorer = load_scorer(clip, jax.local_devices(), None, config_key="metrics.aesthetic.clip")
        scores = predictions(scorer, predictor, images)
    except Exception as exc:
        error = describe(exc) or f"{type(exc).__name__}: {one_line(exc, 300)}"
        log.warning("metrics: no aesthetic score for this run: %s", error)
        return None, Quality(aesthetic_error=error, aesthetic_s=time.perf_counter() - started)
    return scores, Quality(aesthetic_mean=float(scores.mean()), aesthetic_std=float(scores.std()),
                           aesthetic_s=time.perf_counter() - started)
