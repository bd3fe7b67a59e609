"""diffusers 0.39's Flax pipelines' images, kept on disk: what a test compares the runner with, computed by diffusers'
own code the first time and stored in ``tests/fixtures/flax_references/NAME.npz`` with the digest of everything it
was made from.

A Flax pipeline run by a test costs a compile per call (diffusers' ``jit=True`` pmaps its loop with the pipeline, the
start step and the sizes as static arguments): the img2img test alone spent a minute on six of them. The stored images
are the same pixels diffusers gave, not values of ours: the digest covers the model folder's files, the input images
(``sdjax_runner.files.file_sha256``), every setting the test passes, the versions of diffusers, transformers, flax
and jax, XLA's flags and the instruction sets of the CPU, so a change to any of them makes the test run diffusers'
pipeline again (and say so in a warning). ``SDJAX_WRITE_REFERENCES=1`` stores what it computed; commit the file with
the change that needed it.

The CPU is part of it because XLA compiles for the host it runs on: the same program rounds differently with AVX-512
and AMX than with AVX2 alone (measured: a guide-flow image one level apart), while the runner and diffusers on one
machine agree bit for bit. So a reference is stored per kind of CPU, ``NAME@KIND.npz`` (KIND: :func:`cpu_kind`), and a
machine of another kind computes its own. ``NAME.npz`` files without a kind were stored before the CPU was recorded
(before 2026-11-28) and are read where no file of this machine's kind is: on the CPU that made them they match.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import platform
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sdjax_runner.files import file_sha256

FOLDER = Path(__file__).resolve().parent.parent / "fixtures" / "flax_references"
LIBRARIES = ("diffusers", "transformers", "flax", "jax", "jaxlib")
# The CPU flags (Linux's /proc/cpuinfo names) that decide which vector instructions XLA's CPU backend emits.
ISA_PREFIXES = ("sse", "ssse", "avx", "amx", "fma", "f16c", "bmi", "vnni", "neon", "asimd", "sve", "fp", "lse")


def cpu_features() -> list[str]:
    """The instruction sets XLA may compile for on this host: the vector-relevant flags of the first CPU in
    /proc/cpuinfo (``flags`` on x86, ``Features`` on ARM), with the machine's architecture; elsewhere the
    architecture and what ``platform.processor()`` says."""
    features: list[str] = []
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() in ("flags", "Features"):
                features = sorted(f for f in value.split() if f.startswith(ISA_PREFIXES))
                break
    else:
        features = [platform.processor()]
    return [platform.machine(), *features]


def cpu_kind() -> str:
    """A short name for this host's kind of CPU, as XLA compiles for it (the digest of :func:`cpu_features`)."""
    return hashlib.sha256(" ".join(cpu_features()).encode()).hexdigest()[:10]


def folder_digest(folder: Path) -> str:
    """sha256 over the relative names and bytes of every file under ``folder`` (a model's weights and configs)."""
    digest = hashlib.sha256()
    for path in sorted(p for p in Path(folder).rglob("*") if p.is_file()):
        digest.update(str(path.relative_to(folder)).encode() + b"\0")
        digest.update(bytes.fromhex(file_sha256(path)))
    return digest.hexdigest()


def versions() -> dict[str, str]:
    from importlib.metadata import version

    return {name: version(name) for name in LIBRARIES}


def made_from(make: Callable, parts: dict[str, Any], with_cpu: bool = True) -> str:
    """The digest of ``make``'s source, ``parts`` (strings, numbers, lists, dicts: what else the reference depends
    on -- folder and file digests, prompts, settings), the libraries' versions, XLA's flags (the tests' compile
    options, tests/conftest.py: they change how XLA rounds) and, ``with_cpu``, the CPU's instruction sets (the
    files stored before they were recorded: without)."""
    from sdjax_runner.engine.executable_cache import xla_flag_settings

    # XLA's flags as the settings they are (each flag's last value, by name): the same flags in another order or
    # written twice -- a device count a run set again -- are the same compile options
    made = {"code": inspect.getsource(make), "parts": parts, "versions": versions(),
            "xla_flags": xla_flag_settings(os.environ.get("XLA_FLAGS", ""))}
    if with_cpu:
        made["cpu"] = cpu_features()
    text = json.dumps(made, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def stored(path: Path, digest: str) -> np.ndarray | None:
    """The images of the file at ``path`` if it was made from ``digest``, else None."""
    if path.is_file():
        with np.load(path, allow_pickle=False) as kept:
            if str(kept["digest"]) == digest:
                return np.asarray(kept["images"])
    return None


def reference(name: str, make: Callable[[], Any], **parts: Any) -> np.ndarray:
    """The images ``make`` (a call of diffusers' pipeline) gives, ``parts`` being what else they depend on: read
    from this kind of CPU's stored file where it was made from the same (:func:`made_from`), else from a file stored
    before CPUs were recorded, else computed now (and stored for this kind of CPU with ``SDJAX_WRITE_REFERENCES=1``,
    which skips the older files)."""
    digest = made_from(make, parts)
    path = FOLDER / f"{name}@{cpu_kind()}.npz"
    writing = os.environ.get("SDJAX_WRITE_REFERENCES") == "1"
    found = stored(path, digest)
    if found is None and not writing:  # an older file, of a CPU not recorded: storing makes this CPU's own
        found = stored(FOLDER / f"{name}.npz", made_from(make, parts, with_cpu=False))
    if found is not None:
        return found
    images = np.asarray(make())
    if writing:
        FOLDER.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, digest=np.array(digest), images=images)
    else:
        warnings.warn(f"{path.name}: made by diffusers' pipeline in this run (no stored reference for its inputs and "
                      "versions); SDJAX_WRITE_REFERENCES=1 stores it", stacklevel=2)
    return images
