"""The LAION aesthetic predictor (metrics/aesthetic.py) against its published ``simple_inference.py`` on the same
weights (tests/helpers/make_aesthetic_reference.py: transformers' PyTorch CLIP, the published MLP, saved as the
published .pth is), read after the documented one-time conversion of that pickle to safetensors, and through a run."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import run_cli
from sdjax_runner.metrics import aesthetic

FIXTURE = Path(__file__).parent / "fixtures" / "aesthetic"
IMAGES = Path(__file__).parent / "fixtures" / "pickscore" / "images"


def converted(folder: Path) -> Path:
    """docs/guides/comparing.md's one-time conversion of the published .pth, as a user runs it (no torch)."""
    from safetensors.numpy import save_file

    from sdjax_runner.models.torch_pickle import pickled_tensors

    out = folder / "aesthetic.safetensors"
    save_file({name: load() for name, load in pickled_tensors([FIXTURE / "predictor.pth"])}, str(out))
    return out


def test_the_score_is_the_published_codes_on_the_same_weights(tmp_path):
    from types import SimpleNamespace

    rows = json.loads((FIXTURE / "scores.json").read_text())
    images = []
    for row in rows:
        with Image.open(IMAGES / row["image"]) as image:
            images.append(image.convert("RGB"))
    config = SimpleNamespace(enabled=True, model=str(converted(tmp_path)), clip=str(FIXTURE / "clip"))
    scores, quality = aesthetic.score_run(config, images)
    expected = np.array([row["aesthetic"] for row in rows])
    assert scores is not None and quality.aesthetic_error is None
    np.testing.assert_allclose(scores, expected, rtol=1e-6, atol=1e-5)
    assert np.ptp(expected) > 1e-3  # the three images score apart: a check that can fail
    assert quality.aesthetic_mean == pytest.approx(float(np.mean(scores)))


def test_a_predictor_file_it_cannot_read_is_one_message(tmp_path):
    from safetensors.numpy import save_file

    with pytest.raises(aesthetic.PredictorFileError, match=r"predictor\.pth is a PyTorch pickle, which is not read"):
        aesthetic.read_predictor(FIXTURE / "predictor.pth")
    good = aesthetic.read_predictor(converted(tmp_path))
    renamed = {name.replace("layers.7", "layers.8"): value for name, value in good.items()}
    save_file(renamed, str(tmp_path / "renamed.safetensors"))
    with pytest.raises(aesthetic.PredictorFileError, match="not the predictor's"):
        aesthetic.read_predictor(tmp_path / "renamed.safetensors")
    broken = dict(good, **{"layers.2.weight": good["layers.2.weight"][:, :-1]})
    save_file(broken, str(tmp_path / "broken.safetensors"))
    with pytest.raises(aesthetic.PredictorFileError, match=r"layers\.2 is \(128, 1023\)"):
        aesthetic.read_predictor(tmp_path / "broken.safetensors")


@pytest.mark.slow
def test_a_run_records_the_aesthetic_score_per_image_and_for_the_run(tmp_path, tiny_model_dir):
    predictor = converted(tmp_path)
    common = ("+experiment=smoke", "metrics.aesthetic.enabled=true", f"metrics.aesthetic.clip={FIXTURE / 'clip'}",
              "tracking=none", "parallelism.num_devices=1", "parallelism.per_device_batch_size=2")
    result = run_cli(*common, f"metrics.aesthetic.model={predictor}", f"hydra.run.dir={tmp_path / 'run'}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = json.loads((tmp_path / "run" / "images.json").read_text())
    quality = json.loads((tmp_path / "run" / "quality.json").read_text())
    scores = [r["aesthetic"] for r in records]
    assert len(scores) == 2 and quality["aesthetic_mean"] == pytest.approx(np.mean(scores))
    images = []
    for record in records:
        with Image.open(tmp_path / "run" / record["file"]) as image:
            images.append(image.convert("RGB"))
    from types import SimpleNamespace

    again, _ = aesthetic.score_run(SimpleNamespace(model=str(predictor), clip=str(FIXTURE / "clip")), images)
    np.testing.assert_allclose(scores, again, rtol=1e-6, atol=1e-5)  # recomputed from the images on disk
    # the pickle itself given: a warning naming the conversion, the run and its other metrics go on
    result = run_cli(*common, f"metrics.aesthetic.model={FIXTURE / 'predictor.pth'}",
                     f"hydra.run.dir={tmp_path / 'pickle'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    quality = json.loads((tmp_path / "pickle" / "quality.json").read_text())
    assert "aesthetic_mean" not in quality and "is a PyTorch pickle" in quality["aesthetic_error"]
    assert "clip_score_mean" in quality
