"""How much work a batch is, and how well the devices did it: FLOPs, TFLOP/s, MFU, memory.

FLOPs come from XLA's own cost analysis (HloCostAnalysis) of the compiled generate function.
XLA counts a while loop's body once -- it does not know the trip count -- and the sampling loop
is a ``fori_loop``, so the count is completed with ``steps - 1`` more denoising steps, each the
cost of one UNet application at the guided batch size (also XLA's count, of the UNet lowered
alone); likewise for Hires. fix's second loop, at its size and guidance. The compiled program is per
device (pmap and SPMD alike), so a batch is that times the number of devices. ``tests/test_efficiency.py`` checks the result against a fully unrolled program.
"""

from __future__ import annotations

import resource
import sys
from typing import Any, Optional

# Dense peak FLOP/s per device (one JAX device), from the vendors' data sheets.
# fp32 on NVIDIA is the TF32 tensor-core peak: JAX's default matmul precision there.
PEAK_TFLOPS = {  # device_kind substring -> {activations dtype: TFLOP/s}
    "H100 PCIe": {"bfloat16": 756.0, "float16": 756.0, "float32": 378.0},
    "H100": {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7},  # SXM / HBM3
    "H200": {"bfloat16": 989.4, "float16": 989.4, "float32": 494.7},
    "A100": {"bfloat16": 312.0, "float16": 312.0, "float32": 156.0},
    "L4": {"bfloat16": 121.0, "float16": 121.0, "float32": 60.0},
    "TPU v2": {"bfloat16": 22.5},  # per core: a v2-8 host has 8 devices, 180 TFLOP/s
    "TPU v3": {"bfloat16": 61.5},  # per core: v3-8 = 8 x 61.5 (123 per chip)
    "TPU v4": {"bfloat16": 275.0},  # per chip (one device per chip)
    "TPU v5 lite": {"bfloat16": 197.0},
    "TPU v5p": {"bfloat16": 459.0},
    "TPU v6 lite": {"bfloat16": 918.0},
}


def peak_tflops(device_kind: str, dtype: str, override: Optional[float]) -> Optional[float]:
    """Per-device peak for ``dtype`` (None where unknown, e.g. CPUs: then MFU is not reported)."""
    if override:
        return float(override)
    for kind, peaks in PEAK_TFLOPS.items():  # "H100 PCIe" is listed before "H100"
        if kind.lower() in device_kind.lower():
            return peaks.get(dtype)
    return None


def _flops(analysis: Any) -> Optional[float]:
    if isinstance(analysis, (list, tuple)):
        analysis = analysis[0] if analysis else None
    return float(analysis["flops"]) if analysis and "flops" in analysis else None


def cost_flops(lowered: Any) -> Optional[float]:
    """XLA's FLOP count of a lowered function (None where the backend has none before compiling)."""
    return _flops(lowered.cost_analysis())


# XLA's count of one denoiser call is decided by the module (its fields, as its repr shows them: the config, dtypes,
# the attention implementation), the function applying it, the argument shapes and the backend. Counting traces and
# lowers the whole model (~0.3 s for the tiny UNet, seconds for a full-size one), and a sweep over samplers, step
# counts or guidance compiles a program per point around the same call: the process keeps each count
# (process.ProcessState.call_flops). A module with a callable field (a gather function) shows an address in its
# repr, and is counted anew.
MAX_COUNTED = 256


def call_flops(module: Any, apply: Any, *shapes: Any, variant: str = "") -> Optional[float]:
    """:func:`cost_flops` of ``jax.jit(apply)`` lowered on ``shapes`` (ShapeDtypeStructs, in pytrees, or None),
    where ``apply`` applies ``module``; counted once per process for the same module, function, ``variant`` (what
    the function closes over that changes what it computes) and shapes."""
    import jax

    from sdjax_runner import process

    counted = process.current().call_flops
    leaves, tree = jax.tree_util.tree_flatten(shapes)
    code = apply.__code__
    key = (jax.default_backend(), type(module).__module__, type(module).__qualname__, repr(module),
           code.co_filename, code.co_firstlineno, variant, str(tree),
           tuple((leaf.shape, str(leaf.dtype)) for leaf in leaves))
    if key not in counted:
        if len(counted) >= MAX_COUNTED:
            counted.pop(next(iter(counted)))
        counted[key] = cost_flops(jax.jit(apply).lower(*shapes))
    return counted[key]


def step_flops(call: Any, component: str, pipeline: Any, params: dict, skipped: Optional[tuple[str, Any]] = None
               ) -> Optional[float]:
    """XLA's count for one denoiser call (``call``: an engine/family.DenoiserCall of the pipeline's ``component``)
    with ``params``, the host weights; ``skipped``: (a step cache's name and shaping settings, a function giving the
    denoiser's keyword arguments that make a call it skipped, called as it is traced: engine/family.Family.
    skipped_calls) -- the count of such a call. None on GPUs (jaxlib 0.11.2, H100): there only the
    compiled program has a cost analysis, and it leaves out the cuDNN/cuBLAS custom calls that do most of the work
    (measured: 1.9 TFLOP counted for a ~640 TFLOP batch), so no FLOPs and no MFU are reported rather than wrong
    ones."""
    import jax

    module = getattr(pipeline, component)
    shapes = jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), params[component])

    def apply(p, args, kwargs):
        return module.apply({"params": p}, *args, **kwargs, **({} if skipped is None else skipped[1]()))

    return call_flops(module, apply, shapes, call.args, call.kwargs, variant=skipped[0] if skipped else "")


def executed_flops(flops: Optional[float], saved_per_call: Optional[float], calls: int, skipped: int, steps: int,
                   num_devices: int) -> Optional[float]:
    """FLOPs of one batch as it ran under a step cache: ``flops`` (every call whole) less what the skipped calls did
    not run (``saved_per_call``: a whole call's count less a skipped one's), at the run's share of skipped calls
    (``skipped`` of ``calls``, every batch's, ``steps`` x ``num_devices`` a batch); None where either is unknown."""
    if flops is None or not skipped:
        return flops
    if saved_per_call is None or not calls:
        return None
    return flops - saved_per_call * skipped / calls * steps * num_devices


def program_flops(compiled: Any) -> Optional[float]:
    """XLA's FLOP count of a compiled program on one device (None where the backend has none)."""
    try:
        return _flops(compiled.cost_analysis())
    except Exception:  # some backends or cached executables have no analysis
        return None


def batch_flops(compiled: Any, loops: list[tuple[int, Optional[float]]], num_devices: int) -> Optional[float]:
    """FLOPs of one batch on all devices: the compiled program plus the loop steps XLA does not count (``loops``:
    each sampling loop's steps and the FLOPs of one of them)."""
    program = program_flops(compiled)
    if program is None or any(step is None for _, step in loops):
        return None
    return num_devices * (program + sum((steps - 1) * step for steps, step in loops if step is not None))


def device_memory_peak(devices: list) -> Optional[int]:
    """The largest peak of bytes in use on any of ``devices`` (None where the backend does not say: CPU)."""
    peaks = []
    for device in devices:
        try:
            stats = device.memory_stats()
        except Exception:
            stats = None
        if stats and "peak_bytes_in_use" in stats:
            peaks.append(int(stats["peak_bytes_in_use"]))
    return max(peaks) if peaks else None


def program_memory(compiled: Any) -> Optional[int]:
    """What XLA planned per device for the program: arguments + outputs + temporaries."""
    try:
        stats = compiled.memory_analysis()
    except Exception:
        return None
    if stats is None:
        return None
    return int(stats.argument_size_in_bytes + stats.output_size_in_bytes + stats.temp_size_in_bytes
               - stats.alias_size_in_bytes)


def host_peak_rss() -> int:
    """This process's peak resident memory in bytes (ru_maxrss is KiB on Linux, bytes on macOS)."""
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return int(peak if sys.platform == "darwin" else peak * 1024)


def summary(flops: Optional[float], seconds: float, num_devices: int, peak: Optional[float]) -> dict[str, Any]:
    """tflops_per_s and mfu for a batch of ``flops`` taking ``seconds`` (None where not measurable)."""
    tflops = flops / seconds / 1e12 if flops and seconds else None
    mfu = tflops / (peak * num_devices) if tflops and peak else None
    return {"flops_per_batch": flops, "tflops_per_s": tflops, "mfu": mfu,
            "peak_tflops_per_device": peak}


def param_bytes_per_device(tree) -> int:
    """Bytes of the weights one device holds: ``tree`` placed (jax.Array leaves: their first device's shards --
    a whole copy where replicated, about 1/N where split, parallelism.params=sharded), or host arrays (a whole
    copy)."""
    import jax
    import numpy as np

    def on_one_device(leaf) -> int:
        shards = getattr(leaf, "addressable_shards", None)
        if not shards:
            return int(np.asarray(leaf).nbytes)
        first = shards[0].device
        return int(sum(shard.data.nbytes for shard in shards if shard.device == first))

    return int(sum(on_one_device(leaf) for leaf in jax.tree_util.tree_leaves(tree)))
