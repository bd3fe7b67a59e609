"""The sharded path with a shard_map per device vs its earlier global-jit program, and vs pmap.

    python benchmarks/sharded_layout.py --rounds 3 --out docs/sharded_layout.json

``--baseline`` (default f904663) is the last commit whose sharded path was one global ``jit``:
there XLA's SPMD partitioner moved half of each device's batch to another device at every
sampling step (classifier-free guidance's ``concatenate``/``split`` of the batch). Each round runs,
as new processes in turn: the baseline's sharded path, the current sharded path and the current
pmap path (``+experiment=smoke`` on 8 CPU devices, 25 PNDM steps, 128x128, fp32, CLIP score off,
5 steady-state batches each; medians of ``generate_s``). Then one profiled run of each sharded
version (``performance.profile=true``, which the baseline already has): device time by component
and the collective operations among the top operations.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import baseline_env, machine_facts, setup, write_report

COMMON = ["+experiment=smoke", "tracking=none", "sampling.num_inference_steps=25", "sampling.height=128",
          "sampling.width=128", "timing.repeats=5", "metrics.clip_score.enabled=false"]
COLLECTIVES = ("all-to-all", "collective-permute", "all-gather", "all-reduce", "reduce-scatter")


def one(extra: list[str], run_dir: Path, work: Path, env: dict, cache: Path) -> dict:
    result = subprocess.run([sys.executable, "-m", "sdjax_runner", *COMMON, *extra, f"compilation_cache.dir={cache}",
                             f"hydra.run.dir={run_dir}"], cwd=work, env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"failed: {extra}\n{result.stderr[-3000:]}")
    return json.loads((run_dir / "timings.json").read_text())


def main() -> None:
    args, work, env = setup(__doc__, rounds=3, prefix="sharded-", extra={"--baseline": "f904663"})
    # The current version bounds its timing re-runs by default (timing.max_extra_share): unbounded, it times
    # timing.repeats=5 calls as the baseline, which has no such key, does.
    exact = ["timing.max_extra_share=null"]
    configs = {"sharded_baseline": (["parallelism=sharded"], baseline_env(env, work, args.baseline)),
               "sharded": (["parallelism=sharded", *exact], env),
               "pmap": (exact, env)}
    samples: dict[str, list[float]] = {name: [] for name in configs}
    for index in range(args.rounds):
        for name, (extra, run_env) in configs.items():
            timings = one(extra, work / f"{name}-{index}", work, run_env, work / f"cache-{name}")
            samples[name].append(timings["generate_s"])
        print(f"round {index}: " + ", ".join(f"{k} {v[-1]:.3f} s" for k, v in samples.items()), flush=True)
    profiles = {}
    for name in ("sharded_baseline", "sharded"):
        extra, run_env = configs[name]
        one(extra + ["performance.profile=true"], work / f"{name}-profiled", work, run_env, work / f"cache-{name}")
        summary = json.loads((work / f"{name}-profiled" / "profile.json").read_text())
        profiles[name] = {"device_time_s": summary["device_time_s"], "components": summary["components"],
                          "collective_ops": [op for op in summary["top_ops"] if op["name"].split(".")[0] in COLLECTIVES]}
    medians = {name: statistics.median(v) for name, v in samples.items()}
    report = {
        "machine": machine_facts(),
        "rounds": args.rounds,
        "baseline": args.baseline,
        "generate_s_medians": medians,
        "ratios": {"sharded_vs_sharded_baseline": medians["sharded"] / medians["sharded_baseline"],
                   "sharded_vs_pmap": medians["sharded"] / medians["pmap"]},
        "profiles": profiles,
        "samples": samples,
    }
    write_report(report, args.out)


if __name__ == "__main__":
    main()
