"""LCM-LoRA through the LoRA path (issue #49): an adapter on LCM-LoRA's modules -- the resnets' 3x3 convolutions,
shortcuts, down/upsamplers and time embeddings as well as attention -- in kohya's names, as latent-consistency's
files are published. The reference is diffusers' own: tests/helpers/make_lcm_lora_reference.py wrote the file with
PEFT on diffusers' PyTorch UNet in tiny-random's shape, read it back with diffusers' kohya reader, merged it with PEFT
and recorded what the merge added to one module of each kind. Through the command line it runs as LCM-LoRA is run
(sampler LCM, 4 steps, guidance 1), a scale sweep compiles once and its 0 is the run without the adapter."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import run_cli

FIXTURES = Path(__file__).parent / "fixtures" / "lcm_lora"
LCM_LORA = FIXTURES / "tiny-lcm-lora.safetensors"


def test_lcm_lora_is_read_as_diffusers_merges_it(tiny_model_dir):
    from helpers.lora_files import host_params
    from sdjax_runner.models import lora

    params = host_params(tiny_model_dir)
    adapter = lora.read(str(LCM_LORA), params, "lora.0.path")
    written = json.loads((FIXTURES / "VERSIONS.json").read_text())
    assert len(adapter.factors) == written["modules"] == 79  # every module of the file found its kernel
    kernels = {"_".join(path[:-1]): (component, path) for component, path in adapter.factors}
    deltas = np.load(FIXTURES / "deltas.npz")
    convolutions = 0
    for name in deltas.files:
        component, path = kernels[name.replace(".", "_")]
        down, up = adapter.factors[(component, path)]
        kernel = lora._leaf(params[component], path)
        ours = (down @ up).reshape(kernel.shape)  # what the merge adds at scale 1 (models/lora.py: merge)
        added = deltas[name]  # PyTorch's layout: (out, in, kh, kw) or (out, in)
        expected = added.transpose(2, 3, 1, 0) if added.ndim == 4 else added.T
        np.testing.assert_allclose(ours, expected, rtol=0, atol=1e-6, err_msg=name)
        assert np.abs(expected).max() > 0.05, name
        convolutions += kernel.ndim == 4 and kernel.shape[0] == 3
    assert convolutions == 4  # conv1, conv2, the downsampler's and the upsampler's: 3x3


@pytest.mark.slow
def test_an_lcm_lora_runs_with_the_lcm_sampler_and_its_scale_sweep_compiles_once(tmp_path, tiny_model_dir, cache_dir):
    quiet = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
             "parallelism.num_devices=2", "sampler=LCM", "sampling.num_inference_steps=4", "sampling.guidance_scale=1"]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", *quiet, f"lora=[{{path: {LCM_LORA}, scale: 1}}]", "lora.0.scale=0,1",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    said = result.stdout + result.stderr
    assert result.returncode == 0, said[-3000:]
    assert "lora: tiny-lcm-lora.safetensors at scale 1 merged into 79 layer(s) (unet 79)" in said, said[-3000:]
    plain = run_cli(*quiet, "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    hashes = [[r["pixels_sha256"] for r in json.loads((sweep / job / "images.json").read_text())] for job in "01"]
    without = [r["pixels_sha256"] for r in json.loads((tmp_path / "plain" / "images.json").read_text())]
    assert hashes[0] == without  # scale 0: the model as it is
    assert hashes[1] != hashes[0]
    assert json.loads((sweep / "1" / "timings.json").read_text())["compile_reused"] == 1
