"""The sharded (jit + NamedSharding) path against the guide's pmap path, batch layouts,
padding, and a real two-process JAX cluster on CPU."""

import json
import sqlite3
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers.cli import assert_one_line_error, call_cli, free_port, run_cli
from helpers.flax_references import folder_digest, reference
from helpers.images import images_of as runner_images


def run_ok(tmp_path, name, *overrides):
    run_dir = tmp_path / name
    result = run_cli("+experiment=smoke", "tracking=none", f"hydra.run.dir={run_dir}", *overrides, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    return run_dir, result


@pytest.mark.slow
def test_sharded_path_gives_the_pmap_images_exactly_in_fp32_and_bf16(tmp_path):
    # One process, four jobs: (fp32, pmap), (fp32, sharded), (bf16, pmap), (bf16, sharded). Each
    # device runs the same per-device program under both (shard_map), so even bf16 rounds alike.
    # All 8 devices, as other tests' runs, so the session cache has most of these programs already.
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "dtype=fp32,bf16", "parallelism=pmap,sharded",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    fp32_pmap, fp32_sharded, bf16_pmap, bf16_sharded = (runner_images(sweep / str(i)) for i in range(4))
    assert len(fp32_sharded) == 8
    assert all(np.array_equal(a, b) for a, b in zip(fp32_pmap, fp32_sharded, strict=True))
    assert all(np.array_equal(a, b) for a, b in zip(bf16_pmap, bf16_sharded, strict=True))
    assert not np.array_equal(fp32_pmap[0], bf16_pmap[0])  # bf16 really ran in bf16
    timings = json.loads((sweep / "1" / "timings.json").read_text())
    assert timings["num_devices"] == 8 and timings["param_bytes_per_device"] > 0


@pytest.mark.slow
def test_two_per_device_on_four_devices_is_the_guide_flow_with_that_layout(tmp_path, tiny_model_dir):
    """The mapping that holds: with D devices and B images each, device d draws its B latents
    from split(PRNGKey(seed), D)[d] -- so a 4 x 2 run equals the guide's code on 4 devices with
    (4, 2, 77) prompt shards, not the 8 x 1 run. Both paths, one process."""
    prompts = [f"prompt number {i}" for i in range(8)]
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "parallelism=pmap,sharded",
                     "parallelism.num_devices=4", "parallelism.per_device_batch_size=2",
                     f"prompts.texts=[{','.join(prompts)}]", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    def guide_flow():
        from diffusers import FlaxStableDiffusionPipeline
        from flax.jax_utils import replicate

        pipeline, params = FlaxStableDiffusionPipeline.from_pretrained(
            str(tiny_model_dir), dtype=jnp.float32, safety_checker=None, feature_extractor=None)
        prompt_ids = pipeline.prepare_inputs(prompts).reshape(4, 2, 77)
        rng = jax.random.split(jax.random.PRNGKey(0), 4)
        images = pipeline(prompt_ids, replicate(params, devices=jax.local_devices()[:4]), rng,
                          num_inference_steps=4, height=64, width=64, jit=True).images
        return np.stack([np.asarray(i) for i in pipeline.numpy_to_pil(images.reshape((8, 64, 64, 3)))])

    expected = reference("four_by_two", guide_flow, model=folder_digest(tiny_model_dir), prompts=prompts)
    for job in ("0", "1"):
        got = runner_images(sweep / job)
        assert all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True)), f"job {job}"


@pytest.mark.slow
def test_padding_is_generated_but_dropped(tmp_path):
    run_dir, result = run_ok(tmp_path, "pad", "parallelism=sharded", "parallelism.num_devices=4",
                             "prompts.texts=[a,b,c]", "prompts.fill=pad")
    records = json.loads((run_dir / "images.json").read_text())
    assert [r["prompt"] for r in records] == ["a", "b", "c"] and len(runner_images(run_dir)) == 3
    assert "1 padding image(s) will be generated and dropped" in result.stdout


@pytest.mark.parametrize("overrides,expected", [
    (["parallelism.distributed.enabled=true"],
     "error: parallelism.distributed.enabled: multi-host runs need the sharded path (allowed: parallelism=sharded)"),
    (["parallelism=sharded", "parallelism.distributed.num_processes=2", "parallelism.distributed.process_id=1"],
     "error: parallelism.distributed.enabled: false, but num_processes, process_id given: each process would run "
     "alone, all writing the same outputs (allowed: true, with all three settings)"),
    (["parallelism=sharded", "parallelism.distributed.enabled=true", "parallelism.distributed.num_processes=2"],
     "error: parallelism.distributed: give coordinator_address, num_processes and process_id together"),
    (["parallelism=sharded", "parallelism.distributed.enabled=true",
      "parallelism.distributed.coordinator_address=127.0.0.1:1", "parallelism.distributed.num_processes=2",
      "parallelism.distributed.process_id=2"],
     "error: parallelism.distributed.process_id: 2 is out of range (allowed: 0..1)"),
])
def test_bad_distributed_settings(tmp_path, overrides, expected):
    assert_one_line_error(call_cli("+experiment=smoke", *overrides, cwd=tmp_path), expected)


@pytest.mark.timeout(400)
@pytest.mark.slow
@pytest.mark.server
def test_two_processes_make_the_images_of_one_eight_device_process(tmp_path, tiny_model_dir):
    single_dir, _ = run_ok(tmp_path, "single", "parallelism=sharded")
    port = free_port()
    procs = []
    for process_id in (1, 0):  # process 1 first: its Hydra writes into the folder before process 0 checks it
        args = ["+experiment=smoke", "parallelism=sharded", "parallelism.host_device_count=4",
                "parallelism.distributed.enabled=true", f"parallelism.distributed.coordinator_address=127.0.0.1:{port}",
                "parallelism.distributed.num_processes=2", f"parallelism.distributed.process_id={process_id}",
                f"hydra.run.dir={tmp_path / 'shared'}"]  # one folder, as a SLURM job on a shared filesystem has
        procs.append(subprocess.Popen([sys.executable, "-m", "sdjax_runner", *args], cwd=tmp_path,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        deadline = time.monotonic() + 120  # the round-five case: process 0 found the peer's files and refused
        while process_id == 1 and not (tmp_path / "shared" / ".hydra").exists() and time.monotonic() < deadline:
            time.sleep(0.2)
    procs.reverse()
    outs = [p.communicate(timeout=300) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    timings = json.loads((tmp_path / "shared" / "timings.json").read_text())
    assert (timings["num_devices"], timings["process_count"]) == (8, 2)
    # Process 0 writes the run; process 1 adds only Hydra's own files (the same names), and no second run.
    assert {p.name for p in (tmp_path / "shared").iterdir()} >= {".hydra", "run.log", "status.json", "images"}
    assert json.loads((tmp_path / "shared" / "status.json").read_text())["status"] == "FINISHED"
    # Another run given the folder is still refused.
    assert_one_line_error(run_cli("+experiment=smoke", f"hydra.run.dir={tmp_path / 'shared'}", cwd=tmp_path),
                          f"error: hydra.run.dir: {tmp_path / 'shared'} already holds a run")
    with sqlite3.connect(tmp_path / "outputs" / "mlflow.db") as db:
        assert db.execute("select status from runs").fetchall() == [("FINISHED",)]
    # Same keys, same order: the images are the one-process images, up to float rounding in one
    # op. The compiled program (HLO, LLVM IR, object code) is byte-identical in both layouts, and
    # the text encoder, the UNet and the VAE up to its last layer give bit-identical outputs; the
    # VAE's conv_out (3x3, 16 -> 3 channels) does not: XLA:CPU's result for that convolution
    # depends on how many CPU devices the process has (1, 2 or 4 give one answer, 3, 5-8 or 16
    # another; no XLA flag changes it), so ~1 ulp differences make a rare pixel round one level apart.
    single, multi = runner_images(single_dir), runner_images(tmp_path / "shared")
    diffs = [np.abs(a.astype(int) - b.astype(int)) for a, b in zip(single, multi, strict=True)]
    assert all(d.max() <= 1 for d in diffs)
    assert sum(int((d > 0).sum()) for d in diffs) <= 8
    assert sum(int(d.max() == 0) for d in diffs) >= 6


@pytest.mark.parametrize("process_id, expected", [
    (1, "error: parallelism.distributed.timeout_s: process 1 found no coordinator (process 0) at 127.0.0.1:{port} "
        "within 3 s (allowed: start process 0, or a larger timeout_s)"),
    (0, "error: parallelism.distributed.timeout_s: 0 of 1 other process(es) reached 127.0.0.1:{port} within 3 s; "
        "missing process_id 1 (allowed: start every process, or a larger timeout_s)"),
])
@pytest.mark.slow
@pytest.mark.server
def test_a_peer_that_never_comes_is_one_line_after_the_timeout(tmp_path, process_id, expected):
    port = free_port()
    started = time.monotonic()
    result = run_cli("+experiment=smoke", "parallelism=sharded", "parallelism.host_device_count=4",
                     "parallelism.distributed.enabled=true", f"parallelism.distributed.coordinator_address=127.0.0.1:{port}",
                     "parallelism.distributed.num_processes=2", f"parallelism.distributed.process_id={process_id}",
                     "parallelism.distributed.timeout_s=3", cwd=tmp_path)
    assert_one_line_error(result, expected.format(port=port))
    assert time.monotonic() - started < 60  # not JAX's minutes of waiting, no C++ abort


@pytest.mark.slow
@pytest.mark.parametrize("experiment,model", [("smoke", "tiny-random-v2"), ("flux_smoke", "tiny-random-flux-v1"),
                                              ("sd3_smoke", "tiny-random-sd3-v1")])
def test_split_weights_give_the_replicated_images_and_each_device_holds_an_nth_of_them(experiment, model, tmp_path,
                                                                                        cache_dir):
    """parallelism.params=sharded (FSDP-style): the images of the replicated weights, bit for bit; each device
    holds 1/8 of every weight the split rule splits (engine/split.py) and all of the rest; the program's arguments
    shrink by as much (FLUX.1's and SD 3's transformer blocks are gathered one at a time, so their programs need
    less memory in all; SD's components are gathered whole as the program starts)."""
    from sdjax_runner.config.schema import DtypeConfig, ModelConfig
    from sdjax_runner.engine.split import split_spec
    from sdjax_runner.models.loaders import load_model

    sweep = tmp_path / "sweep"
    result = run_cli("-m", f"+experiment={experiment}", "tracking=none", "metrics.clip_score.enabled=false",
                     "parallelism=sharded", "parallelism.params=replicated,sharded", f"paths.cache_dir={cache_dir}",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.count("; weights split across the 8 devices (parallelism.params=sharded)") == 1  # plan lines
    replicated, split = (json.loads((sweep / str(job) / "images.json").read_text()) for job in (0, 1))
    assert [r["pixels_sha256"] for r in split] == [r["pixels_sha256"] for r in replicated] and len(split) == 8
    timings = [json.loads((sweep / str(job) / "timings.json").read_text()) for job in (0, 1)]
    weights = load_model(ModelConfig(name="m", pretrained_model_name_or_path=str(cache_dir / "models" / model)),
                         DtypeConfig(name="fp32")).host_weights
    leaves = jax.tree_util.tree_leaves(weights)
    whole = sum(np.asarray(leaf).nbytes for leaf in leaves)
    held = sum(np.asarray(leaf).nbytes // (8 if split_spec(np.shape(leaf), 8) != jax.P() else 1) for leaf in leaves)
    assert timings[0]["param_bytes_per_device"] == whole and timings[1]["param_bytes_per_device"] == held
    assert held < 0.6 * whole  # the tiny models' many small leaves stay whole; a full-size model's are ~1/N
    if experiment in ("flux_smoke", "sd3_smoke"):
        assert timings[1]["program_memory_bytes"] < timings[0]["program_memory_bytes"]


def test_split_weights_need_the_sharded_mode(tmp_path):
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", "parallelism.params=sharded", cwd=tmp_path),
                          "error: parallelism.params: sharded needs parallelism=sharded")
