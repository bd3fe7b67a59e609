"""Step caches (issue #62, item 2; config/caches.py): First-Block Cache as diffusers' hooks run it, in the one
compiled program (the skip decided on the device), its threshold a traced input.

* models/nn/step_cache.first_block_call against a NumPy transcription of diffusers 0.39's
  ``hooks/first_block_cache.py`` (FBCHeadBlockHook, FBCBlockHook: which calls skip, what they return, what the
  shared state keeps), over a run of calls;
* FLUX.1 from the command line: a threshold sweep compiles once, threshold 0 is the plain run pixel for pixel, a
  threshold no change reaches skips every call after the first, and the records, timings and infotext say so;
* against diffusers' PyTorch FluxPipeline with ``enable_cache(FirstBlockCacheConfig(threshold))`` on the published
  tiny FLUX.1 folder (tests/fixtures/step_cache, made by tests/helpers/make_step_cache_reference.py): the same
  calls skipped, the images within 2/255.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.images import recorded_pixels, records_of

FLUX = Path(__file__).resolve().parent / "fixtures" / "flux"
SD3 = Path(__file__).resolve().parent / "fixtures" / "sd3"
REFERENCE = Path(__file__).resolve().parent / "fixtures" / "step_cache"


class DiffusersFirstBlockCache:
    """diffusers 0.39's First-Block Cache hooks, transcribed in NumPy for a stack of blocks ``head`` then ``rest``
    (each ``(hidden_states, encoder_hidden_states) -> (encoder_hidden_states, hidden_states)``, as FLUX.1's blocks
    return them): FBCSharedBlockState's fields, FBCHeadBlockHook.new_forward and _should_compute_remaining_blocks,
    FBCBlockHook.new_forward for the tail block (the blocks between it and the head return their inputs when
    skipped, so the whole rest is one call here)."""

    def __init__(self, threshold: float):
        self.threshold = threshold
        self.head_block_output = self.head_block_residual = self.tail_block_residuals = None
        self.should_compute = True

    def _should_compute_remaining_blocks(self, hidden_states_residual) -> bool:
        if self.head_block_residual is None:
            return True
        previous = self.head_block_residual
        absmean = np.abs(hidden_states_residual - previous).mean()
        diff = absmean / np.abs(previous).mean()
        return bool(diff > self.threshold)

    def __call__(self, head, rest, hidden_states, encoder_hidden_states):
        context, x = head(hidden_states, encoder_hidden_states)  # FBCHeadBlockHook: the head's own forward
        residual = x - hidden_states
        self.should_compute = self._should_compute_remaining_blocks(residual)
        if not self.should_compute:
            return context + self.tail_block_residuals[1], x + self.tail_block_residuals[0], True
        self.head_block_output = (x, context)
        self.head_block_residual = residual
        out_context, out_x = rest(x, context)  # FBCBlockHook: the blocks run; the tail keeps the residuals
        self.tail_block_residuals = (out_x - self.head_block_output[0], out_context - self.head_block_output[1])
        return out_context, out_x, False


def _toy_blocks():
    """A head and a rest, each a small nonlinear function of both streams (float64 in NumPy, float32 in JAX)."""
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((6, 6)) / 3, rng.standard_normal((6, 6)) / 3

    def head(x, context, np=np):
        return context + 0.1 * np.tanh(context @ b), x + np.tanh(x @ a) + context.mean()

    def rest(x, context, np=np):
        return context * 0.9 + 0.2 * np.sin(x).mean(), x + np.sin(x @ b) * 0.5 - 0.1 * context.mean()

    return head, rest


@pytest.mark.parametrize("threshold", [0.0, 0.03, 0.1, 0.3, 10.0])
def test_first_block_call_is_diffusers_first_block_cache_call_for_call(threshold):
    import jax
    import jax.numpy as jnp

    from sdjax_runner.models.nn.step_cache import first_block_call, first_block_state

    head, rest = _toy_blocks()
    rng = np.random.default_rng(1)
    start, context = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 3, 6))
    drifts = [rng.standard_normal((2, 4, 6)) * scale for scale in (1.0, 0.05, 0.02, 0.5, 0.01, 0.01, 0.3, 0.001)]
    inputs = [start + sum(drifts[:i + 1]) for i in range(len(drifts))]  # the sampler's latents, step by step

    reference = DiffusersFirstBlockCache(threshold)
    expected = [reference(head, rest, x, context) for x in inputs]

    jhead = lambda x, c: head(x, c, np=jnp)  # noqa: E731
    jrest = lambda x, c: rest(x, c, np=jnp)  # noqa: E731

    @jax.jit
    def calls(xs, context, threshold):
        def one(state, x):
            out_context, out_x, state, skipped = first_block_call(jhead, jrest, x, context, state, threshold)
            return state, (out_context, out_x, skipped)

        state = first_block_state(xs.shape[1:], context.shape, jnp.float32)
        return jax.lax.scan(one, state, xs)[1]

    got_context, got_x, skipped = calls(jnp.asarray(np.stack(inputs), jnp.float32),
                                        jnp.asarray(context, jnp.float32), jnp.float32(threshold))
    assert [bool(s) for s in skipped] == [e[2] for e in expected]
    assert not skipped[0]  # the first call runs every block
    for i, (out_context, out_x, _) in enumerate(expected):
        np.testing.assert_allclose(got_x[i], out_x, rtol=0, atol=2e-5)
        np.testing.assert_allclose(got_context[i], out_context, rtol=0, atol=2e-5)
    if threshold == 10.0:  # no change reaches it: every call after the first is skipped
        assert [bool(s) for s in skipped] == [False] + [True] * (len(inputs) - 1)
    if threshold == 0.0:  # every change is over 0: no call is skipped
        assert not any(bool(s) for s in skipped)


class DiffusersMagCache:
    """diffusers 0.39's MagCache hooks (hooks/mag_cache.py), transcribed in NumPy for a stack of blocks run by
    ``blocks`` (``(hidden_states, encoder_hidden_states) -> (encoder_hidden_states, hidden_states)``): MagCacheState's
    fields, MagCacheHeadHook.new_forward's decision and its skipped output, MagCacheBlockHook.new_forward's tail
    (the residual kept, the step advanced; the state reset after the last step)."""

    def __init__(self, threshold: float, max_skip_steps: int, retention_ratio: float, steps: int, ratios):
        self.threshold, self.max_skip_steps, self.retention_ratio, self.steps = (threshold, max_skip_steps,
                                                                                 retention_ratio, steps)
        self.ratios = np.asarray(ratios, np.float32)
        self.previous_residual = None
        self.accumulated_ratio, self.accumulated_err, self.accumulated_steps, self.step_index = 1.0, 0.0, 0, 0

    def __call__(self, blocks, hidden_states, encoder_hidden_states):
        should_compute = True
        current_step = self.step_index
        current_scale = self.ratios[current_step] if current_step < len(self.ratios) else np.float32(1.0)
        retention_step = int(self.retention_ratio * self.steps + 0.5)
        if current_step >= retention_step:
            self.accumulated_ratio = np.float32(self.accumulated_ratio * current_scale)
            self.accumulated_steps += 1
            self.accumulated_err = np.float32(self.accumulated_err + np.float32(abs(np.float32(1.0)
                                                                                    - self.accumulated_ratio)))
            if (self.previous_residual is not None and self.accumulated_err <= self.threshold
                    and self.accumulated_steps <= self.max_skip_steps):
                should_compute = False
            else:
                self.accumulated_ratio, self.accumulated_steps, self.accumulated_err = 1.0, 0, 0.0
        if not should_compute:
            out = (encoder_hidden_states, hidden_states + self.previous_residual)
        else:
            out = blocks(hidden_states, encoder_hidden_states)
            self.previous_residual = out[1] - hidden_states
        self.step_index += 1
        if self.step_index >= self.steps:
            self.step_index, self.previous_residual = 0, None
            self.accumulated_ratio, self.accumulated_steps, self.accumulated_err = 1.0, 0, 0.0
        return out[0], out[1], not should_compute


@pytest.mark.parametrize(("threshold", "max_skip_steps", "retention_ratio", "steps"), [
    (0.06, 3, 0.2, 8), (0.3, 3, 0.2, 8), (1.0, 2, 0.0, 12), (0.1, 1, 0.5, 12), (0.0, 3, 0.2, 28), (0.06, 3, 0.2, 1)])
def test_mag_cache_call_is_diffusers_mag_cache_call_for_call(threshold, max_skip_steps, retention_ratio, steps):
    import jax
    import jax.numpy as jnp

    from sdjax_runner.families.flux.engine.stages import MAG_RATIOS
    from sdjax_runner.models.nn.step_cache import mag_cache_call, mag_ratios, mag_state

    head, rest = _toy_blocks()

    def blocks(x, context, np=np):
        head_context, head_x = head(x, context, np=np)
        return rest(head_x, head_context, np=np)

    # diffusers' nearest_interp, as published: round(arange(steps) * (28 - 1) / (steps - 1)), the last for 1 step
    indices = ([27] if steps == 1 else np.round(np.arange(steps) * (27 / (steps - 1))).astype(int))
    ratios = np.asarray(MAG_RATIOS, np.float32)[indices]
    assert np.array_equal(mag_ratios(MAG_RATIOS, steps), ratios)
    rng = np.random.default_rng(2)
    start, context = rng.standard_normal((2, 4, 6)), rng.standard_normal((2, 3, 6))
    inputs = [start + 0.1 * i * rng.standard_normal((2, 4, 6)) for i in range(steps)]
    reference = DiffusersMagCache(threshold, max_skip_steps, retention_ratio, steps, ratios)
    expected = [reference(blocks, x, context) for x in inputs]

    @jax.jit
    def calls(xs, context, threshold, max_skip_steps, retention_ratio):
        retention_step = jnp.floor(retention_ratio * steps + 0.5)

        def one(state, scanned):
            index, x = scanned
            out_context, out_x, state, skipped = mag_cache_call(
                lambda x, c: blocks(x, c, np=jnp), x, context, state, index, jnp.asarray(ratios)[index], threshold,
                max_skip_steps, retention_step)
            return state, (out_context, out_x, skipped)

        return jax.lax.scan(one, mag_state(xs.shape[1:], jnp.float32), (jnp.arange(steps), xs))[1]

    got_context, got_x, skipped = calls(jnp.asarray(np.stack(inputs), jnp.float32), jnp.asarray(context, jnp.float32),
                                        jnp.float32(threshold), jnp.float32(max_skip_steps),
                                        jnp.float32(retention_ratio))
    assert [bool(s) for s in skipped] == [e[2] for e in expected]
    for i, (out_context, out_x, _) in enumerate(expected):
        np.testing.assert_allclose(got_x[i], out_x, rtol=0, atol=2e-5)
        np.testing.assert_allclose(got_context[i], out_context, rtol=0, atol=2e-5)
    if (threshold, steps) == (0.3, 8):  # a threshold the accumulated error passes: some calls skip, not all
        assert 0 < sum(e[2] for e in expected) < steps


QUIET = ("tracking=none", "metrics.clip_score.enabled=false", "timing.max_extra_share=0")


def reference_run(folder: Path, ref: dict) -> list[str]:
    """The overrides that make a reference's run of ``folder``: its prompt, seed, steps, guidance, size, T5 length and
    devices."""
    return ["model=local", f"model.pretrained_model_name_or_path={folder}", "dtype=fp32",
            f"prompts.texts=[{ref['prompt']}]", f"seed={int(ref['seed'])}",
            f"sampling.num_inference_steps={int(ref['steps'])}", f"sampling.guidance_scale={float(ref['guidance_scale'])}",
            f"sampling.height={int(ref['height'])}", f"sampling.width={int(ref['width'])}",
            f"prompts.max_sequence_length={int(ref['max_sequence_length'])}",
            f"parallelism.num_devices={int(ref['num_devices'])}"]




@pytest.fixture(scope="module")
def threshold_sweep(tmp_path_factory, cache_dir):
    """FLUX.1's smoke on 2 devices: the plain run, then cache=first_block at thresholds 0, 0.05 and 1e6."""
    work = tmp_path_factory.mktemp("first-block")
    common = ("+experiment=flux_smoke", "parallelism.num_devices=2", *QUIET, f"paths.cache_dir={cache_dir}")
    plain = run_cli(*common, "hydra.run.dir=plain", cwd=work)
    assert plain.returncode == 0, plain.stderr[-3000:]
    sweep = run_cli("-m", *common, "cache=first_block", "cache.threshold=0,0.05,1e6", "hydra.sweep.dir=sweep",
                    cwd=work)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    sharded = run_cli(*common, "cache=first_block", "cache.threshold=1e6", "parallelism=sharded",
                      "hydra.run.dir=sharded", cwd=work)
    assert sharded.returncode == 0, sharded.stderr[-3000:]
    return work, sweep


def transformer_call_flops(cache_dir: Path) -> tuple[float, float]:
    """XLA's count (JAX's cost analysis of the lowered call) for one call of the tiny FLUX.1 transformer on the
    sweep's shapes (one image a device a call), whole and with only its first block run (what First-Block
    Cache runs in a skipped call)."""
    import jax
    import jax.numpy as jnp

    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan
    from sdjax_runner.engine.engine import Engine
    from sdjax_runner.families.flux.engine.stages import image_seq_len

    plan = make_plan(admit(compose_cfg(["+experiment=flux_smoke", f"paths.cache_dir={cache_dir}"])), jax.device_count())
    loaded = Engine().load(plan, "cpu").loaded
    transformer, params = loaded.pipeline.transformer, loaded.host_weights["transformer"]
    seq, tokens, batch = image_seq_len(32, 32, loaded.pipeline.vae_scale_factor), 16, 1  # 32x32 images; T5's 16
    shapes = [jax.ShapeDtypeStruct(shape, jnp.float32) for shape in (
        (batch, seq, transformer.in_channels), (batch, tokens, transformer.joint_attention_dim),
        (batch, transformer.pooled_projection_dim), (batch,), (seq, 3), (tokens, 3), (batch,))]

    def count(around):
        def call(p, x, c, y, t, i, j, g):
            return transformer.apply({"params": p}, x, c, y, t, i, j, guidance=g, around_blocks=around)
        return float(jax.jit(call).lower(params, *shapes).cost_analysis()["flops"])

    return count(None), count(lambda head, rest, x, c: (*head(x, c), None))


@pytest.mark.slow
def test_a_threshold_sweep_compiles_once_zero_is_the_plain_run_and_a_large_one_skips_every_later_call(
        threshold_sweep, cache_dir):
    work, sweep = threshold_sweep
    jobs = {float(records_of(job)[0]["cache_settings"].split("=")[1]): job for job in (work / "sweep").glob("[0-9]")}
    assert sorted(jobs) == [0.0, 0.05, 1e6]
    timings = {threshold: json.loads((job / "timings.json").read_text()) for threshold, job in jobs.items()}
    assert sorted(t["compile_reused"] for t in timings.values()) == [0, 1, 1]  # the threshold is a traced input
    steps, devices = 4, 2
    for t in timings.values():
        assert t["denoiser_calls"] == steps * devices
    assert timings[0.0]["denoiser_calls_skipped"] == 0
    # every step's change is below a million: each device runs its first call whole, then the head block alone
    assert timings[1e6]["denoiser_calls_skipped"] == (steps - 1) * devices
    # the FLOPs count what ran: each skipped call still ran the embedders, the first block and the output layers
    whole, head_only = transformer_call_flops(cache_dir)
    skipped_per_batch = (steps - 1) * devices
    assert timings[1e6]["flops_per_batch"] == pytest.approx(
        timings[0.0]["flops_per_batch"] - skipped_per_batch * (whole - head_only), rel=1e-9)
    assert 0 < head_only < whole and timings[1e6]["tflops_per_s"] is not None
    plain = recorded_pixels(work / "plain")
    assert all(np.array_equal(a, b) for a, b in zip(recorded_pixels(jobs[0.0]), plain, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(recorded_pixels(jobs[1e6]), plain, strict=True))
    assert "step cache first_block (threshold 0.05)" in sweep.stdout + sweep.stderr  # the plan line
    # the sharded mode (jit of a shard_map: each device its own state) skips as pmap does, with its images
    sharded = json.loads((work / "sharded" / "timings.json").read_text())
    assert sharded["denoiser_calls_skipped"] == timings[1e6]["denoiser_calls_skipped"]
    assert [r["pixels_sha256"] for r in records_of(work / "sharded")] == [r["pixels_sha256"] for r in records_of(jobs[1e6])]


@pytest.mark.slow
def test_the_records_and_the_infotext_name_the_cache_and_from_png_remakes_the_image(threshold_sweep, cache_dir):
    work, _ = threshold_sweep
    job = next(job for job in (work / "sweep").glob("[0-9]") if records_of(job)[0]["cache_settings"] == "threshold=0.05")
    record = records_of(job)[0]
    assert (record["cache"], record["cache_settings"]) == ("first_block", "threshold=0.05")
    assert "cache" not in records_of(work / "plain")[0]
    png = job / record["file"]
    with Image.open(png) as image:
        assert "Step cache: first_block, Step cache threshold: 0.05, " in image.text["parameters"]
    # laid out as the PNG's run was (2 devices); the T5 length is not in an infotext: the experiment's 16 again
    remade = run_cli(str(png), *QUIET, f"paths.cache_dir={cache_dir}", "parallelism.num_devices=2",
                     "prompts.max_sequence_length=16", "hydra.run.dir=from_png", command="from_png", cwd=work)
    said = remade.stdout + remade.stderr
    assert remade.returncode == 0, said[-3000:]
    assert "Step cache: first_block -> cache=first_block" in said
    assert "Step cache threshold: 0.05 -> cache.threshold=0.05" in said
    assert records_of(work / "from_png")[0]["pixels_sha256"] == record["pixels_sha256"]


@pytest.mark.parametrize(("overrides", "expected"), [
    (["+experiment=smoke", "cache=first_block"],
     "error: cache: first_block: tiny-random is a sd model, which runs none, deepcache (allowed: none, deepcache)"),
    (["+experiment=flux_smoke", "cache=first_block", "sampler=dpmpp_2m"],
     "error: cache: first_block with sampler dpmpp_2m: the cache's state is carried through the model's own "
     "sampler's steps"),
    (["+experiment=flux_smoke", "cache=first_block", "cache.threshold=-1"], "error: cache.threshold: -1.0 (allowed: "),
    (["+experiment=flux_smoke", "cache=magcache", "cache.retention_ratio=1.5"],
     "error: cache.retention_ratio: 1.5 (allowed: a number from 0 to 1"),
    (["+experiment=flux_smoke", "cache=magcache", "cache.max_skip_steps=-1"], "error: cache.max_skip_steps: -1 (allowed: "),
    (["+experiment=flux_smoke", "cache=first_block", "sampling.true_cfg_scale=4", "prompts.negative=blurry"],
     "error: cache: first_block with sampling.true_cfg_scale: true CFG makes two transformer calls a step"),
    (["+experiment=sd3_smoke", "cache=magcache"],
     "error: cache: magcache: tiny-random-sd3 is a sd3 model, which runs none, first_block (allowed: none, first_block)"),
    (["+experiment=sd3_smoke", "cache=first_block", "guider=skip_layer", "guider.layers=[1]"],
     "error: cache: first_block with guider=skip_layer: skip-layer guidance makes a second transformer call"),
    (["+experiment=sd3_smoke", "cache=first_block", "guider=pag"],
     "error: cache: first_block with guider=pag: its perturbed chunk changes what the blocks compute"),
])
def test_what_a_cache_cannot_run_with_is_one_line(tmp_path, overrides, expected):
    assert_one_line_error(call_cli(*overrides, "tracking=none", cwd=tmp_path), expected)


def test_an_unknown_cache_is_one_line(tmp_path):
    result = call_cli("+experiment=flux_smoke", "cache=nope", "tracking=none", cwd=tmp_path)
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert "cache" in result.stderr and "first_block" in result.stderr, result.stderr


@pytest.mark.slow
def test_first_block_skips_as_diffusers_hooks_skip_and_gives_the_pipelines_images(tmp_path, cache_dir):
    """The published tiny FLUX.1 [dev] folder, the reference's prompt, seed and noise (one image on each of 2
    devices): each threshold's job skips as many calls as diffusers' hooks skipped for those images, and its
    images are the pipeline's within 2/255 (issue #46's bound, through the PNG's 8 bits)."""
    ref = dict(np.load(REFERENCE / "first_block.npz"))
    thresholds = [float(t) for t in ref["thresholds"]]
    skipped = {t: ref[f"skipped_{t:g}"] for t in thresholds}
    assert len({int(s.sum()) for s in skipped.values()}) >= 3  # the thresholds give different mixes
    # no change the hooks compared lies within 0.01 of its threshold: float32 rounding cannot flip a decision
    assert all(np.nanmin(np.abs(ref[f"changes_{t:g}"] - t)) > 0.01 for t in thresholds)
    result = run_cli("-m", *reference_run(FLUX / "tiny-flux-dev", ref), "cache=first_block",
                     "cache.threshold=" + ",".join(f"{t:g}" for t in thresholds), *QUIET,
                     f"paths.cache_dir={cache_dir}", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    for job in (tmp_path / "sweep").glob("[0-9]*"):
        records = records_of(job)
        threshold = float(records[0]["cache_settings"].split("=")[1])
        timings = json.loads((job / "timings.json").read_text())
        assert timings["denoiser_calls_skipped"] == int(skipped[threshold].sum()), threshold
        images = ref[f"images_{threshold:g}"]
        for record, pixels in zip(records, recorded_pixels(job), strict=True):
            difference = np.abs(pixels / 255 - images[record["device"]]).max()
            assert difference <= 2 / 255, (threshold, difference)


@pytest.mark.slow
def test_magcache_skips_as_diffusers_hooks_skip_and_gives_the_pipelines_images(tmp_path, cache_dir):
    """MagCache with FLUX.1's published ratios on the published tiny FLUX.1 [dev] folder, from the reference's noise:
    at each of its (threshold, max_skip_steps, retention_ratio) the calls diffusers' hooks skipped (the decision
    reads the ratios alone, so the count says the schedule) and its images within 2/255. The settings sharing a
    max_skip_steps and retention_ratio run as one threshold sweep, which compiles once; the last runs alone."""
    ref = dict(np.load(REFERENCE / "magcache.npz"))
    settings = [(float(t), int(k), float(r)) for t, k, r in ref["settings"]]
    common = (*reference_run(FLUX / "tiny-flux-dev", ref), "cache=magcache", *QUIET, f"paths.cache_dir={cache_dir}")
    swept = [s for s in settings if s[1:] == settings[0][1:]]
    assert len(swept) == 3 and len({s[0] for s in swept}) == 3
    sweep = run_cli("-m", *common, "cache.threshold=" + ",".join(f"{t:g}" for t, _, _ in swept),
                    f"cache.max_skip_steps={swept[0][1]}", f"cache.retention_ratio={swept[0][2]:g}",
                    "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert sweep.returncode == 0, sweep.stderr[-3000:]
    (alone,) = (s for s in settings if s not in swept)
    single = run_cli(*common, f"cache.threshold={alone[0]:g}", f"cache.max_skip_steps={alone[1]}",
                     f"cache.retention_ratio={alone[2]:g}", "hydra.run.dir=alone", cwd=tmp_path)
    assert single.returncode == 0, single.stderr[-3000:]
    jobs = sorted((tmp_path / "sweep").glob("[0-9]")) + [tmp_path / "alone"]
    reused = []
    for job in jobs:
        records = records_of(job)
        values = dict(item.split("=") for item in records[0]["cache_settings"].split())
        number = settings.index((float(values["threshold"]), int(float(values["max_skip_steps"])),
                                 float(values["retention_ratio"])))
        timings = json.loads((job / "timings.json").read_text())
        assert timings["denoiser_calls_skipped"] == int(ref[f"skipped_{number}"].sum()), number
        if job.parent.name == "sweep":
            reused.append(timings["compile_reused"])
        for record, pixels in zip(records, recorded_pixels(job), strict=True):
            difference = np.abs(pixels / 255 - ref[f"images_{number}"][record["device"]]).max()
            assert difference <= 2 / 255, (number, difference)
    assert sorted(reused) == [0, 1, 1]  # every setting a traced input: one program for the sweep
    assert len({int(ref[f"skipped_{n}"].sum()) for n in range(len(settings))}) >= 3


@pytest.mark.slow
def test_first_block_on_sd3_skips_as_diffusers_hooks_skip_and_gives_the_pipelines_images(tmp_path, cache_dir):
    """First-Block Cache on tests/fixtures/sd3/tiny-sd3 (SD 3.5 Medium's shape), from the reference's noise (one image
    on each of 2 devices, both classifier-free guidance halves in one transformer batch, as the pipeline calls it):
    diffusers' hooks with two shims the SD 3 classes need (tests/helpers/make_step_cache_reference.py: a cache context,
    zeros for the last block's text output that nothing reads). Each threshold's job skips the calls the hooks
    skipped, per device, and its images are the pipeline's within 2/255; the threshold sweep compiles once."""
    ref = dict(np.load(REFERENCE / "first_block_sd3.npz"))
    thresholds = [float(t) for t in ref["thresholds"]]
    skipped = {t: ref[f"skipped_{t:g}"] for t in thresholds}
    assert len({int(s.sum()) for s in skipped.values()}) == len(thresholds)  # every threshold its own mix
    assert all(np.nanmin(np.abs(ref[f"changes_{t:g}"] - t)) > 0.01 for t in thresholds)
    result = run_cli("-m", *reference_run(SD3 / "tiny-sd3", ref), "cache=first_block",
                     "cache.threshold=" + ",".join(f"{t:g}" for t in thresholds), *QUIET,
                     f"paths.cache_dir={cache_dir}", "hydra.sweep.dir=sweep", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    reused, flops = [], {}
    for job in (tmp_path / "sweep").glob("[0-9]*"):
        records = records_of(job)
        threshold = float(records[0]["cache_settings"].split("=")[1])
        timings = json.loads((job / "timings.json").read_text())
        assert timings["denoiser_calls_skipped"] == int(skipped[threshold].sum()), threshold
        reused.append(timings["compile_reused"])
        flops[threshold] = timings["flops_per_batch"]
        images = ref[f"images_{threshold:g}"]
        for record, pixels in zip(records, recorded_pixels(job), strict=True):
            difference = np.abs(pixels / 255 - images[record["device"]]).max()
            assert difference <= 2 / 255, (threshold, difference)
    assert sorted(reused) == [0, 1, 1, 1]
    # the executed FLOPs count what ran: fewer as more calls skip their blocks after the first
    assert [flops[t] for t in thresholds] == sorted((flops[t] for t in thresholds), reverse=True)
    assert flops[thresholds[-1]] < 0.8 * flops[0.0]
