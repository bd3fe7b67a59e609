"""A UNet whose config.json asks for what the runner's UNet (diffusers' Flax UNet's arithmetic) does not compute -- an
LCM model's guidance embedding, class embeddings, other blocks or normalisation -- is refused in one line before
anything runs (run anyway, the weights of what it turns on would be dropped: wrong images, silently); the published
SD 1.5, 2.1 and XL configs ask for nothing of the kind."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, call_cli

PUBLISHED = json.loads((Path(__file__).parent / "helpers" / "published_configs.json").read_text())


@pytest.mark.parametrize("layout", ["sd15", "sd21", "sdxl"])
def test_the_published_unets_ask_for_nothing_the_unet_lacks(layout):
    from sdjax_runner.families.sd.models.unet import UNet2DConditionModel

    config = PUBLISHED[layout]["unet/config.json"]
    unet = UNet2DConditionModel.from_config(config)  # refuses, in a ValueError, what it does not compute
    assert unet.config.block_out_channels == tuple(config["block_out_channels"])


@pytest.mark.parametrize(("change", "expected"), [
    ({"time_cond_proj_dim": 256}, "UNet config sets time_cond_proj_dim=256 (an LCM model's guidance embedding"),
    ({"class_embed_type": "timestep"}, "UNet config sets class_embed_type='timestep' (class embeddings (an upscaler's noise level"),
    ({"down_block_types": ["SimpleCrossAttnDownBlock2D", "DownBlock2D"]},
     "UNet config: down block 'SimpleCrossAttnDownBlock2D' (this UNet builds CrossAttnDownBlock2D and DownBlock2D)"),
    ({"norm_num_groups": 16, "act_fn": "gelu"}, "UNet config sets act_fn='gelu' (another activation); "
                                                 "norm_num_groups=16 (another group-norm group count), which this "
                                                 "UNet does not compute"),
])
def test_a_unet_the_flax_class_would_run_wrongly_is_one_line(tmp_path, tiny_model_dir, change, expected):
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    config = json.loads((model / "unet" / "config.json").read_text())
    (model / "unet" / "config.json").write_text(json.dumps(dict(config, **change)))
    result = call_cli("+experiment=smoke", "tracking=none", "model=local",
                      f"model.pretrained_model_name_or_path={model}", cwd=tmp_path)
    assert_one_line_error(result, f"error: model.pretrained_model_name_or_path: unet/config.json: {expected}")
    assert "(allowed: a Stable Diffusion 1.x / 2.x / XL UNet (an LCM model's own UNet does not run yet" in result.stderr
    assert not list(tmp_path.glob("outputs/**/images/*.png"))
