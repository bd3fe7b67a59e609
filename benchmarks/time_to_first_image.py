"""Time to first image: the wall time of a new process of ``+experiment=smoke tracking=none``,
cold (empty compilation caches) and warm (caches filled by an earlier process), measured side by side.

    baseline          the code before the warm-start work (``--baseline``, default 3bad419), run from
                      an extracted copy of that commit with the same environment: "today's code"
    default           the smoke run as it is (the guide's pmap path): a warm start loads the stored
                      executables (generation and CLIP score) and kept parameter shapes and FLOPs
    pmap traced       compilation_cache.executables=false: traces every time; JAX's persistent cache
                      skips XLA's compile when warm
    sharded           parallelism=sharded, with the executable cache

Each sample is a new process; rounds interleave the configurations; cold samples get a fresh cache
directory each (the built-in models stay built). Reports medians and ratios of medians.

    python benchmarks/time_to_first_image.py --rounds 5 --out docs/time_to_first_image.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import baseline_env, machine_facts, setup, write_report

BASE = ["+experiment=smoke", "tracking=none"]
CONFIGS = {
    "baseline": [],
    "default": [],
    "pmap_traced": ["compilation_cache.executables=false"],
    "sharded": ["parallelism=sharded"],
}


def one(args: list[str], cache: Path, run_dir: Path, work: Path, env: dict) -> dict:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sdjax_runner", *BASE, *args, f"compilation_cache.dir={cache}",
                             f"hydra.run.dir={run_dir}"], cwd=work, env=env, capture_output=True, text=True)
    wall = time.perf_counter() - started
    if result.returncode:
        raise SystemExit(f"failed: {args}\n{result.stderr[-3000:]}")
    timings = json.loads((run_dir / "timings.json").read_text())
    return {"wall_s": wall, "trace_s": timings["trace_s"], "compile_s": timings["compile_s"],
            "compile_path": timings.get("compile_path", "traced"), "load_s": timings["load_s"]}


def main() -> None:
    args, work, env = setup(__doc__, rounds=5, prefix="ttfi-", extra={"--baseline": "3bad419"})
    envs = dict.fromkeys(CONFIGS, env)
    envs["baseline"] = baseline_env(env, work, args.baseline)
    warm = {name: work / f"warm-cache-{name}" for name in CONFIGS}  # the baseline's cache files differ
    for name, extra in CONFIGS.items():  # builds the models once, fills the warm caches (and stores executables)
        one(extra, warm[name], work / f"prefill-{name}", work, envs[name])
    samples: dict[str, list[dict]] = {f"{kind}_{name}": [] for kind in ("warm", "cold") for name in CONFIGS}
    for index in range(args.rounds):
        for name, extra in CONFIGS.items():
            samples[f"warm_{name}"].append(one(extra, warm[name], work / f"w{index}-{name}", work, envs[name]))
            samples[f"cold_{name}"].append(one(extra, work / f"cold-{index}-{name}", work / f"c{index}-{name}", work,
                                               envs[name]))
        print(f"round {index}: " + ", ".join(f"{k} {v[-1]['wall_s']:.2f} s" for k, v in samples.items()), flush=True)
    medians = {k: {m: statistics.median(s[m] for s in v) for m in ("wall_s", "trace_s", "compile_s", "load_s")}
               for k, v in samples.items()}
    paths = {k: sorted({s["compile_path"] for s in v}) for k, v in samples.items()}
    report = {
        "machine": machine_facts(),
        "rounds": args.rounds,
        "baseline": args.baseline,
        "medians": medians,
        "compile_paths": paths,
        "ratios": {
            "warm_default_vs_warm_baseline": medians["warm_default"]["wall_s"] / medians["warm_baseline"]["wall_s"],
            "cold_default_vs_cold_baseline": medians["cold_default"]["wall_s"] / medians["cold_baseline"]["wall_s"],
            "warm_pmap_traced_vs_warm_baseline":
                medians["warm_pmap_traced"]["wall_s"] / medians["warm_baseline"]["wall_s"],
            "warm_sharded_vs_warm_baseline": medians["warm_sharded"]["wall_s"] / medians["warm_baseline"]["wall_s"],
            "warm_default_vs_warm_pmap_traced":
                medians["warm_default"]["wall_s"] / medians["warm_pmap_traced"]["wall_s"],
        },
        "samples": samples,
    }
    write_report(report, args.out)


if __name__ == "__main__":
    main()
