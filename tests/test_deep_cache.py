"""DeepCache on the SD family's UNet (``cache=deepcache``; issue #62 item 2; engine/samplers/deep_cache.py,
families/sd/models/unet.DeepCache): DeepCache's own helper is the reference.

* The branch's layers: on every branch of a UNet of SD 1.5's layout (two resnets a level, three up layers), a call
  that reuses the input the whole call kept, on the same inputs, is the whole call's output -- so the layers it skips
  feed nothing it runs -- and it runs fewer FLOPs; a different kept input changes it.
* Which calls run whole: ``deep_cache.whole_call`` against a transcription of the helper's ``is_skip_step``
  ("uniform") and ``list(timesteps).index(t)`` numbering, on PNDM's timesteps (one of them twice) and Euler's, from
  the first step and from an img2img start.
* From the command line against diffusers' PyTorch ``StableDiffusionXLPipeline`` with ``DeepCacheSDHelper`` on the
  tiny SDXL base (tests/fixtures/deep_cache, tests/helpers/make_deep_cache_reference.py): an interval sweep compiles
  once and gives the helper's images within one 8-bit level and its calls skipped, interval 1 is the plain run bit
  for bit; three other branches; the FLOPs count what ran; the records, the A1111 line and from_png; what it cannot
  run with is one line.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import ONE_DEVICE, assert_one_line_error, call_cli, run_cli
from helpers.images import recorded_pixels, records_of

FIXTURES = Path(__file__).parent / "fixtures"
REFERENCE = np.load(FIXTURES / "deep_cache" / "deep_cache.npz")
BASE = FIXTURES / "refiner" / "tiny-sdxl-base"
# the reference's settings: the folder's Euler scheduler, its steps, 32 x 32, seed 0 on 2 devices, its prompt
SDXL = ["model.name=tiny-sdxl", f"model.pretrained_model_name_or_path={BASE}", "scheduler=euler",
        f"sampling.num_inference_steps={int(REFERENCE['steps'])}", "sampling.height=32", "sampling.width=32", "seed=0",
        f"prompts.texts=[{REFERENCE['prompt']}]", f"sampling.guidance_scale={float(REFERENCE['guidance_scale'])}",
        "parallelism.num_devices=2", "tracking=none", "metrics.clip_score.enabled=false"]
DEVICES = 2


def levels_off(run_dir: Path, case: str) -> float:
    """The largest difference, in 8-bit levels, from the reference's float images made 8-bit."""
    got = np.stack(recorded_pixels(run_dir)).astype(np.float64)
    return float(np.abs(got - np.round(REFERENCE[case] * 255)).max())


@pytest.mark.slow
def test_every_branch_reuses_only_what_feeds_the_layers_it_skips():
    import jax
    import jax.numpy as jnp

    from sdjax_runner.engine.efficiency import cost_flops
    from sdjax_runner.engine.samplers.deep_cache import LEVEL_LAYERS, branch
    from sdjax_runner.families.sd.models.unet import UNet2DConditionModel

    # SD 1.5's layout, small: 2 resnets a level (3 up layers), cross-attention in the first level, 2 levels
    levels = 2
    unet = UNet2DConditionModel(sample_size=8, block_out_channels=(32, 64), layers_per_block=2,
                                down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"),
                                attention_head_dim=2, cross_attention_dim=16)
    params = unet.init_weights(jax.random.PRNGKey(0))
    keys = jax.random.split(jax.random.PRNGKey(1), 3)
    x = jax.random.normal(keys[0], (2, 4, 8, 8))
    context = jax.random.normal(keys[1], (2, 7, 16))
    t = jnp.array([500, 500])

    def calls(params, x, context, t):
        whole = unet.apply({"params": params}, x, t, context).sample
        out = {}
        for number in range(LEVEL_LAYERS * levels):
            deep = branch((("branch", number),))
            kept_run, sown = unet.apply({"params": params}, x, t, context, deep_cache=deep, mutable=["intermediates"])
            (kept,) = jax.tree_util.tree_leaves(sown)
            reused = unet.apply({"params": params}, x, t, context, deep_cache=deep._replace(cached=kept)).sample
            other = kept + jax.random.normal(keys[2], kept.shape, kept.dtype)  # (a constant would be normalized away)
            moved = unet.apply({"params": params}, x, t, context, deep_cache=deep._replace(cached=other)).sample
            out[number] = (kept_run.sample, reused, moved)
        return whole, out

    whole, out = jax.jit(calls)(params, x, context, t)
    for number, (kept_run, reused, moved) in out.items():
        np.testing.assert_array_equal(kept_run, whole, err_msg=f"branch {number}: the whole call is the plain UNet")
        np.testing.assert_allclose(reused, whole, rtol=0, atol=1e-5, err_msg=f"branch {number}")
        assert np.abs(moved - whole).max() > 1e-3, number  # the reused call reads the kept input

    def flops(number):
        deep = branch((("branch", number),))
        kept = jax.eval_shape(lambda: unet.apply({"params": params}, x, t, context, deep_cache=deep,
                                                 mutable=["intermediates"]))[1]
        (shape,) = jax.tree_util.tree_leaves(kept)
        cached = jnp.zeros(shape.shape, shape.dtype)
        return cost_flops(jax.jit(lambda p: unet.apply({"params": p}, x, t, context,
                                                       deep_cache=deep._replace(cached=cached))).lower(params))

    plain = cost_flops(jax.jit(lambda p: unet.apply({"params": p}, x, t, context)).lower(params))
    counts = [flops(number) for number in (0, 2, 5)]  # deeper and deeper branches: more layers run
    assert counts[0] < counts[1] < counts[2] < plain


def helpers_whole_calls(timesteps: list, interval: int, start: int) -> list[bool]:
    """DeepCacheSDHelper (DeepCache 0.1.1, skip_mode "uniform"), transcribed: each call's ``cur_timestep =
    list(scheduler.timesteps).index(t)``, ``start_timestep`` the first call's; a call runs every layer where
    ``(cur_timestep - start_timestep) % cache_interval == 0`` (``is_skip_step`` returns False for every layer)."""
    first = None
    out = []
    for t in timesteps[start:]:
        current = list(timesteps).index(t)
        first = current if first is None else first
        out.append((current - first) % interval == 0)
    return out


@pytest.mark.parametrize("scheduler", ["pndm", "euler"])
@pytest.mark.parametrize("steps", [4, 10])
def test_whole_calls_are_the_helpers_numbering_a_repeated_timestep_twice(scheduler, steps):
    import jax
    import jax.numpy as jnp

    from sdjax_runner.engine.guiders import Guidance
    from sdjax_runner.engine.samplers.deep_cache import whole_call
    from sdjax_runner.families.sd.models.schedulers import EulerDiscreteScheduler, PNDMScheduler

    instance = PNDMScheduler(skip_prk_steps=True) if scheduler == "pndm" else EulerDiscreteScheduler()
    state = instance.set_timesteps(instance.create_state(), num_inference_steps=steps, shape=(1, 4, 8, 8))
    timesteps = np.asarray(state.timesteps)[:steps]
    if scheduler == "pndm":
        assert len(set(timesteps.tolist())) < len(timesteps)  # PLMS repeats its second timestep
    decide = jax.jit(lambda interval, index, start: whole_call(Guidance(7.5, "cfg", cache={"interval": interval}),
                                                               jnp.asarray(timesteps), index, start))
    for interval in (1, 2, 3):
        for start in (0, 1, 3):
            got = [bool(decide(np.float32(interval), index, start)) for index in range(start, steps)]
            assert got == helpers_whole_calls(timesteps.tolist(), interval, start), (interval, start)


@pytest.fixture(scope="module")
def interval_sweep(tmp_path_factory, cache_dir):
    """The reference's run with cache=deepcache at intervals 3, 2 and 1 in one sweep, and plainly."""
    work = tmp_path_factory.mktemp("deep-cache")
    common = (*SDXL, f"paths.cache_dir={cache_dir}")
    sweep = run_cli("-m", *common, "cache=deepcache", "cache.interval=3,2,1", "hydra.sweep.dir=sweep", cwd=work)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    plain = run_cli(*common, "hydra.run.dir=plain", cwd=work)
    assert plain.returncode == 0, plain.stderr[-3000:]
    jobs = {int(records_of(job)[0]["cache_settings"].split()[0].split("=")[1]): job for job in (work / "sweep").glob("[0-9]")}
    return work, sweep, jobs


@pytest.mark.slow
def test_an_interval_sweep_compiles_once_and_is_deepcaches_helper_on_diffusers_pipeline(interval_sweep):
    work, sweep, jobs = interval_sweep
    assert sorted(jobs) == [1, 2, 3]
    timings = {interval: json.loads((job / "timings.json").read_text()) for interval, job in jobs.items()}
    assert sorted(t["compile_reused"] for t in timings.values()) == [0, 1, 1]  # the interval is a traced input
    steps = int(REFERENCE["steps"])
    for interval, case in ((3, "i3_b0"), (2, "i2_b0")):
        assert levels_off(jobs[interval], f"images_{case}") <= 1, case  # within one 8-bit level of the helper's
        assert levels_off(jobs[interval], "plain") > 1, case  # (which the check tells from the plain images)
        # the calls the helper ran on the branch alone, on each device
        assert timings[interval]["denoiser_calls"] == steps * DEVICES
        assert timings[interval]["denoiser_calls_skipped"] == int((1 - REFERENCE[f"whole_{case}"]).sum()) * DEVICES
    # interval 1: every call whole, the plain run's images bit for bit
    assert timings[1]["denoiser_calls_skipped"] == 0
    plain = recorded_pixels(work / "plain")
    assert all(np.array_equal(a, b) for a, b in zip(recorded_pixels(jobs[1]), plain, strict=True))
    assert levels_off(work / "plain", "plain") <= 1
    # the FLOPs count what ran: a call on the branch alone saves the same FLOPs at either interval (interval 1's
    # program is theirs, the plain run's but for the few operations that choose and count the calls)
    flops = {interval: t["flops_per_batch"] for interval, t in timings.items()}
    plain_flops = json.loads((work / "plain" / "timings.json").read_text())["flops_per_batch"]
    assert flops[1] == pytest.approx(plain_flops, rel=1e-5)
    saved = {interval: flops[1] - flops[interval] for interval in (2, 3)}
    skipped = {interval: timings[interval]["denoiser_calls_skipped"] for interval in (2, 3)}
    assert saved[3] > 0 and saved[3] / saved[2] == pytest.approx(skipped[3] / skipped[2], rel=1e-9)
    assert "step cache deepcache (interval 3, branch 0)" in sweep.stdout + sweep.stderr  # the plan line


@pytest.mark.slow
def test_deeper_branches_are_the_helpers_too_in_both_parallel_modes(tmp_path, cache_dir):
    for case in ("i3_b1", "i2_b3", "i3_b5"):
        interval, number = (int(v) for v in REFERENCE[f"settings_{case}"])
        result = run_cli(*SDXL, f"paths.cache_dir={cache_dir}", "cache=deepcache", f"cache.interval={interval}",
                         f"cache.branch={number}", f"hydra.run.dir={case}", cwd=tmp_path)
        assert result.returncode == 0, result.stderr[-3000:]
        assert levels_off(tmp_path / case, f"images_{case}") <= 1, case
        assert levels_off(tmp_path / case, "plain") > 1, case
        skipped = json.loads((tmp_path / case / "timings.json").read_text())["denoiser_calls_skipped"]
        assert skipped == int((1 - REFERENCE[f"whole_{case}"]).sum()) * DEVICES, case
    # the sharded mode (jit of a shard_map: each device its own state) skips as pmap does, with its images
    sharded = run_cli(*SDXL, f"paths.cache_dir={cache_dir}", "cache=deepcache", "cache.interval=2", "cache.branch=3",
                      "parallelism=sharded", "hydra.run.dir=sharded", cwd=tmp_path)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    assert [r["pixels_sha256"] for r in records_of(tmp_path / "sharded")] == \
        [r["pixels_sha256"] for r in records_of(tmp_path / "i2_b3")]
    assert json.loads((tmp_path / "sharded" / "timings.json").read_text())["denoiser_calls_skipped"] == \
        int((1 - REFERENCE["whole_i2_b3"]).sum()) * DEVICES


@pytest.mark.slow
def test_the_records_and_the_infotext_name_it_and_from_png_remakes_the_image(interval_sweep, cache_dir):
    work, _, jobs = interval_sweep
    record = records_of(jobs[3])[0]
    assert (record["cache"], record["cache_settings"]) == ("deepcache", "interval=3 branch=0")
    assert "cache" not in records_of(work / "plain")[0]
    png = jobs[3] / record["file"]
    with Image.open(png) as image:
        assert "Step cache: deepcache, Step cache interval: 3, Step cache branch: 0, " in image.text["parameters"]
    remade = run_cli(str(png), "tracking=none", "metrics.clip_score.enabled=false", f"paths.cache_dir={cache_dir}",
                     f"model.pretrained_model_name_or_path={BASE}", "parallelism.num_devices=2",
                     "hydra.run.dir=from_png", command="from_png", cwd=work)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    for line in ("Step cache: deepcache -> cache=deepcache", "Step cache interval: 3 -> cache.interval=3",
                 "Step cache branch: 0 -> cache.branch=0"):
        assert line in said, line
    assert records_of(work / "from_png")[0]["pixels_sha256"] == record["pixels_sha256"]


@pytest.mark.slow
def test_an_img2img_run_counts_its_calls_from_its_first_step_with_pndms_repeated_timestep(tmp_path, cache_dir):
    """img2img on the smoke model (PNDM, 4 steps: timesteps t0, t1, t1, t2, t3) at strength 0.9 starts at step 1: the
    helper numbers its calls 1, 1, 3 (the repeated timestep counts as the first of its pair), from 1: so at interval 2
    every call is whole (0, 0, 2) and at interval 3 the last is not; interval 1 is the plain img2img bit for bit."""
    common = ("+experiment=smoke", *ONE_DEVICE, "tracking=none", "metrics.clip_score.enabled=false",
              f"paths.cache_dir={cache_dir}", "mode=img2img", f"init_image={FIXTURES.parent.parent / 'examples' / 'init.png'}",
              "strength=0.9")
    plain = run_cli(*common, "hydra.run.dir=plain", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    sweep = run_cli("-m", *common, "cache=deepcache", "cache.interval=1,2,3", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    jobs = {int(records_of(job)[0]["cache_settings"].split()[0].split("=")[1]): job for job in (tmp_path / "sweep").glob("[0-9]")}
    skipped = {interval: json.loads((job / "timings.json").read_text())["denoiser_calls_skipped"]
               for interval, job in jobs.items()}
    assert skipped == {1: 0, 2: 0, 3: 1}  # one device: its calls
    assert [r["pixels_sha256"] for r in records_of(jobs[1])] == [r["pixels_sha256"] for r in records_of(tmp_path / "plain")]
    assert [r["pixels_sha256"] for r in records_of(jobs[3])] != [r["pixels_sha256"] for r in records_of(jobs[1])]


REFINED = [f"model.refiner={FIXTURES / 'refiner' / 'tiny-sdxl-refiner'}"]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["+experiment=flux_smoke", "cache=deepcache"],
     "error: cache: deepcache: tiny-random-flux is a flux model, which runs none, first_block, magcache (allowed: "),
    (["+experiment=smoke", "cache=deepcache", "sampler=DPM++ 2M"],
     "error: cache: deepcache with sampler DPM++ 2M: the cache's state is carried through the model's own sampler's "
     "steps (allowed: the model's own sampler (sampler=null; FLUX.1 and SD 3: euler too), or none)"),
    (["+experiment=smoke", "cache=deepcache", "cache.interval=0"], "error: cache.interval: 0 (allowed: a whole number "),
    (["+experiment=smoke", "cache=deepcache", "cache.branch=-1"], "error: cache.branch: -1 (allowed: a whole number "),
    (["+experiment=smoke", "cache=deepcache", "cache.branch=12"],
     "error: cache.branch: 12: tiny-random's UNet has 2 levels, DeepCache's branches 0 to 5 (level branch // 3, "
     "layer branch % 3) (allowed: a whole number from 0 to 5)"),
    (["+experiment=smoke", "cache=deepcache", "cache.interval=1.5"], "error: cache.interval: "),
    ([*SDXL, *REFINED, "cache=deepcache"],
     "error: cache: deepcache with model.refiner: the refiner's UNet takes over mid-run"),
])
def test_what_deepcache_cannot_run_with_is_one_line(tmp_path, overrides, expected):
    assert_one_line_error(call_cli(*overrides, "tracking=none", cwd=tmp_path), expected)
