"""diffusers 0.39's Flax pipelines' images, kept on disk: what a test compares the runner with, computed by diffusers'
own code the first time and stored in ``tests/fixtures/flax_references/NAME.npz`` with the digest of everything it
was made from.

A Flax pipeline run by a test costs a compile per call (diffusers' ``jit=True`` pmaps its loop with the pipeline, the
start step and the sizes as static arguments): the img2img test alone spent a minute on six of them. The stored images
are the same pixels diffusers gave, not values of ours: the digest covers the model folder's files, the input images
(``sdjax_runner.files.file_sha256``), every setting the test passes, the versions of diffusers, transformers, flax
and jax and XLA's flags, so a change to any of them makes the test run diffusers' pipeline again (and say so in a
warning). ``SDJAX_WRITE_REFERENCES=1`` stores what it
computed; commit the file with the change that needed it.
"""

from __future__ import annotations

import hashlib
import inspect
import json
import os
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from sdjax_runner.files import file_sha256

FOLDER = Path(__file__).resolve().parent.parent / "fixtures" / "flax_references"
LIBRARIES = ("diffusers", "transformers", "flax", "jax", "jaxlib")


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


def made_from(make: Callable, parts: dict[str, Any]) -> str:
    """The digest of ``make``'s source, ``parts`` (strings, numbers, lists, dicts: what else the reference depends
    on -- folder and file digests, prompts, settings), the libraries' versions and XLA's flags (the tests' compile
    options, tests/conftest.py: they change how XLA rounds)."""
    from sdjax_runner.engine.executable_cache import xla_flag_settings

    # XLA's flags as the settings they are (each flag's last value, by name): the same flags in another order or
    # written twice -- a device count a run set again -- are the same compile options
    text = json.dumps({"code": inspect.getsource(make), "parts": parts, "versions": versions(),
                       "xla_flags": xla_flag_settings(os.environ.get("XLA_FLAGS", ""))}, sort_keys=True, default=str)
    return hashlib.sha256(text.encode()).hexdigest()


def reference(name: str, make: Callable[[], Any], **parts: Any) -> np.ndarray:
    """The images ``make`` (a call of diffusers' pipeline) gives, ``parts`` being what else they depend on: read
    from the stored file where it was made from the same (:func:`made_from`), else computed now (and stored with
    ``SDJAX_WRITE_REFERENCES=1``)."""
    digest = made_from(make, parts)
    path = FOLDER / f"{name}.npz"
    if path.is_file():
        with np.load(path, allow_pickle=False) as stored:
            if str(stored["digest"]) == digest:
                return np.asarray(stored["images"])
    images = np.asarray(make())
    if os.environ.get("SDJAX_WRITE_REFERENCES") == "1":
        FOLDER.mkdir(parents=True, exist_ok=True)
        np.savez_compressed(path, digest=np.array(digest), images=images)
    else:
        warnings.warn(f"{path.name}: made by diffusers' pipeline in this run (no stored reference for its inputs and "
                      "versions); SDJAX_WRITE_REFERENCES=1 stores it", stacklevel=2)
    return images
