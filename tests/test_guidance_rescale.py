"""CFG rescale (sampling.guidance_rescale, issue #49): diffusers' ``rescale_noise_cfg`` transcribed in NumPy as the
reference for the guidance the SD samplers compute; through the command line a sweep over it compiles once, its 0
is the plain run bit for bit, the PNG names it as Forge does ("Rescale CFG") and from_png reads it back; what it
cannot run on is one line."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli


def diffusers_rescale_noise_cfg(noise_cfg: np.ndarray, noise_pred_text: np.ndarray,
                                guidance_rescale: float) -> np.ndarray:
    """diffusers 0.39's rescale_noise_cfg (pipelines/stable_diffusion/pipeline_stable_diffusion.py), NumPy:
    torch.std is Bessel-corrected (ddof=1)."""
    axes = tuple(range(1, noise_pred_text.ndim))
    std_text = noise_pred_text.std(axis=axes, keepdims=True, ddof=1)
    std_cfg = noise_cfg.std(axis=axes, keepdims=True, ddof=1)
    noise_pred_rescaled = noise_cfg * (std_text / std_cfg)
    return guidance_rescale * noise_pred_rescaled + (1 - guidance_rescale) * noise_cfg


@pytest.mark.parametrize("rescale", [0.0, 0.3, 0.7, 1.0])
def test_the_guided_prediction_is_diffusers_rescale_noise_cfg(rescale):
    from sdjax_runner.engine.guiders import Guidance, guided

    rng = np.random.default_rng(0)
    uncond = rng.standard_normal((3, 4, 8, 8)).astype(np.float32)
    cond = (uncond + 0.5 * rng.standard_normal((3, 4, 8, 8))).astype(np.float32)
    scale = 7.5
    plain = np.asarray(guided(uncond, cond, Guidance(np.float32(scale)), 0))
    expected_cfg = uncond + scale * (cond - uncond)
    np.testing.assert_allclose(plain, expected_cfg, rtol=1e-6, atol=1e-6)
    ours = np.asarray(guided(uncond, cond, Guidance(np.float32(scale), rescale=np.float32(rescale)), 0))
    np.testing.assert_allclose(ours, diffusers_rescale_noise_cfg(expected_cfg, cond, rescale), rtol=1e-5, atol=1e-5)
    if rescale == 0:
        assert np.array_equal(ours, plain)  # exactly the guided prediction
    else:
        assert np.abs(ours - plain).max() > 0.1
        # each image's spread moves toward the conditional prediction's
        spread = lambda a: a.std(axis=(1, 2, 3))  # noqa: E731
        assert np.all(np.abs(spread(ours) - spread(cond)) < np.abs(spread(plain) - spread(cond)))


@pytest.mark.slow
def test_a_rescale_sweep_compiles_once_and_its_zero_is_the_plain_run(tmp_path, cache_dir):
    quiet = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", "compilation_cache.executables=false",
             f"paths.cache_dir={cache_dir}", "sampling.num_inference_steps=4"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *quiet, "sampling.guidance_rescale=0,0.7", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    plain = run_cli(*quiet, "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    records = [json.loads((sweep / job / "images.json").read_text()) for job in ("0", "1")]
    hashes = [[r["pixels_sha256"] for r in job] for job in records]
    assert hashes[0] == [r["pixels_sha256"] for r in json.loads((tmp_path / "plain" / "images.json").read_text())]
    assert hashes[1] != hashes[0]
    timings = json.loads((sweep / "1" / "timings.json").read_text())
    assert timings["compile_reused"] == 1  # the rescale is a traced input: one program for the sweep
    assert records[1][0]["guidance_rescale"] == 0.7 and "guidance_rescale" not in \
        json.loads((tmp_path / "plain" / "images.json").read_text())[0]
    png = sweep / "1" / records[1][0]["file"]
    with Image.open(png) as image:
        assert "Rescale CFG: 0.7, " in image.text["parameters"]
    remade = run_cli(str(png), "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
                     "hydra.run.dir=from_png", command="from_png", cwd=tmp_path)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    assert "Rescale CFG: 0.7 -> sampling.guidance_rescale=0.7" in said
    again = json.loads((tmp_path / "from_png" / "images.json").read_text())[0]
    assert again["pixels_sha256"] == records[1][0]["pixels_sha256"]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["sampling.guidance_rescale=1.5"], "error: sampling.guidance_rescale: 1.5 (allowed: a number from 0 to 1"),
    (["sampling.guidance_rescale=-0.1"], "error: sampling.guidance_rescale: -0.1 (allowed: a number from 0 to 1"),
    (["model=tiny-random-flux", "sampling.guidance_rescale=0.7"],
     "error: sampling.guidance_rescale: 0.7: CFG rescale is the SD family's (diffusers' guidance_rescale); "
     "tiny-random-flux is a flux model (allowed: null)"),
])
def test_rescale_it_cannot_run_is_one_line(tmp_path, overrides, expected):
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", *overrides, cwd=tmp_path), expected)
