"""SD 3 / 3.5 through the command line, against diffusers 0.39's PyTorch ``StableDiffusion3Pipeline``: the tiny
pipeline tests/helpers/make_sd3_reference.py made and saved with diffusers' own classes
(tests/fixtures/sd3/tiny-sd3: SD 3.5 Medium's shape, CLIP-L, CLIP-G and T5) and diffusers' images for the runner's
own initial latents (``pipeline.npz``: seed 0 on 2 devices, 32x32, 4 steps, guidance 5, 32 T5 tokens). The runner's
PNGs must be within 2/255 of them -- with classifier-free guidance and diffusers' default empty negative prompt,
with a negative prompt, at guidance 1 (no unconditional pass in diffusers), and from a folder without T5."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import run_cli

pytestmark = pytest.mark.slow

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "sd3"
TOLERANCE = 2 / 255
RUN = ["dtype=fp32", "sampling.num_inference_steps=4", "sampling.height=32", "sampling.width=32",
       "parallelism.host_device_count=2", "prompts.texts=[a red cube on a table]", "prompts.max_sequence_length=32",
       "tracking=none", "metrics.clip_score.enabled=false", "seed=0"]


@pytest.fixture(scope="module")
def reference() -> dict[str, np.ndarray]:
    with np.load(FIXTURES / "pipeline.npz") as data:
        return {key: data[key] for key in data.files}


def images(run_dir: Path) -> np.ndarray:
    records = json.loads((run_dir / "images.json").read_text())
    return np.stack([np.asarray(Image.open(run_dir / r["file"]), np.float32) / 255 for r in records])


def local(folder: Path) -> list[str]:
    return ["model=local", f"model.pretrained_model_name_or_path={folder}"]


def test_a_guidance_sweep_gives_diffusers_images_and_compiles_once(tmp_path, reference):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *local(FIXTURES / "tiny-sd3"), *RUN, "sampling.guidance_scale=5,1",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for job, name in (("0", "default"), ("1", "no_cfg")):
        ours = images(sweep / job)
        assert ours.shape == reference[f"{name}_images"].shape
        assert float(np.abs(ours - reference[f"{name}_images"]).max()) <= TOLERANCE, name
    timings = json.loads((sweep / "1" / "timings.json").read_text())
    assert timings["compile_reused"] == 1 and timings["process_compiles"] <= 1  # guidance is a traced input
    records = json.loads((sweep / "0" / "images.json").read_text())
    assert records[0]["guidance_scale"] == 5 and records[0]["sampler"] == "Euler"


def test_a_negative_prompt_gives_diffusers_images(tmp_path, reference):
    result = run_cli(*local(FIXTURES / "tiny-sd3"), *RUN, "sampling.guidance_scale=5", "prompts.negative=blurry",
                     "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "run") - reference["negative_images"]).max()) <= TOLERANCE


def test_a_folder_without_t5_runs_without_it_as_diffusers_does(tmp_path, reference):
    folder = tmp_path / "no-t5"
    shutil.copytree(FIXTURES / "tiny-sd3", folder)
    shutil.rmtree(folder / "text_encoder_3")
    shutil.rmtree(folder / "tokenizer_3")
    index = json.loads((folder / "model_index.json").read_text())
    index["text_encoder_3"] = index["tokenizer_3"] = [None, None]
    (folder / "model_index.json").write_text(json.dumps(index))
    result = run_cli(*local(folder), *RUN, "sampling.guidance_scale=5", "hydra.run.dir=run", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert float(np.abs(images(tmp_path / "run") - reference["no_t5_images"]).max()) <= TOLERANCE
    assert float(np.abs(reference["no_t5_images"] - reference["default_images"]).max()) > 10 / 255  # T5 mattered
