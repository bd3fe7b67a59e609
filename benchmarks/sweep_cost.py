"""What an 8-seed sweep on the tiny model costs, three ways, measured side by side.

    (a) one multirun:                 python -m sdjax_runner -m +experiment=smoke seed=0,...,7
    (b) 8 processes, cold XLA cache:  each with an empty compilation cache of its own
    (c) 8 processes, warm XLA cache:  all sharing a cache filled by one earlier run

Every configuration starts from a cold compilation cache where it says so (a fresh directory),
the tiny model is built beforehand, and tracking is off so the numbers are the runner's own.
Rounds interleave a, b, c; the report gives medians over rounds.

    python benchmarks/sweep_cost.py --rounds 3 --out docs/sweep_cost.json
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
BASE = ["+experiment=smoke", "tracking=none"]


def timings(run_dir: Path) -> dict:
    return json.loads((run_dir / "timings.json").read_text())


def one_round(work: Path, env: dict[str, str], index: int) -> dict:
    out: dict = {}
    r = work / f"round{index}"
    # (a) one multirun, cold cache
    sweep = r / "a"
    out["a_wall_s"] = cli(["-m", *BASE, "seed=" + ",".join(map(str, SEEDS)), f"hydra.sweep.dir={sweep}",
                           f"compilation_cache.dir={r / 'xla-a'}"], work, env)
    # (b) separate processes, each with an empty cache
    walls, compiles = [], []
    for seed in SEEDS:
        run_dir = r / f"b{seed}"
        walls.append(cli([*BASE, f"seed={seed}", f"hydra.run.dir={run_dir}",
                          f"compilation_cache.dir={r / f'xla-b{seed}'}"], work, env))
        compiles.append(timings(run_dir)["compile_s"])
    out.update(b_wall_s=sum(walls), b_compile_s=compiles)
    # (c) separate processes sharing a cache warmed by one unmeasured run
    warm = r / "xla-c"
    cli([*BASE, "seed=99", f"hydra.run.dir={r / 'c-warmup'}", f"compilation_cache.dir={warm}"], work, env)
    walls, compiles, hits, traces = [], [], [], []
    for seed in SEEDS:
        run_dir = r / f"c{seed}"
        walls.append(cli([*BASE, f"seed={seed}", f"hydra.run.dir={run_dir}", f"compilation_cache.dir={warm}"],
                         work, env))
        t = timings(run_dir)
        compiles.append(t["compile_s"])
        traces.append(t["trace_s"])
        hits.append(t["compile_cache_hit"])
    out.update(c_wall_s=sum(walls), c_compile_s=compiles, c_trace_s=traces, c_cache_hits=sum(hits))
    return out


def main() -> None:
    args = rounds_arguments(__doc__, 3)

    with tempfile.TemporaryDirectory(prefix="sdjax-bench-") as tmp:
        work = Path(tmp)
        env = dict(os.environ, SDJAX_RUNNER_CACHE_DIR=str(work / "cache"))
        env.pop("MLFLOW_TRACKING_URI", None)
        cli([*BASE, "hydra.run.dir=" + str(work / "build"), "compilation_cache.enabled=false"], work, env)
        rounds = []
        for i in range(args.rounds):
            rounds.append(one_round(work, env, i))
            print(f"round {i}: a {rounds[-1]['a_wall_s']:.1f} s, b {rounds[-1]['b_wall_s']:.1f} s, "
                  f"c {rounds[-1]['c_wall_s']:.1f} s", file=sys.stderr)

    med = {k: statistics.median(r[k] for r in rounds) for k in ("a_wall_s", "b_wall_s", "c_wall_s")}
    cold = statistics.median(c for r in rounds for c in r["b_compile_s"])
    warm = statistics.median(c for r in rounds for c in r["c_compile_s"])
    worst_ratio = max(c / cold for r in rounds for c in r["c_compile_s"])
    summary = {
        "a_multirun_wall_s": med["a_wall_s"],
        "b_cold_processes_wall_s": med["b_wall_s"],
        "c_warm_processes_wall_s": med["c_wall_s"],
        "a_over_b": med["a_wall_s"] / med["b_wall_s"],
        "c_over_b": med["c_wall_s"] / med["b_wall_s"],
        "compile_s_cold_median": cold,
        "compile_s_warm_median": warm,
        "warm_over_cold_compile": warm / cold,
        "warm_over_cold_compile_worst": worst_ratio,
        "trace_s_warm_median": statistics.median(t for r in rounds for t in r["c_trace_s"]),
        "warm_cache_hits": f"{sum(r['c_cache_hits'] for r in rounds)}/{len(SEEDS) * len(rounds)}",
    }
    report_rounds(summary, rounds, args.out)


if __name__ == "__main__":
    main()
