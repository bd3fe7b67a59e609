"""Bad input: one line naming the key and what is allowed, exit 2, no traceback, no RUNNING run.

Most cases call the command in this process (helpers.cli.call_cli: the same dispatcher, the same one line and
exit status, in milliseconds); a few in every group run it as a user does, in a process of its own
(helpers.cli.run_cli), which is where the exit code the shell sees and the absence of any traceback are
checked for real -- and what needs a process of its own (a JAX that has not started, what gets imported)."""

import json

import pytest

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.mlflow_store import mlflow_statuses

CASES = {
    "unknown option": (["scheduler=nope"], "error: scheduler=nope: no such option (allowed: beta, ddim, ddpm, dpm_solver_pp, "
                                           "euler, exponential, flow_match_euler, karras, lcm, lms, normal, pndm, sgm_uniform, simple)"),
    "unknown experiment": (["+experiment=nope"], "error: experiment=nope: no such option (allowed: flux2_smoke, flux_schnell, flux_schnell_smoke, flux_smoke, guide_different_prompts, guide_same_prompt, kontext_smoke, sd3_smoke, smoke)"),
    "misspelled key": (["sampling.num_inference_step=3"],
                       "error: sampling.num_inference_step: unknown key (allowed: num_inference_steps, guidance_scale, true_cfg_scale, guidance_rescale, height, width, eta, hires, refiner_switch)"),
    "wrong type": (["seed=abc"], "error: seed: Value 'abc' of type 'str' could not be converted to Integer "
                                 "(allowed: an integer)"),
    "wrong type, optional": (["compilation_cache.max_size_gb=lots"], "error: compilation_cache.max_size_gb: Value "
                             "'lots' of type 'str' could not be converted to Float (allowed: a number or null)"),
    "bad enum": (["dtype.weights_dtype=int8"],
                 "error: dtype.weights_dtype: Invalid value 'int8', expected one of [float32, bfloat16, float16]"),
    "height not multiple of 8": (["sampling.height=65"], "error: sampling.height: must be a positive multiple of 8 up "
                                 "to 4096, got 65 (allowed: 8, 16, ..., 512, ..., 4096 or null)"),
    "zero width": (["sampling.width=0"], "error: sampling.width: must be a positive multiple of 8 up to 4096, got 0"),
    "group given a number": (["scheduler=0"], "error: scheduler=0: no such option (allowed: beta, ddim, ddpm, "
                             "dpm_solver_pp, euler, exponential, flow_match_euler, karras, lcm, lms, normal, pndm, sgm_uniform, simple)"),
    "unknown XLA flag": (['performance.xla_flags=["--nonsense_flag=1"]'],
                         "error: performance.xla_flags: XLA rejects them: Unknown flag in XLA_FLAGS: --nonsense_flag=1"),
    "autotune level": (["performance.gpu_autotune_level=9"],
                       "error: performance.gpu_autotune_level: 9 is not a level (allowed: 0..4)"),
    "absurd CPU device count": (["parallelism.host_device_count=1000000"],
                                "error: parallelism.host_device_count: 1000000 CPU devices (allowed: 1..512 or null)"),
    "absurd height": (["sampling.height=1000000"],
                      "error: sampling.height: must be a positive multiple of 8 up to 4096, got 1000000"),
    "absurd step count": (["sampling.num_inference_steps=10000000"],
                          "error: sampling.num_inference_steps: 10000000 is more than this runner allows (allowed: 1..1000)"),
    "absurd image count": (["parallelism.num_batches=100000000"],
                           "error: parallelism.num_batches: 100000000 batch(es) of 8 are 800000000 images"),
    "steps < 1": (["sampling.num_inference_steps=0"],
                  "error: sampling.num_inference_steps: must be a positive integer, got 0 (allowed: 1, 2, 3, ...)"),
    "guidance not finite": (["sampling.guidance_scale=inf"],
                            "error: sampling.guidance_scale: must be a finite number, got inf"),
    "per-device batch < 1": (["parallelism.per_device_batch_size=0"],
                             "error: parallelism.per_device_batch_size: must be a positive integer, got 0"),
    "too many devices": (["parallelism.num_devices=9"],
                         "error: parallelism.num_devices: 9 requested but only 8 available (allowed: 1..8 or null)"),
    "negative timing share": (["timing.max_extra_share=-1"], "error: timing.max_extra_share: must be a share of the "
                              "job's cost, 0 or more, got -1.0 (allowed: 0.5 (the default), 0 (no timing re-runs), "
                              "2, ... or null (no bound))"),
    "empty prompt list": (["prompts.texts=[]"], "error: prompts.texts: no prompts given"),
    "missing prompt file": (["prompts.file=/no/such/prompts.txt"],
                            "error: prompts.file: no such file: /no/such/prompts.txt"),
    "local model without a path": (["model=local"],
                                   "error: model.pretrained_model_name_or_path: a value is required"),
    "missing local model": (["model=local", "model.pretrained_model_name_or_path=/no/such/model"],
                            "error: model.pretrained_model_name_or_path: no such directory: /no/such/model"),
    "cudnn_flash on the CPU": (["performance.attention=cudnn_flash", "dtype=bf16"],
                               "error: performance.attention: cudnn_flash needs an NVIDIA GPU, this run has cpu"),
    "fp16 dot_product on the CPU": (["performance.attention=dot_product", "dtype=fp16"],
                                    "error: performance.attention: dot_product with fp16 activations does not run on "
                                    "the CPU (allowed: default, split_head_dim, memory_efficient; or dtype=bf16, fp32)"),
    "unknown key given with +": (["+sampling.num_inference_step=3"], "error: sampling.num_inference_step: unknown "
                                 "key (allowed: num_inference_steps, guidance_scale, true_cfg_scale, guidance_rescale, height, width, eta, hires, refiner_switch)"),
    "unknown key in a LoRA entry": (["lora=[{path:a.safetensors,scale:1,foo:2}]"],
                                    "error: lora.foo: unknown key (allowed: path, scale)"),
    "unknown key in a LoRA entry given with +": (["+lora=[{path:a.safetensors,foo:2}]"],
                                                "error: lora.foo: unknown key (allowed: path, scale)"),
    "tracking server address without its scheme": (["tracking.uri=127.0.0.1:5000"], "error: tracking.uri: "
                                                   "127.0.0.1:5000 is no URI MLflow can log to (a server's address "
                                                   "needs its scheme: http://127.0.0.1:5000) (allowed: http(s)://"),
    "misspelled tracking URI scheme": (["tracking.uri=htp://mlflow.example.org:5000"],
                                       "error: tracking.uri: MLflow has no store for htp://mlflow.example.org:5000 "
                                       "(scheme 'htp': "),
    "MLflow's file store": (["tracking.uri=file:///tmp/mlruns"], "error: tracking.uri: file:///tmp/mlruns is "
                            "MLflow's file store, which MLflow 3 refuses unless MLFLOW_ALLOW_FILE_STORE=true"),
    "reference that is no run": (["metrics.reference=/no/such/run"],
                                 "error: metrics.reference: /no/such/run is not a finished run directory"),
}


# Run in a process of their own: a composition error (Hydra's), a schema error, a value the plan refuses, and
# the XLA flags, which only a process whose JAX has not started checks (this one's has).
AS_A_PROCESS = {"unknown option", "misspelled key", "height not multiple of 8", "unknown XLA flag"}


@pytest.mark.parametrize("case", CASES)
def test_bad_input_fails_fast_with_one_line(tmp_path, case):
    overrides, expected = CASES[case]
    cli = run_cli if case in AS_A_PROCESS else call_cli
    result = cli("+experiment=smoke", *overrides, cwd=tmp_path)
    assert_one_line_error(result, expected)
    assert "load:" not in result.stdout  # failed before the model loaded
    assert mlflow_statuses(tmp_path) == []  # no tracker run was even started


@pytest.mark.parametrize("point,expected", [
    ("+metrics.reference_point.dtype=fp32", "error: metrics.reference_point: dtype is not swept by this multirun "
                                            "(allowed: seed)"),
    ("+metrics.reference_point.seed=5", "error: metrics.reference_point: seed=5 is not one of the sweep's points "
                                        "(allowed: seed=0, seed=1)"),
    # Every swept value is checked before the sweep starts, not when its job comes up.
    ("dtype=fp32,bogus", "error: dtype=bogus: no such option (allowed: bf16, fp16, fp32)"),
    ("sampling.height=64,65", "error: sampling.height: must be a positive multiple of 8 up to 4096, got 65"),
    ("sampling.num_inference_steps=2,abc", "error: sampling.num_inference_steps: Value 'abc' of type 'str' could "
                                           "not be converted to Integer (allowed: an integer or null)"),
    ("+sampling.num_inference_step=2,3", "error: sampling.num_inference_step: unknown key (allowed: "
                                         "num_inference_steps, guidance_scale, true_cfg_scale, guidance_rescale, height, width, eta, hires, refiner_switch)"),
    ("model=tiny-random,local", "error: model.pretrained_model_name_or_path: a value is required"),
    ("sampling.guidance_scale=interval(1,9)", "error: sampling.guidance_scale: an interval is a search space, and "
                                              "this sweeper runs a list of points"),
    ("hydra.sweeper.max_batch_size=0", "error: hydra.sweeper.max_batch_size: must be a positive number of jobs, "
                                       "got 0 (allowed: 1, 2, 3, ... or null for all the jobs at once)"),
])
def test_a_sweep_with_a_bad_point_is_refused_before_it_starts(tmp_path, point, expected):
    sweep = tmp_path / "sweep"
    cli = run_cli if point == "dtype=fp32,bogus" else call_cli  # one sweep refused in a process of its own
    result = cli("-m", "+experiment=smoke", "seed=0,1", point, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert_one_line_error(result, expected)
    assert not sweep.exists() and mlflow_statuses(tmp_path) == []  # nothing ran, nothing was written


def test_a_sweep_over_a_lora_scale_with_a_bad_value_is_refused_before_it_starts(tmp_path):
    sweep = tmp_path / "sweep"
    result = call_cli("-m", "+experiment=smoke", "lora=[{path: style.safetensors}]", "lora.0.scale=0,nan",
                      f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert_one_line_error(result, "error: lora.0.scale: must be a finite number, got nan (allowed: any finite "
                                  "float, e.g. 0.8)")
    assert not sweep.exists() and mlflow_statuses(tmp_path) == []


@pytest.mark.parametrize("key", ["hydra.run.dir", "paths.output_root", "paths.cache_dir", "compilation_cache.dir",
                                 "hydra.sweep.dir"])
def test_a_directory_under_a_regular_file_is_one_line(tmp_path, key):
    """A path whose parent is a file cannot be made (ENOTDIR): before, mkdir's traceback."""
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    sweep = ["-m", "seed=0,1"] if key == "hydra.sweep.dir" else []
    cli = run_cli if key == "hydra.run.dir" else call_cli  # one in a process of its own
    result = cli(*sweep, "+experiment=smoke", "tracking=none", f"{key}={blocker / 'inside'}", cwd=tmp_path)
    assert_one_line_error(result, f"error: {key}: {blocker / 'inside'}")
    assert f"cannot be made: {blocker} is a file, not a folder (allowed: a path whose existing parts are folders)" \
        in result.stderr
    assert blocker.read_text() == "not a folder"


def test_a_tracking_uri_from_the_environment_is_checked_too_and_a_server_down_is_not_bad_input(tmp_path):
    result = call_cli("+experiment=smoke", cwd=tmp_path, env={"MLFLOW_TRACKING_URI": "localhost:5000"})
    assert_one_line_error(result, "error: MLFLOW_TRACKING_URI: localhost:5000 is no URI MLflow can log to (a "
                                  "server's address needs its scheme: http://localhost:5000)")
    from helpers.configs import compose_cfg
    from sdjax_runner.config.checks import tracking_uri

    # A well-formed server address is not contacted here: whether it answers is for the run to find out.
    tracking_uri(compose_cfg(["+experiment=smoke", "tracking.uri=http://127.0.0.1:9"]).tracking)


def test_empty_prompt_file(tmp_path):
    empty = tmp_path / "prompts.txt"
    empty.write_text("\n   \n", encoding="utf-8")
    run_dir = tmp_path / "run"
    result = call_cli("+experiment=smoke", f"prompts.file={empty}", "prompts.texts=[]", f"hydra.run.dir={run_dir}",
                      cwd=tmp_path)
    assert_one_line_error(result, f"error: prompts.file: {empty} has no prompts")
    # Refused before it started: no run is left behind (as when Hydra itself refuses an override).
    assert not run_dir.exists()
    listed = call_cli("list", str(tmp_path), command="runs", cwd=tmp_path)
    assert listed.returncode == 0 and "no runs under" in listed.stdout, listed.stdout


@pytest.mark.slow
def test_size_the_model_cannot_take_fails_after_load_and_ends_the_run(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", "sampling.height=72", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert_one_line_error(result, "error: sampling.height: 72 does not fit tiny-random's down-sampling "
                                  "(allowed: multiples of 16)")
    assert mlflow_statuses(tmp_path) == ["FAILED"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "FAILED" and "sampling.height" in status["error"]
    assert not (run_dir / "images").exists() and not (run_dir / "timings.json").exists()


@pytest.mark.parametrize("failure", ["device", "host"])
def test_running_out_of_memory_is_one_line_naming_the_batch_and_the_run_is_failed(tmp_path, tiny_model_dir,
                                                                                   monkeypatch, failure):
    """Round five: a run past the device's memory ended in XLA's RESOURCE_EXHAUSTED traceback. The generator's
    first call raises what XLA raises (its message, as a GPU's allocator words it) or a host MemoryError; the
    run ends in one line and is FAILED on disk and in MLflow, with no images."""
    from jax.errors import JaxRuntimeError

    from sdjax_runner.engine.generate import Generator

    def exhausted(self, inputs):
        if failure == "host":
            raise MemoryError()
        raise JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory while trying to allocate 85899345920 bytes.\n"
                              "BufferAssignment OOM Debugging.")

    monkeypatch.setattr(Generator, "_timed", exhausted)
    run_dir = tmp_path / "run"
    result = call_cli("+experiment=smoke", "parallelism.per_device_batch_size=4", f"hydra.run.dir={run_dir}",
                      cwd=tmp_path)
    where = "the host ran out of memory (MemoryError)" if failure == "host" else (
        "the device ran out of memory (RESOURCE_EXHAUSTED: Out of memory while trying to allocate 85899345920 bytes.)")
    assert_one_line_error(result, f"error: parallelism.per_device_batch_size: 64x64, 4 image(s) per device, dtype=fp32: "
                          f"{where} (allowed: fewer images per device (parallelism.per_device_batch_size), a "
                          "smaller sampling.height/width, dtype=bf16, parallelism.params=sharded")
    assert mlflow_statuses(tmp_path) == ["FAILED"]
    status = json.loads((run_dir / "status.json").read_text())
    assert status["status"] == "FAILED" and "ran out of memory" in status["error"]
    assert not list(run_dir.rglob("*.png"))  # (timings.json keeps what the failed job measured: load, compile)


def test_full_error_env_brings_the_traceback_back(tmp_path):
    result = run_cli("+experiment=smoke", "sampling.height=65", cwd=tmp_path, env={"HYDRA_FULL_ERROR": "1"})
    assert result.returncode != 0 and "Traceback" in result.stderr


def test_hostile_prompt_files(tmp_path):
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"a cat\nbinary\x00junk\n")
    result = call_cli("+experiment=smoke", f"prompts.file={nul}", "prompts.texts=[]", cwd=tmp_path)
    assert_one_line_error(result, f"error: prompts.file: {nul} has a NUL byte on line 2: not a text file")
    bad = tmp_path / "latin1.txt"
    bad.write_bytes("caf\xe9\n".encode("latin-1"))
    result = call_cli("+experiment=smoke", f"prompts.file={bad}", "prompts.texts=[]", cwd=tmp_path)
    assert_one_line_error(result, f"error: prompts.file: {bad} is not valid UTF-8 (byte 3)")
    # Read whole, a sparse terabyte (no disk, all the memory) or an endless device is refused unread.
    sparse = tmp_path / "sparse.txt"
    with open(sparse, "wb") as file:
        file.truncate(2**40)
    result = call_cli("+experiment=smoke", f"prompts.file={sparse}", "prompts.texts=[]", cwd=tmp_path)
    assert_one_line_error(result, f"error: prompts.file: {sparse} has 1099.5 GB (allowed: a prompt file of at most 256 MB)")
    result = call_cli("+experiment=smoke", "prompts.file=/dev/zero", "prompts.texts=[]", cwd=tmp_path)
    assert_one_line_error(result, "error: prompts.file: not a regular file: /dev/zero")


def test_huge_prompt_files_plan_quickly(tmp_path):
    """100,000 lines and 10,000-character lines: laid out in a plan in seconds, nothing dropped."""
    import time

    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan

    many = tmp_path / "many.txt"
    many.write_text("".join(f"prompt number {i}\n" for i in range(100_000)), encoding="utf-8")
    long = tmp_path / "long.txt"
    long.write_text(("word " * 2000).strip() + "\nshort\n", encoding="utf-8")
    started = time.perf_counter()
    plan = make_plan(admit(compose_cfg(["+experiment=smoke", f"prompts.file={many}", "prompts.texts=[]"])), 8)
    assert time.perf_counter() - started < 10
    assert len(plan.prompts) == 100_000 and plan.num_batches == 12_500 and plan.images[-1].prompt == "prompt number 99999"
    plan = make_plan(admit(compose_cfg(["+experiment=smoke", f"prompts.file={long}", "prompts.texts=[]"])), 8)
    assert len(plan.prompts[0]) == 9_999 and plan.prompts[1] == "short"


def test_cache_directories_other_users_can_write_are_refused(tmp_path):
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    result = call_cli("+experiment=smoke", f"compilation_cache.dir={shared}", cwd=tmp_path)
    assert_one_line_error(result, f"error: compilation_cache.dir: {shared} is writable by other users, who could "
                                  f"plant code this run would load (allowed: a directory only you can write "
                                  f"(chmod go-w {shared}), or another compilation_cache.dir)")
    shared.chmod(0o775)  # a group that can write plants code as well
    result = call_cli("+experiment=smoke", f"compilation_cache.dir={shared}", cwd=tmp_path)
    assert_one_line_error(result, f"error: compilation_cache.dir: {shared} is writable by its group, who could plant "
                                  "code this run would load")
    shared.chmod(0o777)
    result = call_cli("+experiment=smoke", f"paths.cache_dir={shared / 'new'}", cwd=tmp_path)
    assert_one_line_error(result, f"error: paths.cache_dir: {shared / 'new'} would be created in {shared}, "
                                  "which other users can write")
    assert mlflow_statuses(tmp_path) == []


def test_a_bad_value_is_refused_before_jax_and_the_model_libraries_are_imported(tmp_path):
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "sdjax_runner", "+experiment=smoke",
                             "sampling.num_inference_steps=0"], cwd=tmp_path, capture_output=True, text=True)
    assert result.returncode == 2
    imported = {line.split("|")[-1].strip() for line in result.stderr.splitlines() if line.startswith("import time:")}
    assert "omegaconf" in imported and "hydra" in imported  # the report is there
    assert not imported & {"jax", "flax", "diffusers", "transformers", "mlflow"}, imported & {"jax", "diffusers"}
    errors = [line for line in result.stderr.splitlines() if not line.startswith("import time:")]
    assert errors == ["error: sampling.num_inference_steps: must be a positive integer, got 0 (allowed: 1, 2, 3, ...)"]


@pytest.mark.parametrize("experiment,override", [
    ("flux_smoke", "+scheduler.config_overrides.shift=50"),
    ("flux_smoke", "+scheduler.config_overrides.nonsense=1"),
    ("flux_smoke", "+scheduler.config_overrides.rescale_betas_zero_snr=true"),
    ("sd3_smoke", "+scheduler.config_overrides.timestep_spacing=trailing"),
])
def test_scheduler_settings_a_flow_family_does_not_read_are_refused(tmp_path, experiment, override):
    """Round five: on FLUX.1 and SD 3 these gave the baseline's images bit for bit and were recorded as applied."""
    key = override.lstrip("+").split("=")[0]
    result = call_cli(f"+experiment={experiment}", override, cwd=tmp_path)
    assert_one_line_error(result, f"error: {key}: ")
    assert "whose flow-matching schedule (its shift) is the model's own scheduler/scheduler_config.json's" in result.stderr
    assert "(allowed: none (leave scheduler.config_overrides empty))" in result.stderr and "load:" not in result.stdout


def test_round_five_low_items_refused_cleanly(tmp_path):
    """A refused run under a relative paths.output_root left an empty run folder (a relative path compared with
    an absolute one); -m with one bad value started a sweep; error lines were unbounded (one was 689 kB); a hires
    schedule too long said 'allowed: at least 1e+06' of a strength that is at most 1."""
    result = call_cli("+experiment=smoke", "paths.output_root=outs", "sampling.height=65", cwd=tmp_path)
    assert_one_line_error(result, "error: sampling.height: must be a positive multiple of 8")
    assert not (tmp_path / "outs").exists()
    result = call_cli("-m", "+experiment=smoke", "sampling.height=65", cwd=tmp_path)
    assert_one_line_error(result, "error: sampling.height: must be a positive multiple of 8")
    assert not (tmp_path / "outputs" / "multiruns").exists() and mlflow_statuses(tmp_path) == []
    result = call_cli("+experiment=smoke", "sampler=" + "x" * 100_000, cwd=tmp_path)
    assert_one_line_error(result, "error: sampler: unknown sampler 'xxx")
    line = result.stderr.strip()
    assert len(line) < 4100 and "characters left out] ..." in line and line.endswith(
        "(A1111 names may end in Karras or Exponential))")
    assert_one_line_error(call_cli("+experiment=smoke", "sampling.hires.scale=2", "sampling.hires.steps=1000000000",
                                   cwd=tmp_path),
                          "error: sampling.hires.steps: 1000000000: denoising strength 0.7 with 1000000000 steps makes "
                          "a schedule of 1428571428 steps (steps / strength), more than 1000 (allowed: 1..700 at "
                          "strength 0.7)")


def test_a_program_past_the_hosts_memory_is_one_line_before_it_runs(tmp_path, tiny_model_dir, monkeypatch):
    """Round five: a from_png whose size would need far more memory than the machine has ran until it swapped. On
    CPU devices the compiled program's own plan is weighed against the memory available (here: as if 10 MB were)."""
    from sdjax_runner.engine import engine

    monkeypatch.setattr(engine, "available_host_bytes", lambda: 10 << 20)
    run_dir = tmp_path / "run"
    result = call_cli("+experiment=smoke", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert_one_line_error(result, "error: parallelism.per_device_batch_size: 64x64, 1 image(s) per device on 8 CPU "
                          "devices: the compiled program needs at least ")
    assert "GB (XLA's plan), and this machine has 0.0 GB available (allowed: a smaller sampling.height/width" in \
        result.stderr
    assert not list(run_dir.rglob("*.png")) and json.loads((run_dir / "status.json").read_text())["status"] == "FAILED"
