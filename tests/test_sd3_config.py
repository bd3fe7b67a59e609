"""SD 3's settings as the config checks them before anything loads (config/families.py): its defaults, and each
setting it cannot honour one line naming the key."""

from __future__ import annotations

import pytest

from helpers.cli import assert_one_line_error, call_cli

SD3 = ["model=tiny-random-sd3", "tracking=none"]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["model=tiny-random", "guider=skip_layer", "guider.layers=[1]"], "error: guider: skip_layer"),
    (["model=tiny-random-flux", "guider=skip_layer", "guider.layers=[1]"], "error: guider: skip_layer"),
    ([*SD3, "guider=skip_layer"], "error: guider.layers: a value is required with guider=skip_layer (allowed: "
     "distinct transformer block numbers, e.g. [7, 8, 9] (SD 3.5 Medium's card))"),
    ([*SD3, "guider=skip_layer", "guider.layers=[1,1]"], "error: guider.layers: ['1', '1'] (allowed: distinct "
     "transformer block"),
    ([*SD3, "guider=skip_layer", "guider.layers=[blocks.1]"], "error: guider.layers: ['blocks.1'] (allowed: distinct"),
    ([*SD3, "guider=skip_layer", "guider.layers=[1]", "guider.skip_start=0.5", "guider.skip_stop=0.2"],
     "error: guider.skip_start: 0.5, skip_stop 0.2 (allowed: 0 <= skip_start < skip_stop <= 1"),
    ([*SD3, "guider=skip_layer", "guider.layers=[1]", "guider.skip_stop=2"],
     "error: guider.skip_stop: must be a fraction of the steps, got 2.0"),
    ([*SD3, "guider=skip_layer", "guider.layers=[1]", "sampler=dpmpp_2m"],
     "error: guider: skip_layer with sampler dpmpp_2m and scheduler pndm: skip-layer guidance counts"),
    # where it was before it became a guider: its new keys
    ([*SD3, "sampling.slg_layers=[7,8,9]"], "error: sampling.slg_layers: moved (allowed: guider=skip_layer "
     "'guider.layers=[7,8,9]'"),
    ([*SD3, "prompts.syntax=a1111"], "error: prompts.syntax: a1111: A1111's emphasis and BREAK weigh the SD family's"),
    ([*SD3, "prompts.clip_skip=2"], "error: prompts.clip_skip: 2: SD 3 reads its CLIP encoders' penultimate layer"),
    ([*SD3, "prompts.max_sequence_length=600"],
     "error: prompts.max_sequence_length: 600: Stable Diffusion 3 / 3.5's T5 reads at most 512 tokens (allowed: "
     "1..512 (null: 256))"),
    ([*SD3, "sampling.true_cfg_scale=4"], "error: sampling.true_cfg_scale: 4.0: tiny-random-sd3's classifier-free "
                                          "guidance is sampling.guidance_scale (allowed: null)"),
    # a ControlNet with a guider that makes other transformer calls: refused before anything loads
    ([*SD3, "mode=controlnet", "controlnet.model=tiny-random-sd3-controlnet", "controlnet.image=y.png", "guider=pag"],
     "error: guider: pag with mode=controlnet: its extra transformer call has no ControlNet residuals defined"),
])
def test_what_sd3_cannot_honour_is_one_line(tmp_path, overrides, expected):
    assert_one_line_error(call_cli(*overrides, cwd=tmp_path), expected)


def test_sd3_takes_diffusers_defaults(tmp_path):
    result = call_cli(*SD3, "--cfg", "job", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    from sdjax_runner.config import families

    entry = families.FAMILIES["sd3"]
    assert (entry.steps, entry.guidance, entry.t5_tokens) == (28, 7.0, 256)  # StableDiffusion3Pipeline.__call__'s
    assert families.planned(type("M", (), {"family": None, "builtin": "tiny-random-sd3",
                                           "pretrained_model_name_or_path": None})()) is entry


@pytest.mark.parametrize("single,fetched", [
    ("tiny-sd3-transformer.safetensors", {"vae", "text_encoder", "text_encoder_2", "text_encoder_3"}),
    ("tiny-sd3-all-in-one.safetensors", set()),
])
def test_a_hub_base_fetches_the_weights_a_single_file_does_not_hold(tmp_path, monkeypatch, single, fetched):
    """model.checkpoint on a hub base: the configs are fetched, then the weights of the components the file does not
    give (hub access replaced by a recorder over a copy of the tiny folder without weights)."""
    import shutil
    from pathlib import Path

    from sdjax_runner.config.schema import ModelConfig
    from sdjax_runner.models import sources

    fixtures = Path(__file__).resolve().parent / "fixtures" / "sd3"
    base = tmp_path / "snapshot"
    shutil.copytree(fixtures / "tiny-sd3", base, ignore=shutil.ignore_patterns("*.safetensors*"))
    asked: list[list[str]] = []

    def snapshot(model, patterns):
        asked.append(patterns)
        return base

    monkeypatch.setattr(sources, "_snapshot", snapshot)
    model = ModelConfig(name="sd3.5-medium", pretrained_model_name_or_path="stabilityai/stable-diffusion-3.5-medium",
                        family="sd3", checkpoint=str(fixtures / single))
    assert sources.resolve(model) == base
    assert asked[0] == sources.CONFIG_PATTERNS
    weights = {pattern.split("/")[0] for patterns in asked[1:] for pattern in patterns}
    assert weights == fetched


def test_a_size_past_sd3s_position_table_is_one_line_before_and_after_loading(tmp_path, monkeypatch):
    """Round five: SD 3 at 4096x4096 was a ValueError about its position table from inside the program. Where
    the folder is on disk the plan says so before anything loads; where it could not tell (a hub model, fetched
    only at load), the loaded transformer is checked before anything is compiled."""
    import dataclasses

    from helpers.cli import assert_one_line_error, call_cli
    from sdjax_runner.config import families

    expected = ("error: sampling.height: 512x512: tiny-random-sd3 takes at most 256x256 (its transformer's position "
                "table is 16x16 patches")
    quiet = ["tracking=none", "metrics.clip_score.enabled=false", "sampling.height=512", "sampling.width=512"]
    result = call_cli("+experiment=sd3_smoke", *quiet, cwd=tmp_path)
    assert_one_line_error(result, expected)
    assert "load:" not in result.stdout + result.stderr
    monkeypatch.setitem(families.FAMILIES, "sd3", dataclasses.replace(families.FAMILIES["sd3"], largest_side=None))
    result = call_cli("+experiment=sd3_smoke", *quiet, cwd=tmp_path)
    assert_one_line_error(result, expected)
    # the plan passed it (its line names the latents' patches), the loaded transformer refused it before compiling
    assert "plan:" in result.stdout and "patches of 2x2" not in result.stderr and "compile:" not in result.stdout
