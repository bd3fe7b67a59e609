"""Run directory -> tracker. Everything logged here was written to disk first.

``tracking=mlflow`` logs one MLflow run per job through ``MlflowClient`` (no
global active-run state, so multirun jobs in one process cannot mix up).
With ``tracking.uri: null`` (and no ``MLFLOW_TRACKING_URI``) the store is
embedded at a fixed place under ``paths.output_root``: ``mlflow.db`` and
``mlartifacts/``. ``tracking=none`` logs nothing.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.config.schema import TrackingConfig
from sdjax_runner.console import one_line
from sdjax_runner.metrics.comparison import table_rows
from sdjax_runner.metrics.registry import METRICS
from sdjax_runner.record import rundir

# The experiment's kind for MLflow 3's UI (model training, not GenAI): the UI redirects an experiment
# link to the view its kind calls for. (3.17's UI also keeps a GenAI/model-training switch of its own,
# defaulting to GenAI: links printed here carry workflowType=machine_learning; see ui_link.)
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}
# How the database behind an MLflow store (SQLite, PostgreSQL, MySQL) reports an insert that breaks a
# unique key -- through MlflowClient directly or in a tracking server's error response.
DUPLICATE_KEY_ERRORS = ("UNIQUE constraint failed", "duplicate key value", "Duplicate entry")
NOTE = "mlflow.note.content"  # the run's Description in the UI
# The numbers a run's description ends with once it has them (metric key, label, format).
HEADLINE = (("images_per_s", "images/s", "{:.3g}"), ("generate_s", "s/batch", "{:.3g}"),
            ("compile_s", "compile s", "{:.3g}"),
            *((m.run_field, m.label, m.shown) for m in METRICS.values()))  # metrics/registry.py


def headline_line(metrics: dict[str, float]) -> str:
    parts = [f"{label} {fmt.format(metrics[key])}" for key, label, fmt in HEADLINE if key in metrics]
    return ("**" + ", ".join(parts) + "**") if parts else ""


# The experiment's runs table with every run on a row of its own, newest first: MLflow 3.17's UI nests a
# sweep's points under their parent run, collapsed, only while the table is sorted by its default key
# (attributes.start_time); which parents are expanded it keeps in the browser, never in the URL. Sorted by
# attributes.`Created` -- the start time to the server, "Sort: Created" in the UI -- it nests nothing.
# (tools/mlflow_view.py checks this in a browser.)
RUNS_ORDER = "orderByKey=attributes.%60Created%60&orderByAsc=false"


def ui_link(uri: str, experiment_id: Optional[str], run_id: Optional[str] = None) -> str:
    """The MLflow UI page of a run, or the experiment's runs table listing every run, a sweep's points
    too (RUNS_ORDER), in the runs view: MLflow 3.17's UI keeps a GenAI/model-training switch of its own
    and opens the GenAI overview unless the link says ``workflowType=machine_learning``."""
    page = f"#/experiments/{experiment_id}/runs" + (f"/{run_id}?" if run_id else f"?{RUNS_ORDER}&")
    return f"{uri.rstrip('/')}/{page}workflowType=machine_learning"


def numeric_metrics(data: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in data.items() if isinstance(v, (int, float)) and not isinstance(v, bool)}


class NullTracker:
    run_id: Optional[str] = None
    description = "tracking=none"

    def start(self, run_name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        pass

    def reopen(self, run_id: str) -> None:
        pass

    def log_outputs(self, run_dir: Path, metrics: dict[str, float]) -> None:
        pass

    def log_sweep(self, sweep_dir: Path, rows: list[dict[str, Any]], metrics: dict[str, float]) -> None:
        pass

    def end(self, status: str, error: Optional[str] = None) -> None:
        pass


class MlflowTracker:
    def __init__(self, tracking: TrackingConfig, output_root: str, uri: Optional[str] = None):
        root = Path(output_root).expanduser().resolve()
        self.uri = uri or tracking.uri or os.environ.get("MLFLOW_TRACKING_URI") or f"sqlite:///{root / 'mlflow.db'}"
        # Bounded retries for a server that is down or flaky (MLflow reads these per request;
        # a user's own MLFLOW_HTTP_REQUEST_* settings win).
        for name, value in (("MAX_RETRIES", tracking.max_retries), ("BACKOFF_FACTOR", tracking.backoff_factor),
                            ("TIMEOUT", tracking.timeout_s)):
            os.environ.setdefault(f"MLFLOW_HTTP_REQUEST_{name}", str(value))
        os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")  # our own "track:" line says it
        self.artifact_location: Optional[str] = None
        self.db: Optional[Path] = None  # the embedded store's file
        if self.uri.startswith("sqlite:///"):
            self.db = Path(self.uri[len("sqlite:///"):]).expanduser().resolve()
            self.artifact_location = (self.db.parent / "mlartifacts").as_uri()
        self.experiment_name = tracking.experiment_name
        self.run_id: Optional[str] = None
        self.experiment_id: Optional[str] = None
        self.note = ""
        self.client: Any = None

    @property
    def description(self) -> str:
        if self.run_id is None:
            return f"mlflow at {self.uri} (no run)"
        where = f"mlflow run {self.run_id} in experiment {self.experiment_name!r} at {self.uri}"
        if self.uri.startswith(("http://", "https://")):
            where += f" ({ui_link(self.uri, self.experiment_id, self.run_id)})"
        return where

    def find_run(self, tag: str, value: str) -> Optional[str]:
        """The id of this experiment's run whose ``tag`` is ``value``, if there is one."""
        self._connect()
        experiment = self.client.get_experiment_by_name(self.experiment_name)
        if experiment is None:
            return None
        runs = self.client.search_runs([experiment.experiment_id], f"tags.`{tag}` = '{value}'", max_results=1)
        return runs[0].info.run_id if runs else None

    @contextlib.contextmanager
    def _store_lock(self) -> Iterator[None]:
        """For the embedded SQLite store: one process at a time creates (migrates) the store or an
        experiment -- concurrent first runs otherwise race in alembic's migrations."""
        if self.db is None:  # a server serialises these itself
            yield
            return
        import fcntl

        with open(self.db.with_name(self.db.name + ".lock"), "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(lock, fcntl.LOCK_UN)

    def _connect(self) -> None:
        if self.client is None:
            from mlflow.tracking import MlflowClient

            # mlflow sets its logger to INFO when imported; its store-creation notices are noise here.
            logging.getLogger("mlflow").setLevel(logging.WARNING)
            logging.getLogger("alembic").setLevel(logging.WARNING)
            existed = self.db is not None and self.db.exists() and self.db.stat().st_size > 0
            try:
                if self.db is not None:  # an unwritable place is "tracker down": the run goes on
                    self.db.parent.mkdir(parents=True, exist_ok=True)
                with self._store_lock():
                    client = MlflowClient(tracking_uri=self.uri)
                    client.search_experiments(max_results=1)  # creates and migrates the store if it is new
            except Exception as exc:
                if existed and not isinstance(exc, OSError):
                    raise RuntimeError(
                        f"the embedded MLflow store {self.db} cannot be opened -- half-created (a first run killed "
                        f"while making it) or damaged; move it aside (mv {self.db} {self.db}.broken) and a new one "
                        f"is made on the next run ({type(exc).__name__}: {one_line(exc)})") from exc
                raise
            self.client = client

    def _experiment_id(self) -> str:
        """The experiment's id, created if need be (two processes may both try: the loser reads it)."""
        with self._store_lock():
            experiment = self.client.get_experiment_by_name(self.experiment_name)
            if experiment is None:
                try:
                    return self.client.create_experiment(self.experiment_name, artifact_location=self.artifact_location,
                                                         tags=EXPERIMENT_TAGS)
                except Exception:
                    experiment = self.client.get_experiment_by_name(self.experiment_name)
                    if experiment is None:
                        raise
            for key, value in EXPERIMENT_TAGS.items():  # an experiment made elsewhere, or by an older version
                if key not in experiment.tags:
                    self.client.set_experiment_tag(experiment.experiment_id, key, value)
            return experiment.experiment_id

    def resume(self, run_id: str) -> None:
        self._connect()
        self.run_id = run_id

    def reopen(self, run_id: str) -> None:
        """An ended run made RUNNING again (a resumed sweep's parent), without the error it ended with."""
        self.resume(run_id)
        self.client.update_run(run_id, status="RUNNING")
        if "error" in self.client.get_run(run_id).data.tags:
            self.client.delete_tag(run_id, "error")

    def start(self, run_name: str, params: dict[str, str], tags: dict[str, str]) -> None:
        from mlflow.entities import Param

        self._connect()
        self.experiment_id = self._experiment_id()
        run = self.client.create_run(self.experiment_id, run_name=run_name, tags=tags)
        self.run_id = run.info.run_id
        self.note = tags.get(NOTE, "")
        self.client.log_batch(self.run_id, params=[Param(k, v) for k, v in sorted(params.items())])

    def _log_metrics(self, metrics: dict[str, float]) -> None:
        from mlflow.entities import Metric
        from mlflow.utils.time import get_current_time_millis

        now = get_current_time_millis()
        self.client.log_batch(self.run_id, metrics=[Metric(k, v, now, 0) for k, v in sorted(metrics.items())])

    def log_outputs(self, run_dir: Path, metrics: dict[str, float]) -> None:
        from PIL import Image

        self._log_metrics(metrics)
        headline = headline_line(metrics)
        if self.note and headline:
            self.client.set_tag(self.run_id, NOTE, f"{self.note}\n\n{headline}")
        self._log_prompts(run_dir)
        for name in (rundir.TIMINGS, rundir.IMAGES, rundir.QUALITY, rundir.ENVIRONMENT, rundir.INPUTS, rundir.RERUN,
                     rundir.PROFILE):
            if (run_dir / name).exists():
                self.client.log_artifact(self.run_id, str(run_dir / name))
        if (run_dir / rundir.IMAGES_DIR).is_dir():
            self.client.log_artifacts(self.run_id, str(run_dir / rundir.IMAGES_DIR), artifact_path="images")
        if (run_dir / rundir.HYDRA_DIR).is_dir():
            self.client.log_artifacts(self.run_id, str(run_dir / rundir.HYDRA_DIR), artifact_path="config")
        if (run_dir / rundir.GRID).exists():
            with Image.open(run_dir / rundir.GRID) as grid:
                self.client.log_image(self.run_id, grid.copy(), artifact_file="grid.png")

    def _log_prompts(self, run_dir: Path) -> None:
        """The run's prompts as an MLflow dataset input (the runs table's Dataset column; searchable as
        ``dataset.name`` / ``dataset.digest``): named after the prompt file or set, its digest the
        prompt list's (the same prompts, the same digest, whatever the file is called)."""
        import json

        from mlflow.entities import Dataset, DatasetInput, InputTag

        from sdjax_runner.record.inputs import prompts_digest

        recorded = rundir.read_json_or_empty(run_dir / rundir.INPUTS)
        prompts = recorded.get("prompts")
        if not prompts:
            return
        dataset = Dataset(name=str(recorded.get("prompt_set") or "prompts"), digest=prompts_digest(prompts),
                          source_type="local", source=json.dumps({"uri": str(run_dir / rundir.INPUTS)}),
                          profile=json.dumps({"num_prompts": len(prompts)}))
        inputs = [DatasetInput(dataset, [InputTag("mlflow.data.context", "prompts")])]
        try:
            self.client.log_inputs(self.run_id, inputs)
        except Exception as exc:
            # MLflow's stores look the dataset up, then insert it: runs logging the same prompts at once
            # (two terminals, a parallel sweep) race, and the late insert breaks the datasets table's unique
            # key. The dataset is there now, so logging again finds it.
            if not any(text in str(exc) for text in DUPLICATE_KEY_ERRORS):
                raise
            self.client.log_inputs(self.run_id, inputs)

    def log_sweep(self, sweep_dir: Path, rows: list[dict[str, Any]], metrics: dict[str, float]) -> None:
        """The sweep's summary (as an MLflow table and CSV), comparison.json (and as a table), contact sheet and
        report.html, on the parent run."""
        from PIL import Image

        self._log_metrics(metrics)
        if rows:
            table = {column: [str(row[column]) for row in rows] for column in rows[0]}
            self.client.log_table(self.run_id, data=table, artifact_file="summary_table.json")
        judged = rundir.read_json_or_empty(sweep_dir / rundir.COMPARISON)
        settings = table_rows(judged) if isinstance(judged.get("settings"), list) else []
        if settings:  # the settings judged, a row per setting and metric (metrics/comparison.py)
            table = {column: ["" if row[column] is None else str(row[column]) for row in settings]
                     for column in settings[0]}
            self.client.log_table(self.run_id, data=table, artifact_file="comparison_table.json")
        for name in (rundir.SUMMARY_CSV, rundir.SWEEP, rundir.COMPARISON, rundir.REPORT_PAGE):
            if (sweep_dir / name).exists():
                self.client.log_artifact(self.run_id, str(sweep_dir / name))
        for name in (rundir.CONTACT_SHEET, rundir.REPORT):
            if (sweep_dir / name).exists():
                with Image.open(sweep_dir / name) as picture:
                    self.client.log_image(self.run_id, picture.copy(), artifact_file=name)

    def log_quality(self, run_dir: Path, metrics: dict[str, float]) -> None:
        """Quality metrics computed after the run ended (a sweep's comparisons with its reference point)."""
        self._log_metrics(metrics)
        for name in (rundir.IMAGES, rundir.QUALITY):
            if (run_dir / name).exists():
                self.client.log_artifact(self.run_id, str(run_dir / name))

    def end(self, status: str, error: Optional[str] = None) -> None:
        if self.run_id is None:
            return
        if error:
            self.client.set_tag(self.run_id, "error", error[:5000])
        self.client.set_terminated(self.run_id, status=status)


def client_for(uri: Optional[str], run_id: str, key: str = "RUN", what: str = "run directory"):
    """(MlflowClient, its URI) to look ``run_id`` up in: ``uri`` (--uri), else MLFLOW_TRACKING_URI, else the
    embedded store ``outputs/mlflow.db`` if there is one (one line naming ``key`` if not; ``what`` the
    command takes besides a run id)."""
    os.environ.setdefault("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "false")  # a bar per file, on stderr
    from mlflow.tracking import MlflowClient

    from sdjax_runner.config.checks import mlflow_uri
    from sdjax_runner.errors import UserError

    given = uri or os.environ.get("MLFLOW_TRACKING_URI")
    if given:
        mlflow_uri("--uri" if uri else "MLFLOW_TRACKING_URI", given, "no --uri for the embedded store outputs/mlflow.db")
        uri = given
    else:
        embedded = Path("outputs/mlflow.db").resolve()
        if not embedded.is_file():  # opening it would create an empty store here
            raise UserError(key, f"{run_id} is not a {what}, and there is no MLflow store at {embedded} "
                            "to look it up in", f"a {what}, or an MLflow run id with --uri") from None
        uri = f"sqlite:///{embedded}"
    return MlflowClient(tracking_uri=uri), uri


def download_record(run_id: str, uri: Optional[str], into: Path, outputs: bool = False) -> Path:
    """The record of MLflow run ``run_id`` -- its config (as ``.hydra/``), images.json, environment.json,
    inputs.json and a status.json -- downloaded into ``into`` laid out like a run directory; ``outputs``: its
    timings, quality metrics and images too. ``uri``: else MLFLOW_TRACKING_URI, else the embedded
    store ``outputs/mlflow.db``."""
    from sdjax_runner.errors import UserError

    client, uri = client_for(uri, run_id)
    try:
        run = client.get_run(run_id)
    except Exception as exc:
        raise UserError("RUN", f"{run_id} is neither a run directory nor a run in {uri} "
                        f"({type(exc).__name__})", "a run directory, or an MLflow run id with --uri") from None
    into.mkdir(parents=True, exist_ok=True)
    client.download_artifacts(run.info.run_id, "config", str(into))
    (into / "config").rename(into / rundir.HYDRA_DIR)
    names = [rundir.IMAGES, rundir.ENVIRONMENT, rundir.INPUTS] + ([rundir.TIMINGS, rundir.QUALITY, rundir.IMAGES_DIR] if outputs else [])
    for name in names:
        try:
            client.download_artifacts(run.info.run_id, name, str(into))
        except Exception:  # a run without it (an older or a failed one)
            pass
    rundir.write_json(into / rundir.STATUS, {"run_name": run.info.run_name, "run_id": run.info.run_id,
                                             "experiment_id": run.info.experiment_id, "status": run.info.status})
    return into


def make_tracker(tracking: TrackingConfig, output_root: str):
    """The tracker ``tracking`` (a TrackingConfig) asks for; the embedded store lives under ``output_root``."""
    if tracking.backend.name == "none":
        return NullTracker()
    return MlflowTracker(tracking, output_root)
