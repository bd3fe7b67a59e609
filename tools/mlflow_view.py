"""Open the MLflow UI on a store of this runner's runs in a real (headless) browser, and check what a
user sees: the experiment's runs table with the runs' names, not the GenAI overview.

    python tools/mlflow_view.py outputs/mlflow.db --screenshot docs/mlflow_runs_view.png

It starts ``mlflow server`` on the store (a free local port), loads the runs view in headless
Chromium (Debian: ``apt-get install chromium``), and prints one line per check. Exit 0 when every
check passes, 1 when one fails, 2 when it cannot run (no Chromium, server not ready). Checks:

- the experiment is tagged ``mlflow.experimentKind=custom_model_development`` (model training);
- the link this runner prints (``...#/experiments/ID/runs?workflowType=machine_learning``) renders
  the runs table, and every run's name appears in it;
- ``--run NAME`` (repeatable): these names in particular.
"""

from __future__ import annotations

import argparse
import html
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

from mlflow.tracking import MlflowClient

from sdjax_runner.record.tracking import EXPERIMENT_TAGS, ui_link

BROWSERS = ("chromium", "chromium-browser", "google-chrome")


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path, port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false")
    command = [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port),
               "--backend-store-uri", f"sqlite:///{db}", "--artifacts-destination", str(db.parent / "mlartifacts"),
               "--workers", "1"]
    server = subprocess.Popen(command, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
            return server
        except OSError:
            if server.poll() is not None:
                break
            time.sleep(0.5)
    server.kill()
    raise RuntimeError(f"mlflow server did not come up (see {log})")


def render(browser: str, url: str, screenshot: Path | None) -> str:
    """The page's DOM after its scripts ran (and a screenshot of it, if asked)."""
    common = [browser, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
              "--window-size=1600,1000", "--virtual-time-budget=20000"]
    if screenshot is not None:
        subprocess.run([*common, f"--screenshot={screenshot}", url], capture_output=True, timeout=120, check=False)
    result = subprocess.run([*common, "--dump-dom", url], capture_output=True, text=True, timeout=120, check=False)
    return html.unescape(result.stdout)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", type=Path, help="the embedded store's mlflow.db (under paths.output_root)")
    parser.add_argument("--experiment", default="sdjax-runner")
    parser.add_argument("--run", action="append", default=[], help="a run name that must be visible")
    parser.add_argument("--screenshot", type=Path, help="save a PNG of the runs view here")
    args = parser.parse_args()
    browser = next((b for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print("cannot check: no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    db = args.store.resolve()
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        print(f"cannot check: no experiment {args.experiment!r} in {db}", file=sys.stderr)
        return 2
    names = {run.info.run_name for run in client.search_runs([experiment.experiment_id])}
    checks = [(f"experiment tag {k}={v}", experiment.tags.get(k) == v) for k, v in EXPERIMENT_TAGS.items()]
    port = free_port()
    with tempfile.TemporaryDirectory() as scratch:
        try:
            server = start_server(db, port, Path(scratch) / "server.log")
        except RuntimeError as exc:
            print(f"cannot check: {exc}", file=sys.stderr)
            return 2
        try:
            url = ui_link(f"http://127.0.0.1:{port}", experiment.experiment_id)
            dom = render(browser, url, args.screenshot)
        finally:
            server.terminate()
            server.wait(timeout=30)
    checks.append(("the runs view rendered (a 'Run Name' column)", "Run Name" in dom))
    checks.append(("not the GenAI overview (no 'Token Usage' panel)", "Token Usage" not in dom))
    for name in sorted(names | set(args.run)):
        checks.append((f"run {name!r} listed", name in dom))
    for label, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {label}")
    if args.screenshot:
        print(f"screenshot: {args.screenshot}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
