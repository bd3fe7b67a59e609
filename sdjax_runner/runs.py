"""``python -m sdjax_runner.runs``: look at runs without MLflow.

    python -m sdjax_runner.runs list [ROOT] [--limit N]   recent runs under ROOT (default: outputs), newest first:
                                                        name, status, key params, headline numbers, directory
    python -m sdjax_runner.runs diff RUN_A RUN_B          the config keys that differ, and the metrics side by side

Run directories are found by their status.json (single runs, and each job of a sweep).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.record import catalog

LIST_COLUMNS = (("started", "started"), ("status", "status"), ("name", "name"), ("model.name", "model"),
                ("dtype.name", "dtype"), ("scheduler.name", "scheduler"), ("sampling.num_inference_steps", "steps"),
                ("seed", "seed"), ("images_per_s", "images/s"), ("compile_s", "compile_s"),
                ("clip_score_mean", "clip"), ("psnr", "psnr"), ("dir", "dir"))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(rows: list[list[str]], header: list[str]) -> str:
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def list_runs(root: Path, limit: int) -> str:
    summaries = sorted((catalog.summary(d) for d in catalog.find_runs(root)),
                       key=lambda s: (s["started"], s["dir"]), reverse=True)[:limit]
    if not summaries:
        return f"no runs under {root}"
    for s in summaries:
        s["started"] = s["started"][:19].replace("T", " ")
    return table([[_cell(s[key]) for key, _ in LIST_COLUMNS] for s in summaries], [h for _, h in LIST_COLUMNS])


def diff_runs(a: Path, b: Path) -> str:
    out = [f"A: {a}", f"B: {b}", ""]
    config = catalog.config_diff(a, b)
    out.append(table([list(row) for row in config], ["config key", "A", "B"]) if config else "config: identical")
    out.append("")
    metrics = catalog.metric_diff(a, b)
    rows = [[key, _cell(x), _cell(y), ratio] for key, x, y, ratio in metrics]
    out.append(table(rows, ["metric", "A", "B", "B/A"]) if rows else "metrics: none in common")
    return "\n".join(out)


def main(argv: Optional[list[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m sdjax_runner.runs", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="recent runs, newest first")
    listing.add_argument("root", nargs="?", type=Path, default=Path("outputs"), help="where to look (default: outputs)")
    listing.add_argument("--limit", type=int, default=20, help="at most this many runs (default 20)")
    diff = commands.add_parser("diff", help="what differs between two runs")
    diff.add_argument("a", type=Path)
    diff.add_argument("b", type=Path)
    args = parser.parse_args(argv)
    if args.command == "list":
        if not args.root.is_dir():
            print(f"error: {args.root}: no such directory", file=sys.stderr)
            return 2
        print(list_runs(args.root, args.limit))
        return 0
    for path in (args.a, args.b):
        if not (path / "status.json").is_file():
            print(f"error: {path}: not a run directory (no status.json)", file=sys.stderr)
            return 2
    print(diff_runs(args.a, args.b))
    return 0


if __name__ == "__main__":
    sys.exit(main())
