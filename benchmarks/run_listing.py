"""How long ``python -m sdjax_runner runs list`` takes over a large run history, against the code
before the listing read configs with libyaml and resolved only the keys it shows (9f0fb7e).

One real run (``+experiment=smoke tracking=none``) is copied ``--runs`` times under an output
root; then, in interleaved rounds, each version lists the newest 20 (a new process each, so start-up
is included, as a user sees it). The report gives the median wall time of each, the ratio, and the
current code's time with a filter on a key whose value is an interpolation (which is resolved).

    python benchmarks/run_listing.py --runs 1000 --rounds 5 --out docs/run_listing.json
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import baseline_env, machine_facts, setup, write_report

BASELINE = "9f0fb7e"


def listing(args: list[str], cwd: Path, env: dict) -> float:
    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sdjax_runner", "runs", "list", "outputs", *args], cwd=cwd, env=env,
                            capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(f"failed: list {args}\n{result.stderr[-3000:]}")
    return time.perf_counter() - started


def main() -> None:
    args, work, env = setup(__doc__, rounds=5, prefix="run-listing-", extra={"--runs": "1000"})
    record = work / "outputs" / "runs" / "0"
    made = subprocess.run([sys.executable, "-m", "sdjax_runner", "+experiment=smoke", "tracking=none",
                           f"hydra.run.dir={record}"], cwd=work, env=env, capture_output=True, text=True)
    if made.returncode:
        raise SystemExit(made.stderr[-3000:])
    for index in range(1, int(args.runs)):
        shutil.copytree(record, record.with_name(str(index)))
    old = baseline_env(env, work, BASELINE)
    samples: dict[str, list] = {"current_s": [], "baseline_s": [], "current_filtered_s": []}
    for _ in range(args.rounds):
        samples["baseline_s"].append(listing([], work, old))
        samples["current_s"].append(listing([], work, env))
        samples["current_filtered_s"].append(listing(["model.pretrained_model_name_or_path=*tiny*"], work, env))
    medians = {key: statistics.median(values) for key, values in samples.items()}
    report = {
        "machine": machine_facts(), "baseline": BASELINE, "runs": int(args.runs), "rounds": args.rounds,
        **{f"median_{key}": round(value, 3) for key, value in medians.items()},
        "ratio_current_to_baseline": round(medians["current_s"] / medians["baseline_s"], 3),
        "samples": samples,
    }
    write_report(report, args.out)
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
