"""What a large sweep's report.html costs: building it, and opening it in a browser.

A sweep directory of N points is written the way the runner writes one -- per point a job directory
with .hydra/overrides.yaml, status.json, timings.json, quality.json, images.json (8 images with their per-image
CLIP score, PSNR and SSIM, which the settings' comparison reads) and one 512x512 PNG (the image the grid shows) -- over three swept keys (a sampler x steps x
guidance grid, Z pages by guidance), with the CLIP/PSNR/SSIM values a sweep would have. Then, side by
side in rounds that alternate the sizes:

    build:  ``python -m sdjax_runner report DIR`` (a new process, as a user runs it; imports included)
    open:   the page loaded in headless Chromium (Playwright, Debian's chromium) until its load event

    python benchmarks/report_page.py --points 8 200 --rounds 3 --out docs/report_page.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from bench_common import machine_facts, write_report
from helpers.browser import open_page

SAMPLERS = ["Euler", "Euler a", "DPM++ 2M", "DPM++ 2M Karras", "DDIM", "LMS", "Heun", "UniPC"]


def write_sweep(directory: Path, points: int) -> None:
    rng = np.random.default_rng(0)
    steps = [10, 15, 20, 25, 30, 40, 50, 60]
    guidance = [3, 4.5, 6, 7.5, 9, 12, 15]
    combos = [(s, n, g) for g in guidance for s in SAMPLERS for n in steps][:points]
    keys = ["sampler", "sampling.num_inference_steps", "sampling.guidance_scale"]
    directory.mkdir(parents=True)
    (directory / "sweep.json").write_text(json.dumps({"swept_keys": keys, "overrides": [
        f"sampler={','.join(SAMPLERS)}", f"sampling.num_inference_steps={','.join(map(str, steps))}",
        f"sampling.guidance_scale={','.join(map(str, guidance))}"], "reference_point": {}}))
    base = rng.integers(0, 256, (64, 64, 3), dtype=np.uint8)
    for job, (sampler, count, scale) in enumerate(combos):
        run = directory / str(job)
        (run / ".hydra").mkdir(parents=True)
        (run / "images").mkdir()
        (run / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(
            ["+experiment=bench", f"sampler={sampler}", f"sampling.num_inference_steps={count}",
             f"sampling.guidance_scale={scale}"]))
        picture = Image.fromarray(np.roll(base, job, axis=0)).resize((512, 512), Image.BICUBIC)
        picture.save(run / "images" / "0000_seed0.png")
        seconds = 0.02 * count * (2 if "a" in sampler.split()[-1:] else 1)
        (run / "status.json").write_text(json.dumps({"status": "FINISHED", "run_id": f"{job:032x}"}))
        (run / "timings.json").write_text(json.dumps({"images_per_s": 1 / seconds, "generate_s": 8 * seconds,
                                                      "mfu": 0.4}))
        clip = 30 - 40 / count + rng.normal(0, 0.3)
        (run / "quality.json").write_text(json.dumps({"clip_score_mean": clip, "psnr": 20 + count / 3,
                                                      "ssim_mean": 0.5 + count / 150, "non_finite_images": 0}))
        # 8 images a point, with the per-image values the settings' comparison reads (one PNG: the grid's)
        (run / "images.json").write_text(json.dumps([
            {"index": i, "file": "images/0000_seed0.png", "seed": 0, "prompt": "a prompt",
             "clip_score": clip + rng.normal(0, 1.0), "psnr": 20 + count / 3 + rng.normal(0, 0.5),
             "ssim": 0.5 + count / 150} for i in range(8)]))


def build(directory: Path) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sdjax_runner", "report", str(directory)],
                            capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(result.stderr[-2000:])
    return time.perf_counter() - started


def open_time(page: Path) -> float:
    started = time.perf_counter()
    with open_page(page.as_uri()) as opened:
        loaded = time.perf_counter() - started
        assert not opened.console_errors, opened.console_errors
        navigation = opened.page.evaluate("performance.getEntriesByType('navigation')[0].loadEventEnd")
    return navigation / 1000 if navigation else loaded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--points", type=int, nargs="+", default=[8, 200])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    results: dict[int, dict[str, list[float]]] = {n: {"build_s": [], "open_s": []} for n in args.points}
    with tempfile.TemporaryDirectory() as scratch:
        for n in args.points:
            write_sweep(Path(scratch) / str(n), n)
        for _ in range(args.rounds):
            for n in args.points:
                directory = Path(scratch) / str(n)
                results[n]["build_s"].append(build(directory))
                results[n]["open_s"].append(open_time(directory / "report.html"))
        sizes = {n: (Path(scratch) / str(n) / "report.html").stat().st_size for n in args.points}
    report = {"machine": machine_facts(), "rounds": args.rounds, "points": {
        str(n): {"build_s_median": statistics.median(r["build_s"]), "open_s_median": statistics.median(r["open_s"]),
                 "page_bytes": sizes[n], **r} for n, r in results.items()}}
    first = str(args.points[0])
    for n in map(str, args.points[1:]):
        point = report["points"][n]
        point["build_ratio"] = point["build_s_median"] / report["points"][first]["build_s_median"]
        point["open_ratio"] = point["open_s_median"] / report["points"][first]["open_s_median"]
    write_report(report, args.out)


if __name__ == "__main__":
    main()
