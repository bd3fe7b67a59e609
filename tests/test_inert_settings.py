"""A setting that changes nothing says so (round five): the docs' own skip-layer-guidance example ran 4 steps whose
default window held none, gave the plain images bit for bit and recorded ``slg_layers: 1`` (today's
``guider=skip_layer``). Each such setting logs
one line naming its key and why it acts on nothing, and the run -- its program, its FLOPs, its records -- is the
run without it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import call_cli

QUIET = ["tracking=none", "metrics.clip_score.enabled=false"]


def records(run_dir: Path) -> list[dict]:
    return json.loads((run_dir / "images.json").read_text())


@pytest.mark.slow
def test_skip_layer_guidance_on_no_step_is_said_and_the_run_is_the_plain_one(tmp_path):
    plain, inert, acting = tmp_path / "plain", tmp_path / "inert", tmp_path / "acting"
    skip_layer = ["guider=skip_layer", "guider.layers=[1]"]
    for run_dir, extra in ((plain, []), (inert, skip_layer), (acting, [*skip_layer, "guider.skip_stop=0.6"])):
        result = call_cli("+experiment=sd3_smoke", *QUIET, *extra, f"hydra.run.dir={run_dir}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-2000:]
        said = result.stdout
        if run_dir == inert:
            assert ("guider=skip_layer: blocks [1] act on no step of this run: its window 0.01..0.2 of the 4 steps "
                    "(diffusers' start * steps < step < stop * steps) holds none of them; run and recorded as "
                    "guider=cfg") in said
        else:
            assert "act on no step" not in said
        if run_dir == acting:  # the plan line says what runs
            assert ("; guider skip_layer (scale 2.8, skip_start 0.01, skip_stop 0.6) on 1: skip-layer guidance on "
                    "steps 1..2") in said
    hashes = {d: [r["pixels_sha256"] for r in records(d)] for d in (plain, inert, acting)}
    assert hashes[inert] == hashes[plain] and hashes[acting] != hashes[plain]
    assert records(inert)[0].get("guider") is None and records(inert)[0].get("guider_layers") is None
    assert records(acting)[0]["guider"] == "skip_layer" and records(acting)[0]["guider_layers"] == ["1"]
    flops = {d: json.loads((d / "timings.json").read_text())["flops_per_batch"] for d in (plain, inert, acting)}
    assert flops[inert] == flops[plain] < flops[acting]  # the extra transformer call counted only where it runs


@pytest.mark.slow
def test_cfg_rescale_without_cfg_and_an_embedding_no_prompt_names_are_said(tmp_path, tiny_model_dir):
    from safetensors.numpy import save_file

    embedding = tmp_path / "shiny.safetensors"
    save_file({"<shiny>": np.random.default_rng(0).standard_normal(32).astype(np.float32)}, str(embedding))
    run_dir = tmp_path / "run"
    result = call_cli("+experiment=smoke", *QUIET, "sampling.guidance_scale=1", "sampling.guidance_rescale=0.7",
                      f"prompts.embeddings=[{embedding}]", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("sampling.guidance_rescale: 0.7 rescales classifier-free guidance, and sampling.guidance_scale is 1 (no "
            "CFG); run and recorded without it") in result.stdout
    assert ("prompts.embeddings: shiny named by no prompt: used by none, the images are as without them (a prompt "
            "calls one by its file name, e.g. 'shiny')") in result.stdout
    assert records(run_dir)[0].get("guidance_rescale") is None


@pytest.mark.slow
def test_an_embedding_that_pushes_a_prompt_past_its_tokens_says_what_was_dropped(tmp_path, tiny_model_dir):
    """The plain syntax cuts a prompt at 75 tokens; a prompt that fit until its embedding's 40 vectors went in lost
    its end without a word."""
    from safetensors.numpy import save_file

    embedding = tmp_path / "long.safetensors"
    save_file({"emb_params": np.random.default_rng(0).standard_normal((40, 32)).astype(np.float32)}, str(embedding))
    prompt = " ".join(["a"] * 60) + " long"  # 63 tokens as written ("long" is 3), 100 with the embedding's 40
    result = call_cli("+experiment=smoke", *QUIET, f"prompts.embeddings=[{embedding}]", f"prompts.texts=['{prompt}']",
                      f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert ("prompts.embeddings: prompt 0 takes 100 tokens with its embeddings' vectors, past the 75 a CLIP prompt "
            "holds: its last 25 dropped (prompts.syntax=a1111 chunks a longer prompt)") in result.stdout


@pytest.mark.slow
def test_a_lora_at_scale_zero_and_hires_at_scale_one_are_said(tmp_path, tiny_model_dir):
    from helpers.lora_files import factors, write_kohya

    lora = write_kohya(tmp_path / "style.safetensors", factors(tiny_model_dir), alpha=2.0)
    result = call_cli("+experiment=smoke", *QUIET, f"+lora=[{{path: '{lora}', scale: 0}}]", "sampling.hires.scale=1",
                      f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert f"lora.0.scale: 0 -- {lora} merges nothing at scale 0; the images are the model's own" in result.stdout
    assert ("sampling.hires.scale: 1 upscales nothing: the second pass denoises the first pass's image again at the "
            "same size (as A1111 does)") in result.stdout


def test_a_controlnet_window_that_holds_no_step_or_no_controlnet_is_said(caplog):
    """controlnet.guidance_start/end (diffusers' controlnet_keep: step i of N where start <= i / N and (i + 1) / N <=
    end): a window holding none of the run's steps, or a window where no ControlNet runs, says so in one line; a
    window holding some says nothing."""
    import logging

    from sdjax_runner.config.inert import control_window_steps, said_control_window

    assert control_window_steps(4, 0.25, 0.75) == [1, 2] and control_window_steps(4, 0.8, 1.0) == []
    assert control_window_steps(20, 0.0, 1.0) == list(range(20))
    with caplog.at_level(logging.WARNING, logger="sdjax_runner"):
        said_control_window(True, "controlnet", 4, 0.8, 1.0)
        said_control_window(False, "txt2img", 4, 0.2, 0.6)
        said_control_window(True, "controlnet", 4, 0.25, 0.75)
        said_control_window(True, "controlnet", 4, 0.0, 1.0)
    lines = [record.getMessage() for record in caplog.records]
    assert lines == ["controlnet.guidance_start/guidance_end: the window 0.8..1 of the 4 steps (diffusers' start <= "
                     "step / steps and (step + 1) / steps <= end) holds none of them: the ControlNet steers no step "
                     "(widen the window or run more steps)",
                     "controlnet.guidance_start/guidance_end: set, but mode=txt2img runs no ControlNet"]
