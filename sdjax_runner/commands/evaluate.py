"""``python -m sdjax_runner evaluate A B [--clip MODEL_FOLDER]``: CMMD between two sets of images, and where
both are runs, B's per-image metrics against A's image by image.

A and B are each a run directory (images.json and images/), a sweep directory (the images of every point: its
numbered job folders) or a folder of .png/.jpg/.jpeg images. It prints ``cmmd: X``, the CMMD distance of B's
images from A's (metrics/cmmd.py: Google's reference estimator on CLIP image embeddings, sigma 10, scale 1000;
0: the same distribution; symmetric). Where A and B are runs, the images of the same slot (same index, seed,
prompt, negative prompt and size) are paired and each per-image metric both records have (clip_score, psnr,
ssim) shown as the mean difference B - A with a 95% percentile-bootstrap interval over the paired differences
(2,000 resamples, seed 0), n, and the win rate (the share of pairs where B is higher, a tie counting half).

--clip: a CLIP model folder in transformers' layout (config.json, preprocessor_config.json, flax_model.msgpack
or model.safetensors), or a hub id in the local Hugging Face cache. Default: metrics.clip_score.model's
default, openai/clip-vit-large-patch14, where it is in the local cache (else --clip is required). The paper's
CLIP, whose CMMD values are comparable with published ones, is openai/clip-vit-large-patch14-336.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Optional

from sdjax_runner import console
from sdjax_runner.commands import command_parser
from sdjax_runner.errors import UserError
from sdjax_runner.metrics.cmmd import IMAGE_SUFFIXES, ImageFiles, cached_hub_model, model_folder
from sdjax_runner.metrics.comparison import BOOTSTRAP_SEED, PER_IMAGE_METRICS, RESAMPLES, matched_pairs, paired_metrics
from sdjax_runner.record import rundir
from sdjax_runner.records import ImageRecord

SET_ALLOWED = ("a run directory (images.json and images/), a sweep directory (its numbered job folders) or a "
               "folder of .png/.jpg/.jpeg images")
CLIP_ALLOWED = ("a CLIP model folder in transformers' layout (config.json, preprocessor_config.json, "
                "flax_model.msgpack or model.safetensors), or a hub id in the local Hugging Face cache")


@dataclass
class ImageSet:
    """What one argument names: its images' files, and a run's image records (None for a sweep or a folder)."""

    label: str  # "A" or "B"
    path: Path
    kind: str  # "run", "sweep" or "folder"
    files: list[Path]
    records: Optional[list[ImageRecord]] = None
    points: int = 0  # a sweep's points with images

    def describe(self) -> str:
        what = {"run": "run", "folder": "folder", "sweep": f"sweep of {self.points} point(s)"}[self.kind]
        return f"{self.label}: {console.shown(self.path)} ({what}, {len(self.files)} image(s))"


def _run_files(label: str, run_dir: Path) -> tuple[list[Path], list[ImageRecord]]:
    """A run's image files (in images.json's order) and the records that have one."""
    try:
        records = rundir.image_records(run_dir)
    except rundir.DamagedRecord as error:
        raise UserError(label, f"{error.key}: {error.problem}", error.allowed) from None
    kept = [record for record in records if record.file]
    files = [run_dir / str(record.file) for record in kept]
    missing = [file for file in files if not file.is_file()]
    if records and len(missing) == len(files):
        raise UserError(label, f"run {run_dir} kept no image files (output.save_images=false, or removed)",
                        SET_ALLOWED)
    if missing:
        raise UserError(label, f"{missing[0]}, an image of run {run_dir}'s images.json, is missing "
                               f"({len(missing)} of {len(files)} are)", SET_ALLOWED)
    return files, kept


def image_set(label: str, given: str) -> ImageSet:
    """The images ``given`` names (a run, a sweep or a folder of images); UserError naming ``label`` otherwise."""
    path = Path(given).expanduser()
    if not path.exists():
        raise UserError(label, f"{given}: no such directory", SET_ALLOWED)
    if not path.is_dir():
        raise UserError(label, f"{given} is a file, not a directory", SET_ALLOWED)
    if (path / rundir.IMAGES).is_file():
        files, records = _run_files(label, path)
        found = ImageSet(label, path, "run", files, records)
    else:
        jobs = [job for job in rundir.job_dirs(path) if (job / rundir.IMAGES).is_file()]
        if jobs:
            files = [file for job in jobs for file in _run_files(label, job)[0]]
            found = ImageSet(label, path, "sweep", files, points=len(jobs))
        else:
            files = sorted(p for p in path.iterdir() if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file())
            found = ImageSet(label, path, "folder", files)
    if not found.files:
        raise UserError(label, f"{given} holds no images", SET_ALLOWED)
    return found


class LazyImages(ImageFiles):
    """A set's images (metrics/cmmd.py's ImageFiles), an unreadable one a one-line error naming the set."""

    def __init__(self, found: ImageSet):
        super().__init__(found.files)
        self.found = found

    def _read(self, file: Path) -> Any:
        from PIL import Image

        try:
            return super()._read(file)
        except (OSError, ValueError, Image.DecompressionBombError) as error:
            raise UserError(self.found.label, f"{file} is not an image Pillow can read "
                            f"({type(error).__name__}: {console.one_line(error, 120)})", SET_ALLOWED) from None


def default_clip() -> str:
    """metrics.clip_score.model's default (config/schema.py; conf/config.yaml does not set it)."""
    from sdjax_runner.config.schema import ClipScoreConfig

    return str(ClipScoreConfig().model)


def clip_folder(given: Optional[str]) -> tuple[Path, str]:
    """(the CLIP model's folder, how to name it): --clip's folder or cached hub id, else the default's cached copy."""
    if given is None:
        name = default_clip()
        folder = cached_hub_model(name)
        if folder is None:
            raise UserError("--clip", f"not given, and the default CLIP {name} (metrics.clip_score.model's default) "
                            f"is not in the local Hugging Face cache: give --clip MODEL_FOLDER, or fetch it first "
                            f"(hf download {name} --include '*.json' '*.txt' 'flax_model.msgpack')", CLIP_ALLOWED)
        return folder, name
    try:
        folder = model_folder(given)
    except ValueError as error:  # neither a folder nor a cached hub model
        raise UserError("--clip", str(error), CLIP_ALLOWED) from None
    return folder, str(folder) if Path(given).expanduser().is_dir() else given


def load_clip(folder: Path, name: str) -> Any:
    """metrics/cmmd.py's embedder for ``folder``; what its loading refuses is one line naming --clip."""
    from sdjax_runner.metrics.cmmd import load_embedder

    for file in ("config.json", "preprocessor_config.json"):
        if not (folder / file).is_file():
            raise UserError("--clip", f"{name} has no {file}", CLIP_ALLOWED)
    try:
        return load_embedder(folder)
    except UserError as error:
        raise UserError("--clip", f"{name}: {error.problem}", CLIP_ALLOWED) from None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise UserError("--clip", f"{name} cannot be loaded as a CLIP model ({type(error).__name__}: "
                        f"{console.one_line(error, 200)})", CLIP_ALLOWED) from None


# ---------------------------------------------------------------------------------------------------------------
# Paired metrics (metrics/comparison.py's, paired by metrics/fidelity.py's slot: the same image of two runs)


def _slot(record: ImageRecord) -> Optional[tuple]:
    """metrics/fidelity.py's slot of the record; None where it lacks a field of it (unmatchable)."""
    from sdjax_runner.metrics.fidelity import slot

    try:
        return slot(record)
    except KeyError:
        return None


def paired_text(a: ImageSet, b: ImageSet) -> str:
    if a.kind != "run" or b.kind != "run":
        return "paired: not computed (paired metrics need two runs: A and B's images of the same slot)"
    pairs = matched_pairs(a.records or [], b.records or [], _slot)
    if not pairs:
        return (f"paired: none -- no image of B has its slot in A (same index, seed, prompt, negative prompt and "
                f"size; B has {len(b.files)})")
    rows = paired_metrics(pairs)
    head = (f"paired: {len(pairs)} of B's {len(b.files)} image(s) have their slot in A (same index, seed, prompt, "
            f"negative prompt and size)")
    if not rows:
        return f"{head}; no per-image metric ({', '.join(PER_IMAGE_METRICS)}) is in both runs' records"
    from sdjax_runner.commands.runs import table

    cells = []
    for row in rows:
        if not row.n:
            cells.append([row.metric, "0", "-", "-", "-"])
            continue
        cells.append([row.metric, str(row.n), f"{row.mean:+.4g}", f"[{row.low:+.4g}, {row.high:+.4g}]",
                      f"{row.win_rate:.3f} ({row.higher} higher, {row.ties} tied, {row.n - row.higher - row.ties} "
                      f"lower)"])
    notes = [f"{row.metric}: {row.left_out} pair(s) with a value that is not finite left out"
             for row in rows if row.left_out]
    method = (f"B - A per pair; 95% interval: percentile bootstrap of the mean over the paired differences, "
              f"{RESAMPLES} resamples, seed {BOOTSTRAP_SEED}; win rate: share of pairs where B is higher, ties half")
    return "\n".join([head, method, "", table(cells, ["metric", "n", "mean B-A", "95% interval", "win rate"]),
                      *notes])


def main(argv: Optional[list[str]] = None) -> int:
    parser = command_parser("evaluate", __doc__)
    parser.add_argument("a", metavar="A", help="a run directory, a sweep directory or a folder of images")
    parser.add_argument("b", metavar="B", help="a run directory, a sweep directory or a folder of images")
    parser.add_argument("--clip", metavar="MODEL_FOLDER",
                        help="a CLIP model folder (transformers' layout) or a cached hub id (default: "
                             "metrics.clip_score.model's default, where it is in the local Hugging Face cache)")
    args = parser.parse_args(argv)
    try:
        sets = [image_set("A", args.a), image_set("B", args.b)]
        folder, name = clip_folder(args.clip)
        from sdjax_runner.engine import runtime

        runtime.silence_libraries()
        embedder = load_clip(folder, name)
        from sdjax_runner.metrics.cmmd import BATCH, SCALE, SIGMA, mmd

        batch = min(BATCH, max(len(found.files) for found in sets))  # one program for both sets
        a, b = (embedder(LazyImages(found), batch) for found in sets)
        value = float(mmd(a, b))
    except UserError as error:
        console.error(error)
        return 2
    console.say("\n".join([
        *(found.describe() for found in sets),
        f"clip: {name} (image size {embedder.size})",
        f"cmmd: {value:.4f}",
        f"(CMMD of B's images from A's: MMD of CLIP image embeddings, RBF kernel sigma {SIGMA:g}, scale {SCALE:g}; "
        f"0: the same distribution)",
        "",
        paired_text(*sets),
    ]))
    return 0
