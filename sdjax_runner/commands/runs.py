"""``python -m sdjax_runner runs``: look at runs without MLflow.

    python -m sdjax_runner runs list [ROOT] [--limit N] [--since WHEN] [--dirs] [--refused] [KEY=VALUE ...]
        recent runs under ROOT (default: outputs), newest first: name, status, key params (the sampler as
        A1111 spells it: DPM++ 2M Karras, Euler a; a diffusers scheduler by its name: pndm), headline
        numbers, directory. KEY=VALUE keeps the runs whose config (or status, name, run_id) has that
        value (shell patterns: *, ?, [..]; a key given twice: either value; model, dtype, scheduler,
        steps, guidance, parallelism are short for model.name, ...; sampler matches as given or as
        shown). --since 7d / 12h / 2026-11-15: runs started since then. --dirs: only the directories,
        one a line (for scripts). Runs refused for bad input (status REFUSED: stopped before making an
        image) are left out and counted on stderr; --refused (or a status= filter) lists them.
    python -m sdjax_runner runs diff RUN_A RUN_B [--no-images] [--uri URI]
        the config keys and inputs (inputs.json: the prompts as read, the model's commit or weight
        files, LoRA and checkpoint hashes) that differ, the metrics side by side, and B's images
        against A's slot by slot (same index, seed, prompt and size): how many are identical, PSNR
        and SSIM, the images that differ.
        A run is a run directory or an MLflow run id (its record and images are downloaded from --uri,
        else MLFLOW_TRACKING_URI, else the embedded store outputs/mlflow.db).

Run directories are found by their status.json (single runs, and each job of a sweep).
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
import sys
from pathlib import Path
from typing import Any, Optional

from sdjax_runner import console
from sdjax_runner.commands import command_parser
from sdjax_runner.metrics.registry import METRICS
from sdjax_runner.record import catalog, inputs, rundir
from sdjax_runner.records import required

LIST_COLUMNS = (("started", "started"), ("status", "status"), ("name", "name"), ("model.name", "model"),
                ("dtype.name", "dtype"), ("sampler", "sampler"), ("sampling.num_inference_steps", "steps"),
                ("seed", "seed"), ("images_per_s", "images/s"), ("compile_s", "compile_s"),
                *((m.run_field, m.column) for m in METRICS.values() if m.column), ("dir", "dir"))


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4g}"
    return str(value)


def table(rows: list[list[str]], header: list[str]) -> str:
    """Rows in aligned columns; a cell's control and bidi characters (a record's text) shown escaped."""
    rows = [[console.shown(cell) for cell in row] for row in rows]
    widths = [max(len(str(x)) for x in column) for column in zip(header, *rows, strict=True)]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True))]
    lines += ["  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)) for row in rows]
    return "\n".join(line.rstrip() for line in lines)


def select_runs(root: Path, filters: dict[str, list[str]], since: Optional[datetime.datetime]) -> list[dict[str, Any]]:
    """Summaries of the runs under ``root`` that pass the filters, newest first. A filter key that no
    run has is an error (a misspelt key would otherwise quietly match nothing)."""
    selected: list[dict[str, Any]] = []
    known: set[str] = set()
    shown_keys = set(filters) | set(catalog.KEY_PARAMS) | {"run_name"}
    for run_dir in catalog.find_runs(root):
        config = catalog.flat_config(run_dir, needed=shown_keys)
        summary = catalog.summary(run_dir, config)
        values = catalog.filterable(config, summary)
        known.update(values)
        if since is not None and (catalog.started_at(summary) or since) < since:
            continue
        if catalog.matches(values, filters):
            selected.append(summary)
    unknown = sorted(set(filters) - known)
    if unknown and known:
        examples = ", ".join(sorted(catalog.ALIASES) + ["status", "sampling.height", "prompts.file"])
        raise ValueError(f"{unknown[0]}: no run under {root} has this key (e.g. {examples}; "
                         f"any key of a run's .hydra/config.yaml, dotted)")
    return sorted(selected, key=lambda s: (s["started"], s["dir"]), reverse=True)


def list_table(summaries: list[dict[str, Any]]) -> str:
    for s in summaries:
        s["started"] = s["started"][:19].replace("T", " ")
    return table([[_cell(s[key]) for key, _ in LIST_COLUMNS] for s in summaries], [h for _, h in LIST_COLUMNS])


def diff_runs(a: Path, b: Path, images: bool = True, labels: Optional[tuple[str, str]] = None) -> str:
    out = [f"A: {console.shown(labels[0] if labels else a)}", f"B: {console.shown(labels[1] if labels else b)}", ""]
    config, problems = catalog.config_diff(a, b)
    if problems:
        out += [f"config keys: not compared -- {'; '.join(problems)}", ""]
    config += [
        (f"inputs.{key}", x, y) for key, x, y in inputs.differences(rundir.read_json_or_empty(a / rundir.INPUTS),
                                                                    rundir.read_json_or_empty(b / rundir.INPUTS))]
    out.append(table([list(row) for row in config], ["config key", "A", "B"]) if config
               else "inputs: identical" if problems else "config and inputs: identical")
    out.append("")
    metrics = catalog.metric_diff(a, b)
    rows = [[key, _cell(x), _cell(y), ratio] for key, x, y, ratio in metrics]
    out.append(table(rows, ["metric", "A", "B", "B/A"]) if rows else "metrics: none in common")
    if images:
        out += ["", image_diff(a, b)]
    return "\n".join(out)


def image_diff(a: Path, b: Path, shown: int = 10) -> str:
    """B's images against A's, slot by slot (PSNR/SSIM as ``metrics.reference`` computes them): how
    many are identical, and the ``shown`` least faithful of those that differ."""
    title = "images (B against A, slot by slot: same index, seed, prompt and size)"
    kept = {}
    for label, run in (("A", a), ("B", b)):
        try:
            kept[label] = rundir.image_records(run)
            on_disk = bool(kept[label]) and all((run / required(r.file, "file")).is_file() for r in kept[label])
        except rundir.DamagedRecord as error:
            return f"images: not compared ({label}'s {rundir.IMAGES}: {error.problem})"
        except (OSError, ValueError, TypeError, KeyError) as error:
            return f"images: not compared ({label}'s {rundir.IMAGES}: {_reason(error)})"
        if not on_disk:
            return f"images: not compared ({label} kept no image files: output.save_images=false, or removed)"
    records = kept["B"]
    os.environ["JAX_PLATFORMS"] = "cpu"  # before JAX starts: a few small programs, never an accelerator
    from sdjax_runner.metrics.fidelity import compare

    try:
        per_image, fields = compare(b, records, a, kept["A"])
    except (OSError, ValueError, TypeError, KeyError) as error:  # a damaged record or image
        return f"images: not compared ({_reason(error)})"
    count = fields.compared_images
    if not count:
        return (f"images: none compared -- no image of B has its slot in A "
                f"(B has {len(records)}; PSNR/SSIM need the same seeds, prompts and size)")
    head = f"{count} of {len(records)} compared: "
    if fields.identical_images == count:
        return f"{title}\n{head}all identical (PSNR inf, SSIM 1)"
    head += (f"{fields.identical_images} identical; PSNR {fields.psnr:.2f} dB "
             f"(min {fields.psnr_min:.2f}), SSIM {fields.ssim_mean:.4f} (min {fields.ssim_min:.4f})")
    differing = sorted(((v, r) for v, r in zip(per_image, records, strict=True)
                        if v is not None and not math.isinf(v.psnr)), key=lambda pair: pair[0].psnr)
    rows = [[str(r.index), str(r.seed), f"{v.psnr:.2f}", f"{v.ssim:.4f}", _short(required(r.prompt, "prompt"))]
            for v, r in differing[:shown]]
    more = f"\n({len(differing) - shown} more differ)" if len(differing) > shown else ""
    return f"{title}\n{head}\n\n{table(rows, ['image', 'seed', 'psnr_db', 'ssim', 'prompt'])}{more}"


def _reason(error: Exception) -> str:
    if isinstance(error, KeyError):
        return f"a record has no {error}"
    return console.one_line(error, None)


def _short(text: str, width: int = 60) -> str:
    text = console.one_line(text, None)
    return text if len(text) <= width else text[:width - 3] + "..."


def without_refused(summaries: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], int]:
    """The summaries but the runs refused for bad input (catalog.REFUSED), and how many those were."""
    kept = [s for s in summaries if s["status"] != catalog.REFUSED]
    return kept, len(summaries) - len(kept)


def list_command(args: argparse.Namespace) -> int:
    if "=" in str(args.root) and not args.root.is_dir():  # `list model=x`: the root was left out
        args.filters.insert(0, str(args.root))
        args.root = Path("outputs")
    if not args.root.is_dir():
        console.error(f"{args.root}: no such directory")
        return 2
    try:
        filters = catalog.parse_filters(args.filters)
        since = catalog.parse_since(args.since) if args.since else None
        summaries = select_runs(args.root, filters, since)
    except ValueError as error:
        console.error(error)
        return 2
    refused = 0
    if not args.refused and "status" not in filters:
        summaries, refused = without_refused(summaries)
    if refused:
        print(f"({refused} run(s) refused for bad input not shown: nothing was generated; --refused lists them)",
              file=sys.stderr)
    shown = summaries[:args.limit] if args.limit > 0 else summaries
    for s in shown:
        if s["damaged"]:
            print(f"runs: {console.shown(s['damaged'])}; listed with status UNKNOWN", file=sys.stderr)
    if args.dirs:
        for s in shown:
            print(console.shown(s["dir"]))
        return 0
    if not shown:
        print(f"no runs under {args.root}" + (" match" if filters or since else ""))
        return 0
    print(list_table(shown))
    if len(shown) < len(summaries):
        print(f"({len(shown)} of {len(summaries)} runs shown; --limit 0 shows all)", file=sys.stderr)
    return 0


def main(argv: Optional[list[str]] = None) -> int:
    # Piped into head, less or grep -m: end quietly when the reader stops reading, as Unix tools do
    # (this command only reads, so stopping anywhere is safe), not with a BrokenPipeError traceback.
    import signal

    signal.signal(signal.SIGPIPE, signal.SIG_DFL)
    parser = command_parser("runs", __doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    listing = commands.add_parser("list", help="recent runs, newest first")
    listing.add_argument("root", nargs="?", type=Path, default=Path("outputs"), help="where to look (default: outputs)")
    listing.add_argument("filters", nargs="*", metavar="KEY=VALUE",
                         help="keep runs whose config (or status, name, run_id) has this value; shell patterns")
    listing.add_argument("--limit", type=int, default=20, help="at most this many runs (default 20; 0: all)")
    listing.add_argument("--since", help="runs started since: 7d, 12h, 30m ago, or 2026-11-15[T09:30]")
    listing.add_argument("--dirs", action="store_true", help="print only the run directories, one a line")
    listing.add_argument("--refused", action="store_true",
                         help="list the runs refused for bad input too (status REFUSED; left out by default)")
    diff = commands.add_parser("diff", help="what differs between two runs")
    diff.add_argument("a", help="a run directory or an MLflow run id")
    diff.add_argument("b", help="a run directory or an MLflow run id")
    diff.add_argument("--uri", help="tracking URI holding the MLflow runs (default: MLFLOW_TRACKING_URI, "
                                    "else the embedded store outputs/mlflow.db)")
    diff.add_argument("--no-images", action="store_true",
                      help="skip comparing the images (PSNR/SSIM; it starts JAX on the CPU)")
    args = parser.parse_args(argv)
    if args.command == "list":
        return list_command(args)
    return diff_command(args)


def diff_command(args: argparse.Namespace) -> int:
    """Two runs, each a run directory or an MLflow run id (downloaded into a scratch directory)."""
    import tempfile

    from sdjax_runner.errors import UserError

    with tempfile.TemporaryDirectory(prefix="sdjax-diff-") as scratch:
        runs = []
        for label, given in (("a", args.a), ("b", args.b)):
            path = Path(given).expanduser()
            if (path / rundir.STATUS).is_file():
                runs.append(path)
            elif path.exists() or "/" in given or not given.isalnum():
                console.error(f"{given}: not a run directory (no status.json) and not an MLflow run id")
                return 2
            else:
                from sdjax_runner.record.tracking import download_record

                try:
                    runs.append(download_record(given, args.uri, Path(scratch) / label, outputs=True))
                except UserError as error:
                    console.error(error)
                    return 2
        text = diff_runs(runs[0], runs[1], images=not args.no_images, labels=(args.a, args.b))
    console.say(text)  # after the scratch directory is gone: a reader that stops early cannot leave it behind
    return 0

