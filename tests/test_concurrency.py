"""Two runs logging to one embedded SQLite store at once, starting from no store at all."""

import os
import subprocess
import sys

from mlflow.tracking import MlflowClient


def test_concurrent_runs_on_a_new_embedded_store_all_land(tmp_path, tiny_model_dir):
    work = tmp_path / "fresh"  # no store yet: the processes race to create it
    work.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
    procs = [subprocess.Popen([sys.executable, "-m", "sdjax_runner", "+experiment=smoke", f"seed={seed}",
                               f"run_name=concurrent-{seed}", f"hydra.run.dir={work / f'run{seed}'}"],
                              cwd=work, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for seed in range(2)]
    results = [(proc.wait(timeout=300), proc.communicate()) for proc in procs]
    for code, (stdout, stderr) in results:
        assert code == 0, stderr
        assert "tracking failed" not in stdout + stderr  # logged, not merely kept on disk
    client = MlflowClient(f"sqlite:///{work / 'outputs' / 'mlflow.db'}")
    [experiment] = [e for e in client.search_experiments() if e.name == "sdjax-runner"]
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(r.info.run_name for r in runs) == ["concurrent-0", "concurrent-1"]
    assert {r.info.status for r in runs} == {"FINISHED"}
    for run in runs:
        assert len(client.list_artifacts(run.info.run_id, "images")) == 8
        assert run.data.metrics["num_images"] == 8
