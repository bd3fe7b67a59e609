"""What the quality metrics cost, as a ratio of run time, measured side by side.

    (a) metrics on:   +experiment=smoke (CLIP score with the built-in tiny CLIP) + metrics.reference=<a run>
    (b) metrics off:  the same with metrics.clip_score.enabled=false and no reference
    (c) a 4-seed sweep with metrics on, (d) the same sweep off: the per-job cost once CLIP is loaded

Each configuration is a new process with tracking off, sharing one warm compilation cache (filled
by a first, unmeasured run of each), so the numbers are what a user sees on a second run. Rounds
interleave a, b, c, d; the report gives medians over rounds and the ratios of the medians. The
runner's own ``metrics_s`` (CLIP load, compile and scoring, plus the comparison) is reported too.

    python benchmarks/metric_cost.py --rounds 3 --out docs/metric_cost.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_facts, run_sweep, setup, write_report

BASE = ["+experiment=smoke", "tracking=none"]
OFF = ["metrics.clip_score.enabled=false"]
SEEDS = "seed=0,1,2,3"


def single(args: list[str], run_dir: Path, cwd: Path, env: dict) -> dict:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sdjax_runner", *BASE, *args, f"hydra.run.dir={run_dir}"],
                            cwd=cwd, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"failed: {args}\n{result.stderr[-3000:]}")
    quality = json.loads((run_dir / "quality.json").read_text())
    return {"process_s": time.perf_counter() - started, "metrics_s": quality["metrics_s"]}


def main() -> None:
    args, work, env = setup(__doc__, rounds=3, prefix="metric-cost-", models_subdir="cache")
    reference = work / "reference"
    single([], reference, work, env)  # builds the models, fills the cache; the later runs compare with it
    on = [f"metrics.reference={reference}"]
    single(OFF, work / "warm-off", work, env)
    samples: dict[str, list] = {k: [] for k in ("a_process_s", "a_metrics_s", "b_process_s", "c_job_metrics_s",
                                                "c_wall_s", "d_wall_s")}
    for index in range(args.rounds):
        a = single(on, work / f"a{index}", work, env)
        b = single(OFF, work / f"b{index}", work, env)
        started = time.perf_counter()
        jobs = run_sweep([*BASE, SEEDS, *on], work / f"c{index}", env, work)
        samples["c_wall_s"].append(time.perf_counter() - started)
        started = time.perf_counter()
        run_sweep([*BASE, SEEDS, *OFF], work / f"d{index}", env, work)
        samples["d_wall_s"].append(time.perf_counter() - started)
        later = [json.loads((work / f"c{index}" / str(j) / "quality.json").read_text())["metrics_s"]
                 for j in range(1, len(jobs))]
        samples["a_process_s"].append(a["process_s"])
        samples["a_metrics_s"].append(a["metrics_s"])
        samples["b_process_s"].append(b["process_s"])
        samples["c_job_metrics_s"].append(statistics.median(later))
        print(f"round {index}: on {a['process_s']:.2f} s (metrics {a['metrics_s']:.2f} s), off {b['process_s']:.2f} s;"
              f" sweep on {samples['c_wall_s'][-1]:.1f} s, off {samples['d_wall_s'][-1]:.1f} s", flush=True)
    med = {k: statistics.median(v) for k, v in samples.items()}
    report = {
        "machine": machine_facts(),
        "rounds": args.rounds,
        "medians": med,
        "process_ratio_on_vs_off": med["a_process_s"] / med["b_process_s"],
        "metrics_share_of_process": med["a_metrics_s"] / med["a_process_s"],
        "sweep_ratio_on_vs_off": med["c_wall_s"] / med["d_wall_s"],
        "samples": samples,
    }
    write_report(report, args.out)


if __name__ == "__main__":
    main()
