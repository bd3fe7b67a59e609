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

from typing import Any, Optional

import numpy as np

from sdjax_runner.records import Quality

KEY = "metrics.pick_score.model"


def score_run(config: Any, images: list, prompts: list[str], executables: Optional[str] = None
              ) -> tuple[Optional[np.ndarray], Quality]:
    """(each image's PickScore for its prompt or None, the run-level quality fields) for a PickScoreConfig. Never
    raises: a model that cannot be loaded or run is one warning and ``pick_score_error``. ``executables``: where the
    scoring program is kept (metrics/clip_score.load_scorer)."""
    from sdjax_runner.metrics.clip_score import scored_run

    def quality(scores: Optional[np.ndarray], seconds: float, scorer: Any, error: Optional[str]) -> Quality:
        if scores is None:
            return Quality(pick_score_error=error, pick_score_s=seconds, pick_model=str(config.model))
        return Quality(pick_score_mean=float(scores.mean()), pick_score_std=float(scores.std()), pick_score_s=seconds,
                       pick_model=str(config.model))

    return scored_run(config, images, prompts, executables, "pick_score", KEY, "PickScore", quality)
