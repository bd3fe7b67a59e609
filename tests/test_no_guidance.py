"""Guidance of 1 or less (SDXL Turbo's 0, LCM-LoRA's 1): as diffusers' PyTorch pipelines (``do_classifier_free_guidance
= guidance_scale > 1``) the UNet sees the conditional half alone -- no negative pass -- so 0 and 1 give the same,
the prompt's, images and the negative prompt is not read; FLOPs count the one batch."""

from __future__ import annotations

import json

import pytest

from helpers.cli import run_cli

QUIET = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", "compilation_cache.executables=false",
         "parallelism.num_devices=2"]


@pytest.mark.slow
def test_guidance_of_one_or_less_runs_the_conditional_half_alone(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *QUIET, f"paths.cache_dir={cache_dir}", "sampling.guidance_scale=0,1,7.5",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    negative = run_cli(*QUIET, f"paths.cache_dir={cache_dir}", "sampling.guidance_scale=1", "prompts.negative=blurry",
                       "hydra.run.dir=negative", cwd=tmp_path)
    assert negative.returncode == 0, negative.stderr[-3000:]
    hashes = [[r["pixels_sha256"] for r in json.loads((sweep / job / "images.json").read_text())]
              for job in ("0", "1", "2")]
    assert hashes[0] == hashes[1]  # 0 is not the unconditional image: no guidance at all, as diffusers
    assert hashes[2] != hashes[1]
    assert [r["pixels_sha256"] for r in json.loads((tmp_path / "negative" / "images.json").read_text())] == hashes[1]
    timings = [json.loads((sweep / job / "timings.json").read_text()) for job in ("0", "1", "2")]
    assert timings[1]["compile_reused"] == 1 and timings[2]["compile_reused"] == 0  # guidance > 1: another program
    assert timings[0]["flops_per_batch"] < 0.75 * timings[2]["flops_per_batch"]  # one UNet batch a step, not two


@pytest.mark.slow
def test_the_few_step_recipes_run_lcm_and_tcd_without_guidance(tmp_path, cache_dir):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *QUIET, f"paths.cache_dir={cache_dir}", "sampler=lcm,tcd", "scheduler=sgm_uniform",
                     "sampling.num_inference_steps=4", "sampling.guidance_scale=1", f"hydra.sweep.dir={sweep}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    records = [json.loads((sweep / job / "images.json").read_text()) for job in ("0", "1")]
    assert [r[0]["sampler"] for r in records] == ["LCM", "tcd"]
    assert all(r["non_finite"] is False for job in records for r in job)
    assert {r["pixels_sha256"] for r in records[0]}.isdisjoint(r["pixels_sha256"] for r in records[1])
