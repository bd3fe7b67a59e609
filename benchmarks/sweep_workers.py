"""An 8-point seed sweep on the tiny model, four ways, measured side by side in one run (docs/benchmarks.md,
"Sweeps on workers"):

    (a) basic:      python -m sdjax_runner -m ... seed=0,...,7                  one process, one load, one compile
    (b) ray:        ... hydra/launcher=ray hydra.launcher.num_workers=2         a local Ray cluster the command starts
    (c) array:      ... hydra/launcher=local_workers hydra.launcher.num_workers=2   2 submitit tasks (local processes)
    (d) processes:  8 separate commands, one per point                          each loads and compiles (warm XLA cache)

Each point: +experiment=smoke at 128x128, 20 steps, 4 CPU devices per process, tracking off. Every configuration
uses one compilation cache warmed by an unmeasured run and no stored executables, so each process traces and
loads its program the same way; rounds interleave a-d and the report gives medians.

    python benchmarks/sweep_workers.py --rounds 2 --out docs/sweep_workers.json
"""

from __future__ import annotations

import json
import os
import statistics
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import cli, report_rounds, rounds_arguments

SEEDS = list(range(8))
POINT = ["+experiment=smoke", "tracking=none", "parallelism.host_device_count=4", "sampling.height=128",
         "sampling.width=128", "sampling.num_inference_steps=20", "compilation_cache.executables=false"]
CONFIGS = {"a_basic": [], "b_ray": ["hydra/launcher=ray", "hydra.launcher.num_workers=2"],
           "c_array": ["hydra/launcher=local_workers", "hydra.launcher.num_workers=2"]}


def job_timings(sweep: Path) -> list[dict]:
    return [json.loads((sweep / str(seed) / "timings.json").read_text()) for seed in SEEDS]


def one_round(work: Path, env: dict[str, str], index: int) -> dict:
    out: dict = {}
    r = work / f"round{index}"
    seeds = "seed=" + ",".join(map(str, SEEDS))
    for name, launcher in CONFIGS.items():
        sweep = r / name
        out[f"{name}_wall_s"] = cli(["-m", *POINT, seeds, *launcher, f"hydra.sweep.dir={sweep}"], work, env)
        timings = job_timings(sweep)
        out[f"{name}_generate_s"] = statistics.median(t["generate_s"] for t in timings)
        out[f"{name}_processes"] = len({t["pid"] for t in timings})
        out[f"{name}_loads"] = sum(max(t["process_model_loads"] for t in timings if t["pid"] == pid)
                                   for pid in {t["pid"] for t in timings})
    walls = [cli([*POINT, f"seed={seed}", f"hydra.run.dir={r / f'd{seed}'}"], work, env) for seed in SEEDS]
    out["d_processes_wall_s"] = sum(walls)
    return out


def main() -> None:
    args = rounds_arguments(__doc__, 2)

    with tempfile.TemporaryDirectory(prefix="sdjax-bench-") as tmp:
        work = Path(tmp)
        env = dict(os.environ, SDJAX_RUNNER_CACHE_DIR=str(work / "cache"), RAY_USAGE_STATS_ENABLED="0")
        env.pop("MLFLOW_TRACKING_URI", None)
        env.pop("RAY_ADDRESS", None)
        cli([*POINT, "seed=99", f"hydra.run.dir={work / 'warmup'}"], work, env)  # the model built, the cache warm
        rounds = []
        for i in range(args.rounds):
            rounds.append(one_round(work, env, i))
            print(f"round {i}: " + ", ".join(f"{k} {v:.1f}" for k, v in rounds[-1].items() if k.endswith("wall_s")),
                  file=sys.stderr)

    keys = [k for k in rounds[0] if k.endswith("_wall_s")]
    med = {k: statistics.median(r[k] for r in rounds) for k in keys}
    summary = {**{f"{k}_median": v for k, v in med.items()},
               **{f"{k.removesuffix('_wall_s')}_over_basic": med[k] / med["a_basic_wall_s"] for k in keys},
               **{k: rounds[0][k] for k in rounds[0] if k.endswith(("_processes", "_loads"))},
               **{f"{k}_median": statistics.median(r[k] for r in rounds) for k in rounds[0] if k.endswith("_generate_s")}}
    report_rounds(summary, rounds, args.out)


if __name__ == "__main__":
    main()
