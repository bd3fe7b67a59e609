"""Images/s and MFU as the per-device batch grows, in one multirun process.

    python benchmarks/batch_scaling.py --out docs/batch_scaling.json                       # CPU, tiny model
    python benchmarks/batch_scaling.py --model sd-v1-arch --dtype bf16 --size 512 --steps 50 \
        --devices 1 --batches 1 2 4 8 16 --out docs/batch_scaling_gpu.json                # one accelerator

Each point is one job of ``-m parallelism.per_device_batch_size=...``: the model loads once, each
batch size compiles once, and ``timing.repeats`` blocked executions give the median seconds per
batch. MFU needs a peak for the device (the table in sdjax_runner/engine/efficiency.py, or
--peak-tflops for a CPU). Device memory peaks are per process, so they only grow along the sweep.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_facts, run_sweep

FIELDS = ("per_device_batch_size", "images_per_batch", "generate_s", "images_per_s", "flops_per_batch",
          "tflops_per_s", "mfu", "compile_s", "program_memory_bytes", "device_memory_peak_bytes")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model", default="tiny-random")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--size", type=int, default=64)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--devices", type=int, default=None, help="devices to use (default: all)")
    parser.add_argument("--batches", type=int, nargs="+", default=[1, 2, 4, 8, 16])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--attention", default="default")
    parser.add_argument("--peak-tflops", type=float, default=None, help="per-device peak, for MFU on unlisted devices")
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()

    env = dict(os.environ)
    env.pop("MLFLOW_TRACKING_URI", None)
    overrides = [f"model={args.model}", f"dtype={args.dtype}", f"sampling.height={args.size}",
                 f"sampling.width={args.size}", f"sampling.num_inference_steps={args.steps}", "tracking=none",
                 "output.save_images=false", "output.grid=false", f"timing.repeats={args.repeats}",
                 "timing.max_extra_share=null",  # exactly `repeats` timed calls, whatever they cost
                 f"performance.attention={args.attention}", "parallelism=sharded",
                 "parallelism.per_device_batch_size=" + ",".join(map(str, args.batches))]
    if args.devices:
        overrides.append(f"parallelism.num_devices={args.devices}")
    if args.peak_tflops:
        overrides.append(f"performance.peak_tflops_per_device={args.peak_tflops}")
    with tempfile.TemporaryDirectory() as tmp:
        jobs = run_sweep(overrides, Path(tmp) / "sweep", env, cwd=tmp)
    points = [{k: job.get(k) for k in FIELDS} for job in jobs]
    for point in points:
        print(json.dumps(point))
    report = {"settings": {k: str(v) for k, v in vars(args).items()}, "machine": machine_facts(),
              "device_kind": jobs[0]["device_kind"], "points": points}
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
