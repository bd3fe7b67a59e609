"""The runner against the Diffusers JAX guide's hand-written code, same model and settings.

Each round starts two fresh processes, one after the other (the order alternates by round):

* guide:  the guide's code (from_pretrained, prepare_inputs, replicate, shard, split keys,
          pipeline(..., jit=True), numpy_to_pil), then the same call repeated, each blocked;
* runner: ``python -m sdjax_runner`` with the same model, prompt, seed and sampling options,
          ``parallelism=pmap``, tracking off and no persistent compilation cache (both compile cold).

Reported per side: steady-state seconds per batch (median of the repeats) and the wall time from
launching the process to the first image on the host (guide) / the first PNG on disk (runner).
The runner's ``write_s`` (PNGs, grid, JSON) is reported apart, as the issue allows for it.

    python benchmarks/overhead.py --rounds 3 --steps 25 --size 128 --out docs/overhead.json       # CPU, tiny
    python benchmarks/overhead.py --model sd-v1-arch --dtype bf16 --steps 50 --size 512 --devices 1  # accelerator
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_facts

PROMPT = "a photo of an astronaut riding a horse on mars"

GUIDE = r'''
import json, sys, time
launched = float(sys.argv[1]); model_dir, steps, size, repeats, devices, dtype = sys.argv[2:8]
steps, size, repeats, devices = int(steps), int(size), int(repeats), int(devices)
import jax
import jax.numpy as jnp
import numpy as np
from diffusers import FlaxStableDiffusionPipeline
from flax.jax_utils import replicate
from flax.training.common_utils import shard

pipeline, params = FlaxStableDiffusionPipeline.from_pretrained(model_dir, dtype=getattr(jnp, dtype),
                                                               safety_checker=None, feature_extractor=None)
prompt_ids = shard(pipeline.prepare_inputs([sys.argv[8]] * devices))
p_params = replicate(params, devices=jax.devices()[:devices])
rng = jax.random.split(jax.random.PRNGKey(0), devices)
images = pipeline(prompt_ids, p_params, rng, num_inference_steps=steps, height=size, width=size, jit=True).images
images = images.reshape((images.shape[0] * images.shape[1],) + images.shape[-3:])
first = pipeline.numpy_to_pil(np.asarray(images))
first_image_s = time.time() - launched
steady = []
for _ in range(repeats):
    started = time.perf_counter()
    pipeline(prompt_ids, p_params, rng, num_inference_steps=steps, height=size, width=size, jit=True).images  # NumPy: blocked
    steady.append(time.perf_counter() - started)
print(json.dumps({"first_image_s": first_image_s, "steady_s": steady}))
'''


def guide(model_dir: Path, args, env: dict[str, str]) -> dict:
    launched = time.time()
    result = subprocess.run([sys.executable, "-c", GUIDE, str(launched), str(model_dir), str(args.steps),
                             str(args.size), str(args.repeats), str(args.devices), args.jnp_dtype, PROMPT],
                            env=env, capture_output=True, text=True)
    if result.returncode:
        raise SystemExit(result.stderr)
    data = json.loads(result.stdout.strip().splitlines()[-1])
    return {"first_image_s": data["first_image_s"], "generate_s": statistics.median(data["steady_s"]),
            "wall_s": time.time() - launched}


def runner(work: Path, args, env: dict[str, str], index: int) -> dict:
    run_dir = work / f"runner{index}"
    launched = time.time()
    result = subprocess.run(
        [sys.executable, "-m", "sdjax_runner", f"model={args.model}", f"dtype={args.dtype}", "parallelism=pmap",
         f"parallelism.num_devices={args.devices}", f"sampling.num_inference_steps={args.steps}",
         f"sampling.height={args.size}", f"sampling.width={args.size}", "prompts=guide_single", f"prompts.texts=['{PROMPT}']", "seed=0", "tracking=none", "compilation_cache.enabled=false",
         f"timing.repeats={args.repeats}", "timing.max_extra_share=null",  # as many calls as the guide's side
         f"hydra.run.dir={run_dir}"] + args.runner_args,
        cwd=work, env=env, capture_output=True, text=True)
    wall = time.time() - launched
    if result.returncode:
        raise SystemExit(result.stderr)
    timings = json.loads((run_dir / "timings.json").read_text())
    first_png = min(p.stat().st_mtime for p in (run_dir / "images").glob("*.png"))
    return {"first_image_s": first_png - launched, "generate_s": timings["generate_s"], "write_s": timings["write_s"],
            "wall_s": wall, "compile_s": timings["compile_s"]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5, help="steady-state calls per process")
    parser.add_argument("--steps", type=int, default=25)
    parser.add_argument("--size", type=int, default=128)
    parser.add_argument("--model", default="tiny-random", help="a built-in model config name")
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--devices", type=int, default=8)
    parser.add_argument("--host-devices", type=int, default=8, help="forced CPU devices (CPU only)")
    parser.add_argument("--runner-args", nargs="*", default=[])
    parser.add_argument("--out", type=Path)
    args = parser.parse_args()
    args.jnp_dtype = {"fp32": "float32", "bf16": "bfloat16"}[args.dtype]

    from sdjax_runner.models.builtin import build_builtin

    cache = Path(os.environ.get("SDJAX_RUNNER_CACHE_DIR", Path.home() / ".cache" / "sdjax-runner"))
    model_dir = build_builtin(args.model, cache / "models" / f"{args.model}-v1")
    env = dict(os.environ, SDJAX_RUNNER_CACHE_DIR=str(cache),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={args.host_devices}")
    env.pop("MLFLOW_TRACKING_URI", None)
    rounds = []
    with tempfile.TemporaryDirectory() as tmp:
        for index in range(args.rounds):
            sides = [("guide", functools.partial(guide, model_dir, args, env)),
                     ("runner", functools.partial(runner, Path(tmp), args, env, index))]
            if index % 2:
                sides.reverse()  # alternate which goes first
            rounds.append({name: measure() for name, measure in sides})
            print(json.dumps(rounds[-1]), flush=True)

    def median(side, key):
        return statistics.median(r[side][key] for r in rounds)

    report = {
        "settings": {k: v for k, v in vars(args).items() if k != "out"} | {"out": str(args.out)},
        "machine": machine_facts(),
        "rounds": rounds,
        "median": {side: {k: median(side, k) for k in rounds[0][side]} for side in ("guide", "runner")},
    }
    m = report["median"]
    report["ratio"] = {
        "steady_generate_s": m["runner"]["generate_s"] / m["guide"]["generate_s"],
        "first_image_s": m["runner"]["first_image_s"] / m["guide"]["first_image_s"],
        "first_image_s_less_writing": (m["runner"]["first_image_s"] - m["runner"]["write_s"]) / m["guide"]["first_image_s"],
    }
    print(json.dumps(report["ratio"], indent=1))
    if args.out:
        args.out.write_text(json.dumps(report, indent=1) + "\n")


if __name__ == "__main__":
    main()
