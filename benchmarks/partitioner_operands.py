"""What a program's operand count costs XLA's compile on 8 CPU devices: one program of 1,000 matmuls over the
same weights passed as 50 or as 1,000 arguments, compiled as one device's program, as a ``jit`` over 8 devices
with the weights replicated, and as a ``jit`` of a ``shard_map`` (how JAX runs ``jax.pmap`` since 0.10, and how
the runner's sharded path runs a generation program), with Shardy (JAX's default partitioner) and with GSPMD.

Why: a generation program of the tiny SD model takes ~1,100 arguments (every weight is one) and ~0.5 s of its
~2.2 s compile went to the SPMD partitioner (XLA's pass timings, TF_CPP_VMODULE=hlo_pass_pipeline=1); the suite
compiles some 160 such programs (issue #59). Each case runs in a process of its own (the partitioner is chosen
once per process), the tests' XLA flags (8 devices, backend optimization level 0); medians of --rounds.

    python benchmarks/partitioner_operands.py --rounds 3 --out docs/partitioner_operands.json
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_facts, setup, write_report

CASE = r"""
import os, sys, time, json
os.environ["XLA_FLAGS"] = ("--xla_force_host_platform_device_count=8 --xla_backend_optimization_level=0 "
                           "--xla_llvm_disable_expensive_passes=true")
import jax, jax.numpy as jnp, numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec as P
mode, operands, shardy = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "1"
jax.config.update("jax_use_shardy_partitioner", shardy)
mesh = Mesh(np.array(jax.devices()), ("d",))
single = mode == "one device"
weights = [jax.ShapeDtypeStruct((16, 16), np.float32, sharding=None if single else NamedSharding(mesh, P()))
           for _ in range(operands)]
x = jax.ShapeDtypeStruct((1 if single else 8, 4, 16), np.float32,
                         sharding=None if single else NamedSharding(mesh, P("d")))
def f(ws, x):
    def body(i, x):
        for j in range(1000):
            x = jnp.tanh(x @ ws[j % operands])
        return x
    return jax.lax.fori_loop(0, 4, body, x)
g = {"one device": jax.jit(f), "jit, replicated weights": jax.jit(f),
     "jit of shard_map": jax.jit(jax.shard_map(f, mesh=mesh, in_specs=(P(), P("d")), out_specs=P("d")))}[mode]
started = time.perf_counter(); lowered = g.lower(weights, x); lowered_at = time.perf_counter()
lowered.compile(); done = time.perf_counter()
print(json.dumps({"lower_s": lowered_at - started, "compile_s": done - lowered_at}))
"""

MODES = ("one device", "jit, replicated weights", "jit of shard_map")


def main() -> None:
    args, _, env = setup(__doc__, rounds=3, prefix="partitioner-")
    env = {k: v for k, v in env.items() if k != "XLA_FLAGS"}
    samples: dict[str, list[float]] = {}
    for _ in range(args.rounds):
        for shardy in ("1", "0"):
            for mode in MODES:
                if mode == "one device" and shardy == "0":
                    continue  # nothing to partition
                for operands in (50, 1000):
                    result = subprocess.run([sys.executable, "-c", CASE, mode, str(operands), shardy], env=env,
                                            capture_output=True, text=True, check=True)
                    found = json.loads(result.stdout.strip().splitlines()[-1])
                    name = f"{mode}, {operands} operands, {'Shardy' if shardy == '1' else 'GSPMD'}"
                    samples.setdefault(name, []).append(found["compile_s"])
    medians = {name: statistics.median(values) for name, values in samples.items()}
    write_report({"machine": machine_facts(), "rounds": args.rounds, "compile_s_median": medians,
                  "samples": samples}, args.out)


if __name__ == "__main__":
    main()
