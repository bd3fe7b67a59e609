"""What steady-state timing costs a sweep, before and after its bound (timing.max_extra_share), side by side.

    (a) before:  timing.repeats=3 timing.max_extra_share=null  -- each point's one batch re-run 3 times
    (b) after:   the default (timing.max_extra_share=0.5)        -- re-run while the re-runs stay within
                                                                    half of what the point had cost so far

The sweep: ``-m +experiment=smoke seed=0,1,2,3`` (4 points of one batch of 8 images, tiny model, tracking and
CLIP score off), at the smoke size (64x64) and at 256x256, where a batch takes seconds on a CPU and the
generation is most of a point's time. Each sweep is a new process; all share one compilation cache, warmed by
an unmeasured sweep of each size first, so compilation is the same on both sides. Rounds interleave a and b;
the report gives the medians of the sweeps' wall seconds over rounds, their ratio (after / before), the
re-runs' own seconds and counts, and what the points' figure became: ``generate_s`` after (the median of the
re-runs afforded, or the first call's where steady_calls is 0) over before (the median of 3), per point.

    python benchmarks/timing_cost.py --rounds 3 --out docs/timing_cost.json
"""

from __future__ import annotations

import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_facts, run_sweep, setup, write_report

SWEEP = ["+experiment=smoke", "tracking=none", "metrics.clip_score.enabled=false", "output.grid=false",
         "seed=0,1,2,3"]
SIDES = {"before": ["timing.repeats=3", "timing.max_extra_share=null"], "after": []}
SIZES = (64, 256)


def sweep(side: str, size: int, out: Path, work: Path, env: dict) -> dict:
    started = time.perf_counter()
    jobs = run_sweep([*SWEEP, f"sampling.height={size}", f"sampling.width={size}",
                      f"compilation_cache.dir={work / 'xla'}", *SIDES[side]], out, env, work)
    return {"wall_s": time.perf_counter() - started,
            "extra_s": sum(job["timing_extra_s"] for job in jobs),
            "extra_calls": sum(job["timing_extra_calls"] for job in jobs),
            "steady_calls": [job["steady_calls"] for job in jobs],
            "generate_s": [job["generate_s"] for job in jobs],
            "first_batch_s": [job["first_batch_s"] for job in jobs]}


def main() -> None:
    args, work, env = setup(__doc__, rounds=3, prefix="timing-cost-")
    env.pop("MLFLOW_TRACKING_URI", None)
    for size in SIZES:  # builds the model and fills the compilation cache
        sweep("after", size, work / f"warm-{size}", work, env)
    samples: dict[str, list] = {f"{side}_{size}": [] for size in SIZES for side in SIDES}
    for index in range(args.rounds):
        for size in SIZES:
            for side in SIDES:
                samples[f"{side}_{size}"].append(sweep(side, size, work / f"{side}-{size}-{index}", work, env))
        print(f"round {index}: " + ", ".join(f"{k} {v[-1]['wall_s']:.1f} s" for k, v in samples.items()), flush=True)
    results = {}
    for size in SIZES:
        before, after = samples[f"before_{size}"], samples[f"after_{size}"]
        wall = {side: statistics.median(r["wall_s"] for r in runs) for side, runs in (("before", before),
                                                                                      ("after", after))}
        # Per point, the figure each side reports, as medians over rounds.
        figure = {side: [statistics.median(r["generate_s"][p] for r in runs) for p in range(4)]
                  for side, runs in (("before", before), ("after", after))}
        results[f"{size}x{size}"] = {
            "sweep_wall_s_before": wall["before"],
            "sweep_wall_s_after": wall["after"],
            "ratio_after_to_before": wall["after"] / wall["before"],
            "timing_reruns_s_before": statistics.median(r["extra_s"] for r in before),
            "timing_reruns_s_after": statistics.median(r["extra_s"] for r in after),
            "timing_reruns_before": statistics.median(r["extra_calls"] for r in before),
            "timing_reruns_after": statistics.median(r["extra_calls"] for r in after),
            "steady_calls_per_point_before": [statistics.median(r["steady_calls"][p] for r in before)
                                              for p in range(4)],
            "steady_calls_per_point_after": [statistics.median(r["steady_calls"][p] for r in after)
                                             for p in range(4)],
            "generate_s_per_point_before": figure["before"],
            "generate_s_per_point_after": figure["after"],
            "generate_s_after_over_before_per_point": [a / b for a, b in zip(figure["after"], figure["before"], strict=True)],
        }
    report = {
        "machine": machine_facts(with_devices=False),
        "sweep": " ".join(SWEEP) + " sampling.height=H sampling.width=H",
        "sides": {side: " ".join(extra) or "(defaults: timing.repeats=3 timing.max_extra_share=0.5)"
                  for side, extra in SIDES.items()},
        "rounds": args.rounds,
        "results": results,
        "samples": samples,
    }
    write_report(report, args.out)


if __name__ == "__main__":
    main()
