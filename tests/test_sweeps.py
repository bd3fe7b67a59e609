"""Multirun sweeps: load and compile once, a parent run with children, failures that do not sink
the sweep, the persistent compilation cache across processes, and the joblib launcher."""

import csv
import json
import shutil

import numpy as np
import pytest
from PIL import Image

from helpers.cli import ONE_DEVICE, run_cli
from helpers.mlflow_store import sweep_runs as mlflow_runs
from sdjax_runner.record.sweep import job_label, swept_keys


def timings(job_dir):
    return json.loads((job_dir / "timings.json").read_text())


def summary(sweep_dir):
    with open(sweep_dir / "summary.csv", newline="") as f:
        return list(csv.DictReader(f))


def test_sweep_keys_and_labels():
    assert swept_keys(["+experiment=smoke", "seed=0,1", "prompts=guide_single,guide_eight", "tracking=none"]) == [
        "seed", "prompts"]
    assert swept_keys(["sampling.guidance_scale=range(1,3)", "+x=choice(a,b)"]) == ["sampling.guidance_scale", "x"]
    assert job_label(["+experiment=smoke", "seed=1", "prompts=guide_eight"], ["seed", "prompts"]) == \
        "seed=1 prompts=guide_eight"


def test_a_job_whose_records_are_damaged_is_a_blank_row_not_a_failed_summary(tmp_path):
    from sdjax_runner.record.sweep import collect_jobs, write_summary

    for job, seed in ((0, 0), (1, 1)):
        (tmp_path / str(job) / ".hydra").mkdir(parents=True)
        (tmp_path / str(job) / ".hydra" / "overrides.yaml").write_text(f"- +experiment=smoke\n- seed={seed}\n")
    (tmp_path / "0" / "status.json").write_text('{"status": "FINISHED", "run_id": "abc"}')
    (tmp_path / "0" / "timings.json").write_text('{"generate_s": 0.5}')
    (tmp_path / "1" / "status.json").write_text('{"status": "FINI')  # cut short by a full disk
    (tmp_path / "1" / "timings.json").write_bytes(b"\xff\xfe not json")
    write_summary(tmp_path, collect_jobs(tmp_path, ["seed"]), ["seed"])
    rows = summary(tmp_path)
    assert [(r["label"], r["status"], r["generate_s"], r["run_id"]) for r in rows] == [
        ("seed=0", "FINISHED", "0.5", "abc"), ("seed=1", "UNKNOWN", "", "")]


@pytest.mark.slow
def test_each_point_of_a_sweep_is_composed_once_after_the_points_are_checked(tmp_path, monkeypatch):
    """Hydra's basic sweeper composes every point before launching any, and its launcher each again as it runs it:
    the default sweeper (hydra/sweeper=checked) leaves the first pass to the runner's check of the points
    (config/sweep_points.py), which composes the first point and applies the other seeds to it."""
    from hydra._internal.config_loader_impl import ConfigLoaderImpl

    composed: list[list[str]] = []
    load = ConfigLoaderImpl.load_sweep_config

    def counted(self, master_config, sweep_overrides):
        composed.append([o for o in sweep_overrides if o.startswith("seed=")])
        return load(self, master_config, sweep_overrides)

    monkeypatch.setattr(ConfigLoaderImpl, "load_sweep_config", counted)
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "seed=0,1,2", "tracking=none", "metrics.clip_score.enabled=false",
                     *ONE_DEVICE, f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert composed == [["seed=0"], ["seed=0"], ["seed=1"], ["seed=2"]]  # the check's first point, then each job's
    assert [json.loads((sweep / str(i) / "images.json").read_text())[0]["seed"] for i in range(3)] == [0, 1, 2]
    # a bad seed is still refused before any point runs, in one line
    bad = run_cli("-m", "+experiment=smoke", "seed=0,-1", "tracking=none", f"hydra.sweep.dir={tmp_path / 'bad'}",
                  cwd=tmp_path)
    assert bad.returncode == 2 and bad.stderr.strip().startswith("error: seed: ") and not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_seed_sweep_loads_and_compiles_once_under_one_parent_run(tmp_path, tiny_model_dir):
    sweep_dir = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "seed=0,1,2,3", f"hydra.sweep.dir={sweep_dir}",
                     f"compilation_cache.dir={tmp_path / 'xla'}", cwd=tmp_path, steady_timing=True)
    assert result.returncode == 0, result.stderr
    jobs = [sweep_dir / str(i) for i in range(4)]
    assert all(len(list((j / "images").glob("*.png"))) == 8 for j in jobs)
    first, *rest = [timings(j) for j in jobs]
    assert (first["model_reused"], first["compile_reused"], first["compile_s"] > 0) == (0, 0, True)
    assert all((t["model_reused"], t["compile_reused"], t["compile_s"]) == (1, 1, 0.0) for t in rest)
    # The process's own counters: one model load and one compile for the whole sweep.
    assert (rest[-1]["process_model_loads"], rest[-1]["process_compiles"]) == (1, 1)
    assert result.stdout.count("compile: reused from an earlier job of this process") == 3
    # Different seeds, different images.
    grids = [np.asarray(Image.open(j / "grid.png")) for j in jobs]
    assert len({g.tobytes() for g in grids}) == 4

    rows = summary(sweep_dir)
    assert [(r["label"], r["status"]) for r in rows] == [(f"seed={i}", "FINISHED") for i in range(4)]
    # How many timed calls each point's generate_s rests on (its timing re-runs are bounded by
    # timing.max_extra_share of the point's own cost; 0: the first call's figure).
    assert all(r["steady_calls"] in {"0", "1", "2", "3"} for r in rows)
    with Image.open(sweep_dir / "contact_sheet.png") as sheet:
        assert sheet.size[0] == 4 * 256  # one row, a column per seed

    client, parent, children = mlflow_runs(tmp_path)
    assert parent.info.run_name == "smoke sweep" and parent.info.status == "FINISHED"
    assert parent.data.metrics["jobs"] == 4 and parent.data.metrics["failed_jobs"] == 0
    assert {"summary.csv", "contact_sheet.png", "summary_table.json", "sweep.json"} <= {
        a.path for a in client.list_artifacts(parent.info.run_id)}
    assert [c.info.run_name for c in children] == [f"smoke seed={i}" for i in range(4)]
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert all(c.info.status == "FINISHED" for c in children)
    assert [r["run_id"] for r in rows] == [c.info.run_id for c in children]

    # Last week's sweep re-run from its directory: every job checked, in one process that loads the
    # model once and compiles once, as the sweep did.
    rerun = run_cli(str(sweep_dir), "--no-tracking", cwd=tmp_path, command="rerun")
    assert rerun.returncode == 0, rerun.stderr
    assert rerun.stdout.count("rerun: identical -- all 8 image(s) match the record bit for bit") == 4
    assert f"rerun: sweep {sweep_dir}: 4 of 4 job(s) identical" in rerun.stdout
    again = [timings(d) for d in (tmp_path / "outputs" / "reruns").glob("*/*")]
    assert len(again) == 4 and max(t["process_model_loads"] for t in again) == 1
    assert sorted(t["compile_reused"] for t in again) == [0, 1, 1, 1]
    # A job that cannot be re-run (here its record no longer fits the config schema) is named; the rest go on.
    partial = tmp_path / "partial"
    shutil.copytree(sweep_dir, partial, ignore=shutil.ignore_patterns("0", "1"))
    config = partial / "2" / ".hydra" / "config.yaml"
    config.write_text(config.read_text().replace("sampling:\n", "sampling:\n  no_such_key: 0.0\n"))
    rerun = run_cli(str(partial), "--no-tracking", cwd=tmp_path, command="rerun")
    assert rerun.returncode == 2, rerun.stderr
    assert (f"rerun: job 2 could not be re-run: RUN: {partial / '2'}/.hydra/config.yaml does not fit this "
            "version's config schema: sampling.no_such_key: unknown key") in rerun.stdout
    assert rerun.stdout.count("rerun: identical -- all 8 image(s)") == 1
    assert f"rerun: sweep {partial}: 1 of 1 job(s) identical; could not re-run: job(s) 2" in rerun.stdout


@pytest.mark.slow
def test_guidance_sweep_does_not_recompile_and_a_dtype_change_releases_the_old_model(tmp_path, tiny_model_dir):
    # Hydra runs (fp32, 2.0), (fp32, 7.5), (bf16, 2.0), (bf16, 7.5) in that order.
    sweep_dir = tmp_path / "sweep"
    # Stored executables off: this counts what the process itself compiles (test_warm_start covers them).
    result = run_cli("-m", "+experiment=smoke", "dtype=fp32,bf16", "sampling.guidance_scale=2.0,7.5",
                     "tracking=none", "compilation_cache.executables=false", f"hydra.sweep.dir={sweep_dir}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    jobs = [timings(sweep_dir / str(i)) for i in range(4)]
    # Guidance is a traced value: the second guidance scale reuses model and program.
    assert [(t["model_reused"], t["compile_reused"]) for t in jobs] == [(0, 0), (1, 1), (0, 0), (1, 1)]
    # The dtype change loads the model again -- after releasing the fp32 one (reuse.max_models=1).
    assert [(t["process_model_loads"], t["process_compiles"], t["process_models_held"]) for t in jobs] == [
        (1, 1, 1), (1, 1, 1), (2, 2, 1), (2, 2, 1)]
    a, b = (np.asarray(Image.open(sweep_dir / str(i) / "grid.png")) for i in (0, 1))
    assert not np.array_equal(a, b)  # the guidance value really changed the images


@pytest.mark.slow
def test_a_failed_point_does_not_sink_the_sweep(tmp_path, tiny_model_dir):
    sweep_dir = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "sampling.height=64,72,48", f"hydra.sweep.dir={sweep_dir}",
                     cwd=tmp_path)
    assert result.returncode == 1
    assert "Traceback" not in result.stderr
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: sweep: 1 of 3 job(s) failed (#1 sampling.height=72: sampling.height: 72 does "
                           "not fit tiny-random's down-sampling (allowed: multiples of 16))")
    rows = summary(sweep_dir)
    assert [r["status"] for r in rows] == ["FINISHED", "FAILED", "FINISHED"]
    assert "multiples of 16" in rows[1]["error"]
    assert len(list((sweep_dir / "2" / "images").glob("*.png"))) == 8  # the job after the failure ran
    _, parent, children = mlflow_runs(tmp_path)
    assert parent.info.status == "FAILED" and parent.data.metrics["failed_jobs"] == 1
    assert [c.info.status for c in children] == ["FINISHED", "FINISHED", "FAILED"]  # sorted by name: 48, 64, 72
    assert "multiples of 16" in children[2].data.tags["error"]


@pytest.mark.slow
def test_persistent_compilation_cache_serves_a_new_process(tmp_path, tiny_model_dir):
    # JAX's own cache alone: with stored executables (on by default) a warm start would not compile at all.
    cache = [f"compilation_cache.dir={tmp_path / 'xla'}", "compilation_cache.executables=false"]
    cold = run_cli("+experiment=smoke", "tracking=none", *cache, f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    warm = run_cli("+experiment=smoke", "tracking=none", *cache, "seed=5", f"hydra.run.dir={tmp_path / 'b'}",
                   cwd=tmp_path)
    assert cold.returncode == warm.returncode == 0, cold.stderr + warm.stderr
    cold_t, warm_t = timings(tmp_path / "a"), timings(tmp_path / "b")
    assert (cold_t["compile_cache_hit"], warm_t["compile_cache_hit"]) == (0, 1)
    assert warm_t["compile_s"] < cold_t["compile_s"]
    assert any((tmp_path / "xla").iterdir())
    assert "from the persistent compilation cache" in warm.stdout

    # An entry cut short (a run killed, a disk full while JAX wrote it) is removed and written again,
    # not read, warned about and recompiled by every later run.
    entry = max((tmp_path / "xla").glob("*-cache"), key=lambda p: p.stat().st_size)  # the generate program
    whole = entry.stat().st_size
    entry.write_bytes(entry.read_bytes()[: whole // 3])
    cut = run_cli("+experiment=smoke", "tracking=none", *cache, f"hydra.run.dir={tmp_path / 'c'}", cwd=tmp_path)
    again = run_cli("+experiment=smoke", "tracking=none", *cache, f"hydra.run.dir={tmp_path / 'd'}", cwd=tmp_path)
    assert cut.returncode == again.returncode == 0, cut.stderr + again.stderr
    assert f"compilation_cache: entry {entry.name} could not be read" in cut.stdout
    assert "removed, compiling again" in cut.stdout and "Warning" not in cut.stdout + cut.stderr
    assert (timings(tmp_path / "c")["compile_cache_hit"], timings(tmp_path / "d")["compile_cache_hit"]) == (0, 1)
    assert entry.stat().st_size > whole // 3
    hashes = [[r["pixels_sha256"] for r in json.loads((tmp_path / d / "images.json").read_text())] for d in "acd"]
    assert hashes[0] == hashes[1] == hashes[2]


def test_compilation_cache_disabled_leaves_jax_without_one(monkeypatch):
    import jax
    from omegaconf import OmegaConf

    from sdjax_runner import process
    from sdjax_runner.engine import compile_cache

    monkeypatch.setattr(process.current(), "compile_cache", None)  # a process that has configured nothing yet
    earlier = jax.config.jax_compilation_cache_dir  # an earlier test's in-process run may have set one: put back
    jax.config.update("jax_compilation_cache_dir", None)
    try:
        compile_cache.configure(OmegaConf.create({"enabled": False, "dir": "/unused", "min_compile_time_s": 0.0,
                                                 "max_size_gb": None}))
        assert jax.config.jax_compilation_cache_dir is None
    finally:
        jax.config.update("jax_compilation_cache_dir", earlier)


@pytest.mark.timeout(400)
@pytest.mark.slow
def test_joblib_launcher_keeps_the_parent_child_linkage(tmp_path, tiny_model_dir):
    sweep_dir = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "seed=0,1", "hydra/launcher=joblib", "hydra.launcher.n_jobs=2",
                     f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    # Separate processes: each job loads and compiles for itself (the persistent cache may serve it).
    assert all(timings(sweep_dir / str(i))["process_model_loads"] == 1 for i in (0, 1))
    _, parent, children = mlflow_runs(tmp_path)
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)
    assert [r["status"] for r in summary(sweep_dir)] == ["FINISHED", "FINISHED"]


@pytest.mark.slow
def test_a_killed_sweep_resumes_only_its_unfinished_jobs_into_the_same_parent_run(tmp_path, tiny_model_dir):
    import os
    import signal
    import subprocess
    import sys
    import time

    from helpers.cli import assert_one_line_error

    sweep_dir = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    sweep = subprocess.Popen([sys.executable, "-m", "sdjax_runner", "-m", "+experiment=smoke", "seed=0,1,2",
                              f"hydra.sweep.dir={sweep_dir}"], cwd=tmp_path, env=env,
                             stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 240
    while not (sweep_dir / "2" / "status.json").exists() and sweep.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    sweep.send_signal(signal.SIGKILL)  # as a preempted VM: no handler runs
    sweep.wait()
    assert sweep.returncode == -signal.SIGKILL and not (sweep_dir / "summary.csv").exists()
    kept = {n: (sweep_dir / n / "status.json").read_bytes() for n in ("0", "1")}
    assert all(b'"FINISHED"' in status for status in kept.values())
    kept_config = (sweep_dir / "0" / ".hydra" / "config.yaml").stat().st_mtime_ns
    from mlflow.tracking import MlflowClient  # the parent as Ctrl-C leaves it (SIGKILL leaves it RUNNING)

    parent_id = json.loads((sweep_dir / "sweep.json").read_text())["parent_run_id"]
    store = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    store.set_tag(parent_id, "error", "interrupted (SIGINT)")
    store.set_terminated(parent_id, "KILLED")

    elsewhere = tmp_path / "elsewhere"  # resumed from another directory: it runs where the sweep ran
    elsewhere.mkdir()
    result = run_cli(str(sweep_dir), cwd=elsewhere, command="resume")
    assert result.returncode == 0, result.stderr
    assert f"resume: in {tmp_path}, where the sweep was started" in result.stdout
    assert "resume: job 0 (+experiment=smoke seed=0) finished in an earlier attempt; kept" in result.stdout
    assert "resume: job 1 (+experiment=smoke seed=1) finished in an earlier attempt; kept" in result.stdout
    assert "Launching 1 jobs locally" in result.stdout and "#2 : +experiment=smoke seed=2" in result.stdout
    # Finished jobs untouched, the cut-short one set aside (KILLED), job 2 made afresh.
    assert {n: (sweep_dir / n / "status.json").read_bytes() for n in ("0", "1")} == kept
    assert (sweep_dir / "0" / ".hydra" / "config.yaml").stat().st_mtime_ns == kept_config
    assert json.loads((sweep_dir / "earlier_attempts" / "2" / "status.json").read_text())["status"] == "KILLED"
    assert len(list((sweep_dir / "2" / "images").glob("*.png"))) == 8
    assert [(r["label"], r["status"]) for r in summary(sweep_dir)] == [(f"seed={i}", "FINISHED") for i in range(3)]
    record = json.loads((sweep_dir / "sweep.json").read_text())
    assert len(record["resumed_at"]) == 1 and record["parent_logged"] is True
    assert not (elsewhere / "outputs").exists()

    # One parent, reopened and finished; one finished child per seed; the cut-short attempt KILLED.
    _client, parent, children = mlflow_runs(tmp_path)
    assert parent.info.status == "FINISHED" and parent.info.run_id == record["parent_run_id"] == parent_id
    assert "error" not in parent.data.tags
    assert parent.data.metrics["jobs"] == 3 and parent.data.metrics["failed_jobs"] == 0
    finished = [c.info.run_name for c in children if c.info.status == "FINISHED"]
    assert finished == ["smoke seed=0", "smoke seed=1", "smoke seed=2"]
    assert {c.info.status for c in children} <= {"FINISHED", "KILLED"}
    assert all(c.data.tags["mlflow.parentRunId"] == parent.info.run_id for c in children)

    # A sweep whose job still runs is not resumed, nor is a directory that holds no sweep.
    alive = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "sdjax_runner"])
    try:
        status = json.loads(kept["1"])
        (sweep_dir / "1" / "status.json").write_text(json.dumps(dict(status, status="RUNNING", pid=alive.pid)))
        refused = run_cli(str(sweep_dir), cwd=tmp_path, command="resume")
        assert_one_line_error(refused, f"error: hydra.sweep.dir: job 1 of {sweep_dir} is still running (pid {alive.pid})")
        assert not (sweep_dir / "earlier_attempts" / "1").exists()
    finally:
        alive.kill()
    assert_one_line_error(run_cli(str(tmp_path / "nothing"), cwd=tmp_path, command="resume"),
                          f"error: SWEEP_DIR: {tmp_path / 'nothing'} has no readable multirun.yaml")
