"""PickScore (Kirstain et al., "Pick-a-Pic", 2023): how much people would prefer each image for its prompt, in JAX.

PickScore is LAION's CLIP ViT-H/14 fine-tuned on Pick-a-Pic's choices between two images of one prompt, published as
a transformers ``CLIPModel`` (yuvalkirstain/PickScore_v1) whose tokenizer and image processor are LAION's CLIP-H's
(laion/CLIP-ViT-H-14-laion2B-s32B-b79K). Its score, as the published inference code computes it, is
``exp(logit_scale) * cos(E_image, E_text)`` on the projected, L2-normalised embeddings: the runner's CLIP modules
(models/nn/clip.py) and its CLIP score's scoring program (metrics/clip_score.py, ``formula="pick_score"``), with the
model's own logit scale and nothing clamped. Comparisons are what it is for -- the paper's preference probability of
image A over B is softmax([score_A, score_B]) -- so a setting's mean, interval and paired difference in a sweep's
comparison.json are the useful numbers.

Checked against the published code (transformers' PyTorch CLIPModel and CLIPProcessor) on a tiny model of its kind:
tests/helpers/make_pickscore_reference.py.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Optional

import numpy as np

from sdjax_runner.console import one_line
from sdjax_runner.records import Quality

log = logging.getLogger("sdjax_runner")
KEY = "metrics.pick_score.model"


def score_run(config: Any, images: list, prompts: list[str], executables: Optional[str] = None
              ) -> tuple[Optional[np.ndarray], Quality]:
    """(each image's PickScore for its prompt or None, the run-level quality fields) for a PickScoreConfig. Never
    raises: a model that cannot be loaded or run is one warning and ``pick_score_error``. ``executables``: where the
    scoring program is kept (metrics/clip_score.load_scorer)."""
    import jax

    from sdjax_runner.config.messages import describe
    from sdjax_runner.metrics.clip_score import clip_scores, load_scorer

    started = time.perf_counter()
    try:
        scorer = load_scorer(config, jax.local_devices(), executables, formula="pick_score", config_key=KEY)
        scores = clip_scores(scorer, images, prompts)
    except Exception as exc:
        error = describe(exc) or f"{type(exc).__name__}: {one_line(exc, 300)}"
        log.warning("metrics: no PickScore for this run: %s", error)
        return None, Quality(pick_score_error=error, pick_score_s=time.perf_counter() - started,
                             pick_model=str(config.model))
    return scores, Quality(pick_score_mean=float(scores.mean()), pick_score_std=float(scores.std()),
                           pick_score_s=time.perf_counter() - started, pick_model=str(config.model))
