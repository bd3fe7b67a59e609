"""The model catalogue: built-in architectures, SDXL, PyTorch-only checkpoints without torch, the hub cache."""

import json
import sys

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from helpers.configs import compose_cfg
from helpers.images import images_of as runner_images
from helpers.params import assert_same_params
from helpers.pt_layout import write_pytorch_only

pytestmark = pytest.mark.slow


def param_count(tree) -> int:
    from flax.traverse_util import flatten_dict

    return sum(int(np.prod(leaf.shape)) for leaf in flatten_dict(tree).values())


def test_full_size_architectures_have_the_published_parameter_counts():
    from sdjax_runner.families.sd.models.builtin import architecture

    _, sd = architecture("sd-v1-arch")  # shapes only: nothing is allocated
    assert {k: param_count(v) for k, v in sd.items()} == {
        "unet": 859_520_964, "vae": 83_653_863, "text_encoder": 123_060_480}
    _, xl = architecture("sdxl-arch")
    assert {k: param_count(v) for k, v in xl.items()} == {
        "unet": 2_567_463_684, "vae": 83_653_863, "text_encoder": 123_060_480, "text_encoder_2": 694_659_840}


def test_full_size_random_weights_are_drawn_in_parallel_and_the_same_every_time():
    """The full-size (bfloat16) builds draw each tensor from its own seeded generator on every CPU:
    the weights do not depend on which thread drew which tensor, and keep the tiny builds' rules
    (LeCun-scaled kernels, N(0, 0.02) embeddings, unit scales, zero biases)."""
    import ml_dtypes
    from flax.traverse_util import flatten_dict

    from sdjax_runner.models.builtin_parts import random_params

    shapes = {f"block_{i}": {"kernel": np.empty((256, 512)), "bias": np.empty(512), "scale": np.empty(512)}
              for i in range(12)}
    shapes["embedding"] = {"embedding": np.empty((1000, 64))}
    bf16 = np.dtype(ml_dtypes.bfloat16)
    first = flatten_dict(random_params(shapes, 7, bf16, "float32"))
    again = flatten_dict(random_params(shapes, 7, bf16, "float32"))
    other = flatten_dict(random_params(shapes, 8, bf16, "float32"))
    assert first.keys() == again.keys() and all(np.array_equal(first[k], again[k]) for k in first)
    assert not np.array_equal(first["block_0", "kernel"], other["block_0", "kernel"])
    assert not np.array_equal(first["block_0", "kernel"], first["block_1", "kernel"])  # a generator per tensor
    assert all(v.dtype == bf16 for v in first.values())
    kernels = np.stack([first[f"block_{i}", "kernel"].astype(np.float32) for i in range(12)])
    assert abs(kernels.std() * np.sqrt(256) - 1) < 0.01 and abs(kernels.mean()) < 1e-3
    assert abs(first["embedding", "embedding"].astype(np.float32).std() - 0.02) < 1e-3
    assert all((first[f"block_{i}", "scale"] == 1).all() and (first[f"block_{i}", "bias"] == 0).all() for i in range(12))


def test_tiny_xl_runs_end_to_end_on_both_paths_and_takes_a_negative_prompt(tmp_path, tiny_xl_dir):
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "model=tiny-random-xl", "scheduler=euler", "tracking=none",
                     "parallelism=pmap,sharded", "prompts.negative=null,blurry", f"hydra.sweep.dir={sweep}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = {}
    for job in range(4):
        overrides = (sweep / str(job) / ".hydra" / "overrides.yaml").read_text()
        key = ("sharded" if "parallelism=sharded" in overrides else "pmap", "blurry" in overrides)
        images = runner_images(sweep / str(job))
        assert len(images) == 8 and all(np.isfinite(i).all() and i.std() > 5 for i in images)
        jobs[key] = images
        timings = json.loads((sweep / str(job) / "timings.json").read_text())
        assert timings["process_model_loads"] == 1
    for negative in (False, True):  # the sharded path gives the pmap path's images for SDXL too
        assert all(np.array_equal(a, b) for a, b in zip(jobs["pmap", negative], jobs["sharded", negative], strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(jobs["pmap", False], jobs["pmap", True], strict=True))


def load(path, **overrides):
    from sdjax_runner.models.loaders import load_model

    cfg = compose_cfg(["model=local", f"model.pretrained_model_name_or_path={path}"]
                      + [f"{k}={v}" for k, v in overrides.items()])
    return load_model(cfg.model, cfg.dtype)


@pytest.mark.parametrize("fixture", ["tiny_model_dir", "tiny_xl_dir"])
def test_pytorch_only_safetensors_load_without_torch_into_the_flax_params(tmp_path, request, fixture):
    flax_dir = request.getfixturevalue(fixture)
    pt_dir = write_pytorch_only(flax_dir, tmp_path / "pt")
    assert not list(pt_dir.rglob("*.msgpack"))
    converted, native = load(pt_dir), load(flax_dir)
    assert "torch" not in sys.modules
    assert set(converted.formats.values()) == {"safetensors"} and set(native.formats.values()) == {"flax"}
    assert converted.host_weights.keys() == native.host_weights.keys()
    for name in native.host_weights:
        assert_same_params(converted.host_weights[name], native.host_weights[name])
    bf16 = load(pt_dir, dtype="bf16")  # cast while converting
    assert {leaf.dtype.name for leaf in bf16.host_weights["unet"]["conv_in"].values()} == {"bfloat16"}


def test_pytorch_only_pipeline_gives_the_flax_pipelines_images(smoke_run, tmp_path, tiny_model_dir):
    _, flax_run, _ = smoke_run
    pt_dir = write_pytorch_only(tiny_model_dir, tmp_path / "pt")
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", "model=local", f"model.pretrained_model_name_or_path={pt_dir}",
                     "tracking=none", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "PyTorch safetensors converted: text_encoder, unet, vae" in result.stdout
    got, expected = runner_images(run_dir), runner_images(flax_run)
    assert len(got) == 8 and all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))


def test_pickle_weights_are_refused_with_one_line(tmp_path, tiny_model_dir):
    pt_dir = write_pytorch_only(tiny_model_dir, tmp_path / "pt", as_pickle=("unet",))
    result = run_cli("+experiment=smoke", "model=local", f"model.pretrained_model_name_or_path={pt_dir}",
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 2
    assert "Traceback" not in result.stderr
    line = [e for e in result.stderr.splitlines() if e.startswith("error:")]
    assert line == ["error: model.allow_pickle: unet/ has only pickle weights (diffusion_pytorch_model.bin); "
                    "unpickling can run code, so they are not loaded (allowed: true to read their tensors anyway: "
                    "nothing in the file is imported or run)"]
    assert json.loads((tmp_path / "run" / "status.json").read_text())["status"] == "FAILED"
    # allowed, the file is read by the runner's own reader (tests/test_torch_pickle.py): this one is no PyTorch file
    result = run_cli("+experiment=smoke", "model=local", f"model.pretrained_model_name_or_path={pt_dir}",
                     "model.allow_pickle=true", "tracking=none", f"hydra.run.dir={tmp_path / 'allowed'}", cwd=tmp_path)
    assert_one_line_error(result, "error: model.allow_pickle: unet/ is not read: it is not a zip archive: PyTorch's "
                          "format before 1.6 or another pickle")


def hub_cache(home, repo, source):
    """A Hugging Face cache holding ``source`` as ``repo``'s main revision, laid out as huggingface_hub does."""
    import shutil

    commit = "0123456789abcdef0123456789abcdef01234567"
    folder = home / "hub" / f"models--{repo.replace('/', '--')}"
    shutil.copytree(source, folder / "snapshots" / commit)
    (folder / "refs").mkdir()
    (folder / "refs" / "main").write_text(commit)


def test_hub_ids_load_from_the_local_cache_offline_and_a_missing_one_says_how_to_fetch_it(smoke_run, tmp_path,
                                                                                          tiny_model_dir):
    _, flax_run, _ = smoke_run
    home = tmp_path / "hf"
    hub_cache(home, "sdjax-test/tiny-pytorch", write_pytorch_only(tiny_model_dir, tmp_path / "pt"))
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(home)}
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", "model=sd-v1-5", "model.pretrained_model_name_or_path=sdjax-test/tiny-pytorch",
                     "tracking=none", f"hydra.run.dir={run_dir}", cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert all(np.array_equal(a, b) for a, b in zip(runner_images(run_dir), runner_images(flax_run), strict=True))
    # The record names the snapshot's commit, and a re-run loads that commit (offline, from the cache).
    commit = "0123456789abcdef0123456789abcdef01234567"
    assert json.loads((run_dir / "inputs.json").read_text())["model"]["revision"] == commit
    rerun = run_cli(str(run_dir), "--no-tracking", cwd=tmp_path, env=env, command="rerun")
    assert rerun.returncode == 0, rerun.stderr
    assert f"rerun: model.revision: the default branch -> {commit}, the snapshot the run loaded" in rerun.stderr
    assert "rerun: identical -- all 8 image(s) match the record bit for bit" in rerun.stdout

    missing = run_cli("+experiment=smoke", "model=sd-2-1", "tracking=none", f"hydra.run.dir={tmp_path / 'missing'}",
                      cwd=tmp_path, env=env)
    assert missing.returncode == 2 and "Traceback" not in missing.stderr
    (line,) = [e for e in missing.stderr.splitlines() if e.startswith("error:")]
    assert line.startswith("error: model.pretrained_model_name_or_path: stabilityai/stable-diffusion-2-1 is not in "
                           "the local Hugging Face cache (HF_HUB_OFFLINE=1)")
    assert "fetch it first with: hf download stabilityai/stable-diffusion-2-1" in line
    assert not (tmp_path / "missing" / "images").exists()


def test_v_prediction_from_the_model_config_reaches_every_scheduler(tiny_model_dir):
    from sdjax_runner.families.sd.models.loading import with_scheduler

    loaded = load(tiny_model_dir, **{"model.prediction_type": "v_prediction"})
    for name in ("pndm", "euler", "lms", "ddpm"):
        cfg = compose_cfg([f"scheduler={name}", "model.prediction_type=v_prediction"])
        pipeline, _ = with_scheduler(loaded, cfg.scheduler, cfg.model.prediction_type)
        assert pipeline.scheduler.config.prediction_type == "v_prediction"
    cfg = compose_cfg(["scheduler=ddim", "+scheduler.config_overrides.prediction_type=epsilon"])
    pipeline, _ = with_scheduler(loaded, cfg.scheduler, "v_prediction")  # an explicit override wins
    assert pipeline.scheduler.config.prediction_type == "epsilon"
