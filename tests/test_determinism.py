"""Same seed, same pixels; another seed, other images; later batches get their own keys."""

import numpy as np
import pytest

from helpers.cli import run_cli
from helpers.images import images_of

pytestmark = pytest.mark.slow


def test_same_seed_same_pixels_other_seed_other_images(smoke_run, tmp_path):
    _, first_dir, _ = smoke_run  # seed 0, another process
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "seed=0,1", "tracking=none", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    first, again, other = images_of(first_dir), images_of(sweep / "0"), images_of(sweep / "1")
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_batches_and_per_device_slots_get_distinct_noise(tmp_path):
    # 2 devices x 2 per device x 2 batches of one prompt: 8 images, no two alike; batch 0 is
    # the guide's keys, so its images match a 1-batch run with the same layout.
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", "parallelism.num_devices=2", "parallelism.per_device_batch_size=2",
                     "parallelism.num_batches=2,1", "tracking=none", f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    images = images_of(sweep / "0")
    assert len(images) == 8 and len({i.tobytes() for i in images}) == 8
    assert all(np.array_equal(a, b) for a, b in zip(images[:4], images_of(sweep / "1"), strict=True))
