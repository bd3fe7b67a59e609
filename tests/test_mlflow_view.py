"""The MLflow UI a person opens on this runner's runs, in a real headless Chromium (tools/mlflow_view.py,
against ``mlflow server`` bound to 127.0.0.1): through the link the runner and the docs give, a sweep's
points are listed on rows of their own as the page opens (MLflow 3.17 otherwise folds them under their
parent run), and their self-describing names are whole once the Run Name column is fitted, a width the
browser keeps across a reload. (A single run: tests/test_find_and_rerun.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from PIL import Image

from helpers.browser import chromium
from helpers.cli import run_cli
from helpers.mlflow_store import sweep_runs
from sdjax_runner.record.tracking import ui_link

pytestmark = [pytest.mark.slow, pytest.mark.browser, pytest.mark.server]

REPO = Path(__file__).resolve().parent.parent
NAMES = ["smoke sampler=DPM++ 2M Karras", "smoke sampler=DPM++ 2M SDE Karras"]  # past the 190 px MLflow opens with


def test_a_sweeps_points_are_listed_by_their_whole_names(tmp_path, tiny_model_dir):
    chromium()  # the README's test setup installs it: apt-get install chromium
    result = run_cli("-m", "+experiment=smoke", "metrics.clip_score.enabled=false",
                     "sampler=DPM++ 2M Karras,DPM++ 2M SDE Karras", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    _, parent, children = sweep_runs(tmp_path)
    assert [c.info.run_name for c in children] == NAMES and parent.info.run_name == "smoke sweep"
    assert ui_link("http://127.0.0.1:5000", "1") == ("http://127.0.0.1:5000/#/experiments/1/runs?orderByKey="
                                                     "attributes.%60Created%60&orderByAsc=false"
                                                     "&workflowType=machine_learning")
    # report.html links each point to its run page as ui_link makes it (a bare #/runs/ID opened MLflow's GenAI view)
    page = (tmp_path / "sweep" / "report.html").read_text()
    for child in children:
        link = ui_link("http://127.0.0.1:5000", child.info.experiment_id, child.info.run_id).replace("&", "&amp;")
        assert f'href="{link}"' in page, link
    assert "/#/runs/" not in page
    view = subprocess.run([sys.executable, str(REPO / "tools" / "mlflow_view.py"),
                           str(tmp_path / "outputs" / "mlflow.db"), "--screenshot", str(tmp_path / "view.png")],
                          capture_output=True, text=True, timeout=300)
    assert view.returncode == 0, view.stdout + view.stderr
    for name in [*NAMES, "smoke sweep"]:
        assert f"ok   run {name!r} listed on a row of its own as the page opens" in view.stdout
        assert f"ok   run {name!r} whole once the Run Name column is fitted (double-click on its edge)" in view.stdout
    assert "ok   after a reload the browser kept the fitted width (no name cut)" in view.stdout
    assert "FAIL" not in view.stdout
    with Image.open(tmp_path / "view.png") as shot:
        assert shot.size == (1600, 1000)
