"""``hydra/launcher=ray``: a sweep's points on long-lived Ray workers (sdjax_runner/launchers/ray_sweep.py), on a
local Ray cluster this module starts bound to 127.0.0.1 (no dashboard, no usage report) and stops by its own
process when the module ends. Two workers with 4 forced CPU devices each; the images are compared with the same
sweep run by Hydra's basic launcher in one process."""

from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, free_port, run_cli
from helpers.mlflow_store import sweep_runs

pytestmark = [pytest.mark.slow, pytest.mark.server]

DEVICES = "parallelism.host_device_count=4"
# A cluster on this host's loopback only (Ray would otherwise bind its node to the host's external address), with
# its own authentication token (a file the fixture writes), given to the head and to every command that connects.
RAY_ENV = {"RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0", "RAY_USAGE_STATS_ENABLED": "0", "RAY_AUTH_MODE": "token"}


def ray_processes(marker: str) -> list[int]:
    """The PIDs of processes whose command line names ``marker`` (the cluster's own temp folder)."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


@pytest.fixture(scope="module")
def ray_address():
    """host:port of a 2-CPU Ray head on 127.0.0.1, stopped (and every process it started) at the end."""
    temp = tempfile.mkdtemp(prefix="ray", dir="/tmp")  # short: Ray's socket paths must fit 107 characters
    port = free_port()
    token = Path(temp) / "auth_token"
    token.write_text(secrets.token_hex(32))
    token.chmod(0o600)
    RAY_ENV["RAY_AUTH_TOKEN_PATH"] = str(token)
    ray = Path(sys.executable).parent / "ray"
    env = {**os.environ, **RAY_ENV}
    head = subprocess.Popen(
        [str(ray), "start", "--head", "--block", "--node-ip-address=127.0.0.1", f"--port={port}", "--num-cpus=2",
         "--num-gpus=0", "--include-dashboard=false", "--disable-usage-stats", f"--temp-dir={temp}",
         f"--metrics-export-port={free_port()}", f"--dashboard-agent-listen-port={free_port()}",
         f"--dashboard-agent-grpc-port={free_port()}", f"--runtime-env-agent-port={free_port()}"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    import socket

    while time.monotonic() < deadline:
        assert head.poll() is None, "ray start --head ended"
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            break
        except OSError:
            time.sleep(0.5)
    time.sleep(2)  # the raylet registers after the GCS answers
    try:
        yield f"127.0.0.1:{port}"
    finally:
        head.send_signal(signal.SIGTERM)  # --block: ray start stops what it started
        try:
            head.wait(timeout=60)
        except subprocess.TimeoutExpired:
            head.kill()
        for pid in ray_processes(temp):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        subprocess.run(["rm", "-rf", temp], check=False)


def ray_cli(*overrides: str, cwd: Path, address: str, timeout: int = 500) -> subprocess.CompletedProcess:
    return run_cli("-m", "+experiment=smoke", *overrides, DEVICES, "hydra/launcher=ray", "hydra.launcher.num_workers=2",
                   f"hydra.launcher.address={address}", cwd=cwd, env=RAY_ENV, timeout=timeout)


def images(job_dir: Path) -> list[np.ndarray]:
    return [np.asarray(Image.open(path)) for path in sorted((job_dir / "images").glob("*.png"))]


def status(job_dir: Path) -> str:
    return json.loads((job_dir / "status.json").read_text())["status"]


def timings(job_dir: Path) -> dict:
    return json.loads((job_dir / "timings.json").read_text())


def test_eight_points_on_two_ray_workers_each_load_and_compile_once(tmp_path, ray_address, basic_seed_sweep):
    sweep_dir = tmp_path / "sweep"
    # No stored executables: each worker traces and compiles its program itself (counted by process_compiles).
    result = ray_cli("seed=0,1,2,3,4,5,6,7", f"hydra.sweep.dir={sweep_dir}", "compilation_cache.executables=false",
                     cwd=tmp_path, address=ray_address)
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = [sweep_dir / str(i) for i in range(8)]
    assert [status(job) for job in jobs] == ["FINISHED"] * 8
    for i, job in enumerate(jobs):  # bit for bit the basic launcher's images
        ours, basic = images(job), images(basic_seed_sweep / str(i))
        assert len(ours) == len(basic) == 4  # smoke: one batch on the 4 devices
        assert all(np.array_equal(a, b) for a, b in zip(ours, basic, strict=True)), f"job {i}"
    by_worker: dict[str, list[dict]] = {}
    for job in jobs:
        record = timings(job)
        assert record["devices"] == "cpu 0-3" and record["host"] and isinstance(record["pid"], int)
        by_worker.setdefault(record["worker"], []).append(record)
    assert sorted(by_worker) == ["ray worker 1", "ray worker 2"]
    for records in by_worker.values():  # each worker: one process, one load, one compile, however many points
        assert len({r["pid"] for r in records}) == 1
        assert max(r["process_model_loads"] for r in records) == 1
        assert max(r["process_compiles"] for r in records) == 1
    assert os.getpid() not in {r["pid"] for records in by_worker.values() for r in records}
    # One sweep: one parent run with a child per point, each naming its worker; the summary and the report.
    _, parent, children = sweep_runs(tmp_path)
    assert parent.info.status == "FINISHED" and len(children) == 8
    assert {c.data.tags["mlflow.parentRunId"] for c in children} == {parent.info.run_id}
    assert all(c.data.tags["sdjax.worker"].startswith("ray worker ") for c in children)
    rows = json.loads((sweep_dir / "summary.json").read_text())
    assert [r["status"] for r in rows] == ["FINISHED"] * 8 and len(rows) == 8
    page = (sweep_dir / "report.html").read_text()
    assert all(f"seed={seed}" in page for seed in range(8))
    listed = run_cli("list", str(sweep_dir), command="runs", cwd=tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert sum("FINISHED" in line for line in listed.stdout.splitlines()) == 8
    # a point re-run on its own (no launcher): its images bit for bit
    rerun = run_cli(str(sweep_dir / "5"), command="rerun", cwd=tmp_path, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert "identical" in (rerun.stdout + rerun.stderr).lower()
    # resume of a finished sweep runs nothing again, on the recorded launcher
    resumed = run_cli(str(sweep_dir), command="resume", cwd=tmp_path, env=RAY_ENV, timeout=300)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert (resumed.stdout + resumed.stderr).count("finished in an earlier attempt; kept") == 8


def kill_first_worker_point(driver: subprocess.Popen, sweep_dir: Path) -> int:
    """SIGKILL the worker process that runs the sweep's first point (status.json names its pid) once it runs."""
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline and driver.poll() is None:
        for job in sorted(sweep_dir.glob("[0-9]*")):
            try:
                record = json.loads((job / "status.json").read_text())
            except (OSError, ValueError):
                continue
            if record.get("status") == "RUNNING" and record.get("pid") != driver.pid:
                os.kill(record["pid"], signal.SIGKILL)
                return int(job.name)
        time.sleep(0.05)
    raise AssertionError("no point started")


def start_driver(tmp_path: Path, address: str, *overrides: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    return subprocess.Popen(
        [sys.executable, "-m", "sdjax_runner", "-m", "+experiment=smoke", "seed=0,1,2,3", DEVICES, "hydra/launcher=ray",
         "hydra.launcher.num_workers=2", f"hydra.launcher.address={address}", *overrides],
        cwd=tmp_path, env={**env, **RAY_ENV}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_killed_worker_leaves_its_point_killed_the_others_finish_and_resume_completes(tmp_path, ray_address,
                                                                                        basic_seed_sweep):
    sweep_dir = tmp_path / "sweep"
    driver = start_driver(tmp_path, ray_address, f"hydra.sweep.dir={sweep_dir}", "hydra.launcher.retries=0")
    killed = kill_first_worker_point(driver, sweep_dir)
    stderr, _ = driver.communicate(timeout=400)
    assert driver.returncode == 1, stderr[-3000:]  # the sweep ends with its summary, one point not finished
    assert stderr.count(f"ray: job {killed} (") == 1 and "died" in stderr
    assert status(sweep_dir / str(killed)) == "KILLED"
    others = [i for i in range(4) if i != killed]
    assert all(status(sweep_dir / str(i)) == "FINISHED" for i in others)
    rows = json.loads((sweep_dir / "summary.json").read_text())
    assert [r["status"] for r in rows].count("FINISHED") == 3
    _, parent, children = sweep_runs(tmp_path)
    assert parent.info.status == "FAILED" and not [c for c in children if c.info.status == "RUNNING"]
    resumed = run_cli(str(sweep_dir), command="resume", cwd=tmp_path, env=RAY_ENV, timeout=400)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert all(status(sweep_dir / str(i)) == "FINISHED" for i in range(4))
    assert all(np.array_equal(a, b) for a, b in zip(images(sweep_dir / str(killed)), images(basic_seed_sweep / str(killed)),
                                                    strict=True))
    assert status(sweep_dir / "earlier_attempts" / str(killed)) == "KILLED"


def test_a_killed_worker_point_runs_again_on_another_worker(tmp_path, ray_address):
    sweep_dir = tmp_path / "sweep"
    driver = start_driver(tmp_path, ray_address, f"hydra.sweep.dir={sweep_dir}", "tracking=none")
    killed = kill_first_worker_point(driver, sweep_dir)
    stderr, _ = driver.communicate(timeout=400)
    assert driver.returncode == 0, stderr[-3000:]
    said = [line for line in stderr.splitlines() if "runs again on another worker" in line]
    assert len(said) == 1 and f"job {killed} (" in said[0], stderr[-3000:]
    assert all(status(sweep_dir / str(i)) == "FINISHED" for i in range(4))
    assert status(sweep_dir / "earlier_attempts" / str(killed)) == "KILLED"
    dead = json.loads((sweep_dir / "earlier_attempts" / str(killed) / "status.json").read_text())["pid"]
    assert timings(sweep_dir / str(killed))["pid"] != dead


def test_ctrl_c_stops_the_workers_and_leaves_no_point_running(tmp_path, ray_address):
    sweep_dir = tmp_path / "sweep"
    driver = start_driver(tmp_path, ray_address, f"hydra.sweep.dir={sweep_dir}")
    deadline = time.monotonic() + 240
    while not any(job.joinpath("status.json").exists() for job in sweep_dir.glob("[0-9]*")):
        assert time.monotonic() < deadline and driver.poll() is None
        time.sleep(0.05)
    driver.send_signal(signal.SIGINT)
    stderr, _ = driver.communicate(timeout=120)
    assert driver.returncode != 0
    states = [status(job) for job in sweep_dir.glob("[0-9]*") if (job / "status.json").exists()]
    assert states and "RUNNING" not in states, stderr[-3000:]
    _, parent, children = sweep_runs(tmp_path)
    assert parent.info.status == "KILLED" and all(c.info.status != "RUNNING" for c in children)


def test_workers_the_cluster_cannot_start_are_one_line_and_the_sweep_runs_no_point(tmp_path, ray_address):
    result = ray_cli("seed=0,1", f"hydra.sweep.dir={tmp_path / 'sweep'}", "hydra.launcher.resources={GPU:1}",
                     "hydra.launcher.start_timeout_s=5", cwd=tmp_path, address=ray_address, timeout=120)
    assert_one_line_error(result, "error: hydra.launcher.resources: GPU: 1 per worker: the cluster did not start 2 "
                                  "such worker(s) within 5 s (allowed: what the cluster has, ")
    assert not list((tmp_path / "sweep").glob("[0-9]*"))  # no point started
    _, parent, children = sweep_runs(tmp_path)
    assert parent.info.status == "FAILED" and not children


def listening(pids: set[int]) -> set[tuple[str, int, str]]:
    """(address, port, process name) of every listening TCP socket of the processes ``pids``."""
    import psutil

    found = set()
    for connection in psutil.net_connections(kind="tcp"):
        if connection.status == psutil.CONN_LISTEN and connection.pid in pids:
            try:
                name = psutil.Process(connection.pid).name()
            except psutil.Error:
                name = "?"
            found.add((connection.laddr.ip, connection.laddr.port, name))
    return found


def is_loopback(address: str) -> bool:
    import ipaddress

    ip = ipaddress.ip_address(address.split("%")[0])
    return ip.is_loopback or (ip.version == 6 and ip.ipv4_mapped is not None and ip.ipv4_mapped.is_loopback)


def test_a_local_cluster_listens_on_loopback_only_while_a_sweep_runs(tmp_path):
    """Round five, HIGH: the local cluster a sweep starts (hydra.launcher.address null) had its GCS server, raylet,
    workers and driver listen on every interface and its runtime-env agent on the host's external address. Every
    listening socket of the command's processes -- the driver and everything it started -- is listed while the
    sweep runs, and each must be 127.0.0.1 (gRPC's IPv4-mapped ::ffff:127.0.0.1 is that too)."""
    import psutil

    driver = subprocess.Popen(
        [sys.executable, "-m", "sdjax_runner", "-m", "+experiment=smoke", "seed=0,1", DEVICES, "hydra/launcher=ray",
         "hydra.launcher.num_workers=1", "tracking=none", f"hydra.sweep.dir={tmp_path / 'sweep'}"],
        cwd=tmp_path, env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")},
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: set[tuple[str, int, str]] = set()
    pids: set[int] = set()
    names: set[str] = set()
    deadline = time.monotonic() + 400
    while driver.poll() is None and time.monotonic() < deadline:
        try:
            tree = [psutil.Process(driver.pid), *psutil.Process(driver.pid).children(recursive=True)]
        except psutil.Error:
            break
        pids |= {p.pid for p in tree}
        names |= {p.name() for p in tree if p.is_running()}
        seen |= listening({p.pid for p in tree})
        time.sleep(0.5)
    output = driver.communicate(timeout=60)[0]
    assert driver.returncode == 0, output[-3000:]
    assert {"gcs_server", "raylet"} <= names, names  # the cluster's own processes were looked at
    assert any(name == "raylet" for _, _, name in seen) and any(name == "gcs_server" for _, _, name in seen), seen
    assert all(is_loopback(address) for address, _, _ in seen), sorted(seen)
    left = [pid for pid in pids if psutil.pid_exists(pid) and psutil.Process(pid).status() != psutil.STATUS_ZOMBIE]
    assert not left, f"processes the sweep started are still running: {left}"


def test_a_local_cluster_too_small_for_the_workers_is_refused_at_once(tmp_path):
    started = time.monotonic()
    result = run_cli("-m", "+experiment=smoke", "seed=0,1", DEVICES, "hydra/launcher=ray", "hydra.launcher.num_workers=2",
                     "hydra.launcher.resources={GPU:1}", "tracking=none", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                     cwd=tmp_path, env={k: v for k, v in os.environ.items() if not k.startswith("RAY_")}, timeout=200)
    assert_one_line_error(result, "error: hydra.launcher.resources: 2 worker(s) of {GPU: 1} need GPU 2 (it has 0) from "
                                  "this host's local cluster (allowed: fewer workers, hydra.launcher.num_workers, or "
                                  "less each)")
    assert time.monotonic() - started < 90  # not the 300 s start timeout
    assert not list((tmp_path / "sweep").glob("[0-9]*"))
