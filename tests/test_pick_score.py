"""PickScore (metrics/pick_score.py) against the published inference code -- transformers' PyTorch CLIPModel and
CLIPProcessor on the same weights, tests/helpers/make_pickscore_reference.py -- and through a run: per image in
images.json, per run in quality.json, a warning (not a failure) when the model cannot be had."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import run_cli

FIXTURE = Path(__file__).parent / "fixtures" / "pickscore"
PICK = ("metrics.pick_score.enabled=true", f"metrics.pick_score.model={FIXTURE / 'model'}",
        f"metrics.pick_score.processor={FIXTURE / 'processor'}")


def _scorer():
    import jax

    from sdjax_runner.config.schema import PickScoreConfig
    from sdjax_runner.metrics.clip_score import load_scorer

    config = PickScoreConfig(enabled=True, model=str(FIXTURE / "model"), processor=str(FIXTURE / "processor"))
    return load_scorer(config, jax.local_devices(), None, formula="pick_score", config_key="metrics.pick_score.model")


def test_pick_score_is_the_published_codes_on_the_same_weights():
    from sdjax_runner.metrics.clip_score import clip_scores

    rows = json.loads((FIXTURE / "scores.json").read_text())
    images = []
    for row in rows:
        with Image.open(FIXTURE / "images" / row["image"]) as image:
            images.append(image.convert("RGB"))
    scorer = _scorer()
    # the model is PyTorch safetensors, its logit scale a 0-d tensor: read as one (it was made 1-d once, and failed)
    assert np.shape(scorer.params["logit_scale"]) == ()
    ours = clip_scores(scorer, images, [row["prompt"] for row in rows])
    expected = np.array([row["pick_score"] for row in rows])
    np.testing.assert_allclose(ours, expected, rtol=1e-5, atol=1e-4)
    assert len(set(np.round(expected, 3))) == 3  # three different scores: a check that can fail


@pytest.mark.slow
def test_a_run_records_pick_score_per_image_and_for_the_run(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", *PICK, "tracking=none", "parallelism.num_devices=1",
                     "parallelism.per_device_batch_size=2", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads((run_dir / "images.json").read_text())
    quality = json.loads((run_dir / "quality.json").read_text())
    scores = [r["pick_score"] for r in records]
    assert len(scores) == 2 and all(isinstance(s, float) for s in scores)
    assert quality["pick_score_mean"] == pytest.approx(np.mean(scores))
    assert quality["pick_score_std"] == pytest.approx(np.std(scores))
    assert quality["pick_model"] == str(FIXTURE / "model") and "clip_score_mean" in quality  # beside the CLIP score
    assert "PickScore" in result.stdout + result.stderr  # the metrics line names it
    # each score recomputed from the image on disk and its prompt
    from sdjax_runner.metrics.clip_score import clip_scores

    images = []
    for record in records:
        with Image.open(run_dir / record["file"]) as image:
            images.append(image.convert("RGB"))
    again = clip_scores(_scorer(), images, [r["prompt"] for r in records])
    np.testing.assert_allclose(scores, again, rtol=1e-5, atol=1e-4)

    # a model that cannot be had: a warning and pick_score_error, the run and its CLIP score go on
    missing = tmp_path / "missing"
    result = run_cli("+experiment=smoke", *PICK[:1], f"metrics.pick_score.model={tmp_path / 'nowhere'}",
                     "metrics.pick_score.processor=null", "tracking=none", "parallelism.num_devices=1",
                     "parallelism.per_device_batch_size=2", f"hydra.run.dir={missing}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    quality = json.loads((missing / "quality.json").read_text())
    assert "pick_score_mean" not in quality and quality["pick_score_error"] and "clip_score_mean" in quality
    assert "metrics: no PickScore for this run" in result.stdout + result.stderr
