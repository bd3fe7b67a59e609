"""Same seed, same pixels; another seed, other images; later batches get their own keys."""

import numpy as np
from PIL import Image

from conftest import run_cli


def images_of(run_dir):
    return [np.asarray(Image.open(f)) for f in sorted((run_dir / "images").glob("*.png"))]


def test_same_seed_same_pixels_other_seed_other_images(smoke_run, tmp_path):
    _, first_dir, _ = smoke_run
    runs = {}
    for seed in (0, 1):
        runs[seed] = tmp_path / f"seed{seed}"
        result = run_cli("+experiment=smoke", f"seed={seed}", "tracking=none", f"hydra.run.dir={runs[seed]}",
                         cwd=tmp_path)
        assert result.returncode == 0, result.stderr
    first, again, other = images_of(first_dir), images_of(runs[0]), images_of(runs[1])
    assert all(np.array_equal(a, b) for a, b in zip(first, again, strict=True))
    assert not any(np.array_equal(a, b) for a, b in zip(first, other, strict=True))


def test_batches_and_per_device_slots_get_distinct_noise(tmp_path):
    # 2 devices x 2 per device x 2 batches of one prompt: 8 images, no two alike; batch 0 is
    # the guide's keys, so its images match a 1-batch run with the same layout.
    run_dir, single_dir = tmp_path / "two", tmp_path / "one"
    layout = ["parallelism.num_devices=2", "parallelism.per_device_batch_size=2", "tracking=none"]
    two = run_cli("+experiment=smoke", *layout, "parallelism.num_batches=2", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    one = run_cli("+experiment=smoke", *layout, f"hydra.run.dir={single_dir}", cwd=tmp_path)
    assert two.returncode == 0 and one.returncode == 0, two.stderr + one.stderr
    images = images_of(run_dir)
    assert len(images) == 8 and len({i.tobytes() for i in images}) == 8
    assert all(np.array_equal(a, b) for a, b in zip(images[:4], images_of(single_dir), strict=True))
