"""``python -m sdjax_runner report SWEEP [report.x=KEY] [report.y=KEY] [report.image=N]``: (re)build a
sweep's report.html (record/report_page.py) and comparison.json (its settings judged: metrics/comparison.py).

SWEEP is a sweep directory -- one that finished, or one cut short (its finished points are shown, the
others as grey cells saying their status) -- or the MLflow run id of a sweep's parent run, whose child
runs (their records, timings, quality and images) are downloaded from ``--uri`` (else
MLFLOW_TRACKING_URI, else the embedded store ``outputs/mlflow.db``) into ``--out`` (default
``report-<id>/``) and reported from there. ``report.x``/``report.y``/``report.image`` replace the
sweep's own; the page goes into the sweep directory (or ``--out``) and its path is printed.
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any, Optional

from sdjax_runner import console
from sdjax_runner.commands import command_parser
from sdjax_runner.config.report_axes import choose, image_index
from sdjax_runner.errors import UserError
from sdjax_runner.record import rundir

SETTINGS = ("report.x", "report.y", "report.image")


def settings_of(words: list[str], earlier: Optional[dict]) -> dict[str, Any]:
    out = dict(earlier or {})
    for word in words:
        key, sep, value = word.partition("=")
        if not sep or key not in SETTINGS:
            raise UserError(word, "is not a report setting", ", ".join(f"{k}=..." for k in SETTINGS))
        if key == "report.image":
            out["image"] = image_index(value)
        else:
            out[key.split(".")[1]] = value or None
    return out


def swept(sweep_dir: Path) -> dict[str, Any]:
    """sweep.json, or (a sweep that left none) the swept keys read from Hydra's multirun.yaml."""
    from sdjax_runner.record.sweep import read_sweep_file, swept_keys

    record = read_sweep_file(sweep_dir) if (sweep_dir / rundir.SWEEP).is_file() else {}
    if not record.get("swept_keys") and (sweep_dir / rundir.MULTIRUN).is_file():
        from hydra.errors import OverrideParseException

        task = recorded_task(sweep_dir)
        try:
            record = dict(record, swept_keys=swept_keys(task), overrides=task)
        except OverrideParseException as exc:
            raise UserError(str(sweep_dir / rundir.MULTIRUN), f"holds an override Hydra cannot read "
                            f"({console.one_line(exc)})", "key=value overrides") from None
    return record


def recorded_task(sweep_dir: Path) -> list[str]:
    """The sweep's task overrides from Hydra's multirun.yaml, read within the record bounds."""
    from sdjax_runner.files import UnreadableRecord, read_yaml

    path = sweep_dir / rundir.MULTIRUN
    try:
        task = read_yaml(path)["hydra"]["overrides"]["task"]
    except (OSError, UnreadableRecord, KeyError, TypeError) as exc:
        raise UserError(str(path), f"cannot be read ({exc if isinstance(exc, UnreadableRecord) else type(exc).__name__})",
                        "the multirun.yaml Hydra wrote for the sweep") from None
    if not isinstance(task, list) or not all(isinstance(o, str) for o in task):
        raise UserError(str(path), "holds task overrides that are not a list of texts", "key=value overrides")
    return task


def from_mlflow(run_id: str, uri: Optional[str], out: Path) -> dict[str, Any]:
    """The parent run's sweep record, its children downloaded into ``out/<n>/`` (n: by start time)."""
    import json

    from sdjax_runner.record.tracking import client_for, download_record

    client, uri = client_for(uri, run_id, "SWEEP", "sweep directory")
    try:
        parent = client.get_run(run_id)
    except Exception as exc:
        raise UserError("SWEEP", f"{run_id} is neither a directory nor a run in {uri} ({type(exc).__name__})",
                        "a sweep directory, or the run id of a sweep's parent run") from None
    record: dict[str, Any] = {"swept_keys": parent.data.params.get("sweep.keys", "").split(),
                              "overrides": parent.data.params.get("sweep.overrides", "").split()}
    with tempfile.TemporaryDirectory() as scratch:
        try:
            client.download_artifacts(run_id, rundir.SWEEP, scratch)
            record.update(json.loads((Path(scratch) / rundir.SWEEP).read_text(encoding="utf-8")))
        except Exception:  # a parent that has none: the params above
            pass
    children = client.search_runs([parent.info.experiment_id], f"tags.mlflow.parentRunId = '{run_id}'",
                                  order_by=["attributes.start_time ASC"], max_results=10000)
    if not children:
        raise UserError("SWEEP", f"MLflow run {run_id} has no child runs: not a sweep's parent run",
                        "a sweep directory, or the run id of a sweep's parent run")
    for number, child in enumerate(children):
        download_record(child.info.run_id, uri, out / str(number), outputs=True)
    with tempfile.TemporaryDirectory() as scratch:
        try:  # the sweep's own judgement: what the records cannot give again (its CMMD) is kept from it
            client.download_artifacts(run_id, rundir.COMPARISON, scratch)
            (out / rundir.COMPARISON).write_bytes((Path(scratch) / rundir.COMPARISON).read_bytes())
        except Exception:  # a parent logged before comparison.json existed
            pass
    return record


def build(sweep_dir: Path, record: dict[str, Any], settings: dict[str, Any]) -> Path:
    from sdjax_runner.record.report_page import mlflow_ui_of, write_page
    from sdjax_runner.record.sweep import collect_jobs, judge_settings

    keys = record.get("swept_keys", [])
    rows = collect_jobs(sweep_dir, keys)
    if not rows:
        raise UserError("SWEEP", f"{sweep_dir} holds no job directories (0/, 1/, ...)", "a sweep directory")
    axes = choose(keys, settings.get("x"), settings.get("y"))
    judged = judge_settings(sweep_dir, rows, keys, record.get("reference_point"))  # comparison.json, made again
    return write_page(sweep_dir, rows, keys, axes, image_index(settings.get("image")), record.get("reference_point"),
                      record.get("overrides"), mlflow_ui_of(rows), judged)


def main(argv: Optional[list[str]] = None) -> int:
    parser = command_parser("report", __doc__)
    parser.add_argument("sweep", help="a sweep directory, or the MLflow run id of a sweep's parent run")
    parser.add_argument("settings", nargs="*", help="report.x=KEY report.y=KEY report.image=N")
    parser.add_argument("--uri", help="tracking URI to read a parent run from (default: MLFLOW_TRACKING_URI, "
                                      "else outputs/mlflow.db)")
    parser.add_argument("--out", type=Path, help="where a report from MLflow goes (default: report-<id>/)")
    args = parser.parse_args(argv)
    try:
        path = Path(args.sweep).expanduser()
        if path.is_dir():
            record = swept(path)
            page = build(path, record, settings_of(args.settings, record.get("report")))
        else:
            settings = settings_of(args.settings, None)
            out = (args.out or Path(f"report-{args.sweep[:12]}")).expanduser()
            record = from_mlflow(args.sweep, args.uri, out)
            page = build(out, record, dict(record.get("report") or {}, **settings))
    except UserError as error:
        console.error(error)
        return 2
    print(page)
    return 0
