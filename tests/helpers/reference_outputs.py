"""What the CLIP-based reference makers (make_pickscore_reference.py, make_aesthetic_reference.py) share: their
outputs' files and their command line. They run in the reference environment (torch, transformers), as
``python tests/helpers/make_X.py``; nothing here imports either."""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
from collections.abc import Callable
from pathlib import Path


def write_outputs(out: Path, rows: list[dict]) -> None:
    """``scores.json`` (a row per image) and ``VERSIONS.json`` (the libraries that made them)."""
    (out / "scores.json").write_text(json.dumps(rows, indent=1) + "\n")
    versions = {name: importlib.metadata.version(name) for name in ("torch", "transformers", "pillow", "numpy")}
    (out / "VERSIONS.json").write_text(json.dumps({**versions, "python": platform.python_version()}, indent=1) + "\n")


def tokenizer_main(doc: str, write: Callable[[Path, Path], None], default_out: Path) -> None:
    """The makers' command line: ``--tokenizer`` (the runner's tiny-random-clip folder) and ``--out``."""
    parser = argparse.ArgumentParser(description=doc.split("\n\n")[0])
    parser.add_argument("--tokenizer", type=Path, required=True, help="the runner's tiny-random-clip folder")
    parser.add_argument("--out", type=Path, default=default_out)
    args = parser.parse_args()
    write(args.out, args.tokenizer)
