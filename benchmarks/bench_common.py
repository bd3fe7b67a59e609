"""What every benchmark records about where it ran: versions, CPU count and the JAX devices."""

from __future__ import annotations

import datetime
import os
import platform
from importlib import metadata


def machine_facts(with_devices: bool = False) -> dict:
    facts = {"date": datetime.date.today().isoformat(), "python": platform.python_version(),
             "machine": platform.machine(), "cpus": os.cpu_count(),
             **{p: metadata.version(p) for p in ("jax", "jaxlib", "flax", "diffusers", "hydra-core")}}
    if with_devices:
        import jax

        facts.update(backend=jax.default_backend(), device_kind=jax.devices()[0].device_kind,
                     device_count=jax.device_count())
    return facts


def run_sweep(overrides: list[str], sweep_dir, env: dict, cwd, log=None) -> list[dict]:
    """``python -m sdjax_runner -m OVERRIDES`` into ``sweep_dir``; each job's overrides and timings.json (and its
    quality.json under ``"quality"``, where it wrote one).

    ``log``: a file the sweep's output is appended to as it comes (what a run cut off by a time limit printed
    survives it); without one the output is kept in memory and its end shown if the sweep fails."""
    import json
    import subprocess
    import sys
    from pathlib import Path

    command = [sys.executable, "-m", "sdjax_runner", "-m", *overrides, f"hydra.sweep.dir={sweep_dir}"]
    if log is None:
        result = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
        failed, tail = result.returncode, result.stderr[-3000:]
    else:
        with open(log, "a", encoding="utf-8") as stream:
            stream.write(f"$ {' '.join(command)}\n")
            stream.flush()
            failed = subprocess.run(command, cwd=cwd, env=env, stdout=stream, stderr=subprocess.STDOUT).returncode
        tail = Path(log).read_text(encoding="utf-8", errors="replace")[-3000:]
    if failed:
        raise SystemExit(f"failed: {' '.join(overrides)}\n{tail}")
    jobs = []
    for job in sorted((p for p in Path(sweep_dir).iterdir() if p.name.isdigit()), key=lambda p: int(p.name)):
        overrides_done = (job / ".hydra" / "overrides.yaml").read_text()
        quality = json.loads((job / "quality.json").read_text()) if (job / "quality.json").is_file() else {}
        jobs.append({"overrides": overrides_done, **json.loads((job / "timings.json").read_text()), "quality": quality})
    return jobs


def write_report(report: dict, out) -> None:
    """Print the report without its raw samples, and write it whole to ``out`` (if given)."""
    import json

    print(json.dumps({k: v for k, v in report.items() if k != "samples"}, indent=2))
    if out:
        out.write_text(json.dumps(report, indent=2) + "\n")


def setup(doc: str, rounds: int, prefix: str, models_subdir: str = "models", extra: dict | None = None):
    """(arguments --rounds/--out, a fresh work directory, an environment whose built-in models live in it)."""
    import argparse
    import tempfile
    from pathlib import Path

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", type=Path)
    for flag, default in (extra or {}).items():
        parser.add_argument(flag, default=default)
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix=prefix))
    return args, work, dict(os.environ, SDJAX_RUNNER_CACHE_DIR=str(work / models_subdir))


def baseline_env(env: dict, work, revision: str) -> dict:
    """``env`` running the package as it was at ``revision`` (an extracted copy first on PYTHONPATH)."""
    import subprocess
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    target = work / f"baseline-{revision}"
    target.mkdir()
    archive = subprocess.run(["git", "-C", str(root), "archive", revision, "sdjax_runner"], capture_output=True, check=True)
    subprocess.run(["tar", "-x", "-C", str(target)], input=archive.stdout, check=True)
    env = dict(env, PYTHONPATH=str(target))
    found = subprocess.run([sys.executable, "-c", "import sdjax_runner; print(sdjax_runner.__file__)"], env=env,
                           cwd=work, capture_output=True, text=True, check=True).stdout.strip()
    if not found.startswith(str(target)):
        raise SystemExit(f"the baseline is not what runs: {found}")
    return env


def cli(args: list[str], cwd, env: dict[str, str]) -> float:
    """``python -m sdjax_runner ARGS`` in a subprocess: its wall seconds (the script stops, naming it, if it fails)."""
    import subprocess
    import sys
    import time

    started = time.perf_counter()
    result = subprocess.run([sys.executable, "-m", "sdjax_runner", *args], cwd=cwd, env=env, capture_output=True,
                            text=True)
    if result.returncode != 0:
        raise SystemExit(f"failed: {' '.join(args)}\n{result.stderr[-3000:]}")
    return time.perf_counter() - started


def rounds_arguments(doc: str, rounds: int):
    """``--rounds`` and ``--out``, the arguments of the benchmarks that interleave rounds."""
    import argparse
    from pathlib import Path

    parser = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=rounds)
    parser.add_argument("--out", type=Path, default=None, help="write the raw results as JSON here")
    return parser.parse_args()


def report_rounds(summary: dict, rounds: list[dict], out) -> None:
    """The summary and the machine on stdout; with the raw rounds into ``out`` (a path, or None)."""
    import json

    machine = machine_facts()
    print(json.dumps({"summary": summary, "machine": machine}, indent=2))
    if out:
        out.write_text(json.dumps({"summary": summary, "machine": machine, "rounds": rounds}, indent=2))
