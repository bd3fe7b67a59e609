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

from conftest import run_cli
from test_parallelism import free_port


@pytest.fixture
def mlflow_server(tmp_path):
    """``mlflow server`` on 127.0.0.1 (SQLite store, proxied artifacts, one worker); stopped by PID."""
    port = free_port()
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    mlflow = Path(sys.executable).with_name("mlflow")
    server = subprocess.Popen(
        [str(mlflow), "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{tmp_path / 'server.db'}", "--artifacts-destination",
         str(tmp_path / "server-artifacts")],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"{url}/health", timeout=2) as response:
                    if response.status == 200:
                        break
            except OSError:
                if time.monotonic() > deadline or server.poll() is not None:
                    raise RuntimeError("mlflow server did not start")
                time.sleep(0.5)
        yield url
    finally:
        os.killpg(server.pid, signal.SIGTERM)
        server.wait(timeout=30)


def test_smoke_run_logs_to_a_tracking_server(tmp_path, mlflow_server, tiny_model_dir):
    from mlflow.tracking import MlflowClient

    result = run_cli("+experiment=smoke", f"tracking.uri={mlflow_server}", "tracking.experiment_name=remote",
                     f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    from test_bad_input import mlflow_statuses

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
    assert len(warnings) == 1 and f"python -m sdjax_runner.sync {run_dir}" in warnings[0]
    assert "Traceback" not in result.stdout + result.stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["status"], status["logged"]) == ("FINISHED", False) and "Connection refused" in status["tracking_error"]
    assert len(list((run_dir / "images").glob("*.png"))) == 8 and (run_dir / "timings.json").exists()

    sync = [sys.executable, "-m", "sdjax_runner.sync", str(run_dir), "--uri", mlflow_server]
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
