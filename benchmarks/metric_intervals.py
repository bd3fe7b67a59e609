"""How many images a metric needs: the width of the CLIP score's 95% interval and the spread of CMMD at n = 8, 32
and 128 images, measured on the tiny model with PartiPrompts samples.

One sweep, ``+experiment=smoke prompts=parti prompts.sample=8,32,128 seed=0,1 parallelism.per_device_batch_size=1``:
each point makes one image per prompt (its prompts.sample of PartiPrompts, drawn by prompts.sample_seed 0, so both
seeds have the same prompts). For each n and seed: the CLIP score's mean and 95% interval over its n images
(metrics/comparison.py: percentile bootstrap, 2,000 resamples) -- the width reported is the mean of the two seeds'.
For each n: CMMD between the two seeds' images (the same prompts, other noise: one distribution, so the value is
what chance and the estimator's bias give at that n), and its permutation null: the 2n images pooled and split at
random into two sets of n, 200 times (NumPy default_rng(0)), CMMD of each split -- the median and the 95th
percentile, the value a difference between two settings must pass at that n to be told apart from none; on the
tiny CLIP's image embeddings (metrics/cmmd.py). The tiny model's CLIP is random: the numbers show how the spread shrinks with n, not what a
real CLIP would score.

    python benchmarks/metric_intervals.py --out docs/metric_intervals.json
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_facts, run_sweep, setup, write_report

SIZES = (8, 32, 128)
RESAMPLES = 200


def main() -> None:
    args, work, env = setup(__doc__, rounds=1, prefix="metric-intervals-")
    sweep = work / "sweep"
    run_sweep(["+experiment=smoke", "prompts=parti", f"prompts.sample={','.join(map(str, SIZES))}", "seed=0,1",
               "tracking=none"], sweep, env, work)
    from PIL import Image

    from sdjax_runner.metrics.cmmd import load_embedder, mmd
    from sdjax_runner.metrics.comparison import estimate

    embedder = load_embedder(Path(env["SDJAX_RUNNER_CACHE_DIR"]) / "models" / "tiny-random-clip-v1")
    points: dict[tuple[int, int], Path] = {}
    for job in sweep.iterdir():
        if job.name.isdigit():
            overrides = (job / ".hydra" / "overrides.yaml").read_text()
            size = next(n for n in SIZES if f"prompts.sample={n}\n" in overrides)
            points[(size, 0 if "seed=0\n" in overrides else 1)] = job
    rows = []
    for size in SIZES:
        widths, embeddings = [], []
        for seed in (0, 1):
            job = points[(size, seed)]
            records = json.loads((job / "images.json").read_text())
            assert len(records) == size, (job, len(records))
            found = estimate([r["clip_score"] for r in records])
            widths.append(found.high - found.low)
            images = [Image.open(job / r["file"]).convert("RGB") for r in records]
            embeddings.append(np.asarray(embedder(images, min(size, 32))))
        rng, pooled = np.random.default_rng(0), np.concatenate(embeddings)
        null = []
        for _ in range(RESAMPLES):
            order = rng.permutation(2 * size)
            null.append(float(mmd(pooled[order[:size]], pooled[order[size:]])))
        rows.append({"n": size, "clip_score_interval_width": float(np.mean(widths)),
                     "clip_score_interval_widths": widths, "cmmd_seed0_vs_seed1": float(mmd(*embeddings)),
                     "cmmd_null_median": float(np.median(null)), "cmmd_null_95th": float(np.percentile(null, 95))})
    write_report({"machine": machine_facts(with_devices=True), "what": __doc__.split("\n\n")[0], "rows": rows},
                 args.out)


if __name__ == "__main__":
    main()
