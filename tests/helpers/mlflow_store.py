"""MLflow stores for tests: a migrated template copied in, and runs read back."""

from __future__ import annotations

import shutil
import sqlite3
from pathlib import Path


def seed_store(directory: Path, template: Path) -> None:
    """Give ``directory/outputs`` a copy of the migrated store, as if earlier runs had created it."""
    (directory / "outputs").mkdir(parents=True, exist_ok=True)
    shutil.copyfile(template, directory / "outputs" / "mlflow.db")


def mlflow_statuses(work: Path) -> list[str]:
    """The status of every run in ``work``'s embedded store (read with sqlite, no MLflow import)."""
    db = work / "outputs" / "mlflow.db"
    if not db.exists():
        return []
    with sqlite3.connect(db) as conn:
        return [row[0] for row in conn.execute("select status from runs")]


def sweep_runs(work: Path):
    """(client, parent run, child runs sorted by name) of the sweep logged to ``work``'s embedded store."""
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sdjax-runner")
    runs = client.search_runs([experiment.experiment_id])
    [parent] = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = sorted((r for r in runs if r is not parent), key=lambda r: r.info.run_name)
    return client, parent, children


def nothing_written(work: Path) -> bool:
    """No run, re-run or sweep directory and no tracker run under ``work`` (its seeded store aside)."""
    return sorted(p.name for p in (work / "outputs").iterdir()) == ["mlflow.db"] and mlflow_statuses(work) == []
