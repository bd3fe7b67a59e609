"""Reliability, round two: a model folder is untrusted input, a full or read-only disk, a process
killed without a word, a run directory given twice, prompts that are not what they seem. Each fault
is made for real (a planted module, a tiny tmpfs, SIGKILL) and the user-visible outcome checked."""

import hashlib
import json
import os
import shutil
import signal
import sqlite3
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, run_cli
from helpers.images import wait_for_images
from helpers.mlflow_store import sweep_runs

KEY = "error: model.pretrained_model_name_or_path:"


def _json(path: Path):
    return json.loads(path.read_text())


def _edit_index(model: Path, component: str, spec) -> None:
    index = _json(model / "model_index.json")
    index[component] = spec
    (model / "model_index.json").write_text(json.dumps(index))


def _plant(model: Path) -> None:
    _edit_index(model, "unet", ["planted", "FlaxUNet2DConditionModel"])


def _bad_class(model: Path) -> None:
    _edit_index(model, "unet", ["diffusers", "os.system"])


def _not_a_component(model: Path) -> None:
    _edit_index(model, "vae", ["diffusers", "DiffusionPipeline"])


def _truncated_weights(model: Path) -> None:
    weights = model / "unet" / "diffusion_flax_model.msgpack"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])


def _config_not_json(model: Path) -> None:
    (model / "vae" / "config.json").write_text("{ this is not json")


def _index_not_json(model: Path) -> None:
    (model / "model_index.json").write_bytes(b"\xff\xfe not json")


def _sparse(relative: str, size: int):
    """A file that claims ``size`` bytes and takes no disk: read whole, it would take all the memory."""
    def edit(model: Path) -> None:
        with open(model / relative, "wb") as file:
            file.truncate(size)
    return edit


HOSTILE = {
    "a library that is a planted module": (_plant, "{m}/model_index.json: component 'unet' names library 'planted', "
                                                   "which is not loaded (allowed: diffusers, transformers, stable_diffusion)"),
    "a class name that is a path": (_bad_class, "{m}/model_index.json: component 'unet' names class 'os.system', "
                                                "not a class name"),
    "a class that is no component": (_not_a_component, "{m}/model_index.json: component 'vae': diffusers has no "
                                                       "loadable class 'DiffusionPipeline'"),
    "a pipeline setting of the wrong type": (lambda m: _edit_index(m, "requires_safety_checker", "no"),
                                             "{m}/model_index.json: setting 'requires_safety_checker' is \"no\", "
                                             "not true/false"),
    "an entry that is neither a component nor a setting": (
        lambda m: _edit_index(m, "watermark", 1),
        "{m}/model_index.json: component 'watermark' is 1, not [library, class] (pipeline settings allowed beside "
        "the components: requires_safety_checker, force_zeros_for_empty_prompt, add_watermarker, is_distilled)"),
    "truncated weights": (_truncated_weights, "{m}/unet/: cannot be loaded ("),
    # refused before the run starts (config/folder_files.py reads the folder's text files first): no run folder
    "a config that is not JSON": (_config_not_json, "{m}/vae/config.json is not JSON (JSONDecodeError)"),
    "an index that is not JSON": (_index_not_json, "{m}/model_index.json is not JSON (UnicodeDecodeError)"),
    "a sparse terabyte tokenizer file": (_sparse("tokenizer/vocab.json", 2**40),
                                         "{m}/tokenizer/vocab.json has 1099511.6 MB (allowed: at most 64 MB)"),
    "weights larger than any host's memory": (_sparse("unet/diffusion_flax_model.msgpack", 2**43),
                                              "{m}/unet/diffusion_flax_model.msgpack: 8796.1 GB of weights, which "
                                              "take 17592.2 GB to read, more than this host's "),
    "weights far larger than their config describes": (_sparse("unet/diffusion_flax_model.msgpack", 2**31),
                                                       "unet/ does not match its config.json: diffusion_flax_model."
                                                       "msgpack has 2147483648 bytes, far more than the "),
}


@pytest.mark.parametrize("case", HOSTILE)
@pytest.mark.slow
def test_a_model_folder_cannot_run_code_or_crash_the_loader(tmp_path, tiny_model_dir, case):
    edit, expected = HOSTILE[case]
    model = tmp_path / "model"
    shutil.copytree(tiny_model_dir, model)
    edit(model)
    planted = "open('PLANTED_CODE_RAN', 'w').write('yes')\nclass FlaxUNet2DConditionModel: pass\n"
    for where in (tmp_path, model):  # the working directory (on sys.path with -m) and the folder itself
        (where / "planted.py").write_text(planted)
    result = run_cli("+experiment=smoke", "model=local", f"model.pretrained_model_name_or_path={model}",
                     "tracking=none", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert_one_line_error(result, f"{KEY} {expected.format(m=model)}")
    assert not list(tmp_path.rglob("PLANTED_CODE_RAN"))
    if " is not JSON " in expected or "allowed: at most 64 MB" in expected:  # refused before it started
        assert not (tmp_path / "run").exists()
    else:
        assert _json(tmp_path / "run" / "status.json")["status"] == "FAILED"


def test_python_m_from_a_folder_that_ships_modules_imports_none_of_them(tmp_path):
    """A model folder that ships hydra.py, numpy.py or json.py, a run started inside it: ``python -m``
    puts the working directory first on sys.path; the runner takes it off before importing anything."""
    folder = tmp_path / "downloaded-model"
    folder.mkdir()
    for name in ("hydra", "omegaconf", "numpy", "json", "logging", "jax", "mlflow"):
        (folder / f"{name}.py").write_text(f"open({str(tmp_path / ('RAN_' + name))!r}, 'w').write('yes')\n"
                                           "raise SystemExit('planted module imported')\n")
    result = run_cli("+experiment=smoke", "sampling.height=65", cwd=folder)
    assert_one_line_error(result, "error: sampling.height: must be a positive multiple of 8")
    listing = run_cli("list", str(tmp_path), cwd=folder, command="runs")
    assert "planted module imported" not in listing.stderr + listing.stdout, listing.stderr
    assert not list(tmp_path.glob("RAN_*"))


@pytest.mark.slow
def test_a_reused_run_or_sweep_directory_is_refused_and_the_first_run_kept(smoke_run, tmp_path):
    _, original, _ = smoke_run
    first = tmp_path / "first"
    shutil.copytree(original, first)
    before = {p: p.read_bytes() for p in first.rglob("*") if p.is_file()}
    result = run_cli("+experiment=smoke", "seed=1", f"hydra.run.dir={first}", cwd=tmp_path)
    assert_one_line_error(result, f"error: hydra.run.dir: {first} already holds a run (status.json, images, .hydra, "
                                  "timings.json); a run directory holds one run")
    assert {p: p.read_bytes() for p in first.rglob("*") if p.is_file()} == before  # not even .hydra/ rewritten

    sweep = tmp_path / "sweep"
    (sweep / "0").mkdir(parents=True)
    (sweep / "sweep.json").write_text("{}")
    result = run_cli("-m", "+experiment=smoke", "seed=1,2", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert_one_line_error(result, f"error: hydra.sweep.dir: {sweep} already holds a run (sweep.json, 0)")
    assert sorted(p.name for p in sweep.iterdir()) == ["0", "sweep.json"]


@pytest.mark.slow
def test_a_killed_run_says_whose_it_was_and_sync_finishes_it_from_disk(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    prompt = "a cat\nNegative prompt: injected\nSteps: 1"  # a prompt with line breaks: not new PNG fields
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    proc = subprocess.Popen([sys.executable, "-m", "sdjax_runner", "+experiment=smoke", "parallelism.num_batches=500",
                             f"prompts.texts=['{prompt}']", f"hydra.run.dir={run_dir}"], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wait_for_images(run_dir / "images", 17, proc)  # PNGs are written one after another: 16 are whole
    proc.send_signal(signal.SIGKILL)  # no handler runs: what is on disk is all there is
    proc.wait(timeout=60)
    status = _json(run_dir / "status.json")
    assert (status["status"], status["pid"]) == ("RUNNING", proc.pid) and status["host"] and status["started_at"]
    assert not (run_dir / "images.json").exists()

    result = run_cli(str(run_dir), cwd=tmp_path, command="sync")
    assert result.returncode == 0, result.stderr
    assert f"{run_dir}: KILLED: its process is gone; " in result.stdout and "logged as mlflow run" in result.stdout
    status = _json(run_dir / "status.json")
    assert status["status"] == "KILLED" and f"pid {proc.pid}" in status["error"] and status["logged"] is True
    records = _json(run_dir / "images.json")
    pngs = [f"images/{p.name}" for p in sorted((run_dir / "images").glob("*.png"))]
    cut_short = status.get("unreadable_images", [])  # a PNG the kill cut in half is named, not listed
    assert len(records) >= 16 and len(cut_short) <= 1 and [r["file"] for r in records] == [p for p in pngs if p not in cut_short]
    for record in records[:4]:
        with Image.open(run_dir / record["file"]) as image:
            assert record["pixels_sha256"] == hashlib.sha256(np.asarray(image.convert("RGB")).tobytes()).hexdigest()
            assert record["prompt"] == prompt and isinstance(record["seed"], int)
            parameters = image.text["parameters"].splitlines()
        assert len(parameters) == 2 and parameters[0] == "a cat Negative prompt: injected Steps: 1"
        assert parameters[1].startswith("Steps: 4, Sampler: pndm")
    with sqlite3.connect(tmp_path / "outputs" / "mlflow.db") as db:
        assert db.execute("select status from runs").fetchall() == [("KILLED",)]
    again = run_cli(str(run_dir), cwd=tmp_path, command="sync")
    assert again.returncode == 0 and "already logged" in again.stdout


def test_an_interrupted_build_leaves_no_staging_behind_and_a_partial_folder_is_one_line(tmp_path):
    import socket

    from sdjax_runner.errors import UserError
    from sdjax_runner.models.builtin import build_builtin, remove_abandoned_builds

    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    target = tmp_path / "models" / "tiny-random-clip-v1"
    target.parent.mkdir()
    abandoned = target.parent / f".{target.name}.{socket.gethostname()}.{dead.pid}.x1y2"
    (abandoned / "text_encoder").mkdir(parents=True)
    alive = target.parent / f".{target.name}.{socket.gethostname()}.{os.getppid()}.a3b4"  # a build still going
    alive.mkdir()
    assert remove_abandoned_builds(target) == [abandoned]
    assert not abandoned.exists() and alive.exists()

    target.mkdir()
    (target / "half-copied.bin").write_bytes(b"x")
    with pytest.raises(UserError, match=f"{target} exists but is not a complete built-in model \\(no config.json\\)"):
        build_builtin("tiny-random-clip", target)


def _mount_tmpfs(path: Path, size: str, read_only: bool = False) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    options = f"size={size}" + (",ro" if read_only else "")
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)], capture_output=True).returncode == 0


@pytest.fixture
def small_disk(tmp_path):
    """A 64 KiB tmpfs (and a read-only one): a full disk and an unwritable one, for real."""
    full, read_only = tmp_path / "full", tmp_path / "ro"
    if not (_mount_tmpfs(full, "64k") and _mount_tmpfs(read_only, "64k", read_only=True)):
        subprocess.run(["umount", str(full)], capture_output=True)
        pytest.skip("needs permission to mount a tmpfs (root)")
    yield full, read_only
    for mount in (full, read_only):
        subprocess.run(["umount", str(mount)], capture_output=True)


@pytest.mark.slow
def test_a_full_disk_fails_the_run_with_one_line_and_leaves_nothing_half_written(tmp_path, small_disk):
    full, _ = small_disk
    run_dir = full / "run"
    result = run_cli("+experiment=smoke", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr + result.stdout
    errors = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "No space left on device -- the outputs could not be written (allowed: free space " \
                                "there, or another paths.output_root)" in errors[0], result.stderr
    assert not list(full.rglob("*.tmp"))
    with sqlite3.connect(tmp_path / "outputs" / "mlflow.db") as db:
        assert db.execute("select status from runs").fetchall() == [("FAILED",)]  # nothing left RUNNING
    if (run_dir / "status.json").exists():
        assert _json(run_dir / "status.json")["status"] == "FAILED"
    for png in (run_dir / "images").glob("*.png"):  # every PNG left is a whole image
        with Image.open(png) as image:
            image.load()


def test_a_compilation_cache_entry_that_does_not_fit_leaves_nothing_behind(small_disk, caplog):
    # JAX writes an entry in place: on a full disk a truncated entry would stay, and every later run
    # would fail to read it and compile again. The runner's guard writes it whole or not at all.
    from jax._src.lru_cache import LRUCache

    from sdjax_runner.engine.compile_cache import guard_entries

    full, _ = small_disk
    assert guard_entries()
    cache = LRUCache(str(full / "xla"), max_size=-1)
    cache.put("fits", b"x" * 1000)
    with caplog.at_level("INFO", logger="sdjax_runner"):
        cache.put("too-big", b"x" * 200_000)  # the tmpfs holds 64 KiB
    assert sorted(p.name for p in (full / "xla").iterdir()) == ["fits-cache"]
    assert "compilation_cache: entry too-big-cache not written (" in caplog.text
    assert cache.get("fits") == b"x" * 1000 and cache.get("too-big") is None


@pytest.mark.slow
def test_an_unwritable_or_damaged_embedded_store_is_tracker_down_not_a_crash(tmp_path, small_disk):
    _, read_only = small_disk
    result = run_cli("+experiment=smoke", f"tracking.uri=sqlite:///{read_only}/store/mlflow.db",
                     f"hydra.run.dir={tmp_path / 'a'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert "tracking failed, the run goes on" in result.stdout + result.stderr
    assert _json(tmp_path / "a" / "status.json")["logged"] is False

    damaged = tmp_path / "damaged" / "mlflow.db"
    damaged.parent.mkdir()
    damaged.write_bytes(b"SQLite format 3\x00" + b"\x00" * 84 + b"half a migration")
    result = run_cli("+experiment=smoke", f"tracking.uri=sqlite:///{damaged}", f"hydra.run.dir={tmp_path / 'b'}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    output = " ".join((result.stdout + result.stderr).split())
    assert f"the embedded MLflow store {damaged} cannot be opened -- half-created" in output
    assert f"mv {damaged} {damaged}.broken" in output
    assert len(list((tmp_path / "b" / "images").glob("*.png"))) == 8


def test_command_line_prompts_must_be_utf8_before_anything_loads(tmp_path):
    result = run_cli("+experiment=smoke", "prompts.texts=['a \udcff b']", cwd=tmp_path)
    assert_one_line_error(result, "error: prompts.texts: is not valid UTF-8: prompts.texts=['a \\udcff b'] "
                                  "(allowed: UTF-8 text)")
    assert not (tmp_path / "outputs" / "runs").exists()


def test_prompt_files_split_on_line_ends_only(tmp_path):
    from sdjax_runner.config.prompts import read_prompt_file

    path = tmp_path / "prompts.txt"
    path.write_bytes("one\u2028still one\x0cand one\r\ntwo \r\n\r\n  three\rstill three\n".encode())
    assert read_prompt_file(str(path)) == ["one\u2028still one\x0cand one", "two", "three\rstill three"]


@pytest.mark.slow
def test_a_sweep_that_breaks_off_before_its_jobs_leaves_no_running_parent_run(tmp_path):
    # Whatever goes wrong between the sweep's start and its first job (here: the sweeper itself fails,
    # as a launcher plugin might) ends the parent tracker run FAILED with the error, not RUNNING.
    script = f"""
import sys
from hydra.core.plugins import Plugins
def broken(self, config, **kwargs):
    raise RuntimeError("the sweeper broke")
Plugins.instantiate_sweeper = broken  # called right after the sweep's start (parent run, sweep.json)
sys.argv = ["sdjax_runner", "-m", "+experiment=smoke", "seed=0,1", "hydra.sweep.dir={tmp_path / 'sweep'}"]
from sdjax_runner.commands.run import main
main()
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert result.returncode == 1 and "RuntimeError: the sweeper broke" in result.stderr  # a bug keeps its traceback
    _, parent, children = sweep_runs(tmp_path)
    assert parent.info.status == "FAILED" and children == []
    assert parent.data.tags["error"] == "RuntimeError: the sweeper broke"


@pytest.mark.slow
def test_a_sweep_check_that_fails_itself_lets_the_sweep_run(tmp_path, tiny_model_dir):
    # The up-front check of a sweep's points is a convenience: if it breaks (not bad input, a bug),
    # the sweep runs as Hydra would run it, with its parent run and records, and says so once.
    script = f"""
import sys
from sdjax_runner.config import sweep_points
def broken(config, task):
    raise RuntimeError("the check broke")
sweep_points.check_points = broken
sys.argv = ["sdjax_runner", "-m", "+experiment=smoke", "seed=0", "hydra.sweep.dir={tmp_path / 'sweep'}"]
from sdjax_runner.commands.run import main
main()
"""
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    output = result.stdout + result.stderr
    assert output.count("sweep: the points were not checked before the start (RuntimeError: the check broke)") == 1
    _, parent, [child] = sweep_runs(tmp_path)
    assert parent.info.status == child.info.status == "FINISHED"
    assert len(list((tmp_path / "sweep" / "0" / "images").glob("*.png"))) == 8
