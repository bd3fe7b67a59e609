"""Every scheduler runs the pipeline's loop to real, distinct images; a scheduler sweep loads once."""

import json

import numpy as np
from PIL import Image

from conftest import CONF_SCHEDULERS, run_cli


def test_every_scheduler_gives_its_own_images_from_one_model_load(tmp_path, tiny_model_dir):
    sweep_dir = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", f"scheduler={','.join(CONF_SCHEDULERS)}", "tracking=none",
                     f"hydra.sweep.dir={sweep_dir}", timeout=600, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    grids = {}
    for job, name in enumerate(CONF_SCHEDULERS):
        job_dir = sweep_dir / str(job)
        with Image.open(job_dir / "images" / "0000_seed0.png") as image:
            assert image.text["scheduler"] == name
        grid = np.asarray(Image.open(job_dir / "grid.png"))
        assert grid.std() > 10 and 5 < grid.mean() < 250  # a picture, not black (NaN) or blown out
        grids[name] = grid
        timings = json.loads((job_dir / "timings.json").read_text())
        assert timings["process_model_loads"] == 1  # the weights load once; each scheduler compiles
    assert len({g.tobytes() for g in grids.values()}) == len(CONF_SCHEDULERS)
