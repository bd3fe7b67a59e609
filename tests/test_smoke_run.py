"""``python -m sdjax_runner +experiment=smoke`` in a subprocess: what lands on disk and in MLflow."""

import json
import subprocess
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

pytestmark = pytest.mark.slow

REPO = Path(__file__).resolve().parent.parent

TIMING_KEYS = {"compile_s", "generate_s", "generate_s_min", "generate_s_max", "images_per_s", "s_per_step",
               "num_images", "num_devices", "device_kind", "backend"}


def test_images_grid_and_metadata_on_disk(smoke_run):
    _, run_dir, _ = smoke_run
    files = sorted((run_dir / "images").glob("*.png"))
    assert [f.name for f in files] == [f"{i:04d}_seed0.png" for i in range(8)]
    with Image.open(files[3]) as image:
        assert image.size == (64, 64)
        text = dict(image.text)
    assert text["prompt"].startswith("A cinematic film still of Morgan Freeman")
    assert (text["seed"], text["steps"], text["guidance_scale"], text["scheduler"]) == ("0", "4", "7.5", "pndm")
    assert (text["model"], text["dtype"], text["device"], text["batch"]) == ("tiny-random", "float32", "3", "0")
    assert text["non_finite"] == "False"
    assert text["parameters"].splitlines()[1].startswith("Steps: 4, Sampler: pndm, CFG scale: 7.5, Seed: 0, Size: 64x64")
    with Image.open(run_dir / "grid.png") as grid:
        assert grid.size == (4 * 64, 2 * 64)
        # The grid's cells are the images themselves.
        with Image.open(files[5]) as sixth:
            assert np.array_equal(np.asarray(grid.convert("RGB"))[64:, 64:128], np.asarray(sixth.convert("RGB")))
    records = json.loads((run_dir / "images.json").read_text())
    assert [r["file"] for r in records] == [f"images/{f.name}" for f in files]


def test_images_are_real_distinct_pictures(smoke_run):
    _, run_dir, _ = smoke_run
    pixels = [np.asarray(Image.open(f)) for f in sorted((run_dir / "images").glob("*.png"))]
    assert all(p.std() > 10 for p in pixels)  # not blank
    assert len({p.tobytes() for p in pixels}) == 8  # one key per device: eight different images
    records = json.loads((run_dir / "images.json").read_text())
    assert [r["non_finite"] for r in records] == [False] * 8
    assert json.loads((run_dir / "quality.json").read_text())["non_finite_images"] == 0


def test_timings_status_and_resolved_config(smoke_run):
    _, run_dir, _ = smoke_run
    timings = json.loads((run_dir / "timings.json").read_text())
    assert timings.keys() >= TIMING_KEYS
    assert timings["num_images"] == 8 and timings["num_devices"] == 8 and timings["backend"] == "cpu"
    assert timings["compile_s"] > 0
    # One batch, re-run for its steady state while the re-runs cost at most timing.max_extra_share (0.5) of
    # the job so far (a tiny model's batch is cheap next to its load and compile: usually all 3 fit).
    calls = timings["steady_calls"]
    assert calls == timings["timing_extra_calls"] and 0 <= calls <= 3
    assert timings["generate_s_from"] == ("steady_median" if calls else "first_call")
    assert timings["timing_extra_s"] <= 0.5 * timings["timing_base_s"] + timings["generate_s_max"]
    # The tests share one compilation cache: an earlier test may have stored this program (test_warm_start.py).
    assert (timings["compile_path"], timings["trace_s"] > 0) in {("traced", True), ("executable_cache", False)}
    assert timings["generate_s_min"] <= timings["generate_s"] <= timings["generate_s_max"]
    assert timings["images_per_s"] == pytest.approx(8 / timings["generate_s"])
    assert timings["s_per_step"] == pytest.approx(timings["generate_s"] / 4)
    assert json.loads((run_dir / "status.json").read_text())["status"] == "FINISHED"
    config = (run_dir / ".hydra" / "config.yaml").read_text()
    assert "experiment: smoke" in config and "num_inference_steps: 4" in config
    assert "+experiment=smoke" in (run_dir / ".hydra" / "overrides.yaml").read_text()


def test_console_shows_phases_not_library_noise(smoke_run):
    _, _, result = smoke_run
    for phase in ("plan:", "load:", "compile:", "generate:", "write:", "track:"):
        assert phase in result.stdout
    # The generate line says what its figure rests on: the median of the steady-state calls, or the first
    # call alone when none was afforded.
    timings = json.loads((smoke_run[1] / "timings.json").read_text())
    [generate] = [line for line in result.stdout.splitlines() if "] generate: " in line]
    calls = timings["steady_calls"]
    said = f"generate: {timings['generate_s']:.3f} s/batch " + (f"median of {calls} (min " if calls else
                                                                "from the first call alone (no steady-state call")
    assert said in generate
    assert ("would cost over timing.max_extra_share=0.5 of the job's" in generate) == (calls < 3)
    noise = result.stdout + result.stderr
    for text in ("deprecated", "safety checker", "Traceback", "INFO mlflow"):
        assert text not in noise


def test_mlflow_run_read_back(smoke_run):
    from mlflow.tracking import MlflowClient

    work, run_dir, _ = smoke_run
    client = MlflowClient(tracking_uri=f"sqlite:///{work / 'outputs' / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("sdjax-runner")
    assert experiment.artifact_location == (work / "outputs" / "mlartifacts").as_uri()
    [run] = client.search_runs([experiment.experiment_id])
    assert run.info.status == "FINISHED" and run.info.run_name == "smoke"
    params = run.data.params
    assert params["seed"] == "0" and params["sampling.num_inference_steps"] == "4"
    assert params["model.name"] == "tiny-random" and params["dtype.weights_dtype"] == "float32"
    assert "prompts.texts" not in params  # lists go to artifacts
    timings = json.loads((run_dir / "timings.json").read_text())
    for key in ("compile_s", "generate_s", "images_per_s", "s_per_step", "num_images"):
        assert run.data.metrics[key] == pytest.approx(timings[key])
    tags = run.data.tags
    assert tags["backend"] == "cpu" and tags["device_count"] == "8" and tags["process_count"] == "1"
    assert tags["experiment"] == "smoke" and "+experiment=smoke" in tags["hydra.overrides"]
    for package in ("jax", "jaxlib", "flax", "numpy"):  # what decides the pixels (sdjax_runner/versions.py)
        assert tags[f"version.{package}"][0].isdigit()
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True)
    if commit.returncode == 0:
        assert tags["mlflow.source.git.commit"] == commit.stdout.strip()
    top = {a.path for a in client.list_artifacts(run.info.run_id)}
    assert {"grid.png", "timings.json", "images.json", "images", "config"} <= top
    assert len(client.list_artifacts(run.info.run_id, "images")) == 8
    assert "config/config.yaml" in {a.path for a in client.list_artifacts(run.info.run_id, "config")}
