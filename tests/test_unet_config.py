"""A UNet whose config.json asks for what diffusers' Flax UNet does not compute -- an LCM model's guidance embedding,
class embeddings, other blocks or normalisation -- is refused in one line before anything runs (the Flax class would
ignore the setting and its weight conversion would drop the weights: wrong images, silently); the published SD 1.5,
2.1 and XL configs ask for nothing of the kind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, call_cli

PUBLISHED = json.loads((Path(__file__).parent / "helpers" / "published_configs.json").read_text())


@pytest.mark.parametrize("layout", ["sd15", "sd21", "sdxl"])
def test_the_published_unets_ask_for_nothing_the_flax_unet_lacks(layout):
    from sdjax_runner.models.unet_config import unsupported

    assert unsupported(PUBLISHED[layout]["unet/config.json"]) == []


@pytest.mark.parametrize(("change", "expected"), [
    ({"time_cond_proj_dim": 256}, "sets time_cond_proj_dim=256 (an LCM model's guidance embedding"),
    ({"class_embed_type": "timestep"}, "sets class_embed_type='timestep' (class embeddings"),
    ({"down_block_types": ["SimpleCrossAttnDownBlock2D", "DownBlock2D"]},
     "sets down_block_types SimpleCrossAttnDownBlock2D (the Flax UNet builds CrossAttnDownBlock2D and DownBlock2D only)"),
    ({"norm_num_groups": 16, "act_fn": "gelu"}, "sets act_fn='gelu' (another activation), which the Flax UNet does not "
                                                 "compute (and 1 more)"),
])
def test_a_unet_the_flax_class_would_run_wrongly_is_one_line(tmp_path, tiny_model_dir, change, expected):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "unet" / "config.json").read_text())
    (model / "unet" / "config.json").write_text(json.dumps(dict(config, **change)))
    result = call_cli("+experiment=smoke", "tracking=none", "model=local",
                      f"model.pretrained_model_name_or_path={model}", cwd=tmp_path)
    assert_one_line_error(result, f"error: model.pretrained_model_name_or_path: unet/config.json {expected}")
    assert not list(tmp_path.glob("outputs/**/images/*.png"))
