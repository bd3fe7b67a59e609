"""``python -m sdjax_runner rerun RUN_DIR_OR_MLFLOW_RUN_ID``: run a recorded run again, from its record
alone, and check that it makes the same images, bit for bit.

The record is the run's resolved config (``.hydra/config.yaml``, or the ``config/`` artifact of an
MLflow run), its ``images.json`` (a SHA-256 of every image's pixels), ``environment.json`` (library
versions, devices) and ``inputs.json`` (what it read besides its config). The re-run is a new run
under ``<output_root>/reruns/`` (tagged ``sdjax.rerun_of``) that reads what the run read: the
recorded prompts (not a prompt file as it is now), relative paths against the run's working
directory, a hub model at the commit it loaded. Then each image is compared with the recorded one.
It prints which images differ, if any, and the inputs (model weight files, adapters) and
environment facts (a different jaxlib or device kind can change pixels) that differ, writes
``rerun.json`` into the new run directory, and exits 0 when every image is identical, 1 when one
is not, 2 when the record cannot be re-run.

    python -m sdjax_runner rerun outputs/runs/2026-11-22/17-08-10_smoke
    python -m sdjax_runner rerun outputs/multiruns/2026-11-22/17-10-00_smoke     # every finished job
                                                     # (one that cannot be re-run is named, the rest go on)
    python -m sdjax_runner rerun 5b90ca2ae3d141d192a2c9737e8ab6db --uri sqlite:///outputs/mlflow.db
"""

from __future__ import annotations

import datetime
import logging
import tempfile
from pathlib import Path
from typing import Any, Optional

from omegaconf import DictConfig, OmegaConf

from sdjax_runner import console
from sdjax_runner.commands import command_parser
from sdjax_runner.config.messages import describe, stop_reason
from sdjax_runner.config.naming import slug
from sdjax_runner.errors import Terminated, UserError, stop_exit_status, stop_on_sigterm
from sdjax_runner.record import inputs, rundir
from sdjax_runner.record.fresh_dirs import claim
from sdjax_runner.record.tracking import download_record
from sdjax_runner.records import required

log = logging.getLogger("sdjax_runner")
# The environment facts that can change pixels, compared between the record and this machine.
ENVIRONMENT_KEYS = ("versions", "backend", "device_kind", "device_count", "process_count")


def recorded_config(record: Path):
    """The record's resolved config, typed by this version's schema."""
    from sdjax_runner.config.schema import RunConfig

    path = record / rundir.CONFIG
    if not path.is_file():
        raise UserError("RUN", f"{record} has no {rundir.CONFIG}: not a run record", "a run directory")
    try:
        recorded = rundir.recorded_config(record)
    except (OSError, ValueError) as exc:
        raise UserError(str(path), f"cannot be read ({console.one_line(exc)})",
                        "the config.yaml Hydra wrote for the run") from None
    try:
        return OmegaConf.merge(OmegaConf.structured(RunConfig), recorded)
    except Exception as exc:
        raise UserError("RUN", f"{path} does not fit this version's config schema: {describe(exc) or exc}") from None


def repeat(cfg: DictConfig, recorded: dict[str, Any]) -> list[str]:
    """Make ``cfg`` read what the recorded run read: relative paths resolved against its working
    directory, its prompts as recorded (not the prompt file as it is now), a hub model at the commit
    it loaded. Returns one line per change worth saying."""
    from sdjax_runner.config.checks import is_local
    from sdjax_runner.config.prompts import load_prompts

    notes = []
    cwd = Path(recorded.get("cwd") or ".")
    keys = list(inputs.PATH_KEYS) + [f"lora.{index}.path" for index in range(len(cfg.lora))]
    for key in keys:
        value = OmegaConf.select(cfg, key)
        if isinstance(value, str) and value and not Path(value).expanduser().is_absolute() \
                and (cwd / value).exists() and (cwd / value).resolve() != Path(value).resolve():
            OmegaConf.update(cfg, key, str(cwd / value))
            notes.append(f"{key}: {value} is read from the recorded run's working directory ({cwd})")
    if recorded.get("prompts"):
        file = cfg.prompts.file
        if file:
            file = file if Path(file).expanduser().is_absolute() else str(cwd / file)
            try:
                now = load_prompts(list(cfg.prompts.texts), file)
            except UserError as error:
                now = None
                why = error.problem
            else:
                why = "changed since the run"
            if now != recorded["prompts"]:
                notes.append(f"prompts.file: {cfg.prompts.file}: {why}; the run's {len(recorded['prompts'])} "
                             f"recorded prompt(s) are used")
        cfg.prompts.texts = list(recorded["prompts"])
        cfg.prompts.file = None
        cfg.prompts.set = None  # a prompt set's sample too: the recorded prompts are the run's
    revision = (recorded.get("model") or {}).get("revision")
    name = cfg.model.pretrained_model_name_or_path
    if revision and cfg.model.revision != revision and not (name and is_local(str(name))):
        notes.append(f"model.revision: {cfg.model.revision or 'the default branch'} -> {revision}, "
                     f"the snapshot the run loaded")
        cfg.model.revision = revision
    return notes


def recorded_overrides(record: Path) -> list[str]:
    """The run's command-line overrides (``.hydra/overrides.yaml``: its name and records are made from them),
    each one the runner could have recorded (config/overrides.replayable); [] where the file is absent."""
    from sdjax_runner.config.overrides import replayable
    from sdjax_runner.config.schema import RunConfig, field_types

    path = record / rundir.OVERRIDES
    if not path.is_file():
        return []
    try:
        overrides = OmegaConf.to_container(rundir.read_config_record(path))
    except (OSError, ValueError) as exc:
        raise UserError(str(path), f"cannot be read ({console.one_line(exc)})",
                        "the overrides.yaml Hydra wrote for the run") from None
    if not isinstance(overrides, list):
        raise UserError(str(path), f"is {type(overrides).__name__}", "a list of overrides")
    return replayable(overrides, str(path), field_types(RunConfig))


def recorded_hashes(record: Path) -> dict[int, str]:
    """Index -> pixel hash of each recorded image (hashed from its PNG where the record predates hashes)."""
    import numpy as np
    from PIL import Image

    hashes = {}
    for r in rundir.image_records(record) if (record / rundir.IMAGES).exists() else []:
        if r.pixels_sha256:
            hashes[required(r.index, "index")] = r.pixels_sha256
            continue
        path = record / required(r.file, "file")
        if path.is_file():
            with Image.open(path) as image:
                hashes[required(r.index, "index")] = rundir.pixel_hash(np.asarray(image.convert("RGB")))
    return hashes


def environment_differences(recorded: dict, current: dict) -> list[str]:
    lines = []
    for key in ENVIRONMENT_KEYS:
        old, new = recorded.get(key), current.get(key)
        if isinstance(old, dict) and isinstance(new, dict):
            lines += [f"{key}.{k}: {old.get(k)} -> {new.get(k)}" for k in sorted(set(old) | set(new))
                      if old.get(k) != new.get(k)]
        elif old != new:
            lines.append(f"{key}: {old} -> {new}")
    return lines


def rerun(record: Path, source: str, tracking: bool) -> int:
    from sdjax_runner.runner import run

    cfg = recorded_config(record)
    status = rundir.read_record(record / rundir.STATUS) if (record / rundir.STATUS).exists() else {}
    name = status.get("run_name") or cfg.run_name
    overrides = recorded_overrides(record)
    if not tracking:
        cfg.tracking.backend = "none"
    expected = recorded_hashes(record)
    if not expected:
        raise UserError("RUN", f"{record} records no images to compare with (no images.json or PNGs)")
    recorded_inputs = rundir.read_json_or_empty(record / rundir.INPUTS)
    repeated = repeat(cfg, recorded_inputs)
    now = datetime.datetime.now()
    run_dir = claim(Path(cfg.paths.output_root) / "reruns" / now.strftime("%Y-%m-%d") / f"{now:%H-%M-%S}_{slug(name)}")
    (run_dir / rundir.HYDRA_DIR).mkdir()
    OmegaConf.save(cfg, run_dir / rundir.CONFIG)  # what runs: the record's config as repeat() set it
    OmegaConf.save(OmegaConf.create(overrides), run_dir / rundir.OVERRIDES)
    log.info("rerun: %s (%s) into %s", name, source, run_dir)
    for note in repeated:
        log.info("rerun: %s", note)
    run(cfg, run_dir, overrides, run_name=f"{name} rerun", extra_tags={"sdjax.rerun_of": source})

    got = {r.index: r.pixels_sha256 for r in rundir.image_records(run_dir)}
    differing = sorted(i for i in expected if got.get(i) != expected[i])
    recorded_env = rundir.read_json(record / rundir.ENVIRONMENT) if (record / rundir.ENVIRONMENT).is_file() else {}
    environment = environment_differences(recorded_env, rundir.read_json(run_dir / rundir.ENVIRONMENT))
    changed = [f"{key}: {old} -> {new}" for key, old, new in
               inputs.differences(recorded_inputs, rundir.read_json_or_empty(run_dir / rundir.INPUTS))]
    report = {"source": source, "record": str(record), "images": len(expected), "identical": not differing,
              "differing_images": differing, "environment_differences": environment,
              "inputs_repeated": repeated, "input_differences": changed}
    rundir.write_json(run_dir / rundir.RERUN, report)
    if not differing:
        print(f"rerun: identical -- all {len(expected)} image(s) match the record bit for bit ({run_dir})")
    else:
        print(f"rerun: DIFFERENT -- {len(differing)} of {len(expected)} image(s) differ from the record: "
              f"{', '.join(map(str, differing[:20]))} ({run_dir})")
    if changed:
        console.say("inputs differ from the record: " + "; ".join(changed))
    elif not recorded_inputs:
        print("the record has no inputs.json: the model's files and the prompt file cannot be compared")
    if environment:
        console.say("environment differs from the record: " + "; ".join(environment))
    elif not recorded_env:
        print("the record has no environment.json: library versions and devices cannot be compared")
    return 0 if not differing else 1


def rerun_sweep(sweep: Path, tracking: bool) -> int:
    """Each finished job of a sweep re-run, in this one process (a model loaded and a program compiled
    once for all of them, as in the sweep) and checked as a run is; 0 when every job is identical."""
    jobs = [job for job in rundir.job_dirs(sweep) if (job / rundir.CONFIG).is_file()]
    if not jobs:
        raise UserError("RUN", f"{sweep} is a sweep directory without job records", "a run or sweep directory")
    codes, failed = {}, []
    for job in jobs:
        status = rundir.read_json_or_empty(job / rundir.STATUS).get("status")
        if status != "FINISHED":  # its images are not all there to compare with
            console.say(f"rerun: job {job.name} skipped: it ended {status or 'without a status.json'}")
            continue
        try:
            codes[job.name] = rerun(job, str(job), tracking)
        except Exception as exc:  # this job's inputs (a LoRA file gone, a damaged record): the others go on
            message = describe(exc)
            if message is None:
                raise
            console.say(f"rerun: job {job.name} could not be re-run: {message}")
            failed.append(job.name)
    differing = [name for name, code in codes.items() if code]
    print(f"rerun: sweep {sweep}: {len(codes) - len(differing)} of {len(codes)} job(s) identical"
          + (f"; DIFFERENT: job(s) {', '.join(differing)}" if differing else "")
          + (f"; could not re-run: job(s) {', '.join(failed)}" if failed else ""))
    return 1 if differing else 2 if failed else 0


def main(argv: Optional[list[str]] = None) -> int:
    parser = command_parser("rerun", __doc__)
    parser.add_argument("run", help="a run directory, a sweep directory (each finished job), or an MLflow run id")
    parser.add_argument("--uri", help="tracking URI holding the MLflow run (default: MLFLOW_TRACKING_URI, "
                                      "else the embedded store outputs/mlflow.db)")
    parser.add_argument("--no-tracking", action="store_true", help="do not log the re-run to the tracker")
    args = parser.parse_args(argv)
    logging.basicConfig(format="[%(asctime)s] %(message)s", datefmt="%H:%M:%S", level=logging.INFO, force=True,
                        handlers=[console.ConsoleHandler()])  # a record's text shown escaped
    for name in ("mlflow", "alembic"):
        logging.getLogger(name).setLevel(logging.WARNING)
    stop_on_sigterm()  # a scheduler's kill ends the re-run KILLED, as Ctrl-C does, with what it wrote
    try:
        with tempfile.TemporaryDirectory(prefix="sdjax-rerun-") as scratch:
            path = Path(args.run).expanduser()
            if path.is_dir() and not (path / rundir.CONFIG).is_file() and (path / rundir.MULTIRUN).is_file():
                return rerun_sweep(path, tracking=not args.no_tracking)
            record = path if path.is_dir() else download_record(args.run, args.uri, Path(scratch))
            return rerun(record, str(args.run), tracking=not args.no_tracking)
    except (KeyboardInterrupt, Terminated) as exc:
        console.error(stop_reason(exc)[1])
        return stop_exit_status(exc)
    except Exception as exc:
        message = describe(exc)
        if message is None:
            raise
        console.error(message)
        return 2

