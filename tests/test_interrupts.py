"""SIGINT / SIGTERM mid-run: tracker runs end KILLED, status.json says so, images made so far stay.
A console reader that goes away (``| head``) ends nothing."""

import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
import time

import pytest

from helpers.images import wait_for_images

pytestmark = pytest.mark.slow

ENV_DROP = ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")


def start(tmp_path, *overrides):
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    return subprocess.Popen([sys.executable, "-m", "sdjax_runner", *overrides], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def run_statuses(tmp_path):
    with sqlite3.connect(tmp_path / "outputs" / "mlflow.db") as db:
        return sorted(db.execute("select name, status from runs").fetchall())


@pytest.mark.parametrize("sig,code,reason", [(signal.SIGTERM, 143, "terminated (SIGTERM)"),
                                             (signal.SIGINT, 130, "interrupted (SIGINT)")])
def test_a_signal_ends_the_run_killed_and_keeps_the_images(tmp_path, tiny_model_dir, sig, code, reason):
    run_dir = tmp_path / "run"
    proc = start(tmp_path, "+experiment=smoke", "parallelism.num_batches=500", f"hydra.run.dir={run_dir}")
    # PNGs are written one after another, each at its own name: with 17 there, 16 are whole (the one
    # being written when the signal lands is removed, not left half-written).
    wait_for_images(run_dir / "images", 17, proc)
    proc.send_signal(sig)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == code
    assert stderr.strip().splitlines()[-1] == f"error: {reason}" and "Traceback" not in stderr
    status = json.loads((run_dir / "status.json").read_text())
    assert (status["status"], status["error"]) == ("KILLED", reason)
    assert len(list((run_dir / "images").glob("*.png"))) >= 16
    assert run_statuses(tmp_path) == [("smoke parallelism.num_batches=500", "KILLED")]
    # What was finished is kept and logged: timings so far (marked partial) and the images written.
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings["partial"] == 1 and timings["batches_done"] >= 2 and timings["compile_s"] > 0
    records = json.loads((run_dir / "images.json").read_text())
    assert len(records) >= 16 and 8 * timings["batches_done"] <= len(records) <= 8 * (timings["batches_done"] + 1)
    with sqlite3.connect(tmp_path / "outputs" / "mlflow.db") as db:
        metrics = dict(db.execute("select key, value from latest_metrics").fetchall())
    assert metrics["batches_done"] == timings["batches_done"] and metrics["partial"] == 1


def test_a_terminated_sweep_leaves_no_run_running(tmp_path, tiny_model_dir):
    sweep_dir = tmp_path / "sweep"
    proc = start(tmp_path, "-m", "+experiment=smoke", "seed=0,1,2", "parallelism.num_batches=500",
                 f"hydra.sweep.dir={sweep_dir}")
    wait_for_images(sweep_dir / "0" / "images", 16, proc)
    proc.send_signal(signal.SIGTERM)
    proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert run_statuses(tmp_path) == [("smoke seed=0", "KILLED"), ("smoke sweep", "KILLED")]
    assert not (sweep_dir / "1").exists()  # the sweep stopped


def test_a_signal_ends_a_rerun_killed_too(smoke_run, tmp_path):
    """A re-run is a run: a scheduler's SIGTERM ends it KILLED (status.json and MLflow), one line, 143."""
    _, original, _ = smoke_run
    record = tmp_path / "record"
    shutil.copytree(original, record)
    config = record / ".hydra" / "config.yaml"
    assert "  num_batches: null\n" in config.read_text()  # a long re-run of a short record
    config.write_text(config.read_text().replace("  num_batches: null\n", "  num_batches: 500\n"))
    env = {k: v for k, v in os.environ.items() if k not in ENV_DROP}
    proc = subprocess.Popen([sys.executable, "-m", "sdjax_runner", "rerun", str(record)], cwd=tmp_path, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while not list((tmp_path / "outputs" / "reruns").glob("*/*/images")) and time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()
        time.sleep(0.1)
    [images] = (tmp_path / "outputs" / "reruns").glob("*/*/images")
    wait_for_images(images, 17, proc)
    proc.send_signal(signal.SIGTERM)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 143
    assert stderr.strip().splitlines()[-1] == "error: terminated (SIGTERM)" and "Traceback" not in stderr
    status = json.loads((images.parent / "status.json").read_text())
    assert (status["status"], status["error"]) == ("KILLED", "terminated (SIGTERM)")
    assert run_statuses(tmp_path) == [("smoke rerun", "KILLED")]


def test_a_console_reader_that_stops_reading_ends_nothing(tmp_path, tiny_model_dir):
    # `python -m sdjax_runner ... | head -1`: before, the run went on but printed a logging-error
    # traceback for each of its later lines.
    run_dir = tmp_path / "run"
    proc = start(tmp_path, "+experiment=smoke", "tracking=none", f"hydra.run.dir={run_dir}")
    assert "plan:" in proc.stdout.readline()
    proc.stdout.close()
    stderr = proc.stderr.read()
    assert proc.wait(timeout=300) == 0 and "Logging error" not in stderr and "Traceback" not in stderr, stderr
    assert json.loads((run_dir / "status.json").read_text())["status"] == "FINISHED"
    assert len(list((run_dir / "images").glob("*.png"))) == 8
    assert "write: 8 image(s) + grid" in (run_dir / "run.log").read_text()  # the lines still reach run.log
