"""Two runs logging to one embedded SQLite store at once, starting from no store at all."""

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest
from mlflow.tracking import MlflowClient


@pytest.mark.slow
def test_concurrent_runs_on_a_new_embedded_store_all_land(tmp_path, smoke_run):
    # smoke_run has stored the program: what races here is the store and the run directories, not
    # two compiles of the same program on a 2-core machine.
    work = tmp_path / "fresh"  # no store yet: the processes race to create it
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    # One name and the default, time-stamped directories: started together, each claims its own.
    procs = [subprocess.Popen([sys.executable, "-m", "sdjax_runner", "+experiment=smoke", f"seed={seed}",
                               "run_name=concurrent"],
                              cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in range(2)]
    results = [(proc.wait(timeout=300), proc.communicate()) for proc in procs]
    for code, (stdout, stderr) in results:
        assert code == 0, stderr
        assert "tracking failed" not in stdout + stderr  # logged, not merely kept on disk
    run_dirs = sorted((work / "outputs" / "runs").glob("*/*"))
    assert len(run_dirs) == 2 and all(len(list((d / "images").glob("*.png"))) == 8 for d in run_dirs)
    if run_dirs[0].name.split("_")[0] == run_dirs[1].name.split("_")[0]:  # the same second: one is _2
        assert [d.name.split("_", 1)[1] for d in run_dirs] == ["concurrent", "concurrent_2"]
    assert sorted(json.loads((d / "images.json").read_text())[0]["seed"] for d in run_dirs) == [0, 1]
    client = MlflowClient(f"sqlite:///{work / 'outputs' / 'mlflow.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "sdjax-runner"]
    runs = client.search_runs([experiment.experiment_id])
    assert sorted((r.info.run_name, r.data.params["seed"]) for r in runs) == [("concurrent", "0"), ("concurrent", "1")]
    assert {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert len(client.list_artifacts(run.info.run_id, "images")) == 8
        assert run.data.metrics["num_images"] == 8


def test_a_default_directory_already_taken_is_claimed_with_a_suffix_never_shared(tmp_path):
    from sdjax_runner.record.fresh_dirs import claim, release

    base = tmp_path / "runs" / "2026-11-23" / "10-00-00_smoke"
    with ThreadPoolExecutor(8) as pool:  # eight processes' worth of claims on one name at once
        claimed = list(pool.map(lambda _: claim(base), range(8)))
    assert sorted(p.name for p in claimed) == sorted(["10-00-00_smoke"] + [f"10-00-00_smoke_{n}" for n in range(2, 9)])
    assert all(p.is_dir() for p in claimed)
    release(base)  # a claim refused later is given back, with the parents it made, if left empty
    assert not base.exists() and (tmp_path / "runs" / "2026-11-23").exists()  # the others still hold it
    fresh = tmp_path / "new" / "deep" / "sweep"
    release(claim(fresh))
    assert not (tmp_path / "new").exists()


# Two processes each start a run, then log the same prompts as their run's dataset input at the same
# moment, three times over (what two terminals or a parallel sweep on one prompt set do at the end).
_SAME_PROMPTS_AT_ONCE = """
import json, sys, time
from pathlib import Path
from omegaconf import OmegaConf
from sdjax_runner.record.tracking import MlflowTracker

root, me = Path(sys.argv[1]), sys.argv[2]
tracking = OmegaConf.create({"uri": None, "experiment_name": "sdjax-runner", "max_retries": 0,
                             "backoff_factor": 0, "timeout_s": 10})
for round in range(3):
    tracker = MlflowTracker(tracking, str(root / "outputs"))
    tracker.start(f"{me} {round}", {}, {})
    run_dir = root / f"{me}-{round}"
    run_dir.mkdir()
    (run_dir / "inputs.json").write_text(json.dumps({"prompt_set": "cats.txt", "prompts": [f"a cat, take {round}"]}))
    (root / f"ready-{me}-{round}").touch()
    deadline = time.monotonic() + 60
    while not all((root / f"ready-{who}-{round}").exists() for who in "ab"):
        if time.monotonic() > deadline:
            sys.exit("the other process is gone")
    tracker.log_outputs(run_dir, {"num_images": 1.0})
    tracker.end("FINISHED")
"""


@pytest.mark.slow
def test_runs_logging_the_same_prompts_at_once_both_get_their_dataset(tmp_path):
    # MLflow looks a dataset up, then inserts it: before, the later of two simultaneous inserts broke the
    # datasets table's unique key and that run's outputs went unlogged ("tracking failed").
    procs = [subprocess.Popen([sys.executable, "-c", _SAME_PROMPTS_AT_ONCE, str(tmp_path), who], cwd=tmp_path,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for who in "ab"]
    for proc in procs:
        _, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, stderr
    client = MlflowClient(f"sqlite:///{tmp_path / 'outputs' / 'mlflow.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "sdjax-runner"]
    runs = client.search_runs([experiment.experiment_id])
    assert len(runs) == 6
    for run in runs:
        [dataset_input] = run.inputs.dataset_inputs
        round = run.info.run_name.split()[1]
        assert dataset_input.dataset.name == "cats.txt" and run.data.metrics["num_images"] == 1
        same_round = [r for r in runs if r.info.run_name.endswith(round)]
        assert {r.inputs.dataset_inputs[0].dataset.digest for r in same_round} == {dataset_input.dataset.digest}
