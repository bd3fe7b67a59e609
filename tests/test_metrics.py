"""Quality and fidelity: CLIP score against the prompts, PSNR/SSIM against a reference run or a sweep's
reference point, the sweep report, and metrics that never fail a run."""

import csv
import json
import math

import jax
import numpy as np
import pytest
from PIL import Image

from helpers.cli import ONE_DEVICE, run_cli
from helpers.mlflow_store import sweep_runs


@pytest.mark.slow
def test_clip_score_is_transformers_own_clip_similarity_sharded_over_every_device(cache_dir):
    from transformers import CLIPImageProcessor, CLIPTokenizer, FlaxCLIPModel

    from sdjax_runner.config.schema import ClipScoreConfig
    from sdjax_runner.metrics.clip_score import clip_scores, load_scorer

    clip = ClipScoreConfig(model=str(cache_dir / "models" / "tiny-random-clip-v1"), builtin="tiny-random-clip")
    scorer = load_scorer(clip, jax.devices())
    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (48, 40, 3), dtype=np.uint8)) for _ in range(5)]  # 5 on 8 devices
    prompts = ["a red car", "a painting of a cat", "a photo of an astronaut riding a horse on mars", "blurry", "a river"]
    got = clip_scores(scorer, images, prompts)

    # The reference: transformers' whole CLIP forward on one device; its logits are exp(logit_scale) * cosine.
    model = FlaxCLIPModel.from_pretrained(clip.model)
    pixels = CLIPImageProcessor.from_pretrained(clip.model)(images=images, return_tensors="np")["pixel_values"]
    tokens = CLIPTokenizer.from_pretrained(clip.model)(prompts, padding="max_length", truncation=True, max_length=77,
                                                      return_tensors="np")
    out = model(input_ids=tokens["input_ids"], attention_mask=tokens["attention_mask"], pixel_values=pixels)
    cosine = np.diag(np.asarray(out.logits_per_image)) / np.exp(float(model.params["logit_scale"]))
    assert got.shape == (5,)
    np.testing.assert_allclose(got, np.maximum(100 * cosine, 0), rtol=1e-4, atol=1e-4)
    assert len(set(np.round(got, 3))) == 5  # each image scored against its own prompt


@pytest.mark.slow
def test_identical_images_give_psnr_inf_ssim_one_and_the_same_clip_scores(smoke_run, tmp_path):
    from mlflow.tracking import MlflowClient

    _, reference_dir, _ = smoke_run
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", f"metrics.reference={reference_dir}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "metrics: CLIP score" in result.stdout and "PSNR (dB) inf, SSIM 1" in result.stdout

    quality = json.loads((run_dir / "quality.json").read_text())
    assert math.isinf(quality["psnr"]) and quality["ssim_mean"] == 1.0
    assert quality["compared_images"] == quality["identical_images"] == 8
    records = json.loads((run_dir / "images.json").read_text())
    reference_records = json.loads((reference_dir / "images.json").read_text())
    assert all(math.isinf(r["psnr"]) and r["ssim"] == 1.0 for r in records)
    # The CLIP score of each image against its own prompt is computed identically in two runs (processes).
    assert [r["clip_score"] for r in records] == [r["clip_score"] for r in reference_records]
    assert quality["clip_score_mean"] == json.loads((reference_dir / "quality.json").read_text())["clip_score_mean"]

    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    [run] = client.search_runs([client.get_experiment_by_name("sdjax-runner").experiment_id])
    assert run.data.metrics["clip_score_mean"] == pytest.approx(quality["clip_score_mean"])
    assert run.data.metrics["ssim_mean"] == 1.0 and run.data.metrics["metrics_s"] > 0
    assert "quality.json" in {a.path for a in client.list_artifacts(run.info.run_id)}


@pytest.mark.slow
def test_fidelity_reads_images_a_chunk_at_a_time_and_gets_the_same_numbers(smoke_run, tmp_path, monkeypatch):
    import shutil

    from sdjax_runner.metrics import fidelity
    from sdjax_runner.record import rundir

    _, reference, _ = smoke_run
    run_dir = tmp_path / "noisy"
    shutil.copytree(reference, run_dir)
    records = json.loads((run_dir / "images.json").read_text())
    rng = np.random.default_rng(0)
    for i, record in enumerate(records[1:], start=1):  # image 0 stays identical, the others get i levels of noise
        with Image.open(run_dir / record["file"]) as image:
            pixels = np.asarray(image.convert("RGB")).astype(int)
        noisy = np.clip(pixels + rng.integers(-i, i + 1, pixels.shape), 0, 255).astype(np.uint8)
        Image.fromarray(noisy).save(run_dir / record["file"])
    typed = rundir.image_records(run_dir)

    reference_records = rundir.image_records(reference)
    whole, whole_quality = fidelity.compare(run_dir, typed, reference, reference_records)  # 8 images: one chunk
    monkeypatch.setattr(fidelity, "CHUNK", 3)  # 3 + 3 + 2 (padded to 3, the padding dropped)
    chunked, chunked_quality = fidelity.compare(run_dir, typed, reference, reference_records)
    assert None not in chunked and None not in whole
    assert math.isinf(chunked[0].psnr) and chunked_quality.identical_images == 1
    assert [r.psnr for r in chunked[1:]] == sorted((r.psnr for r in chunked[1:]), reverse=True)  # more noise
    for got, expected in zip(chunked, whole, strict=True):
        assert got == pytest.approx(expected, rel=1e-6)
    chunked_fields, whole_fields = chunked_quality.to_json(), whole_quality.to_json()
    assert chunked_fields.pop("reference") == whole_fields.pop("reference") == str(reference)
    assert chunked_fields == pytest.approx(whole_fields, rel=1e-6)


@pytest.mark.slow
def test_a_dtype_sweep_is_compared_with_its_fp32_reference_point_and_reported(tmp_path, tiny_model_dir):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "dtype=fp32,bf16,fp16", "seed=0,1", "+metrics.reference_point.dtype=fp32",
                     *ONE_DEVICE, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    with open(sweep / "summary.csv", newline="") as f:
        rows = {(r["dtype"], r["seed"]): r for r in csv.DictReader(f)}
    for seed in ("0", "1"):
        fp32, bf16 = rows["fp32", seed], rows["bf16", seed]
        assert fp32["psnr"] == "" and float(fp32["clip_score_mean"]) > 0  # the reference itself
        assert 20 < float(bf16["psnr"]) < math.inf and 0 < float(bf16["ssim_mean"]) < 1  # close, not identical
        # fp16 keeps 10 mantissa bits to bf16's 7: closer to fp32, still not identical.
        assert float(bf16["psnr"]) + 6 < float(rows["fp16", seed]["psnr"]) < math.inf  # here: 42 vs 56 dB
        # Compared with the fp32 job of the same seed: its images, slot by slot.
        quality = json.loads((sweep / bf16["job"] / "quality.json").read_text())
        assert quality["reference"] == fp32["dir"] and quality["reference_label"] == fp32["label"]
        records = json.loads((sweep / bf16["job"] / "images.json").read_text())
        assert len(records) == 8 and all(20 < r["psnr"] < math.inf for r in records)
        # ... and into each image's PNG, a chunk and the infotext's last settings, as images.json has them.
        with Image.open(sweep / bf16["job"] / records[0]["file"]) as image:
            texts = dict(image.text)
        assert float(texts["psnr"]) == records[0]["psnr"] and float(texts["ssim"]) == records[0]["ssim"]
        assert texts["parameters"].endswith(f", PSNR to reference dB: {records[0]['psnr']:.4g}, "
                                            f"SSIM to reference: {records[0]['ssim']:.4f}")
    with Image.open(sweep / "report.png") as report:
        assert report.width > 800 and np.asarray(report.convert("L")).std() > 5  # a drawn figure, not blank

    client, parent, children = sweep_runs(tmp_path)
    assert "report.png" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    bf16_run = next(c for c in children if c.info.run_name == "smoke dtype=bf16 seed=1")
    bf16_quality = json.loads((sweep / rows["bf16", "1"]["job"] / "quality.json").read_text())
    assert bf16_run.data.metrics["psnr"] == pytest.approx(bf16_quality["psnr"])


@pytest.mark.slow
def test_a_clip_model_that_cannot_be_had_is_one_warning_and_the_run_goes_on(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    # The default CLIP model (openai/clip-vit-large-patch14), with the hub out of reach.
    result = run_cli("+experiment=smoke", "metrics.clip_score.model=openai/clip-vit-large-patch14",
                     "metrics.clip_score.builtin=null", "tracking=none", f"hydra.run.dir={run_dir}", cwd=tmp_path,
                     env={"HF_HUB_OFFLINE": "1"})
    assert result.returncode == 0, result.stderr
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "no CLIP score" in line]
    assert len(warnings) == 1 and "hf download openai/clip-vit-large-patch14" in warnings[0]
    quality = json.loads((run_dir / "quality.json").read_text())
    assert "clip_score_mean" not in quality and "openai/clip-vit-large-patch14" in quality["clip_score_error"]
    assert len(list((run_dir / "images").glob("*.png"))) == 8
    assert json.loads((run_dir / "status.json").read_text())["status"] == "FINISHED"


@pytest.mark.slow
def test_images_that_overflowed_are_named_not_passed_off_as_black_pictures(tmp_path, tiny_model_dir):
    # A guidance scale of 1e38 overflows float32 in the first step: NaN latents, NaN pixels, which the
    # uint8 conversion would turn into black images without a word.
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", "sampling.guidance_scale=1e38", "tracking=none", f"hydra.run.dir={run_dir}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in (result.stdout + result.stderr).splitlines() if "NaN or infinite pixels" in line]
    assert len(warnings) == 1 and "8 of 8 image(s)" in warnings[0] and "overflowed" in warnings[0]
    assert "RuntimeWarning" not in result.stdout + result.stderr  # the one line, not NumPy's cast warning beside it
    records = json.loads((run_dir / "images.json").read_text())
    assert [r["non_finite"] for r in records] == [True] * 8
    assert json.loads((run_dir / "quality.json").read_text())["non_finite_images"] == 8
    # The PNGs say so too, so a record rebuilt from them (sync, after a kill) keeps it.
    from sdjax_runner.record.rundir import records_from_pngs

    assert [r.non_finite for r in records_from_pngs(run_dir)[0]] == [True] * 8
    assert np.asarray(Image.open(run_dir / "grid.png")).max() == 0  # what the PNGs hold: black


def test_the_report_draws_one_line_per_sampler_against_the_steps():
    from sdjax_runner.metrics.report import series_of

    rows = [{"sampler": s, "sampling.num_inference_steps": n} for s in ("Euler a", "DPM++ 2M Karras") for n in (30, 10, 20)]
    values = [20.0, 12.0, 16.0, 35.0, 25.0, 31.0]
    keys = ["sampler", "sampling.num_inference_steps"]
    by_steps = series_of(rows, values, "sampling.num_inference_steps", keys)
    assert by_steps == {"sampler=Euler a": [("30", 20.0), ("10", 12.0), ("20", 16.0)],
                        "sampler=DPM++ 2M Karras": [("30", 35.0), ("10", 25.0), ("20", 31.0)]}
    assert set(series_of(rows, values, "sampler", keys)) == {f"sampling.num_inference_steps={n}" for n in (30, 10, 20)}
    assert series_of(rows[:1], [None], "sampler", keys) == {}  # a job without the metric draws nothing


def test_a_reference_point_names_a_dotted_swept_key_short_as_the_report_axes_do():
    from sdjax_runner.config.checks import reference_point
    from sdjax_runner.errors import UserError

    swept = {"sampling.num_inference_steps": ["10", "50"], "lora.0.scale": ["0", "1"], "sampler": ["Euler"]}
    assert reference_point({"steps": "50", "scale": "0"}, swept) == {"sampling.num_inference_steps": "50",
                                                                     "lora.0.scale": "0"}
    assert reference_point({"sampling.num_inference_steps": "10"}, swept) == {"sampling.num_inference_steps": "10"}
    with pytest.raises(UserError, match="guidance is not swept by this multirun"):
        reference_point({"guidance": "7"}, swept)
    with pytest.raises(UserError, match=r"sampling.num_inference_steps=20 is not one of the sweep's points"):
        reference_point({"steps": "20"}, swept)
