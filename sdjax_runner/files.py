"""JSON files written whole: what every layer that keeps a file (the caches, the run records) shares."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: Path, data: Any, last_resort_in_place: bool = False) -> None:
    """Write atomically: a reader never sees half a file, and a failed write (a full disk) leaves
    the old file as it was and no ``.tmp`` behind. ``last_resort_in_place``: on a disk too full for
    a second copy, overwrite the file itself (status.json must say how a run ended if it can)."""
    text = json.dumps(data, indent=2, sort_keys=True, default=str) + "\n"
    tmp = path.with_name(path.name + ".tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException as exc:
        tmp.unlink(missing_ok=True)
        if not (last_resort_in_place and isinstance(exc, OSError) and path.exists()):
            raise
        path.write_text(text, encoding="utf-8")


def read_json(path: Path) -> Any:
    return json.loads(path.read_text(encoding="utf-8"))
