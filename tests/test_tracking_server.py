"""``tracking.uri=http://...``: the runner logs to a real MLflow tracking server on loopback."""

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from helpers.cli import free_port, run_cli
from helpers.mlflow_store import mlflow_statuses

pytestmark = [pytest.mark.slow, pytest.mark.server]


def start_server(tmp_path, port):
    """``mlflow server`` on 127.0.0.1 (SQLite store, proxied artifacts, one worker); (process, url) once healthy."""
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination",
         str(tmp_path / "server-artifacts")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while True:
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                if response.status == 200:
                    return server, url
        except OSError as exc:
            if time.monotonic() > deadline or server.poll() is not None:
                stop_server(server)
                raise RuntimeError("mlflow server did not start") from exc
            time.sleep(0.5)


def stop_server(server, sig=signal.SIGTERM):
    os.killpg(server.pid, sig)
    server.wait(timeout=30)


@pytest.fixture
def mlflow_server(tmp_path):
    server, url = start_server(tmp_path, free_port())
    try:
        yield url
    finally:
        stop_server(server)


def test_smoke_run_logs_to_a_tracking_server(tmp_path, mlflow_server, tiny_model_dir):
    from mlflow.tracking import MlflowClient

    result = run_cli("+experiment=smoke", f"tracking.uri={mlflow_server}", "tracking.experiment_name=remote",
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr

    assert mlflow_statuses(tmp_path) == []  # nothing went to the embedded store
    client = MlflowClient(tracking_uri=mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("remote").experiment_id])
    assert run.info.status == "FINISHED" and run.data.params["seed"] == "0"
    assert len(client.list_artifacts(run.info.run_id, "images")) == 8
    grid = client.download_artifacts(run.info.run_id, "grid.png", str(tmp_path))
    assert Path(grid).read_bytes() == (tmp_path / "run" / "grid.png").read_bytes()


def test_tracker_down_loses_nothing_and_sync_logs_it_later_once(tmp_path, mlflow_server, tiny_model_dir):
    from mlflow.tracking import MlflowClient

    run_dir = tmp_path / "run"
    dead = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    result = run_cli("+experiment=smoke", f"tracking.uri={dead}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    warnings = [line for line in result.stdout.splitlines() if "tracking failed" in line]
    assert len(warnings) == 1 and f"python -m sdjax_runner sync {run_dir}" in warnings[0]
    assert "Traceback" not in result.stdout + result.stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["status"], status["logged"]) == ("FINISHED", False) and "Connection refused" in status["tracking_error"]
    assert len(list((run_dir / "images").glob("*.png"))) == 8 and (run_dir / "timings.json").exists()

    sync = [sys.executable, "-m", "sdjax_runner", "sync", str(run_dir), "--uri", mlflow_server]
    first = subprocess.run(sync, capture_output=True, text=True, timeout=120)
    second = subprocess.run(sync, capture_output=True, text=True, timeout=120)
    assert first.returncode == second.returncode == 0, first.stderr + second.stderr
    assert "logged as mlflow run" in first.stdout and second.stdout.strip().endswith("already logged")
    client = MlflowClient(tracking_uri=mlflow_server)
    [run] = client.search_runs([client.get_experiment_by_name("sdjax-runner").experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "smoke"
    timings = json.loads((run_dir / "timings.json").read_text())
    assert run.data.metrics["generate_s"] == pytest.approx(timings["generate_s"])
    assert len(client.list_artifacts(run.info.run_id, "images")) == 8
    assert json.loads((run_dir / "status.json").read_text())["logged"] is True


def test_server_killed_mid_sweep_loses_nothing_and_sync_completes_the_sweep(tmp_path, tiny_model_dir):
    from mlflow.tracking import MlflowClient

    port = free_port()
    server, url = start_server(tmp_path, port)
    sweep = tmp_path / "sweep"
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    proc = subprocess.Popen([sys.executable, "-m", "sdjax_runner", "-m", "+experiment=smoke", "seed=0,1,2",
                             "parallelism.num_batches=3", f"tracking.uri={url}", f"hydra.sweep.dir={sweep}"],
                            cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 240
        while not (sweep / "0" / "status.json").exists() or \
                json.loads((sweep / "0" / "status.json").read_text())["logged"] is not True:
            assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
            time.sleep(0.1)
        stop_server(server, signal.SIGKILL)  # the server dies while job 1 runs
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, stderr
    assert "Traceback" not in stdout + stderr
    statuses = [json.loads((sweep / str(job) / "status.json").read_text()) for job in range(3)]
    assert [s["status"] for s in statuses] == ["FINISHED"] * 3
    assert statuses[0]["logged"] is True and statuses[2]["logged"] is False
    for job in range(3):  # everything is on disk
        assert len(list((sweep / str(job) / "images").glob("*.png"))) == 24
    assert json.loads((sweep / "sweep.json").read_text())["parent_logged"] is False

    server, url = start_server(tmp_path, port)  # back, with the same store
    try:
        sync = [sys.executable, "-m", "sdjax_runner", "sync", str(sweep), "--uri", url]
        first = subprocess.run(sync, capture_output=True, text=True, timeout=180)
        second = subprocess.run(sync, capture_output=True, text=True, timeout=180)
        assert first.returncode == second.returncode == 0, first.stderr + second.stderr
        assert "sweep parent logged" in first.stdout and "sweep parent" not in second.stdout
        client = MlflowClient(tracking_uri=url)
        runs = client.search_runs([client.get_experiment_by_name("sdjax-runner").experiment_id])
        assert sorted(r.info.run_name for r in runs) == ["smoke seed=0", "smoke seed=1", "smoke seed=2", "smoke sweep"]
        assert {r.info.status for r in runs} == {"FINISHED"}
        parent = next(r for r in runs if r.info.run_name == "smoke sweep")
        children = [r for r in runs if r is not parent]
        assert all(r.data.tags["mlflow.parentRunId"] == parent.info.run_id for r in children)
        assert all(len(client.list_artifacts(r.info.run_id, "images")) == 24 for r in children)
    finally:
        stop_server(server)
