"""SLURM through submitit, run here with submitit's local executor (the same code path in local processes):
hydra-submitit-launcher's own ``submitit_local`` (a process per point) works with the runner, and
``hydra/launcher=local_workers`` (sdjax_runner/launchers/array_tasks.py) splits the points into array tasks that
each load and compile once."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import run_cli
from helpers.mlflow_store import sweep_runs

pytestmark = pytest.mark.slow
DEVICES = "parallelism.host_device_count=4"


def images(job_dir: Path) -> list[np.ndarray]:
    return [np.asarray(Image.open(path)) for path in sorted((job_dir / "images").glob("*.png"))]


def record(job_dir: Path, name: str) -> dict:
    return json.loads((job_dir / name).read_text())


def test_hydra_submitit_local_runs_a_process_per_point(tmp_path, tiny_model_dir):
    sweep_dir = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "seed=0,1", DEVICES, "hydra/launcher=submitit_local",
                     f"hydra.sweep.dir={sweep_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    pids = {record(sweep_dir / str(i), "timings.json")["pid"] for i in (0, 1)}
    assert len(pids) == 2  # a process per point: each loads for itself
    assert all(record(sweep_dir / str(i), "timings.json")["process_model_loads"] == 1 for i in (0, 1))
    _, parent, children = sweep_runs(tmp_path)
    assert parent.info.status == "FINISHED" and len(children) == 2
    assert [r["status"] for r in record(sweep_dir, "summary.json")] == ["FINISHED", "FINISHED"]


def test_local_workers_split_the_points_into_array_tasks_that_each_load_and_compile_once(tmp_path,
                                                                                          basic_seed_sweep):
    sweep_dir = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "seed=0,1,2,3,4,5,6,7", DEVICES, "hydra/launcher=local_workers",
                     "hydra.launcher.num_workers=2", "compilation_cache.executables=false",
                     f"hydra.sweep.dir={sweep_dir}", "tracking=none", cwd=tmp_path, timeout=500)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [sweep_dir / str(i) for i in range(8)]
    assert [record(job, "status.json")["status"] for job in jobs] == ["FINISHED"] * 8
    tasks: dict[str, list[dict]] = {}
    for job in jobs:
        timings = record(job, "timings.json")
        tasks.setdefault(timings["worker"], []).append(timings)
    assert sorted(tasks) == ["array task 0", "array task 1"] and all(len(t) == 4 for t in tasks.values())
    for timings in tasks.values():  # one process per task: one load, one compile for its 4 points
        assert len({t["pid"] for t in timings}) == 1
        assert max(t["process_model_loads"] for t in timings) == 1
        assert max(t["process_compiles"] for t in timings) == 1
    for i, job in enumerate(jobs):
        ours, basic = images(job), images(basic_seed_sweep / str(i))
        assert len(ours) == len(basic) == 4
        assert all(np.array_equal(a, b) for a, b in zip(ours, basic, strict=True)), f"job {i}"
    assert len(record(sweep_dir, "summary.json")) == 8
    # the wait says what it waits for (round five: one line, then 25 s of nothing), and no literal %j folder is left
    said = result.stdout + result.stderr
    assert f"sweep: 0 of 8 point(s) done; waiting for 2 array task(s) (loading, compiling, generating: their own " \
           f"logs in {sweep_dir / '.submitit'})" in said
    # points finishing are said as they are seen (polled every 0.5 s, so a count may be skipped under load)
    counts = [int(n) for n in re.findall(r"sweep: (\d+) of 8 point\(s\) done", said)]
    assert counts[0] == 0 and counts == sorted(counts) and any(0 < n <= 8 for n in counts), counts
    assert not (sweep_dir / ".submitit" / "%j").exists()


def test_a_killed_array_task_leaves_its_points_for_resume(tmp_path, tiny_model_dir):
    sweep_dir = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    driver = subprocess.Popen(
        [sys.executable, "-m", "sdjax_runner", "-m", "+experiment=smoke", "seed=0,1,2,3", DEVICES,
         "hydra/launcher=local_workers", "hydra.launcher.num_workers=2", f"hydra.sweep.dir={sweep_dir}",
         "tracking=none"], cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    deadline, killed = time.monotonic() + 240, None
    while killed is None:
        assert time.monotonic() < deadline and driver.poll() is None
        for job in sorted(sweep_dir.glob("[0-9]*")):
            try:
                status = record(job, "status.json")
            except (OSError, ValueError):
                continue
            if status.get("status") == "RUNNING":
                os.kill(status["pid"], signal.SIGKILL)
                killed = int(job.name)
                break
        time.sleep(0.05)
    output, _ = driver.communicate(timeout=400)
    assert driver.returncode == 1, output[-3000:]  # the sweep ends with its summary; the task's points unfinished
    partner = killed + 1 if killed % 2 == 0 else killed - 1  # the same task's other point (shares of 2, in order)
    assert record(sweep_dir / str(killed), "status.json")["status"] == "KILLED"
    assert record(sweep_dir / str(partner), "status.json")["status"] in ("FINISHED", "FAILED")
    other_task = [i for i in range(4) if i not in (killed, partner)]
    assert all(record(sweep_dir / str(i), "status.json")["status"] == "FINISHED" for i in other_task)
    assert "ended early" in output
    resumed = run_cli(str(sweep_dir), command="resume", cwd=tmp_path, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert all(record(sweep_dir / str(i), "status.json")["status"] == "FINISHED" for i in range(4))
