"""Runs a user can tell apart and find again: self-naming runs, the records a re-run needs, exact
re-runs from a directory or an MLflow run id, listing and diffing without MLflow, the app's own
--help, and the MLflow UI opening on the runs view in a real browser."""

import datetime
import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st
from PIL import Image

from helpers.browser import chromium
from helpers.cli import assert_one_line_error, call_cli, run_cli

REPO = Path(__file__).resolve().parents[1]
PROMPTS = ["a red car in the rain", "a painting of a cat"]


def _read(path: Path):
    return json.loads(path.read_text())


def _mlflow(work: Path):
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sdjax-runner")
    return client, experiment, {r.info.run_name: r for r in client.search_runs([experiment.experiment_id])}


@pytest.mark.slow
def test_single_runs_name_themselves_and_record_what_a_rerun_needs(tmp_path, cache_dir):
    (tmp_path / "prompts.txt").write_text("\n".join(PROMPTS) + "\n")
    # (the command line exactly as a user types it: its tags and names are checked below)
    result = run_cli("+experiment=smoke", "seed=5", "prompts.file=prompts.txt", cwd=tmp_path, process=True,
                     steady_timing=True)
    assert result.returncode == 0, result.stderr
    [run_dir] = (tmp_path / "outputs" / "runs").glob("*/*")
    assert run_dir.name.endswith("_smoke_seed=5_prompts.file=prompts.txt"), run_dir.name

    status = _read(run_dir / "status.json")
    assert status["run_name"] == "smoke seed=5 prompts.file=prompts.txt"
    assert status["host"] and status["started_at"] and status["pid"] not in (None, os.getpid())

    # prompts.file alone means exactly the file's prompts (cycled over 8 devices), and the record says so.
    records = _read(run_dir / "images.json")
    assert [r["prompt"] for r in records] == PROMPTS * 4
    assert "prompts.texts=[]" in (run_dir / ".hydra" / "overrides.yaml").read_text()
    for record in records:  # the hash a re-run compares is the PNG's pixels'
        with Image.open(run_dir / record["file"]) as image:
            assert record["pixels_sha256"] == hashlib.sha256(np.asarray(image.convert("RGB")).tobytes()).hexdigest()

    environment = _read(run_dir / "environment.json")
    assert environment["versions"]["jax"] == jax.__version__
    assert (environment["backend"], environment["device_count"], environment["process_count"]) == ("cpu", 8, 1)

    client, experiment, runs = _mlflow(tmp_path)
    assert experiment.tags["mlflow.experimentKind"] == "custom_model_development"
    run = runs["smoke seed=5 prompts.file=prompts.txt"]
    assert run.info.status == "FINISHED"
    tags = run.data.tags
    assert tags["mlflow.source.name"] == "sdjax_runner"
    assert tags["command"] == "python -m sdjax_runner +experiment=smoke seed=5 prompts.file=prompts.txt 'prompts.texts=[]'"
    note = tags["mlflow.note.content"]
    assert f"python -m sdjax_runner rerun {run_dir.resolve()}" in note
    assert f"images/s {run.data.metrics['images_per_s']:.3g}" in note  # the headline, once the run has it
    assert "environment.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    # The prompts are the run's MLflow dataset input: the Dataset column, searchable by name or digest.
    from sdjax_runner.record.inputs import prompts_digest

    [dataset] = run.inputs.dataset_inputs
    assert (dataset.dataset.name, dataset.dataset.digest) == ("prompts.txt", prompts_digest(PROMPTS))
    assert [(t.key, t.value) for t in dataset.tags] == [("mlflow.data.context", "prompts")]
    found = client.search_runs([experiment.experiment_id], f"dataset.digest = '{prompts_digest(PROMPTS)}'")
    assert [r.info.run_id for r in found] == [run.info.run_id]

    # run_name= wins, and a name is never a path: it cannot leave paths.output_root.
    result = run_cli("+experiment=smoke", "run_name=../../outside", "seed=6", "tracking=none", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    second = [d for d in (tmp_path / "outputs" / "runs").glob("*/*") if d != run_dir]
    assert len(second) == 1 and second[0].name.endswith("_outside"), second
    assert _read(second[0] / "status.json")["run_name"] == "../../outside"
    assert not any(tmp_path.parent.glob("outside*")) and not any((tmp_path / "outputs").glob("outside*"))

    # Looking without MLflow: the list, newest first, and what differs between the two.
    listing = run_cli("list", "outputs", cwd=tmp_path, command="runs")
    assert listing.returncode == 0, listing.stderr
    lines = listing.stdout.splitlines()
    assert lines[0].split()[:3] == ["started", "status", "name"]
    assert "../../outside" in lines[1] and "smoke seed=5 prompts.file=prompts.txt" in lines[2]
    assert all("FINISHED" in line for line in lines[1:3])
    # Finding one again: filters on any config key (short names for the listed ones), status and
    # start time; the root may be left out; --dirs for scripts; a misspelt key is one line.
    def listed(*args):
        result = run_cli("list", *args, cwd=tmp_path, command="runs")
        assert result.returncode == 0, result.stderr
        return result
    def dirs(*args):
        return [Path(line) for line in listed("--dirs", *args).stdout.splitlines()]
    first_dir, second_dir = run_dir.relative_to(tmp_path), second[0].relative_to(tmp_path)
    assert dirs("outputs", "seed=5") == [first_dir]
    assert dirs("tracking.backend=none", "model=tiny-r*") == [second_dir]
    assert dirs("seed=5", "seed=6") == [second_dir, first_dir]
    assert dirs("status=FINISHED", "--since", "1h") == [second_dir, first_dir]
    assert dirs("--since", "2999-01-01") == [] and dirs("seed=7") == []
    assert listed("seed=7").stdout.strip() == "no runs under outputs match"
    limited = listed("--limit", "1")
    assert len(limited.stdout.splitlines()) == 2 and "1 of 2 runs shown" in limited.stderr
    for bad, key in ((["sed=5"], "error: sed:"), (["--since", "yesterday"], "error: --since yesterday:")):
        error = run_cli("list", *bad, cwd=tmp_path, command="runs")
        assert_one_line_error(error, key)
    # Values are matched resolved (paths.cache_dir is ${oc.env:SDJAX_RUNNER_CACHE_DIR,...} as recorded).
    assert dirs(f"paths.cache_dir={cache_dir}", "seed=5") == [first_dir]
    damaged = tmp_path / "outputs" / "runs" / "damaged"  # a record cut short is listed, not a crash
    (damaged / ".hydra").mkdir(parents=True)
    (damaged / "status.json").write_text('{"status": "FINI')
    (damaged / ".hydra" / "config.yaml").write_text("seed: [5\n  - {")
    assert dirs() == [second_dir, first_dir, damaged.relative_to(tmp_path)]
    assert dirs("seed=5") == [first_dir]

    diff = run_cli("diff", str(run_dir), str(second[0]), cwd=tmp_path, command="runs")
    assert diff.returncode == 0, diff.stderr
    rows = {line.split()[0]: line.split()[1:] for line in diff.stdout.splitlines() if line.strip()}
    assert rows["seed"] == ["5", "6"]
    assert rows["tracking.backend"] == ["mlflow", "none"]
    assert rows["prompts.texts"][0] == "[]"  # the file alone
    assert rows["images_per_s"][:2] == [f"{_read(run_dir / 'timings.json')['images_per_s']:.4g}",
                                        f"{_read(second[0] / 'timings.json')['images_per_s']:.4g}"]
    # Other seeds: no image has its slot (index, seed, prompt, size) in the other run, and diff says so.
    assert "images: none compared -- no image of B has its slot in A" in diff.stdout
    assert rows["inputs.prompts"][0] == "2" and rows["inputs.prompts"][4] == "1"  # the prompts as read

    # What the run read is kept: a re-run a week later, from another directory, after the prompt file
    # was edited, reads the recorded prompts (not the file as it is now) and makes the same images.
    inputs = _read(run_dir / "inputs.json")
    assert inputs["prompts"] == PROMPTS and inputs["cwd"] == str(tmp_path)
    assert set(inputs["model"]["weights"]) >= {"unet/diffusion_flax_model.msgpack", "vae/diffusion_flax_model.msgpack"}
    assert "inputs.json" in {a.path for a in client.list_artifacts(run.info.run_id)}
    (tmp_path / "prompts.txt").write_text("a green bicycle\n")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    rerun = run_cli(str(run_dir), "--no-tracking", cwd=elsewhere, command="rerun")
    assert rerun.returncode == 0, rerun.stderr
    assert "rerun: identical -- all 8 image(s) match the record bit for bit" in rerun.stdout
    assert ("rerun: prompts.file: prompts.txt: changed since the run; the run's 2 recorded prompt(s) are used"
            in rerun.stderr)
    [rerun_dir] = (elsewhere / "outputs" / "reruns").glob("*/*")
    assert _read(rerun_dir / "rerun.json")["input_differences"] == []
    assert [r["prompt"] for r in _read(rerun_dir / "images.json")] == PROMPTS * 4
    assert "file: null" in (rerun_dir / ".hydra" / "config.yaml").read_text()  # its record says what ran


def test_list_filters_match_whole_values_with_shell_patterns_and_times_in_any_zone():
    from sdjax_runner.record.catalog import matches, parse_filters, parse_since

    filters = parse_filters(["seed=5", "scheduler=pndm", "scheduler=eul*"])
    assert filters == {"seed": ["5"], "scheduler.name": ["pndm", "eul*"]}
    assert matches({"seed": "5", "scheduler.name": "euler"}, filters)
    assert not matches({"seed": "15", "scheduler.name": "pndm"}, filters)  # whole values, not substrings
    assert not matches({"scheduler.name": "pndm"}, filters)  # a run without the key does not match
    now = datetime.datetime(2026, 11, 22, 12, 0, tzinfo=datetime.UTC)
    assert parse_since("7d", now) == now - datetime.timedelta(days=7)
    assert parse_since("90m", now) == now - datetime.timedelta(minutes=90)
    assert parse_since("2026-11-22T13:00+01:00") == now
    assert parse_since("2026-11-15").tzinfo is not None  # local time, comparable with recorded starts
    with pytest.raises(ValueError, match="KEY=VALUE"):
        parse_filters(["=5"])


@pytest.mark.slow
def test_a_rerun_from_an_mlflow_run_id_alone_gives_bit_identical_images(smoke_run, tmp_path):
    work, record, _ = smoke_run
    shutil.copyfile(work / "outputs" / "mlflow.db", tmp_path / "outputs" / "mlflow.db")  # artifacts stay put
    run_id = _read(record / "status.json")["run_id"]
    result = run_cli(run_id, "--uri", f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}", cwd=tmp_path,
                     command="rerun")
    assert result.returncode == 0, result.stderr
    assert "rerun: identical -- all 8 image(s) match the record bit for bit" in result.stdout
    [rerun_dir] = (tmp_path / "outputs" / "reruns").glob("*/*")
    report = _read(rerun_dir / "rerun.json")
    assert report["identical"] is True and report["differing_images"] == [] and report["images"] == 8
    assert report["environment_differences"] == [] and report["input_differences"] == []
    assert "no inputs.json" not in result.stdout  # downloaded with the record
    _, _, runs = _mlflow(tmp_path)
    assert runs["smoke rerun"].data.tags["sdjax.rerun_of"] == run_id
    assert runs["smoke rerun"].info.status == "FINISHED"

    # Two runs found in MLflow compared by their ids alone: config, numbers and images from the artifacts.
    rerun_id = runs["smoke rerun"].info.run_id
    diff = run_cli("diff", run_id, rerun_id, "--uri", f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}",
                   cwd=tmp_path, command="runs")
    assert diff.returncode == 0, diff.stderr
    assert diff.stdout.startswith(f"A: {run_id}\nB: {rerun_id}\n") and "Downloading" not in diff.stderr
    assert "config and inputs: identical" in diff.stdout and "\nimages_per_s " in diff.stdout
    assert diff.stdout.rstrip().endswith("8 of 8 compared: all identical (PSNR inf, SSIM 1)")
    missing = run_cli("diff", run_id, "0123abcd", "--uri", f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}",
                      cwd=tmp_path, command="runs")
    assert_one_line_error(missing, "error: RUN: 0123abcd is neither a run directory nor a run in sqlite:///")


@pytest.mark.slow
def test_a_rerun_reports_changed_images_and_the_environment_facts_that_differ(smoke_run, tmp_path):
    _, original, _ = smoke_run
    record = tmp_path / "record"
    shutil.copytree(original, record)
    images = _read(record / "images.json")
    images[3]["pixels_sha256"] = "0" * 64  # as if the recorded run had made another image 3
    (record / "images.json").write_text(json.dumps(images))
    environment = _read(record / "environment.json")
    environment["versions"]["jax"] = "0.0.1"
    (record / "environment.json").write_text(json.dumps(environment))
    inputs = _read(record / "inputs.json")  # as if the model folder's UNet had been replaced since
    inputs["model"]["weights"]["unet/diffusion_flax_model.msgpack"] = "1 bytes, modified 2000-01-01T00:00:00"
    (record / "inputs.json").write_text(json.dumps(inputs))

    result = run_cli(str(record), "--no-tracking", cwd=tmp_path, command="rerun")
    assert result.returncode == 1, result.stderr
    assert "rerun: DIFFERENT -- 1 of 8 image(s) differ from the record: 3 " in result.stdout
    assert f"versions.jax: 0.0.1 -> {jax.__version__}" in result.stdout
    changed = "model.weights.unet/diffusion_flax_model.msgpack: 1 bytes, modified 2000-01-01T00:00:00 -> "
    assert f"inputs differ from the record: {changed}" in result.stdout
    [rerun_dir] = (tmp_path / "outputs" / "reruns").glob("*/*")
    report = _read(rerun_dir / "rerun.json")
    assert report["differing_images"] == [3]
    assert [line.startswith(changed) for line in report["input_differences"]] == [True]


@pytest.mark.slow
def test_diff_compares_the_images_slot_by_slot_and_names_those_that_differ(smoke_run, tmp_path):
    _, original, _ = smoke_run
    changed = tmp_path / "changed"
    shutil.copytree(original, changed)
    record = _read(changed / "images.json")[3]
    with Image.open(changed / record["file"]) as image:
        pixels = np.asarray(image.convert("RGB")).copy()
    pixels[:8, :8] = 255 - pixels[:8, :8]  # one corner of image 3 inverted
    Image.fromarray(pixels).save(changed / record["file"])

    diff = run_cli("diff", str(original), str(changed), cwd=tmp_path, command="runs")
    assert diff.returncode == 0, diff.stderr
    section = diff.stdout[diff.stdout.index("images (B against A"):].splitlines()
    mse = np.mean(((pixels.astype(float) - np.asarray(Image.open(original / record["file"]).convert("RGB"))) / 255) ** 2)
    run_psnr = -10 * np.log10(mse / 8)  # one of eight images differs
    assert section[1].startswith(f"8 of 8 compared: 7 identical; PSNR {run_psnr:.2f} dB (min {run_psnr - 10 * np.log10(8):.2f})")
    assert section[3].split()[:3] == ["image", "seed", "psnr_db"]
    assert section[4].split()[:2] == ["3", "0"] and len(section) == 5  # only the image that differs

    identical = run_cli("diff", str(original), str(original), cwd=tmp_path, command="runs")
    assert identical.stdout.rstrip().endswith("8 of 8 compared: all identical (PSNR inf, SSIM 1)")
    (changed / "images.json").write_text("[{")  # a damaged record is a line, not a traceback
    damaged = run_cli("diff", str(original), str(changed), cwd=tmp_path, command="runs")
    assert damaged.returncode == 0 and damaged.stdout.rstrip().splitlines()[-1].startswith(
        "images: not compared (B's images.json: ")
    skipped = run_cli("diff", "--no-images", str(original), str(changed), cwd=tmp_path, command="runs")
    assert skipped.returncode == 0 and skipped.stdout.rstrip().splitlines()[-1].startswith("write_s ")
    # A config that cannot be read is named, not shown as every key differing.
    (changed / ".hydra" / "config.yaml").write_text("model: [")
    unreadable = run_cli("diff", "--no-images", str(original), str(changed), cwd=tmp_path, command="runs")
    lines = unreadable.stdout.splitlines()
    assert unreadable.returncode == 0 and lines[3].startswith(
        "config keys: not compared -- B's .hydra/config.yaml cannot be read (UnreadableRecord: is not valid YAML (while parsing "), lines[:6]
    assert "config key " not in unreadable.stdout and "inputs: identical" in lines

    # Piped into a reader that stops early (head): the listing ends quietly, no BrokenPipeError traceback.
    many = tmp_path / "many"
    for number in range(2000):
        (many / f"run{number}").mkdir(parents=True)
        (many / f"run{number}" / "status.json").write_text('{"status": "FINISHED", "run_name": "%s"}' % ("x" * 80))
    reader = subprocess.Popen([sys.executable, "-m", "sdjax_runner", "runs", "list", str(many), "--limit", "0"],
                              cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert reader.stdout.readline().startswith(b"started ")
    reader.stdout.close()
    assert reader.wait(timeout=60) != 0 and b"Traceback" not in reader.stderr.read()


def test_a_rerun_reads_relative_paths_where_the_run_did_and_a_hub_model_at_the_commit_it_loaded(tmp_path):
    from omegaconf import OmegaConf

    from sdjax_runner.commands.rerun import repeat
    from sdjax_runner.config.schema import RunConfig
    from sdjax_runner.record.inputs import hub_revision

    then = tmp_path / "then"
    (then / "models" / "mine").mkdir(parents=True)
    (then / "style.safetensors").write_bytes(b"x")
    (then / "ref").mkdir()
    cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), {
        "model": {"name": "mine", "pretrained_model_name_or_path": "models/mine"},
        "lora": [{"path": "style.safetensors", "scale": 0.5}, {"path": "/abs/other.safetensors"}],
        "metrics": {"reference": "ref"}, "prompts": {"texts": [], "file": "gone.txt"}})
    notes = repeat(cfg, {"cwd": str(then), "prompts": ["a", "b"]})
    assert cfg.model.pretrained_model_name_or_path == str(then / "models" / "mine")
    assert cfg.lora[0].path == str(then / "style.safetensors") and cfg.lora[1].path == "/abs/other.safetensors"
    assert cfg.metrics.reference == str(then / "ref")
    assert (list(cfg.prompts.texts), cfg.prompts.file) == (["a", "b"], None)
    assert notes[-1] == (f"prompts.file: gone.txt: no such file: {then / 'gone.txt'}; "
                         "the run's 2 recorded prompt(s) are used")
    assert len(notes) == 4  # three paths and the prompts

    # A hub id stays a hub id (nothing of that name where the run started), pinned to the loaded commit.
    commit = "39593d5650112b4cc580433f6b0435385882d819"
    snapshot = tmp_path / "hub" / "models--CompVis--stable-diffusion-v1-4" / "snapshots" / commit
    assert hub_revision(snapshot) == commit and hub_revision(then / "models" / "mine") is None
    cfg = OmegaConf.merge(OmegaConf.structured(RunConfig), {
        "model": {"name": "sd", "pretrained_model_name_or_path": "CompVis/stable-diffusion-v1-4"},
        "prompts": {"texts": ["a"]}})
    notes = repeat(cfg, {"cwd": str(then), "prompts": ["a"], "model": {"revision": commit}})
    assert cfg.model.pretrained_model_name_or_path == "CompVis/stable-diffusion-v1-4"
    assert cfg.model.revision == commit
    assert notes == [f"model.revision: the default branch -> {commit}, the snapshot the run loaded"]
    cfg.model.pretrained_model_name_or_path, cfg.model.revision = str(snapshot), None  # a folder: no revision
    assert repeat(cfg, {"cwd": str(then), "prompts": ["a"], "model": {"revision": commit}}) == []
    assert cfg.model.revision is None


def test_a_rerun_of_something_that_is_no_record_is_one_line(tmp_path):
    result = run_cli(str(tmp_path), cwd=tmp_path, command="rerun")
    assert_one_line_error(result, f"error: RUN: {tmp_path} has no .hydra/config.yaml: not a run record")
    # An MLflow run id with no store to look it up in, or with a --uri MLflow cannot read: one line, and
    # no empty store created on the way.
    run_id, elsewhere = "3d70384158934982ac2cf50c80a37ebd", tmp_path / "elsewhere"
    elsewhere.mkdir()
    result = call_cli(run_id, cwd=elsewhere, command="rerun")
    assert_one_line_error(result, f"error: RUN: {run_id} is not a run directory, and there is no MLflow store at "
                                  f"{elsewhere / 'outputs' / 'mlflow.db'} to look it up in")
    for command, args in (("rerun", [run_id]), ("runs", ["diff", run_id, run_id]), ("sync", [str(elsewhere)])):
        result = call_cli(*args, "--uri", "localhost:5000", cwd=elsewhere, command=command)
        assert_one_line_error(result, "error: --uri: localhost:5000 is no URI MLflow can log to (a server's "
                                      "address needs its scheme: http://localhost:5000)")
    assert list(elsewhere.iterdir()) == []


def test_help_is_the_apps_own(tmp_path):
    result = run_cli("--help", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    text = result.stdout
    for expected in ("sdjax-runner: Stable Diffusion inference in JAX/Flax",
                     "python -m sdjax_runner +experiment=smoke", "outputs/runs/DATE/TIME_NAME/",
                     "python -m sdjax_runner rerun RUN", "python -m sdjax_runner runs list", "'sampler=DPM++ 2M Karras'",
                     "scheduler: beta, ddim, ddpm, dpm_solver_pp, euler, exponential, flow_match_euler, karras, lcm, lms, normal, pndm, "
                     "sgm_uniform, simple", "experiment: "):
        assert expected in text, expected
    assert "Powered by Hydra" not in text


def test_a_missing_launcher_extra_names_its_install_command(tmp_path):
    hide = tmp_path / "hide"  # as if hydra-joblib-launcher were not installed: Hydra's plugin scan skips it
    hide.mkdir()
    (hide / "sitecustomize.py").write_text(
        "import pkgutil\n_walk = pkgutil.walk_packages\n"
        "pkgutil.walk_packages = lambda *a, **k: (m for m in _walk(*a, **k) if 'hydra_joblib_launcher' not in m[1])\n")
    result = run_cli("-m", "+experiment=smoke", "hydra/launcher=joblib", "seed=0,1", cwd=tmp_path,
                     env={"PYTHONPATH": str(hide)})
    assert_one_line_error(result, "error: hydra/launcher=joblib: the launcher is not installed "
                                  "(pip install 'sdjax-runner[joblib]'; allowed now: basic, local_workers, ray, "
                                  "slurm_workers, submitit_local, submitit_slurm)")
    assert not (tmp_path / "outputs" / "multiruns").exists()


@given(st.text(max_size=80))
def test_a_name_becomes_one_directory_inside_the_output_root(name):
    from sdjax_runner.config.naming import slug

    part = slug(name)
    assert part and "/" not in part and "\\" not in part and ".." not in part and part not in (".", "..")
    root = Path("/out/runs")
    assert (root / part).resolve().parent == root


@given(st.text(alphabet=st.characters(blacklist_categories=("Cs",)), max_size=60)
       | st.lists(st.sampled_from(["${", "\\", "'", '"', "}", "oc.env:HOME", ",", "=", "a", " ", "[", "]"]),
                  max_size=12).map("".join))
def test_a_value_given_back_to_hydra_is_that_literal_text_whatever_its_characters(text):
    """A path, a prompt from a PNG, a recorded name: one string, never a sweep, never an interpolation, through
    both grammars (Hydra's override grammar, then OmegaConf's resolution)."""
    from hydra.core.override_parser.overrides_parser import OverridesParser
    from omegaconf import OmegaConf

    from sdjax_runner.config.overrides import literal

    override = OverridesParser.create().parse_override(f"hydra.sweep.dir={literal(text)}")
    assert not override.is_sweep_override()
    resolved = OmegaConf.to_container(OmegaConf.create({"value": override.value()}), resolve=True)["value"]
    assert resolved == text  # '=', ',', quotes, backslashes, '${oc.env:HOME}', '\\${...}'


def test_only_what_changes_the_images_names_a_run():
    from sdjax_runner.config.naming import run_name

    assert run_name("smoke", ["+experiment=smoke", "dtype=bf16", "scheduler=euler", "tracking=none",
                              "paths.output_root=/x", "hydra.run.dir=/y"]) == "smoke dtype=bf16 scheduler=euler"
    assert run_name("mine", ["run_name=mine", "dtype=bf16"]) == "mine"
    assert run_name("smoke", ["metrics.reference=/runs/2026-11-22/17-08-10_smoke/"]) == \
        "smoke metrics.reference=17-08-10_smoke"
    # Values as meant: no escapes or quotes of Hydra's grammar (a sweep job's overrides carry them), a LoRA
    # by its file and scale, a number as spelt.
    assert run_name("smoke", [r"sampler=DPM++\ 2M\ Karras", "sampling.guidance_scale=7.50"]) == \
        "smoke sampler=DPM++ 2M Karras sampling.guidance_scale=7.50"
    assert run_name("smoke", ["sampler='Euler a'", "lora=[{path: /x/style.safetensors, scale: 0.8}, "
                              "{path: /x/detail.safetensors, scale: 1}]"]) == \
        "smoke sampler=Euler a lora=style.safetensors@0.8,detail.safetensors@1"


def test_a_prompt_file_replaces_the_prompt_sets_texts_unless_texts_are_given_too():
    from sdjax_runner.config.prompts import file_replaces_texts

    assert file_replaces_texts(["prompts.file=p.txt"]) == ["prompts.file=p.txt", "prompts.texts=[]"]
    assert file_replaces_texts(["prompts.file=p.txt", "prompts.texts=[a]"]) == ["prompts.file=p.txt", "prompts.texts=[a]"]
    assert file_replaces_texts(["seed=1"]) == ["seed=1"]
    assert file_replaces_texts(["prompts.file=null"]) == ["prompts.file=null"]


@pytest.mark.slow
@pytest.mark.browser
@pytest.mark.server
def test_the_mlflow_ui_opens_on_the_runs_view_in_a_real_browser(smoke_run, tmp_path):
    chromium()  # the README's test setup installs it: apt-get install chromium
    work, _, _ = smoke_run
    shutil.copyfile(work / "outputs" / "mlflow.db", tmp_path / "outputs" / "mlflow.db")
    result = subprocess.run([sys.executable, str(REPO / "tools" / "mlflow_view.py"), str(tmp_path / "outputs" / "mlflow.db"),
                             "--run", "smoke", "--screenshot", str(tmp_path / "view.png")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "ok   the runs view rendered" in result.stdout
    assert "ok   run 'smoke' listed on a row of its own as the page opens" in result.stdout
    with Image.open(tmp_path / "view.png") as shot:
        assert shot.size == (1600, 1000)


DAMAGE = {"truncated": lambda text: text[:20], "null": lambda text: "null", "a list": lambda text: "[1, 2]",
          "a number": lambda text: "5"}


@pytest.mark.slow
def test_damaged_status_and_images_records_are_one_line_each_and_the_others_still_listed(smoke_run, tmp_path):
    """status.json / images.json cut short, null, a list or another type (before: tracebacks from rerun,
    runs list and sync; rerun's exit 1 said 'images differ')."""
    _, original, _ = smoke_run
    root = tmp_path / "runs"
    shutil.copytree(original, root / "good")
    for file in ("status.json", "images.json"):
        for name, damage in DAMAGE.items():
            run = root / f"{file.split('.')[0]} {name}"
            shutil.copytree(original, run)
            (run / file).write_text(damage((original / file).read_text()))
    listing = run_cli("list", str(root), cwd=tmp_path, command="runs")
    assert listing.returncode == 0 and "Traceback" not in listing.stderr
    warnings = {line for line in listing.stderr.splitlines() if line.startswith("runs: ")}
    truncated = {w for w in warnings if w.startswith(f"runs: {root / 'status truncated' / 'status.json'}: cannot be "
                                                     "read as JSON, damaged or cut short (")}
    assert len(truncated) == 1 and warnings - truncated == {
        f"runs: {root / ('status ' + name) / 'status.json'}: is {name} (allowed: a JSON object); listed with status "
        "UNKNOWN" for name in ("null", "a list", "a number")}
    assert len([line for line in listing.stdout.splitlines() if str(root) in line]) == 9  # every run listed

    diff = run_cli("diff", str(root / "good"), str(root / "images null"), "--no-images", cwd=tmp_path,
                   command="runs")
    assert diff.returncode == 0, diff.stderr
    diff = run_cli("diff", str(root / "good"), str(root / "images null"), cwd=tmp_path, command="runs")
    assert "images: not compared (B's images.json: is null)" in diff.stdout

    for run, expected in [("status truncated", "status.json: cannot be read as JSON, damaged or cut short ("),
                          ("status a list", "status.json: is a list (allowed: a JSON object)"),
                          ("images null", "images.json: is null (allowed: a list of image records (JSON objects))"),
                          ("images a list", "images.json: is a list holding other things (allowed: a list of image")]:
        rerun = run_cli(str(root / run), "--no-tracking", cwd=tmp_path, command="rerun")
        assert_one_line_error(rerun, f"error: {root / run / expected.split(':')[0]}:{expected.split(':', 1)[1]}")
    sync = run_cli(str(root / "status null"), cwd=tmp_path, command="sync")
    assert sync.returncode == 1 and "Traceback" not in sync.stderr
    assert sync.stderr.strip() == f"error: {root / 'status null' / 'status.json'}: is null (allowed: a JSON object)"
