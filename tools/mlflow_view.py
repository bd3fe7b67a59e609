"""Open the MLflow UI on a store of this runner's runs in a real (headless) browser, and check what a
user sees: the experiment's runs table, every run on a row of its own -- a sweep's points too -- and
each run's self-describing name whole, not cut.

    python tools/mlflow_view.py outputs/mlflow.db --screenshot docs/mlflow_runs_view.png

It starts ``mlflow server`` on the store (127.0.0.1, a free port), opens the link the docs give in
headless Chromium driven by Playwright (Debian: ``apt-get install chromium``; Playwright comes with the
project's test extra and downloads no browser), and prints one line per check. Exit 0 when every check
passes, 1 when one fails, 2 when it cannot run (no Chromium or Playwright, server not ready). Checks:

- the experiment is tagged ``mlflow.experimentKind=custom_model_development`` (model training);
- the link (record/tracking.py: ``ui_link``, ``...#/experiments/ID/runs?orderByKey=attributes.%60Created%60
  &orderByAsc=false&workflowType=machine_learning``) renders the runs table, not the GenAI overview;
- every run has a row as the page opens (the newest 20 where there are more; the table's rows beyond
  the window are drawn as it scrolls). MLflow 3.17 nests a sweep's points under their parent run,
  collapsed, while the table is sorted by its default key, ``attributes.start_time``; whether a parent is
  expanded is kept in the browser only (local storage, left out of MLflow's shared views), never in the
  URL. Sorted by any other key the table lists every run on a row of its own: the link sorts by
  ``attributes.`Created```, which the server reads as the start time (the same order, newest first) and
  the UI shows as "Sort: Created";
- the Run Name column shows every name whole once widened as a person does it: a double-click on the
  right edge of its header fits it to the names. MLflow 3.17 opens it 190 px wide (about 25 characters)
  and keeps no column width in the URL; it keeps the width the person chose, for that experiment, in
  the browser (checked: after a reload the names are still whole);
- ``--run NAME`` (repeatable): these names in particular.
"""

from __future__ import annotations

import argparse
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
# As tests/helpers/browser.py starts it: no sandbox as root, none of its background traffic.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]
NEWEST = 20  # runs checked by name when there are more (rows beyond the window are drawn as the table scrolls)
NAME_COLUMN = 'attributes.`Run Name`'  # the Run Name column's id in MLflow 3.17's runs table
WAIT_S = 60
# Each run name's element in the table and whether it is cut (its text wider than its box: an ellipsis).
NAMES_JS = """column => Array.from(document.querySelectorAll(`.ag-cell[col-id="${column}"]`)).map(cell => {
  const name = cell.querySelector('a[href*="/runs/"] span') || cell.querySelector('a[href*="/runs/"]');
  return name ? [name.textContent, name.scrollWidth > name.clientWidth] : null;
}).filter(Boolean)"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(db: Path, port: int, log: Path) -> subprocess.Popen:
    env = dict(os.environ, MLFLOW_SERVER_ENABLE_JOB_EXECUTION="false", MLFLOW_DISABLE_TELEMETRY="true")
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


def rows(page) -> dict[str, bool]:
    """The run names the table shows, each with whether it is cut."""
    return dict(page.evaluate(NAMES_JS, NAME_COLUMN))


def wait_for_rows(page, names: set[str]) -> dict[str, bool]:
    """The table's rows once every one of ``names`` is there, or as they are after WAIT_S."""
    deadline = time.monotonic() + WAIT_S
    shown = rows(page)
    while not names <= shown.keys() and time.monotonic() < deadline:
        time.sleep(0.5)
        shown = rows(page)
    return shown


def close_assistant(page) -> None:
    """MLflow 3.17 opens its Assistant panel on a first visit; closed, as a person would, for the screenshot."""
    button = page.locator("button[aria-label='Close']")
    if button.count() == 1:
        button.click()


def view(browser: str, url: str, names: set[str], screenshot: Path | None) -> list[tuple[str, bool]]:
    from playwright.sync_api import TimeoutError as PlaywrightTimeout
    from playwright.sync_api import sync_playwright

    checks = []
    with sync_playwright() as playwright:
        chromium = playwright.chromium.launch(executable_path=browser, args=FLAGS, headless=True)
        try:
            page = chromium.new_page(viewport={"width": 1600, "height": 1000})
            page.goto(url, wait_until="load")
            try:
                page.wait_for_selector(f'.ag-header-cell[col-id="{NAME_COLUMN}"]', timeout=WAIT_S * 1000)
                rendered = True
            except PlaywrightTimeout:
                rendered = False
            checks.append(("the runs view rendered (a 'Run Name' column)", rendered))
            checks.append(("not the GenAI overview (no 'Token Usage' panel)", "Token Usage" not in page.content()))
            if not rendered:
                return checks
            shown = wait_for_rows(page, names)
            for name in sorted(names):
                checks.append((f"run {name!r} listed on a row of its own as the page opens", name in shown))
            close_assistant(page)
            page.locator(f'.ag-header-cell[col-id="{NAME_COLUMN}"] .ag-header-cell-resize').first.dblclick()
            time.sleep(1)
            shown = rows(page)
            for name in sorted(names & shown.keys()):
                checks.append((f"run {name!r} whole once the Run Name column is fitted (double-click on its edge)",
                               not shown[name]))
            page.reload(wait_until="load")
            shown = wait_for_rows(page, names)
            checks.append(("after a reload the browser kept the fitted width (no name cut)",
                           bool(shown) and not any(shown.values())))
            if screenshot is not None:
                close_assistant(page)
                time.sleep(1)
                page.screenshot(path=str(screenshot))
        finally:
            chromium.close()
    return checks


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("store", type=Path, help="the embedded store's mlflow.db (under paths.output_root)")
    parser.add_argument("--experiment", default="sdjax-runner")
    parser.add_argument("--run", action="append", default=[], help="a run name that must be visible")
    parser.add_argument("--screenshot", type=Path, help="save a PNG of the runs view here")
    args = parser.parse_args()
    browser = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    if browser is None:
        print("cannot check: no Chromium found (apt-get install chromium)", file=sys.stderr)
        return 2
    try:
        import playwright.sync_api  # noqa: F401
    except ImportError:
        print("cannot check: no Playwright (pip install -e '.[test]'; it drives the system's Chromium)",
              file=sys.stderr)
        return 2
    db = args.store.resolve()
    client = MlflowClient(tracking_uri=f"sqlite:///{db}")
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        print(f"cannot check: no experiment {args.experiment!r} in {db}", file=sys.stderr)
        return 2
    runs = client.search_runs([experiment.experiment_id], order_by=["attributes.start_time DESC"],
                              max_results=NEWEST + 1)
    names = {run.info.run_name for run in runs[:NEWEST]} | set(args.run)
    checks = [(f"experiment tag {k}={v}", experiment.tags.get(k) == v) for k, v in EXPERIMENT_TAGS.items()]
    if len(runs) > NEWEST:
        print(f"note: the newest {NEWEST} runs are checked by name, of more")
    port = free_port()
    with tempfile.TemporaryDirectory() as scratch:
        try:
            server = start_server(db, port, Path(scratch) / "server.log")
        except RuntimeError as exc:
            print(f"cannot check: {exc}", file=sys.stderr)
            return 2
        try:
            checks += view(browser, ui_link(f"http://127.0.0.1:{port}", experiment.experiment_id), names,
                           args.screenshot)
        finally:
            server.terminate()
            server.wait(timeout=30)
    for label, ok in checks:
        print(f"{'ok  ' if ok else 'FAIL'} {label}")
    if args.screenshot:
        print(f"screenshot: {args.screenshot}")
    return 0 if all(ok for _, ok in checks) else 1


if __name__ == "__main__":
    sys.exit(main())
