"""FLOPs, MFU, memory, the attention implementations and profiles."""

import functools
import json
import math
import sys

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from helpers.cli import run_cli
from helpers.configs import compose_cfg
from sdjax_runner.engine import efficiency


def prepared_tiny(overrides, experiment="smoke", size=64):
    from sdjax_runner.config.plan import admit, make_plan
    from sdjax_runner.engine.parallel import PARALLEL
    from sdjax_runner.engine.program import program_spec
    from sdjax_runner.engine.reuse import ReuseCache

    cfg = compose_cfg([f"+experiment={experiment}"] + overrides)
    plan = make_plan(admit(cfg), jax.device_count())
    cache = ReuseCache()
    entry, _ = cache.model(plan)
    devices = jax.devices()[: plan.num_devices]
    mode = PARALLEL[plan.mode]
    spec = program_spec(plan, entry.loaded.pipeline, size, size, family=entry.loaded.family)
    prepared = cache.prepare(plan, entry, False, mode, devices, spec)
    generator = mode(prepared.pipeline, prepared.params, None, plan, spec, devices)
    generator.compiled = cache.compile(prepared, generator.lower)[0]
    decoder = generator.lower_decoder().compile()
    generator.install_decoder(decoder, efficiency.program_flops(decoder))
    return cache, prepared, generator, plan


@pytest.mark.parametrize("mode", ["pmap", "sharded"])
@pytest.mark.slow
def test_flops_per_batch_is_xlas_count_of_the_whole_unrolled_sampling_loop(tiny_model_dir, mode):
    session, prepared, generator, plan = prepared_tiny([f"parallelism={mode}", "parallelism.per_device_batch_size=2"])
    flops = session.flops(prepared, generator.compiled, ((plan.num_inference_steps, 64, 64, 2),), plan.num_devices)
    # the sampling program's count and the decoding program's (as the engine adds them: engine/engine.py)
    flops += plan.num_devices * efficiency.program_flops(generator.decoder)
    assert flops == pytest.approx(_diffusers_unrolled_flops(str(tiny_model_dir), tuple(plan.batch_prompts(0)),
                                                            plan.num_inference_steps), rel=0.02)


@functools.lru_cache(maxsize=1)
def _diffusers_unrolled_flops(folder: str, prompts: tuple[str, ...], steps: int) -> float:
    """The reference, counted once for both parallel modes (it is the same whole batch): diffusers 0.39's own Flax
    pipeline on the same folder, its generate function for the whole batch with the loop unrolled (its DEBUG
    switch turns fori_loop into a Python loop), counted by XLA."""
    from diffusers import FlaxStableDiffusionPipeline

    pipeline, weights = FlaxStableDiffusionPipeline.from_pretrained(folder, dtype=jnp.float32, safety_checker=None,
                                                                   feature_extractor=None)
    module = sys.modules[type(pipeline).__module__]
    ids = jnp.asarray(pipeline.prepare_inputs(list(prompts)))
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), weights)
    module.DEBUG = True
    try:
        lowered = jax.jit(lambda i, p, k, g: pipeline._generate(i, p, k, steps, 64, 64, g)
                          ).lower(ids, shapes, jax.random.PRNGKey(0), jnp.float32(7.5))
    finally:
        module.DEBUG = False
    return lowered.cost_analysis()["flops"]


@pytest.mark.parametrize("mode", ["pmap", "sharded"])
@pytest.mark.slow
def test_flux_flops_per_batch_is_xlas_count_of_the_whole_unrolled_sampling_loop(mode, monkeypatch):
    from sdjax_runner.engine.program import generate

    session, prepared, generator, plan = prepared_tiny([f"parallelism={mode}", "parallelism.per_device_batch_size=2",
                                                        "parallelism.num_devices=2"], "flux_smoke", 32)
    flops = session.flops(prepared, generator.compiled, ((plan.num_inference_steps, 32, 32, 2),), plan.num_devices,
                          generator.spec.prompt_tokens)

    # The reference: one device's generation program with the sampling loop unrolled (a Python loop in place of
    # lax.fori_loop), counted by XLA, times the devices.
    def python_loop(lower, upper, body, value):
        for index in range(lower, upper):
            value = body(index, value)
        return value

    monkeypatch.setattr(jax.lax, "fori_loop", python_loop)
    weights = dict(prepared.entry.loaded.host_weights, scheduler={})
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), weights)
    ids = jnp.asarray(generator.tokens(plan.batch_prompts(0)[:2], 0)[0])
    lowered = jax.jit(lambda i, p, k, g: generate(prepared.pipeline, generator.spec, i, p, k, g, {})).lower(
        ids, shapes, jax.random.PRNGKey(0), jnp.float32(3.5))
    assert flops == pytest.approx(plan.num_devices * lowered.cost_analysis()["flops"], rel=0.02)


@pytest.mark.slow
def test_hires_flops_count_both_sampling_loops(tiny_model_dir, monkeypatch):
    """Hires. fix's program has two sampling loops, the second at the upscaled size: the count is XLA's of the
    program with both unrolled."""
    from sdjax_runner.engine.program import generate

    session, prepared, generator, plan = prepared_tiny(["parallelism.num_devices=1", "sampler=Euler",
                                                        "sampling.hires.scale=2", "sampling.hires.steps=3"])
    spec = generator.spec
    passes = ((plan.num_inference_steps, 64, 64, 1), (spec.hires.steps, 128, 128, 1))
    flops = session.flops(prepared, generator.compiled, passes, plan.num_devices)

    def python_loop(lower, upper, body, value):
        for index in range(lower, upper):
            value = body(index, value)
        return value

    monkeypatch.setattr(jax.lax, "fori_loop", python_loop)
    weights = dict(prepared.entry.loaded.host_weights, scheduler=prepared.params["scheduler"])
    shapes = jax.tree_util.tree_map(lambda x: jax.ShapeDtypeStruct(np.shape(x), np.asarray(x).dtype), weights)
    ids = jnp.asarray(generator.tokens(plan.batch_prompts(0)[:1], 0)[0])
    lowered = jax.jit(lambda i, p, k, g: generate(prepared.pipeline, spec, i, p, k, g, {})).lower(
        ids, shapes, jax.random.PRNGKey(0), jnp.float32(7.5))
    # (without the second loop's uncounted steps the count would be short by about a third)
    assert flops == pytest.approx(lowered.cost_analysis()["flops"], rel=0.02)


def test_a_denoiser_calls_flops_are_counted_once_per_module_function_and_shapes(monkeypatch):
    """A sweep compiles a program per sampler or step count around the same denoiser call: its count (a trace of the
    whole model) is made once per process, and anew for another module field (attention), size or dtype."""
    import flax.linen as nn

    class Block(nn.Module):
        features: int
        attention: str = "default"

        @nn.compact
        def __call__(self, x):
            return nn.Dense(self.features)(x) * (2.0 if self.attention == "twice" else 1.0)

    counted = []
    from sdjax_runner import process

    monkeypatch.setattr(process.current(), "call_flops", {})
    monkeypatch.setattr(efficiency, "cost_flops", lambda lowered: counted.append(1) or efficiency._flops(
        lowered.cost_analysis()))

    def flops(module, rows, dtype=jnp.float32):
        x = jax.ShapeDtypeStruct((rows, 16), dtype)
        shapes = jax.eval_shape(module.init, jax.random.PRNGKey(0), x)["params"]
        return efficiency.call_flops(module, lambda p, v: module.apply({"params": p}, v), shapes, x)

    first = flops(Block(8), 4)
    fresh = jax.jit(lambda p, v: Block(8).apply({"params": p}, v)).lower(
        jax.eval_shape(Block(8).init, jax.random.PRNGKey(0), jnp.zeros((4, 16)))["params"],
        jax.ShapeDtypeStruct((4, 16), jnp.float32)).cost_analysis()["flops"]
    assert first == fresh > 0 and len(counted) == 1
    assert flops(Block(8), 4) == first and len(counted) == 1  # the same call: kept
    assert flops(Block(8, attention="twice"), 4) > first and len(counted) == 2  # another field
    assert flops(Block(8), 8) > first and len(counted) == 3  # another size
    assert flops(Block(16), 4) > first and len(counted) == 4
    flops(Block(8), 4, jnp.bfloat16)
    assert len(counted) == 5


def test_efficiency_arithmetic_and_the_peak_table():
    assert efficiency.peak_tflops("NVIDIA H100 80GB HBM3", "bfloat16", None) == 989.4
    assert efficiency.peak_tflops("NVIDIA H100 PCIe", "bfloat16", None) == 756.0
    assert efficiency.peak_tflops("TPU v4", "bfloat16", None) == 275.0
    assert efficiency.peak_tflops("cpu", "float32", None) is None
    assert efficiency.peak_tflops("cpu", "float32", 2.0) == 2.0
    out = efficiency.summary(flops=8e12, seconds=2.0, num_devices=2, peak=10.0)
    assert out["tflops_per_s"] == 4.0 and out["mfu"] == pytest.approx(0.2)
    assert efficiency.summary(8e12, 2.0, 2, None)["mfu"] is None


@pytest.mark.slow
def test_every_run_records_flops_throughput_and_memory(smoke_run):
    from mlflow.tracking import MlflowClient

    work, run_dir, _ = smoke_run
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["flops_per_batch"] > 1e9  # 8 images x 4 guided steps of the tiny UNet, + text encoder, VAE
    assert timings["tflops_per_s"] == pytest.approx(timings["flops_per_batch"] / timings["generate_s"] / 1e12)
    assert timings["mfu"] is None  # CPUs have no entry in the peak table
    assert timings["host_peak_rss_bytes"] > 100e6 and timings["program_memory_bytes"] > 1e6
    status = json.loads((run_dir / "status.json").read_text())
    metrics = MlflowClient(f"sqlite:///{work / 'outputs' / 'mlflow.db'}").get_run(status["run_id"]).data.metrics
    assert metrics["flops_per_batch"] == timings["flops_per_batch"] and "tflops_per_s" in metrics


@pytest.mark.parametrize("attention", ["split_head_dim", "memory_efficient", "dot_product"])
@pytest.mark.slow
def test_attention_implementations_match_the_default_on_cpu(tiny_model_dir, attention):
    """performance.attention on the loaded UNet (the loader's with_scheduler sets it: models/nn/attention.py)."""
    from sdjax_runner.families.sd.models.loading import with_scheduler
    from sdjax_runner.models.loaders import load_model

    cfg = compose_cfg(["+experiment=smoke"])
    loaded = load_model(cfg.model, cfg.dtype)
    params = loaded.host_weights["unet"]
    rng = np.random.default_rng(0)
    sample = jnp.asarray(rng.standard_normal((2, 4, 8, 8)), jnp.float32)
    context = jnp.asarray(rng.standard_normal((2, 77, 32)), jnp.float32)
    timesteps = jnp.array([999, 500], jnp.int32)

    def run(name):
        unet = with_scheduler(loaded, cfg.scheduler, attention=name)[0].unet
        assert unet.attention_implementation == name
        return jax.jit(lambda p: unet.apply({"params": p}, sample, timesteps, context).sample)(params)

    np.testing.assert_allclose(np.asarray(run(attention)), np.asarray(run("default")), rtol=1e-4, atol=1e-5)


@pytest.mark.slow
def test_a_profiled_run_says_which_model_took_the_device_time(tmp_path):
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", "tracking=none", "performance.profile=true", f"hydra.run.dir={run_dir}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    profile = json.loads((run_dir / "profile.json").read_text())
    assert (run_dir / profile["trace"]).is_file()  # the trace itself, for Perfetto / TensorBoard / XProf
    assert profile["attributed"] and set(profile["components"]) <= {"text_encoder", "unet", "vae", "other"}
    assert {"text_encoder", "unet", "vae"} <= set(profile["components"])
    total = sum(c["time_s"] for c in profile["components"].values())
    assert math.isclose(total, profile["device_time_s"], rel_tol=1e-9) and total > 0
    # Attribution by the program's own metadata: a UNet operation runs once per step on each device,
    # a VAE or text-encoder one once per batch on each device (4 steps, 8 devices).
    counts = {op["component"]: op["count"] for op in profile["top_ops"]}
    assert counts["unet"] == 4 * 8 and all(op["count"] == 8 for op in profile["top_ops"]
                                           if op["component"] in ("vae", "text_encoder"))
    assert all("UNet2DConditionModel" in op["op_name"] for op in profile["top_ops"] if op["component"] == "unet")
    assert sum(line["matched_s"] for line in profile["lines"].values()) == pytest.approx(profile["device_time_s"])
    assert profile["wall_s"] > 0 and "profile: device time" in result.stdout + result.stderr


def test_a_profile_says_what_its_instructions_do_not_account_for(tmp_path):
    """Device events that name no instruction of the program (a library's kernel launched under
    another name) are not silently left out: each device line says how much of its time matched."""
    import gzip

    from sdjax_runner.engine import profiling

    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 7, "args": {"name": "Stream #7(Compute)"}},
        {"ph": "M", "name": "process_name", "pid": 2, "args": {"name": "/host:CPU"}},
        {"ph": "X", "pid": 1, "tid": 7, "name": "sm90_xmma_conv", "dur": 300.0, "args": {"hlo_op": "fusion.1"}},
        {"ph": "X", "pid": 1, "tid": 7, "name": "cudnn_generated_sdpa", "dur": 500.0, "args": {}},
        {"ph": "X", "pid": 1, "tid": 8, "name": "fusion.2", "dur": 200.0},
        {"ph": "X", "pid": 2, "tid": 1, "name": "fusion.1", "dur": 9000.0},  # a host thread: not device time
    ]}
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as file:
        json.dump(trace, file)
    instructions = {"fusion.1": ("unet", "UNet2DConditionModel/conv"), "fusion.2": ("vae", "AutoencoderKL/x")}
    summary = profiling.summarize(path, instructions)
    assert summary["attributed"] and math.isclose(summary["device_time_s"], 500e-6)
    assert {k: round(v["time_s"] * 1e6) for k, v in summary["components"].items()} == {"unet": 300, "vae": 200}
    stream = summary["lines"]["/device:GPU:0 Stream #7(Compute)"]
    assert round(stream["time_s"] * 1e6) == 800 and round(stream["matched_s"] * 1e6) == 300
    assert stream["unmatched_top"] == [{"name": "cudnn_generated_sdpa", "time_s": 500e-6}]
    assert round(summary["lines"]["/device:GPU:0 8"]["matched_s"] * 1e6) == 200  # a line with no name: its tid
    assert not any(line.startswith("/host") for line in summary["lines"])


def test_a_profile_places_kernels_run_inside_command_buffers(tmp_path):
    """The H200's trace of SD-1.x (2026-11-27): 1.70 s of kernels on the compute stream for a 1.71 s batch, of which
    the components placed 0.71 s -- the kernels XLA ran inside command buffers (CUDA graphs) carry the buffer's
    name as their operation. These events are copied from that trace (names, hlo_op, the graph's ids): an
    XLA-generated kernel is placed by its own name (the fusion's, '.' written '_'), and every kernel, placed or
    not, is summed by what it does."""
    import gzip

    from sdjax_runner.engine import profiling

    def kernel(name, dur, op="command_buffer_1", graph=True):
        args = {"hlo_module": "jit_per_device", "hlo_op": op}
        if graph:
            args.update(cuda_graph_id="98", cuda_graph_node_id="420906795009")
        return {"ph": "X", "pid": 1, "tid": 14, "name": name, "dur": dur, "args": args}

    trace = {"traceEvents": [
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "/device:GPU:0"}},
        {"ph": "M", "name": "thread_name", "pid": 1, "tid": 14, "args": {"name": "Stream #14(Memset,MemcpyD2D,Compute)"}},
        kernel("loop_multiply_fusion_61", 358.0),
        kernel("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16_knob_7_64x128x64_4x1x1_cga1x1x1_kernel0_0",
               3396.0),
        kernel("nvjet_sm90_tst_128x128_64x6_2x1_v_bz_bias_NNT", 1180.0),
        kernel("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize256x64x32_warpgroupsize1x1x1",
               1463.0),
        kernel("sm90_xmma_fprop_implicit_gemm_bf16bf16_bf16f32_f32_nhwckrsc_nhwc_tilesize128x128x64_warpgroupsize1x1x1",
               313.0, op="cudnn-conv-bias-activation.631", graph=False),
        kernel("loop_convert_fusion_5", 135.0),
        kernel("wrapped_concatenate_1", 30.0),
        kernel("MemcpyD2D", 2.0, op="copy.1", graph=False),
    ]}
    path = tmp_path / "t.trace.json.gz"
    with gzip.open(path, "wt", encoding="utf-8") as file:
        json.dump(trace, file)
    instructions = {"loop_multiply_fusion.61": ("unet", "UNet2DConditionModel/up_blocks_0/mul"),
                    "cudnn-conv-bias-activation.631": ("unet", "UNet2DConditionModel/up_blocks_2/conv"),
                    "loop_convert_fusion.5": ("vae", "AutoencoderKL/decoder/convert")}
    summary = profiling.summarize(path, instructions)
    assert {k: round(v["time_s"] * 1e6) for k, v in summary["components"].items()} == {"unet": 358 + 313, "vae": 135}
    assert {k: round(v["time_s"] * 1e6) for k, v in summary["kinds"].items()} == {
        "attention": 3396, "convolution": 1463 + 313, "matmul": 1180, "fusion": 358 + 135, "copy": 30 + 2}
    stream = summary["lines"]["/device:GPU:0 Stream #14(Memset,MemcpyD2D,Compute)"]
    assert round(stream["matched_s"] * 1e6) == 358 + 313 + 135
    line = profiling.describe(dict(summary, wall_s=0.0069))
    assert "all device events 0.007 s: attention 49%, convolution 26%, matmul 17%, fusion 7%" in line, line
