"""CMMD (metrics/cmmd.py) against Google's reference (tests/helpers/cmmd_reference.py: its distance.py, and its
image preparation, transcribed to NumPy), its embeddings against transformers' Flax CLIP, and
``python -m sdjax_runner evaluate A B``. The CLIP here is the built-in tiny random one: its values judge nothing."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from PIL import Image

from helpers import cmmd_reference
from helpers.cli import assert_one_line_error, run_cli

# float32's spacing at 1. Each of the three kernel means is a float32 mean of values in (0, 1], within ~2% of 1 for
# unit embeddings: rounding the exponential, its argument and XLA's sum leaves each a few ulp from the exact mean,
# and the distance is SCALE * (k_xx + k_yy - 2 k_xy), four such terms. 4 ulp a term: 16 ulp times SCALE, ~1.9e-3
# (what the cases below show: up to ~3 ulp times SCALE, 3.5e-4). Values far from 0 (the shifted Gaussians) are
# held to float32's relative precision as well.
ULP = float(np.finfo(np.float32).eps)
ATOL = cmmd_reference.SCALE * 16 * ULP
RTOL = 1e-5


def _unit(a: np.ndarray) -> np.ndarray:
    return a / np.linalg.norm(a, axis=-1, keepdims=True)


def _embeddings(rng, n: int, d: int, shift: float = 0.0, unit: bool = True) -> np.ndarray:
    a = rng.normal(size=(n, d)) + shift
    return (_unit(a) if unit else 3 * a).astype(np.float32)


@pytest.mark.parametrize(("n", "m", "d"), [(1, 1, 4), (5, 7, 8), (16, 16, 32), (64, 40, 128), (200, 150, 768)])
def test_mmd_is_the_references_distance(n, m, d):
    from sdjax_runner.metrics.cmmd import mmd

    rng = np.random.default_rng(n * 1000 + m)
    for unit in (True, False):  # CLIP's unit embeddings, and wider ones (kernel values far from 1)
        x, y = _embeddings(rng, n, d, unit=unit), _embeddings(rng, m, d, shift=0.3, unit=unit)
        got = mmd(x, y)
        assert got.dtype == np.float32 and got.shape == ()  # the reference's float32, one number
        expected = cmmd_reference.mmd(x, y)
        assert float(got) == pytest.approx(expected, rel=RTOL, abs=ATOL), (unit, float(got), expected)
    # float64 inputs are computed in float32, as the reference's jnp.asarray does without jax_enable_x64
    assert float(mmd(x.astype(np.float64), y)) == float(mmd(x, y))


def test_mmd_is_zero_for_one_set_symmetric_and_grows_as_a_set_moves_away():
    from sdjax_runner.metrics.cmmd import mmd

    rng = np.random.default_rng(1)
    x, y = _embeddings(rng, 50, 64), _embeddings(rng, 30, 64)
    assert abs(float(mmd(x, x))) <= ATOL
    assert float(mmd(x, y)) == pytest.approx(float(mmd(y, x)), abs=ATOL)
    direction = _unit(rng.normal(size=64))
    base = rng.normal(size=(40, 64))
    values = [float(mmd(x, _unit(base + shift * direction).astype(np.float32))) for shift in (0.0, 2.0, 5.0, 20.0)]
    assert values == sorted(values) and values[-1] > values[0] + 100 * ATOL, values
    # sigma and scale as the reference's formula takes them: scale multiplies, a wider kernel sees less
    assert float(mmd(x, y, scale=1.0)) == pytest.approx(float(mmd(x, y)) / 1000, rel=1e-6)
    assert float(mmd(x, y, sigma=100.0)) < float(mmd(x, y))
    with pytest.raises(ValueError, match="two \\(n, d\\) embedding arrays"):
        mmd(x, y[:, :10])


@pytest.fixture(scope="module")
def tiny_clip(cache_dir):
    from sdjax_runner.models.builtin import build_builtin

    return build_builtin("tiny-random-clip", cache_dir / "models" / "tiny-random-clip-v1")


def _images(seed: int, sizes, dark: bool = False) -> list:
    rng = np.random.default_rng(seed)
    return [Image.fromarray(rng.integers(0, 128 if dark else 256, (h, w, 3), dtype=np.uint8)) for h, w in sizes]


SIZES = [(48, 40), (32, 32), (20, 70), (64, 64), (33, 31), (100, 60), (16, 16), (40, 41), (37, 90)]


@pytest.mark.slow
def test_image_embeddings_are_the_references_preparation_and_transformers_clip_normalised(tiny_clip):
    """The reference's crop, bicubic resize, /255 and normalisation in NumPy, then transformers' own
    get_image_features, divided by its norm: the embeddings of 9 images of assorted sizes on 8 devices."""
    import jax
    from transformers import FlaxCLIPModel

    from sdjax_runner.metrics.cmmd import image_embeddings, load_embedder

    images = _images(0, SIZES) + [Image.fromarray(np.full((24, 50), 200, np.uint8), "L")]  # a grayscale one too
    embedder = load_embedder(tiny_clip)
    size = embedder.size
    expected_pixels = np.stack([cmmd_reference.pixels(image, size) for image in images])
    # Bit for bit: Pillow's resize is the same call, x/255 in float32 equals x*(1/255) in float64 rounded to float32
    # for every uint8 value, and (x - mean) / std is float32 arithmetic in both.
    np.testing.assert_array_equal(embedder.pixels(images), expected_pixels.transpose(0, 3, 1, 2))
    # The reference's jax.image.resize to the size the image has returns it unchanged, so ours leaves it out.
    np.testing.assert_array_equal(np.asarray(jax.image.resize(expected_pixels, expected_pixels.shape, "bicubic")),
                                  expected_pixels)

    got = image_embeddings(images, tiny_clip, batch_size=4)  # 10 images: batches of 8, the last padded
    model = FlaxCLIPModel.from_pretrained(str(tiny_clip))
    features = np.asarray(model.get_image_features(pixel_values=expected_pixels.transpose(0, 3, 1, 2)))
    expected = features / np.linalg.norm(features, axis=-1, keepdims=True)
    assert got.shape == (10, model.config.projection_dim) and got.dtype == np.float32
    # Both float32 forwards of the same weights, ours transformers' op for op: only XLA's fusion and sum order differ.
    np.testing.assert_allclose(got, expected, rtol=0, atol=1e-6)
    np.testing.assert_allclose(np.linalg.norm(got, axis=-1), 1.0, atol=1e-6)
    # a uint8 (N, H, W, 3) array is taken as its images
    array = np.stack([np.asarray(image) for image in _images(0, [(32, 32)] * 3)])
    np.testing.assert_array_equal(image_embeddings(array, embedder=embedder),
                                  image_embeddings([Image.fromarray(a) for a in array], embedder=embedder))


def _write_pngs(folder, images, names=None) -> list:
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for number, image in enumerate(images):
        path = folder / (names[number] if names else f"{number:04d}.png")
        image.save(path)
        paths.append(path)
    return paths


def _cmmd_printed(stdout: str) -> float:
    found = re.findall(r"^cmmd: (-?[0-9.]+)$", stdout, re.MULTILINE)
    assert len(found) == 1, stdout
    return float(found[0])


@pytest.mark.slow
def test_evaluate_prints_the_cmmd_of_two_folders_in_a_process_of_its_own(tiny_clip, tmp_path):
    from sdjax_runner.metrics.cmmd import cmmd_between

    a, b = _images(1, [(40, 48)] * 5), _images(2, [(40, 48)] * 3, dark=True)
    _write_pngs(tmp_path / "a", a)
    _write_pngs(tmp_path / "b", b, names=["x.PNG", "y.jpg", "z.png"])
    b = [Image.open(tmp_path / "b" / name).convert("RGB") for name in ("x.PNG", "y.jpg", "z.png")]  # JPEG's loss
    result = run_cli(str(tmp_path / "a"), str(tmp_path / "b"), "--clip", str(tiny_clip), cwd=tmp_path,
                     command="evaluate", process=True)
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "A: " in result.stdout and "(folder, 5 image(s))" in result.stdout and "(folder, 3 image(s))" in result.stdout
    assert "sigma 10, scale 1000" in result.stdout and "paired: not computed" in result.stdout
    # The same images, CLIP and batch (one program of 8 on 8 devices) in this process: the printed 4 decimals.
    expected = cmmd_between(a, b, tiny_clip)
    assert expected > 0.01
    assert _cmmd_printed(result.stdout) == pytest.approx(expected, abs=5e-5)


def test_evaluate_with_a_missing_folder_is_one_line_in_a_process_of_its_own(tmp_path):
    (tmp_path / "a").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "a" / "0.png")
    result = run_cli(str(tmp_path / "a"), str(tmp_path / "gone"), cwd=tmp_path, command="evaluate", process=True)
    assert_one_line_error(result, f"error: B: {tmp_path / 'gone'}: no such directory (allowed: a run directory")


def test_evaluate_without_clip_and_no_cached_default_says_to_give_clip(tmp_path):
    (tmp_path / "a").mkdir()
    Image.new("RGB", (8, 8)).save(tmp_path / "a" / "0.png")
    empty_cache = tmp_path / "hf"
    empty_cache.mkdir()
    result = run_cli(str(tmp_path / "a"), str(tmp_path / "a"), cwd=tmp_path, command="evaluate",
                     env={"HF_HUB_CACHE": str(empty_cache), "HF_HUB_OFFLINE": "1"})
    assert_one_line_error(result, "error: --clip: not given, and the default CLIP openai/clip-vit-large-patch14 "
                                  "(metrics.clip_score.model's default) is not in the local Hugging Face cache: give "
                                  "--clip MODEL_FOLDER")


def _run_dir(folder, images, records) -> None:
    """A run directory as a run leaves it, for what evaluate reads: images.json and images/."""
    names = [f"images/{r['index']:04d}_seed{r['seed']}.png" for r in records]
    for image, name in zip(images, names, strict=True):
        (folder / "images").mkdir(parents=True, exist_ok=True)
        image.save(folder / name)
    full = [dict(negative_prompt=None, height=image.height, width=image.width, file=name, **record)
            for image, name, record in zip(images, names, records, strict=True)]
    (folder / "images.json").write_text(json.dumps(full), encoding="utf-8")


def _percentile_bootstrap(differences: np.ndarray) -> tuple[float, float]:
    """The interval the command states it computes: 2,000 resamples of the pairs (NumPy's default_rng(0)), the
    2.5th and 97.5th percentiles of the resampled means."""
    rng = np.random.default_rng(0)
    means = np.array([differences[rng.integers(0, len(differences), len(differences))].mean()
                      for _ in range(2000)])
    return float(np.percentile(means, 2.5)), float(np.percentile(means, 97.5))


def test_evaluate_pairs_two_runs_images_by_slot_with_a_bootstrap_interval_and_win_rate(tiny_clip, tmp_path):
    from helpers.cli import call_cli

    prompts = ["a red car", "a cat", "a river", "a house", "a tree", "a dog"]
    a_scores = [20.0, 25.0, 30.0, 22.0, 28.0, 26.0]
    b_scores = [21.5, 24.0, 33.0, 22.0, 29.0, 30.0]  # one lower, one tie, four higher
    a_records = [dict(index=i, seed=7, prompt=p, clip_score=s) for i, (p, s) in enumerate(zip(prompts, a_scores, strict=True))]
    b_records = [dict(index=i, seed=7, prompt=p, clip_score=s) for i, (p, s) in enumerate(zip(prompts, b_scores, strict=True))]
    b_records.append(dict(index=6, seed=7, prompt="not in A", clip_score=99.0))  # no slot in A: not paired
    b_records[5]["psnr"] = 30.0  # a metric only B's records have: not shown
    _run_dir(tmp_path / "run_a", _images(3, [(32, 32)] * 6), a_records)
    _run_dir(tmp_path / "run_b", _images(4, [(32, 32)] * 7), b_records)

    result = call_cli(str(tmp_path / "run_a"), str(tmp_path / "run_b"), "--clip", str(tiny_clip), cwd=tmp_path,
                      command="evaluate")
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "(run, 6 image(s))" in out and "(run, 7 image(s))" in out and _cmmd_printed(out) > 0
    assert "paired: 6 of B's 7 image(s) have their slot in A" in out
    assert "percentile bootstrap" in out and "2000 resamples, seed 0" in out
    differences = np.array(b_scores) - np.array(a_scores)
    low, high = _percentile_bootstrap(differences)
    [row] = [line.split() for line in out.splitlines() if line.startswith("clip_score")]
    assert row[:3] == ["clip_score", "6", f"{differences.mean():+.4g}"]
    assert " ".join(row[3:5]) == f"[{low:+.4g}, {high:+.4g}]"
    assert row[5:] == [f"{(4 + 0.5) / 6:.3f}", "(4", "higher,", "1", "tied,", "1", "lower)"]
    assert not any(line.startswith("psnr") for line in out.splitlines())


def test_the_bootstrap_interval_holds_the_mean_and_is_a_point_for_equal_differences():
    from sdjax_runner.metrics.comparison import bootstrap_interval

    assert bootstrap_interval(np.full(5, 1.25)) == (1.25, 1.25)
    differences = np.random.default_rng(2).normal(0.5, 1.0, size=40)
    low, high = bootstrap_interval(differences)
    assert low < differences.mean() < high
    assert (low, high) == bootstrap_interval(differences)  # seed 0: the same interval every time
    assert (low, high) == pytest.approx(_percentile_bootstrap(differences))


def test_evaluate_reads_a_sweeps_points_and_names_bad_input_in_one_line(tiny_clip, tmp_path):
    from helpers.cli import call_cli

    sweep = tmp_path / "sweep"
    for point in range(2):
        _run_dir(sweep / str(point), _images(point, [(32, 32)] * 2), [dict(index=i, seed=point, prompt="p")
                                                                       for i in range(2)])
    (sweep / "sweep.json").write_text("{}", encoding="utf-8")
    _write_pngs(tmp_path / "folder", _images(9, [(32, 32)] * 3))
    result = call_cli(str(sweep), str(tmp_path / "folder"), "--clip", str(tiny_clip), cwd=tmp_path,
                      command="evaluate")
    assert result.returncode == 0, result.stderr
    assert "(sweep of 2 point(s), 4 image(s))" in result.stdout and "paired: not computed" in result.stdout

    (tmp_path / "empty").mkdir()
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / "0.png").write_bytes(b"not a png")
    (tmp_path / "damaged").mkdir()
    (tmp_path / "damaged" / "images.json").write_text("[{", encoding="utf-8")
    folder = str(tmp_path / "folder")
    cases = [
        ((str(tmp_path / "empty"), folder), f"error: A: {tmp_path / 'empty'} holds no images (allowed: a run"),
        ((folder, str(tmp_path / "folder" / "0000.png")), "error: B: "),
        ((folder, str(tmp_path / "damaged")), f"error: B: {tmp_path / 'damaged' / 'images.json'}: cannot be read"),
        ((folder, folder, "--clip", str(tmp_path / "nowhere")), f"error: --clip: {tmp_path / 'nowhere'} is no folder"),
        ((folder, folder, "--clip", str(tmp_path / "empty")), f"error: --clip: {tmp_path / 'empty'} has no config.json"),
        ((folder, str(tmp_path / "broken"), "--clip", str(tiny_clip)),
         f"error: B: {tmp_path / 'broken' / '0.png'} is not an image Pillow can read"),
    ]
    for arguments, expected in cases:
        assert_one_line_error(call_cli(*arguments, cwd=tmp_path, command="evaluate"), expected)


@pytest.mark.slow
def test_a_run_gets_its_cmmd_against_a_folder_of_real_images(tiny_clip, tmp_path):
    """metrics.cmmd.reference on one run: quality.json's cmmd is the CMMD of its images (read back from disk) against
    the folder's, as cmmd_between computes it; the folder's embeddings are kept; a folder without images is a
    warning and cmmd_error, the run goes on."""
    from helpers.cli import call_cli
    from sdjax_runner.metrics.cmmd import cmmd_between

    real = tmp_path / "real"
    real.mkdir()
    for number, image in enumerate(_images(5, SIZES)):
        image.save(real / f"{number}.png")
    common = ("+experiment=smoke", "tracking=none", "metrics.cmmd.enabled=true", f"metrics.cmmd.model={tiny_clip}",
              "parallelism.num_devices=1", "parallelism.per_device_batch_size=4", f"paths.cache_dir={tmp_path / 'cache'}",
              f"model.pretrained_model_name_or_path={tiny_clip.parent / 'tiny-random-v2'}")
    result = call_cli(*common, f"metrics.cmmd.reference={real}", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    quality = json.loads((tmp_path / "run" / "quality.json").read_text())
    records = json.loads((tmp_path / "run" / "images.json").read_text())
    ours = [Image.open(tmp_path / "run" / r["file"]).convert("RGB") for r in records]
    theirs = [Image.open(real / f"{n}.png").convert("RGB") for n in range(len(SIZES))]
    assert quality["cmmd"] == pytest.approx(cmmd_between(ours, theirs, tiny_clip), rel=1e-5, abs=1e-4)
    assert quality["cmmd"] > 0 and quality["cmmd_reference_images"] == len(SIZES)
    assert quality["cmmd_reference"] == str(real) and quality["cmmd_model"] == str(tiny_clip)
    assert len(list((tmp_path / "cache" / "cmmd").glob("*.npy"))) == 1  # the folder's embeddings, kept
    empty = tmp_path / "empty"
    empty.mkdir()
    result = call_cli(*common, f"metrics.cmmd.reference={empty}", f"hydra.run.dir={tmp_path / 'none'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    quality = json.loads((tmp_path / "none" / "quality.json").read_text())
    assert "cmmd" not in quality and "holds no .png/.jpg/.jpeg images" in quality["cmmd_error"]
    assert "metrics: no CMMD against" in result.stdout + result.stderr


def test_a_reference_folder_is_hashed_and_embedded_once_per_process_until_an_image_changes(tmp_path, monkeypatch):
    """A sweep's jobs each ask for the reference folder's embeddings: the first hashes the images (the key of the
    kept array) and embeds them, the others find them in the process; an image written since is seen."""
    import os

    from sdjax_runner.metrics import cmmd

    hashed, embedded = [], []
    real_key = cmmd._reference_key
    monkeypatch.setattr(cmmd, "_reference_key", lambda *args: hashed.append(1) or real_key(*args))

    class Embedder:  # a stand-in for the CLIP model: each image's mean pixel, counted
        directory = tmp_path / "clip"

        def __call__(self, images, batch):
            embedded.append(len(images))
            return np.stack([np.asarray(image, dtype=np.float32).mean(axis=(0, 1)) for image in images])

    (tmp_path / "clip").mkdir()
    real = tmp_path / "real"
    real.mkdir()
    for number, image in enumerate(_images(3, SIZES[:3])):
        image.save(real / f"{number}.png")
    first = cmmd.reference_embeddings(Embedder(), real, tmp_path / "cache")
    for _ in range(3):
        np.testing.assert_array_equal(cmmd.reference_embeddings(Embedder(), real, tmp_path / "cache"), first)
    assert (len(hashed), embedded) == (1, [3])
    _images(4, SIZES[:1])[0].save(real / "0.png")
    os.utime(real / "0.png", ns=(1, 1))  # another modification time whatever the clock's resolution
    changed = cmmd.reference_embeddings(Embedder(), real, tmp_path / "cache")
    assert (len(hashed), embedded) == (2, [3, 3]) and not np.array_equal(changed, first)
