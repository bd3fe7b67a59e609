"""Where a batch's device time goes (``performance.profile=true``).

After the timed batches, one more batch runs under JAX's profiler (``jax.profiler.trace``). The
trace stays in the run directory (``profile/``: open it in Perfetto, TensorBoard or XProf), and
``profile.json`` says what took the time: every executed operation of the generate program is
matched, by its HLO instruction name, to the model it belongs to -- the text encoder, the UNet or
the VAE, read from the instruction's metadata (the Flax module names JAX records as name scopes) --
and summed. ``other`` is the sampling loop's own arithmetic (scheduler, guidance) and anything not
inside one of those modules. On a GPU the events are the device's kernels; on a CPU they are XLA's
operations on its threads, so their sum is CPU time, not wall time. ``wall_s`` is the profiled
batch's wall time and ``lines`` each trace line's (device stream or host thread) summed event time, the
part of it the program's instructions account for, and the largest events that match none: where the
components fall short of the wall time, whether the device sat idle or ran kernels no instruction names.

On a GPU, XLA runs most of a program as command buffers (CUDA graphs), and the trace names the command buffer, not
the instruction, as the operation of each kernel inside one: a kernel XLA generated is matched by its own name
(the fusion's, with ``_`` for ``.``), a library's kernel launched inside one (a cuDNN convolution or attention, a
cuBLAS matmul) names no instruction at all. So ``kinds`` also sums every device event by what its kernel does --
convolution, matmul, attention, XLA's fused elementwise and reduction kernels, copies -- read from the kernel's
name: on an H200 this accounted for all of SD-1.x's batch that the components could not place.
"""

from __future__ import annotations

import collections
import gzip
import json
import re
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

# The Flax modules (as JAX's name stack records them) that make each part of a Stable Diffusion pipeline.
COMPONENTS = {
    "text_encoder": ("CLIPTextModel",),
    "unet": ("UNet2DConditionModel",),
    "vae": ("AutoencoderKL",),
}
TOP = 20
_INSTRUCTION = re.compile(r'^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s.*?metadata=\{[^}]*?op_name="([^"]*)"')


def component_of(op_name: str) -> str:
    for component, modules in COMPONENTS.items():
        if any(f"/{module}" in op_name or op_name.startswith(module) for module in modules):
            return component
    return "other"


_MODULE = re.compile(r"^HloModule\s+([^\s,]+)")


def instruction_components(hlo_text: str, qualified: bool = False) -> dict[str, tuple[str, str]]:
    """HLO instruction name -> (the component its metadata places it in, its JAX op name); ``qualified``: the names
    written ``MODULE/INSTRUCTION``, the module's as the trace's ``hlo_module`` gives it (several programs' instructions
    in one map: their names repeat)."""
    found = {}
    lines = hlo_text.splitlines()
    header = _MODULE.match(lines[0]) if lines else None
    prefix = f"{header.group(1)}/" if qualified and header else ""
    for line in lines:
        match = _INSTRUCTION.match(line)
        if match:
            found[prefix + match.group(1)] = (component_of(match.group(2)), match.group(2))
    return found


def programs_instructions(programs: Sequence[Any]) -> dict[str, tuple[str, str]]:
    """The instructions of every program a batch runs (the sampling and the decoding program), by
    ``MODULE/INSTRUCTION``."""
    found: dict[str, tuple[str, str]] = {}
    for compiled in programs:
        found.update(instruction_components(program_text(compiled), qualified=True))
    return found


def program_text(compiled: Any) -> str:
    """The compiled program's optimized HLO ("" where the executable does not give it)."""
    try:
        return compiled.as_text() or ""
    except Exception:  # a reloaded executable of some backends keeps no HLO text
        return ""


def _events(trace: dict) -> tuple[list[dict], dict[tuple, str], bool]:
    """The trace's executed operations -- kernel events of GPU/TPU devices if there are any, else every
    complete event (a CPU's XLA operations run on host threads) --, the name of each (process, thread)
    line they lie on, and whether they are a device's."""
    events = trace.get("traceEvents", [])
    processes = {e["pid"]: e.get("args", {}).get("name", "") for e in events
                 if e.get("ph") == "M" and e.get("name") == "process_name"}
    threads = {(e["pid"], e.get("tid")): e.get("args", {}).get("name", "") for e in events
               if e.get("ph") == "M" and e.get("name") == "thread_name"}
    device = {pid for pid, name in processes.items() if name.startswith("/device:")}
    executed = [e for e in events if e.get("ph") == "X" and (not device or e.get("pid") in device)]
    lines = {(e.get("pid"), e.get("tid")): f"{processes.get(e.get('pid'), e.get('pid'))} "
             f"{threads.get((e.get('pid'), e.get('tid'))) or e.get('tid')}" for e in executed}
    return executed, lines, bool(device)


# What a kernel does, from its name: the first pattern that matches (cuDNN's, cuBLAS's and XLA's names on NVIDIA
# GPUs; XLA's instruction names on CPUs, whose events are the instructions themselves).
KERNEL_KINDS = (
    ("attention", re.compile(r"sdpa|fmha|flash|attention", re.I)),
    ("convolution", re.compile(r"conv(?!ert)|fprop|dgrad|wgrad", re.I)),
    ("matmul", re.compile(r"gemm|nvjet|cublas|cutlass|^dot|_dot", re.I)),
    ("copy", re.compile(r"memcpy|memset|^copy|transpose|concatenate|broadcast", re.I)),
    ("fusion", re.compile(r"fusion|triton|reduce|^loop_|^input_|^wrapped_", re.I)),
)


def kernel_kind(name: str) -> str:
    return next((kind for kind, pattern in KERNEL_KINDS if pattern.search(name)), "other")


def _name(event: dict, instructions: dict[str, tuple[str, str]], aliases: dict[str, str]) -> str:
    """The program instruction an event ran, where one can be told: the trace's ``hlo_op``, or -- inside a
    command buffer, whose kernels the trace files under the buffer's name -- the kernel's own name (XLA names
    the kernels it generates after their fusion, ``.`` written ``_``); else what the trace calls it."""
    args = event.get("args") or {}
    operation, kernel, module = args.get("hlo_op") or "", event.get("name", ""), args.get("hlo_module")
    for name in ((f"{module}/{operation}", f"{module}/{kernel}") if module else ()) + (operation, kernel):
        if name in instructions:
            return name
    return (aliases.get(f"{module}/{kernel}") if module else None) or aliases.get(kernel) or operation or kernel


def kernel_aliases(instructions: dict[str, tuple[str, str]]) -> dict[str, str]:
    """Kernel name -> instruction name, for the instructions whose names a kernel writes otherwise."""
    def kernel(name: str) -> str:  # (a qualified name's module as it is)
        module, slash, instruction = name.rpartition("/")
        return module + slash + re.sub(r"[.\-]", "_", instruction)

    return {kernel(name): name for name in instructions if kernel(name) != name}


def _kinds(events: list[dict]) -> dict[str, dict]:
    """Device time by what the kernels do (every event, matched to an instruction or not)."""
    kinds: dict[str, float] = collections.defaultdict(float)
    for event in events:
        kinds[kernel_kind(event.get("name", ""))] += float(event.get("dur", 0.0)) / 1e6
    total = sum(kinds.values())
    return {kind: {"time_s": s, "share": s / total if total else None}
            for kind, s in sorted(kinds.items(), key=lambda item: -item[1])}


def _lines(events: list[dict], names: dict[tuple, str], instructions: dict[str, tuple[str, str]],
           aliases: dict[str, str]) -> dict:
    """Each trace line's (a device stream's, or a host thread's) summed event time, and how much of it
    the program's instructions account for: where the components' sum falls short of the batch's
    wall time, this says whether the device sat idle or ran events that name no instruction."""
    lines: dict[str, dict] = {}
    for event in events:
        line = lines.setdefault(names[event.get("pid"), event.get("tid")],
                                {"time_s": 0.0, "events": 0, "matched_s": 0.0, "unmatched": collections.Counter()})
        seconds = float(event.get("dur", 0.0)) / 1e6
        line["time_s"] += seconds
        line["events"] += 1
        if _name(event, instructions, aliases) in instructions:
            line["matched_s"] += seconds
        else:
            line["unmatched"][event.get("name", "")] += seconds
    for line in lines.values():
        line["unmatched_top"] = [{"name": name[:160], "time_s": s} for name, s in line.pop("unmatched").most_common(5)]
    return dict(sorted(lines.items(), key=lambda item: -item[1]["time_s"]))


def _by_op(events: list[dict], instructions: dict[str, tuple[str, str]], aliases: dict[str, str]) -> dict[str, list]:
    """Operation name -> [seconds, count]; with ``instructions``, only the program's own operations."""
    by_op: dict[str, list] = collections.defaultdict(lambda: [0.0, 0])
    for event in events:
        name = _name(event, instructions, aliases)
        if instructions and name not in instructions:
            continue  # the runtime's own bookkeeping, not an operation of the program
        by_op[name][0] += float(event.get("dur", 0.0)) / 1e6
        by_op[name][1] += 1
    return by_op


def summarize(trace_file: Path, instructions: dict[str, tuple[str, str]]) -> dict[str, Any]:
    """Device time by component and the top operations, from a ``*.trace.json.gz`` file. Where no
    event names an instruction of the program (a backend that names kernels otherwise), the
    device's events are summed by name, unattributed."""
    with gzip.open(trace_file, "rt", encoding="utf-8") as file:
        events, names, on_device = _events(json.load(file))
    aliases = kernel_aliases(instructions)
    by_op = _by_op(events, instructions, aliases) if instructions else {}
    attributed = bool(by_op)
    if not attributed:
        instructions, aliases, by_op = {}, {}, _by_op(events, {}, {})
    total = sum(seconds for seconds, _ in by_op.values())
    components: collections.Counter = collections.Counter()
    for name, (seconds, _) in by_op.items():
        components[instructions.get(name, ("other", ""))[0]] += seconds

    def share(seconds: float):
        return seconds / total if total else None

    top = sorted(by_op.items(), key=lambda item: -item[1][0])[:TOP]
    return {
        "device_time_s": total,
        "attributed": attributed,
        "components": {name: {"time_s": s, "share": share(s)} for name, s in components.most_common()},
        "top_ops": [{"name": name, "component": instructions.get(name, ("other", ""))[0], "time_s": s, "count": n,
                     "share": share(s), "op_name": instructions.get(name, ("", ""))[1][-160:]}
                    for name, (s, n) in top],
        # A device's every kernel; on a CPU, whose trace holds the host's own work too, the program's operations.
        "kinds": _kinds(events if on_device else [e for e in events if _name(e, instructions, aliases) in by_op]),
        "lines": _lines(events, names, instructions, aliases),
    }


def profile_batch(run: Callable[[], Any], programs: Sequence[Any], directory: Path) -> dict[str, Any]:
    """Run one batch (``run()``, blocked on: the compiled ``programs``) under JAX's profiler with the trace written to
    ``directory``; the summary of where its time went."""
    import time

    import jax

    with jax.profiler.trace(str(directory)):
        start = time.perf_counter()
        jax.block_until_ready(run())
        wall = time.perf_counter() - start
    traces = sorted(directory.glob("plugins/profile/*/*.trace.json.gz"), key=lambda p: p.stat().st_mtime)
    if not traces:
        return {"error": f"JAX's profiler wrote no trace under {directory}"}
    summary = summarize(traces[-1], programs_instructions(programs))
    summary["trace"] = str(traces[-1].relative_to(directory.parent))
    summary["wall_s"] = wall  # the profiled batch's, profiler overhead included
    return summary


def describe(summary: dict[str, Any]) -> str:
    """One line: device time and each component's share."""
    if "error" in summary:
        return summary["error"]
    parts = ", ".join(f"{name} {c['share']:.0%}" for name, c in summary["components"].items() if c["share"])
    kind = "device" if summary["attributed"] else "device (unattributed)"
    wall = f" (wall {summary['wall_s']:.3f} s)" if "wall_s" in summary else ""
    line = f"{kind} time {summary['device_time_s']:.3f} s for one batch{wall}: {parts}"
    ran = sum(k["time_s"] for k in summary.get("kinds", {}).values())
    if ran > summary["device_time_s"] * 1.05:  # kernels the components could not place: say what all of them did
        kinds = ", ".join(f"{name} {k['share']:.0%}" for name, k in summary["kinds"].items() if k["share"])
        line += f"; all device events {ran:.3f} s: {kinds}"
    return line
