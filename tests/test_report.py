"""The sweep report a person reads (report.html): a sweep through the CLI, its page opened in a real
headless Chromium (no console errors, nothing fetched, the X/Y/Z grid's cells and labels, the table
sorting), rebuilt by ``python -m sdjax_runner report`` for a sweep cut short and from MLflow, and bad axes
as one line."""

from __future__ import annotations

import csv
import json
import shutil
from pathlib import Path

import pytest

from helpers.browser import open_page
from helpers.cli import assert_one_line_error, run_cli
from helpers.mlflow_store import seed_store, sweep_runs
from sdjax_runner.metrics.report import pareto_front

SWEEP = ("dtype=fp32,bf16", "seed=0,1", "sampling.guidance_scale=5,7.5", "+metrics.reference_point.dtype=fp32")


@pytest.fixture(scope="module")
def sweep(tmp_path_factory, mlflow_template) -> tuple[Path, Path]:
    """(work directory, sweep directory) of a 2 x 2 x 2 sweep logged to an embedded MLflow store."""
    import numpy as np
    from PIL import Image

    work = tmp_path_factory.mktemp("report")
    seed_store(work, mlflow_template)
    real = work / "real"  # metrics.cmmd.reference: a folder of "real" images (here: noise of two sizes)
    real.mkdir()
    for number, size in enumerate([(64, 64)] * 5 + [(96, 80)] * 3):
        noise = np.random.default_rng(number).integers(0, 256, (*size, 3), dtype=np.uint8)
        Image.fromarray(noise).save(real / f"{number:02d}.png")
    result = run_cli("-m", "+experiment=smoke", *SWEEP, "metrics.cmmd.enabled=true", f"metrics.cmmd.reference={real}",
                     f"hydra.sweep.dir={work / 'sweep'}", cwd=work, steady_timing=True)
    assert result.returncode == 0, result.stderr
    assert "report.html" in result.stdout + result.stderr
    return work, work / "sweep"


def summary(sweep_dir: Path) -> dict[str, dict]:
    with open(sweep_dir / "summary.csv", newline="") as f:
        return {row["job"]: row for row in csv.DictReader(f)}


@pytest.mark.slow
@pytest.mark.browser
def test_the_page_opens_in_a_browser_with_its_grid_table_and_plots(sweep):
    _, sweep_dir = sweep
    rows = summary(sweep_dir)
    with open_page((sweep_dir / "report.html").as_uri()) as opened:
        page = opened.page
        assert opened.console_errors == []
        assert {url.split(":", 1)[0] for url in opened.requests} == {"file"}  # the page itself, nothing fetched
        # Axes chosen from the swept keys: x the last (guidance), y the one before (seed), dtype pages (Z).
        assert page.locator("h3.page").all_inner_texts() == ["dtype=fp32", "dtype=bf16"]
        grids = page.locator("table.grid")
        assert grids.count() == 2
        for number in range(2):
            grid = grids.nth(number)
            assert grid.locator("th.x-label").all_inner_texts() == ["sampling.guidance_scale=5",
                                                                     "sampling.guidance_scale=7.5"]
            assert grid.locator("th.y-label").all_inner_texts() == ["seed=0", "seed=1"]
            assert grid.locator("td.cell img").count() == 4
        assert page.evaluate("Array.from(document.images).every(i => i.complete && i.naturalWidth > 0)")
        # Each cell is its point: job 5 is dtype=bf16 seed=0 guidance 7.5 (Hydra's order), in the second grid.
        cell = grids.nth(1).locator("tbody tr").nth(0).locator("td.cell").nth(1)
        assert cell.get_attribute("data-job") == "5" and rows["5"]["label"] == \
            "dtype=bf16 seed=0 sampling.guidance_scale=7.5"

        # The table: every point, its numbers the runs' own; sorting by a column's header.
        table = page.locator("table.points")
        headers = table.locator("thead th").all_inner_texts()
        assert headers[:5] == ["job", "dtype", "seed", "sampling.guidance_scale", "status"]
        clip = headers.index("CLIP score")

        def column(index: int) -> list[str]:
            return table.locator(f"tbody tr td:nth-child({index + 1})").evaluate_all(
                "cells => cells.map(c => c.dataset.value !== undefined ? c.dataset.value : c.textContent)")

        assert len(column(0)) == 8
        by_job = dict(zip(column(0), column(clip), strict=True))
        assert {job: float(v) for job, v in by_job.items()} == pytest.approx(
            {job: float(r["clip_score_mean"]) for job, r in rows.items()})
        seconds = dict(zip(column(0), column(headers.index("s / image")), strict=True))
        assert {job: float(v) for job, v in seconds.items()} == pytest.approx(
            {job: 1 / float(r["images_per_s"]) for job, r in rows.items()})
        table.locator("thead th").nth(clip).click()
        values = [float(v) for v in column(clip)]
        assert values == sorted(values) and table.locator("thead th").nth(clip).get_attribute("aria-sort") == "ascending"
        table.locator("thead th").nth(clip).click()
        assert [float(v) for v in column(clip)] == sorted(values, reverse=True)
        psnr = headers.index("PSNR (dB)")
        table.locator("thead th").nth(psnr).click()
        assert column(psnr)[-4:] == [""] * 4  # the reference point's own jobs have no PSNR: blanks sort last
        # ... and say so: "reference", not a blank, in their PSNR and SSIM cells (dtype=fp32 is the point).
        for metric in (psnr, headers.index("SSIM")):
            texts = table.locator(f"tbody tr td:nth-child({metric + 1})").all_inner_texts()
            dtypes = table.locator("tbody tr td:nth-child(2)").all_inner_texts()
            assert [t == "reference" for t in texts] == [d == "fp32" for d in dtypes]

        # Plots: quality against seconds per image, a point per job -- seeds are swept, so the jobs are not settings
        # and no front is drawn over them (nor is a job's row bold): the front over settings is Settings compared's --
        # and quality against the numeric key.
        captions = page.locator("figcaption").all_inner_texts()
        assert any(c.startswith("CLIP score (mean) against seconds per image; a point per job; seeds and prompts are "
                                "replicates, not settings") for c in captions)
        assert not any("Pareto front (red)" in c for c in captions)
        assert table.locator("tbody tr.pareto").count() == 0
        assert "CLIP score (mean) against sampling.guidance_scale" in captions
        assert any(c.startswith("PSNR to reference (dB) against seconds per image") for c in captions)
        assert page.locator("figure svg").count() == len(captions)
        # Settings compared (comparison.json): one table per metric, a row per setting, the baseline's marked.
        assert page.locator("table.settings").count() == 4  # CLIP score, PSNR, SSIM; CMMD (metrics.cmmd)
        clip_rows = page.locator('table.settings[data-metric="clip_score"] tbody tr')
        assert clip_rows.count() == 4 and clip_rows.nth(0).get_attribute("class") == "baseline"
        assert any(c.startswith("CLIP score per setting: mean and 95% interval") for c in captions)
        page.screenshot(path=str(sweep_dir / "screenshot.png"), full_page=True)
    assert (sweep_dir / "screenshot.png").stat().st_size > 10_000


@pytest.mark.slow
@pytest.mark.browser
def test_a_click_on_a_thumbnail_opens_the_full_image(sweep):
    _, sweep_dir = sweep
    [record] = [r for r in json.loads((sweep_dir / "5" / "images.json").read_text()) if r["index"] == 0]
    with open_page((sweep_dir / "report.html").as_uri()) as opened:
        page = opened.page
        cell = page.locator("td.cell[data-job='5']")
        assert cell.locator("a.grid-link").get_attribute("href") == "5/grid.png"
        shown = cell.locator("img").evaluate("i => [i.naturalWidth, i.naturalHeight]")
        cell.locator("img").click()
        page.wait_for_load_state("load")
        assert page.url == (sweep_dir / "5" / record["file"]).as_uri()
        full = page.evaluate("[document.images[0].naturalWidth, document.images[0].naturalHeight]")
        assert full == [record["width"], record["height"]] and full[0] >= shown[0]


def test_pareto_front_keeps_the_points_nothing_beats():
    points = [(1.0, 10.0), (2.0, 12.0), (2.0, 11.0), (3.0, 11.5), (0.5, 5.0), (4.0, 20.0), (None, 30.0)]
    assert pareto_front(points) == [4, 0, 1, 5]  # fastest first; (2, 11), (3, 11.5) are beaten; no time: left out


@pytest.mark.slow
@pytest.mark.browser
def test_the_report_command_rebuilds_a_sweep_cut_short_with_other_axes(sweep, tmp_path):
    _, sweep_dir = sweep
    copy = tmp_path / "cut"
    shutil.copytree(sweep_dir, copy)
    (copy / "report.html").unlink()
    for name in ("status.json", "timings.json", "quality.json", "images.json", "images", "grid.png"):
        target = copy / "7" / name  # the last job never finished
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    result = run_cli(str(copy), "report.x=dtype", "report.y=seed", cwd=tmp_path, command="report")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == str(copy / "report.html")
    with open_page((copy / "report.html").as_uri()) as opened:
        page = opened.page
        assert opened.console_errors == []
        assert page.locator("h3.page").all_inner_texts() == ["sampling.guidance_scale=5", "sampling.guidance_scale=7.5"]
        assert page.locator("table.grid").nth(0).locator("th.x-label").all_inner_texts() == ["dtype=fp32", "dtype=bf16"]
        assert page.locator("table.grid td.cell img").count() == 7
        missing = page.locator("td.cell.missing")
        assert missing.count() == 1 and missing.get_attribute("data-job") == "7" and "UNKNOWN" in missing.inner_text()
        assert page.locator("table.points tbody tr.failed").count() == 1


@pytest.mark.slow
def test_a_report_axis_that_is_not_swept_is_one_line(sweep, tmp_path):
    _, sweep_dir = sweep
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "seed=0,1", "report.x=steps",
                     f"hydra.sweep.dir={tmp_path / 'sweep'}", cwd=tmp_path)
    assert_one_line_error(result, "error: report.x: steps is not a swept key of this sweep (allowed: seed)")
    assert not (tmp_path / "sweep").exists()
    result = run_cli(str(sweep_dir), "report.y=scheduler", cwd=tmp_path, command="report")
    assert_one_line_error(result, "error: report.y: scheduler is not a swept key of this sweep (allowed: dtype, seed, "
                                  "sampling.guidance_scale)")
    assert_one_line_error(run_cli(str(sweep_dir), "report.z=seed", cwd=tmp_path, command="report"),
                          "error: report.z=seed: is not a report setting (allowed: report.x=..., report.y=..., ")
    # Neither a directory nor a run of the store in the working directory (an empty one, seeded by conftest.py).
    assert_one_line_error(run_cli("no-such-sweep", cwd=tmp_path, command="report"),
                          "error: SWEEP: no-such-sweep is neither a directory nor a run in sqlite:///")


@pytest.mark.slow
@pytest.mark.browser
def test_the_report_of_a_sweep_pulled_from_mlflow(sweep, tmp_path):
    work, sweep_dir = sweep
    client, parent, children = sweep_runs(work)
    assert "report.html" in {a.path for a in client.list_artifacts(parent.info.run_id)}
    out = tmp_path / "from-mlflow"
    result = run_cli(parent.info.run_id, "--uri", f"sqlite:///{work / 'outputs' / 'mlflow.db'}", "--out", str(out),
                     cwd=tmp_path, command="report")
    assert result.returncode == 0, result.stderr
    with open_page((out / "report.html").as_uri()) as opened:
        page = opened.page
        assert opened.console_errors == []
        assert page.locator("table.grid td.cell img").count() == 8
        assert page.locator("table.points tbody tr").count() == len(children) == 8
        links = page.locator("table.points tbody tr td:last-child a").evaluate_all("a => a.map(x => x.href)")
        # each the run's classic page: #/experiments/ID/runs/RUN?workflowType=machine_learning (ui_link)
        assert {link.split("/runs/", 1)[1].split("?", 1)[0] for link in links} == {c.info.run_id for c in children}
        assert all(link.endswith("?workflowType=machine_learning") for link in links)
    records = json.loads(page_data(out / "report.html"))
    assert sorted(r["label"] for r in records) == sorted(r["label"] for r in summary(sweep_dir).values())
    # The settings judged on the parent run, and again from the pulled records: the same settings and numbers (the
    # CMMD, which the records cannot give, kept from the parent's comparison.json).
    logged = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"comparison.json", "comparison_table.json"} <= logged
    table = json.loads(Path(client.download_artifacts(parent.info.run_id, "comparison_table.json",
                                                      str(tmp_path))).read_text())
    judged = json.loads((sweep_dir / "comparison.json").read_text())
    assert len(table["data"]) == sum(len(s["metrics"]) for s in judged["settings"])  # a row per setting and metric
    pulled = json.loads((out / "comparison.json").read_text())
    assert pulled["settings"] == json.loads((sweep_dir / "comparison.json").read_text())["settings"]


def page_data(page: Path) -> str:
    text = page.read_text(encoding="utf-8")
    start = text.index('<script type="application/json" id="points-data">') + len(
        '<script type="application/json" id="points-data">')
    return text[start:text.index("</script>", start)]


@pytest.mark.slow
def test_the_settings_are_judged_with_intervals_and_paired_with_the_reference_points_setting(sweep):
    """#61: seeds are replicates; each dtype x guidance setting gets each per-image metric's mean with its 95%
    interval over its 16 images (2 seeds x 8), and its paired difference from the baseline -- the reference point's
    setting -- over the images of the same seed and index. Checked against the images' own records, and the
    intervals against SciPy's percentile bootstrap (other resamples: within a tenth of the interval's width)."""
    import numpy as np
    from scipy import stats

    _, sweep_dir = sweep
    judged = json.loads((sweep_dir / "comparison.json").read_text())
    rows = summary(sweep_dir)
    assert judged["baseline"] == {"label": "dtype=fp32 sampling.guidance_scale=5",
                                  "setting": {"dtype": "fp32", "sampling.guidance_scale": "5"},
                                  "chosen_by": "metrics.reference_point"}
    assert [s["label"] for s in judged["settings"]] == [
        f"dtype={d} sampling.guidance_scale={g}" for d in ("fp32", "bf16") for g in ("5", "7.5")]

    def images(jobs):
        return [r for job in jobs for r in json.loads((sweep_dir / str(job) / "images.json").read_text())]

    def interval(values):
        found = stats.bootstrap((np.asarray(values),), np.mean, confidence_level=0.95, n_resamples=50_000,
                                method="percentile", random_state=np.random.default_rng(1)).confidence_interval
        return found.low, found.high

    baseline = {(r["seed"], r["index"], r["prompt"]): r for r in images(judged["settings"][0]["jobs"])}
    for setting in judged["settings"]:
        jobs = setting["jobs"]
        assert sorted(rows[str(j)]["seed"] for j in jobs) == ["0", "1"] and setting["images"] == 16
        assert {rows[str(j)]["label"].replace(f"seed={rows[str(j)]['seed']} ", "") for j in jobs} == {setting["label"]}
        scores = [r["clip_score"] for r in images(jobs)]
        estimate = setting["metrics"]["clip_score"]
        assert estimate["n"] == 16 and estimate["mean"] == pytest.approx(np.mean(scores))
        low, high = interval(scores)
        width = high - low
        assert abs(estimate["low"] - low) < 0.1 * width and abs(estimate["high"] - high) < 0.1 * width
        if setting["baseline"]:
            assert "versus_baseline" not in setting and "psnr" not in setting["metrics"]  # identical: inf, left out
            continue
        differences = [r["clip_score"] - baseline[(r["seed"], r["index"], r["prompt"])]["clip_score"]
                       for r in images(jobs)]
        versus = setting["versus_baseline"]["clip_score"]
        assert setting["pairs"] == versus["n"] == 16 and versus["mean"] == pytest.approx(np.mean(differences))
        assert versus["win_rate"] == pytest.approx((np.sum(np.array(differences) > 0)
                                                    + 0.5 * np.sum(np.array(differences) == 0)) / 16)
        assert versus["holds_zero"] == (versus["low"] <= 0 <= versus["high"])
        low, high = interval(differences)
        width = high - low
        assert abs(versus["low"] - low) < 0.1 * width + 1e-9 and abs(versus["high"] - high) < 0.1 * width + 1e-9
    # PSNR to the reference point: the bf16 settings' images against fp32's (finite), paired with the baseline's.
    bf16 = judged["settings"][2]
    assert bf16["metrics"]["psnr"]["n"] == 16 and bf16["metrics"]["ssim"]["mean"] < 1


@pytest.mark.slow
def test_cmmd_judges_each_setting_against_the_baseline_and_a_folder_of_real_images(sweep, cache_dir):
    """metrics.cmmd: each setting's 16 images against the baseline's and against metrics.cmmd.reference's 8, with
    the run's CLIP (the smoke experiment's tiny one): the values are metrics/cmmd.py's on those very images (its
    estimator and embeddings are checked against the references in tests/test_cmmd.py); the folder's embeddings
    are kept in the cache as a NumPy array, not a pickle."""
    import numpy as np
    from PIL import Image

    from sdjax_runner.metrics.cmmd import image_embeddings, load_embedder, mmd

    work, sweep_dir = sweep
    judged = json.loads((sweep_dir / "comparison.json").read_text())
    clip = cache_dir / "models" / "tiny-random-clip-v1"
    assert judged["cmmd"] == {"model": str(clip), "image_size": judged["cmmd"]["image_size"],
                              "reference": str(work / "real"), "reference_images": 8}
    embedder = load_embedder(clip)

    def embedded(files):
        return image_embeddings([Image.open(f).convert("RGB") for f in files], embedder=embedder)

    def embeddings(jobs):
        return embedded([sweep_dir / str(job) / r["file"] for job in jobs
                         for r in json.loads((sweep_dir / str(job) / "images.json").read_text())])

    real = embedded(sorted((work / "real").glob("*.png")))
    baseline = embeddings(judged["settings"][0]["jobs"])
    for setting in judged["settings"]:
        found = embeddings(setting["jobs"])
        assert setting["cmmd"]["images"] == 16
        assert setting["cmmd"]["versus_reference"] == pytest.approx(float(mmd(found, real)), rel=1e-5, abs=1e-6)
        if setting["baseline"]:
            assert "versus_baseline" not in setting["cmmd"]
        else:
            assert setting["cmmd"]["versus_baseline"] == pytest.approx(float(mmd(found, baseline)), rel=1e-5,
                                                                      abs=1e-6)
    [stored] = (cache_dir / "cmmd").glob("*.npy")
    np.testing.assert_allclose(np.load(stored, allow_pickle=False), real, rtol=1e-6, atol=1e-7)
    page = (sweep_dir / "report.html").read_text()
    assert 'data-metric="cmmd"' in page and "CMMD vs baseline" in page


@pytest.mark.slow
def test_a_point_timed_by_its_first_call_alone_is_marked_and_kept_off_the_pareto_front(sweep, tmp_path):
    """Round five: a point whose seconds are its first call's (no steady-state call) stood on the Pareto front as if
    measured. Job 0 made the fastest point by far, timed by its first call alone: the table, its grid caption and
    the plot say so, and the front is made of the others."""
    import json
    import re

    from helpers.cli import call_cli

    _, sweep_dir = sweep
    copy = tmp_path / "sweep"
    shutil.copytree(sweep_dir, copy)
    timings = json.loads((copy / "0" / "timings.json").read_text())
    timings.update(steady_calls=0, images_per_s=1e6, generate_s=1e-6)
    (copy / "0" / "timings.json").write_text(json.dumps(timings))
    result = call_cli(str(copy), cwd=tmp_path, command="report")
    assert result.returncode == 0, result.stderr
    page = (copy / "report.html").read_text()
    rows = {job: classes.split() for classes, job in re.findall(r'<tr class="([^"]*)" data-job="(\d+)">', page)}
    assert not any("pareto" in classes for classes in rows.values())  # seeds swept: no front over jobs
    first = re.split(r'<tr class="[^"]*" data-job="0">', page, maxsplit=1)[1].split("</tr>", 1)[0]
    assert 'class="first-call"' in first and "(first call)</td>" in first
    assert "s/img (first call)" in page  # the grid's caption
    assert "timed by their first call alone (hollow): #0" in page  # the plot's title
    # Where the jobs are settings (no seed swept), the front over them leaves job 0 out though it is the fastest.
    from sdjax_runner.metrics.report import svg_plots
    from sdjax_runner.record.sweep import collect_jobs

    records = collect_jobs(copy, ["dtype", "seed", "sampling.guidance_scale"])  # as the report command reads them
    seed0 = [r for r in records if str(r.get("seed")) == "0" and r["status"] == "FINISHED"]
    assert [r["steady_calls"] for r in seed0 if r["job"] == 0] == [0]
    captions = [caption for caption, _ in svg_plots(seed0, ["dtype", "sampling.guidance_scale"])]
    [clip] = [c for c in captions if c.startswith("CLIP score (mean) against seconds per image")]
    front = clip.split("Pareto front (red): ", 1)[1].split(";", 1)[0]
    assert front != "none" and "#0" not in front.split(", ")
    assert "timed by their first call alone, off the front (hollow): #0" in clip
    # ... and the cost every point has, XLA's count of what ran, places them all in a plot of its own (#62 item 4)
    [counted] = [c for c in captions if c.startswith("CLIP score (mean) against executed GFLOPs per image")]
    untimed = counted.split("(the cost where no steady state was timed: ", 1)[1].split(")", 1)[0].split(", ")
    assert "#0" in untimed and "; Pareto front (red): " in counted
    assert "executed GFLOPs per image (the cost where no steady state was timed: #0" in page
    timings = json.loads((copy / "1" / "timings.json").read_text())
    assert float(summary(copy)["1"]["gflops_per_image"]) == pytest.approx(
        timings["flops_per_batch"] / timings["images_per_batch"] / 1e9, rel=1e-9)


def test_settings_without_steady_state_seconds_are_placed_by_their_executed_flops():
    from sdjax_runner.metrics.report import SETTING_METRICS, settings_plots

    metric = next(iter(SETTING_METRICS))
    judged = {"settings": [{"metrics": {metric: {"mean": m, "low": m - 0.1, "high": m + 0.1, "n": 4}},
                            "baseline": i == 0, "jobs": [i]} for i, m in enumerate((0.3, 0.5))]}
    [(timed, _)] = settings_plots(judged, [0.4, 0.5])
    assert "placed" not in timed and "Pareto front over settings (red): S1, S2" in timed
    [(unplaced, _)] = settings_plots(judged, [0.5, None])  # no FLOPs known: as before, S2 left out and said
    assert unplaced.endswith("; not placed, no steady-state seconds: S2")
    [(counted, svg)] = settings_plots(judged, [0.5, None], [12.0, 20.0])
    assert counted.endswith("; placed by executed GFLOPs per image, no steady-state seconds for S2")
    assert "Pareto front over settings (red): S1, S2" in counted and "executed GFLOPs per image" in svg
