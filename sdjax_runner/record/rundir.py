"""Images and timings -> the run directory: the on-disk contract later tools rely on.

    images/NNNN_seedS.png   one PNG per image, generation settings in PNG text chunks
                            (plus an A1111-style ``parameters`` chunk image tools read)
    grid.png                every image of the run in one grid (img2img, inpaint, controlnet: the input
                            images -- init image, mask, control image -- in the left columns)
    images.json             per image: file, prompt, negative prompt, batch, device, seed, pixels_sha256
    timings.json            compile and steady-state timings, layout and device facts
    status.json             FINISHED / FAILED / KILLED, the error, and the tracker run
    tracking.json           what the tracker is to receive (run name, params, tags), written first
    quality.json            CLIP score, PSNR/SSIM to a reference, and what could not be measured
    environment.json        library versions, backend, device kind and count, host, git commit
    inputs.json             what the run read besides its config: the prompt list as read, the working
                            directory, the model's hub commit or weight files, LoRA/checkpoint hashes
    rerun.json              (a re-run only) whether its images match the recorded run's, bit for bit
    .hydra/                 the resolved config and the overrides (Hydra writes it)

images.json, timings.json and quality.json are written and read as the typed records of
:mod:`sdjax_runner.records` (ImageRecord, RunTimings, Quality), whose fields are their keys.

A sweep directory holds one run directory per job (``0/``, ``1/``, ...) and sweep.json,
summary.csv, summary.json, comparison.json (its settings judged: metrics/comparison.py), contact_sheet.png,
report.html and (with quality metrics) report.png.
"""

from __future__ import annotations

import dataclasses
import hashlib
import math
import struct
import time
import zlib
from collections.abc import Collection, Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional

from PIL import Image
from PIL.PngImagePlugin import PngInfo

from sdjax_runner.config import families
from sdjax_runner.config.choices import number as setting_text
from sdjax_runner.config.prompt_syntax import escape
from sdjax_runner.config.quantizers import DEFAULT as QUANTIZE_DEFAULT
from sdjax_runner.console import one_line
from sdjax_runner.errors import UserError
from sdjax_runner.files import UnreadableRecord, read_config_record, read_json, replaced, write_json
from sdjax_runner.metrics.registry import METRICS, Metric
from sdjax_runner.records import ImageRecord, Quality, RunTimings

if TYPE_CHECKING:
    from sdjax_runner.config.plan import LoraEntry, Plan

IMAGES_DIR = "images"
GRID = "grid.png"
IMAGES = "images.json"
TIMINGS = "timings.json"
STATUS = "status.json"
TRACKING = "tracking.json"
QUALITY = "quality.json"
PROFILE = "profile.json"
PROFILE_DIR = "profile"
ENVIRONMENT = "environment.json"
INPUTS = "inputs.json"
RERUN = "rerun.json"
HYDRA_DIR = ".hydra"
CONFIG = f"{HYDRA_DIR}/config.yaml"
OVERRIDES = f"{HYDRA_DIR}/overrides.yaml"
# In a sweep directory.
SWEEP = "sweep.json"
SUMMARY_CSV = "summary.csv"
SUMMARY_JSON = "summary.json"
COMPARISON = "comparison.json"  # a sweep's settings with intervals and paired differences (metrics/comparison.py)
CONTACT_SHEET = "contact_sheet.png"
REPORT = "report.png"
REPORT_PAGE = "report.html"  # the sweep report a person opens (record/report_page.py)
MULTIRUN = "multirun.yaml"  # Hydra's: the sweep's composed config and overrides (what a resume repeats)


def job_dirs(sweep_dir: Path) -> list[Path]:
    """A sweep's job directories (``0/``, ``1/``, ...), in job order."""
    return sorted((p for p in sweep_dir.iterdir() if p.is_dir() and p.name.isascii() and p.name.isdigit()), key=lambda p: int(p.name))


def job_overrides(job_dir: Path) -> Optional[list[str]]:
    """The overrides a sweep's job ran with (Hydra's ``.hydra/overrides.yaml``), or None where its
    ``.hydra/`` was removed or damaged."""
    from omegaconf import OmegaConf

    try:
        overrides = OmegaConf.to_container(read_config_record(job_dir / OVERRIDES))
    except (OSError, ValueError):
        return None
    return [str(o) for o in overrides] if isinstance(overrides, list) else None


def recorded_config(run_dir: Path) -> Any:
    """The run's ``.hydra/config.yaml`` as an OmegaConf config, read within the record bounds (files.py) and
    checked to call no resolver the packaged config does not (config/overrides.py): a record handed over
    repeats its values and makes no lookups here. OSError / ValueError (unreadable) or UserError."""
    from omegaconf import OmegaConf

    from sdjax_runner.config.overrides import check_recorded_config

    path = run_dir / CONFIG
    config = read_config_record(path)
    check_recorded_config(OmegaConf.to_container(config, resolve=False), str(path))
    return config


def image_records(run_dir: Path) -> list[ImageRecord]:
    """A run's image records (its images.json), each ``file`` checked to be a file name inside the run
    directory: :class:`DamagedRecord` naming images.json otherwise (a record handed over may name
    ``../../etc/passwd``; nothing outside a run directory is read for it)."""
    records = [ImageRecord.from_json(record) for record in read_record(run_dir / IMAGES, list)]
    top = run_dir.resolve()
    for record in records:
        name = record.file
        if name is None:
            continue
        if not isinstance(name, str) or not name or Path(name).is_absolute() \
                or not (run_dir / name).resolve().is_relative_to(top):
            raise DamagedRecord(run_dir / IMAGES, f"names the image file {str(name)[:120]!r}, outside its run directory",
                                "files inside the run directory, e.g. images/0000_seed0.png")
    return records


def image_file(index: int, seed: int) -> str:
    """An image's path relative to its run directory."""
    return f"{IMAGES_DIR}/{index:04d}_seed{seed}.png"


def pixel_hash(array) -> str:
    """SHA-256 of an image's pixels (H x W x 3 uint8, row-major): images.json's ``pixels_sha256``,
    which a re-run compares (python -m sdjax_runner rerun)."""
    import numpy as np

    return hashlib.sha256(np.ascontiguousarray(array, dtype=np.uint8).tobytes()).hexdigest()


def _flat(text: str) -> str:
    """``text`` with each line break a space and all else kept: unlike :func:`sdjax_runner.console.one_line`
    a prompt's own spaces stay as they are and nothing is cut -- the parameters carry the prompt itself."""
    return " ".join(str(text).splitlines())


def quoted(value: str) -> str:
    """A settings value as A1111's ``quote`` writes it: JSON-quoted where a comma, colon or line break would end
    it early (a file name is the user's text)."""
    import json

    return json.dumps(value, ensure_ascii=False) if any(c in value for c in ",:\n\r\"") else value


def refiner_title(refiner: str) -> str:
    """A1111's ``Refiner`` value, its checkpoint's title ``NAME [HASH]`` (the hash's first 10), for the record's
    ``refiner`` (``NAME:sha256=HASH``), quoted where the name needs it."""
    name, _, sha = refiner.rpartition(":sha256=")
    return quoted(f"{name} [{sha[:10]}]")


def ti_hashes(embeddings: str) -> str:
    """A1111's ``TI hashes`` value for the record's ``embeddings``: ``"name: sha256[:12], ..."``, quoted."""
    import json

    pairs = [part.rpartition(":sha256=") for part in embeddings.split("; ")]
    return json.dumps(", ".join(f"{name}: {sha}" for name, _, sha in pairs), ensure_ascii=False)


def first_pass_size(meta: ImageRecord) -> str:
    """A1111's ``Size``, WxH: the first pass's where Hires. fix upscaled the image, else the image's."""
    if meta.first_pass_width is not None:
        return f"{meta.first_pass_width}x{meta.first_pass_height}"
    return f"{meta.width}x{meta.height}"


def a1111_parameters(meta: ImageRecord) -> str:
    """The ``parameters`` text AUTOMATIC1111's web UI writes, which many image tools parse: the
    prompt, a ``Negative prompt:`` line, and a last line of settings. Line breaks inside the
    prompts become spaces here (the ``prompt`` chunk keeps them), so a prompt cannot add lines
    that a reader would take for a negative prompt or settings. A prompt read as plain text here
    (prompts.syntax=plain) has its brackets escaped, so that A1111 reads the same text, not emphasis -- but a
    FLUX.1 or SD 3 prompt, which Forge and this runner read as written, is written as it is. SD 3 adds its
    ``Shift``; Hires. fix its ``Denoising strength``, ``Hires upscale``, ``Hires steps`` and ``Hires
    upscaler`` (and where given ``Hires sampler``, ``Hires schedule type``, ``Hires CFG Scale``), as A1111 writes
    them, with ``Size`` the first pass's; SDXL's refiner ``Refiner: NAME [HASH]`` and ``Refiner switch at``;
    FLUX.1 Kontext's ``Edit image: NAME`` (mode=edit: the input image's file name); FLUX.1 Canny/Depth's ``Control
    image: NAME`` (mode=control: the control image's file name)."""
    def text(prompt: str) -> str:
        family = families.FAMILIES[meta.family or families.DEFAULT]
        as_written = meta.prompt_syntax == "a1111" or not family.a1111_prompts
        return _flat(prompt) if as_written else escape(_flat(prompt))

    lines = [text(str(meta.prompt))]
    if meta.negative_prompt:
        lines.append(f"Negative prompt: {text(meta.negative_prompt)}")
    lines.append(
        f"Steps: {meta.steps}, Sampler: {meta.sampler}, "
        + (f"Schedule type: {meta.schedule_type}, " if meta.schedule_type else "")
        + (f"UniPC variant: {meta.unipc_variant}, " if meta.unipc_variant else "")
        # No classifier-free guidance (FLUX.1) is A1111's and Forge's "CFG scale: 1".
        + f"CFG scale: {meta.guidance_scale if meta.guidance_scale is not None else 1}, "
        + (f"Distilled CFG Scale: {meta.distilled_guidance}, " if meta.distilled_guidance is not None else "")
        + (f"Rescale CFG: {meta.guidance_rescale}, " if meta.guidance_rescale is not None else "")
        + "".join(f"{part}, " for part in choice_parts("Guider", meta.guider, meta.guider_settings))
        + (f"Guider layers: {quoted(', '.join(meta.guider_layers))}, " if meta.guider_layers else "")
        + "".join(f"{part}, " for part in choice_parts("Step cache", meta.cache, meta.cache_settings))
        + "".join(f"{part}, " for part in choice_parts("Quantize", meta.quantize, None))
        + f"Seed: {meta.seed}, Size: {first_pass_size(meta)}, Model: {meta.model}, "
        f"Dtype: {meta.dtype}, Batch: {meta.batch}, Device: {meta.device}"
        + (f", {'Eta DDIM' if meta.sampler == 'ddim' else 'Eta'}: {meta.eta}" if meta.eta is not None else "")
        + (f", Clip skip: {meta.clip_skip}" if meta.clip_skip else "")
        + (f", Denoising strength: {meta.strength}" if meta.strength is not None else "")
        + (f", Denoising strength: {meta.hires_strength}, Hires upscale: {meta.hires_scale:g}"
           + f", Hires steps: {meta.hires_steps}, Hires upscaler: {meta.hires_upscaler}" if meta.hires_scale is not None else "")
        + (f", Hires sampler: {meta.hires_sampler}" if meta.hires_sampler else "")
        + (f", Hires schedule type: {meta.hires_schedule_type}" if meta.hires_schedule_type else "")
        + (f", Hires CFG Scale: {meta.hires_guidance_scale}" if meta.hires_guidance_scale is not None else "")
        + (f", Mask: {meta.mask_image}" if meta.mask_image else "")
        + (f", Edit image: {quoted(str(meta.init_image))}" if meta.mode == "edit" else "")
        + (f", Reference images: {quoted(str(meta.reference_images))}" if meta.reference_images else "")
        + (f", Control image: {quoted(str(meta.control_image))}"
           if meta.mode in ("control", "control_img2img", "control_inpaint") else "")
        + (f", ControlNet: {quoted(str(meta.controlnet))}, Control weight: {meta.conditioning_scale}"
           if meta.controlnet else "")
        + (f", Control mode: {meta.control_mode}" if meta.control_mode is not None else "")
        + (f", Guidance Start: {meta.control_guidance_start}, Guidance End: {meta.control_guidance_end}"
           if meta.control_guidance_start is not None else "")
        + (f", Lora: {meta.lora}" if meta.lora else "")
        + (f", TI hashes: {ti_hashes(meta.embeddings)}" if meta.embeddings else "")
        + (f", Checkpoint: {meta.checkpoint}" if meta.checkpoint else "")
        + (f", VAE hash: {meta.vae.rpartition('sha256=')[2][:10]}, VAE: {quoted(meta.vae.rpartition(':sha256=')[0])}"
           if meta.vae else "")
        + (f", Refiner: {refiner_title(meta.refiner)}, Refiner switch at: {meta.refiner_switch}" if meta.refiner else "")
        + (f", Shift: {meta.shift}" if meta.shift is not None else "")
        + "".join(f", {part}" for part in measured_parts(meta))
    )
    return "\n".join(lines)


def measurements(meta: ImageRecord) -> list[tuple[Metric, float]]:
    """Each registry metric (metrics/registry.py) the image has a value of, with the value: none before the metrics
    are in (:func:`stamp_measurements`)."""
    return [(metric, value) for metric in METRICS.values() if (value := getattr(meta, metric.name)) is not None]


def measured_parts(meta: ImageRecord) -> list[str]:
    """The image's metric values as its infotext gives them, last (``CLIP score: 31.2``: the ``infotext`` keys)."""
    return [f"{metric.infotext}: {metric.shown.format(value)}" for metric, value in measurements(meta)]


def measured_chunks(meta: ImageRecord) -> dict[str, str]:
    """The image's metric values as its PNG's text chunks hold them (named as the record's fields)."""
    return {metric.name: str(value) for metric, value in measurements(meta)}


PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
TEXT_CHUNKS = (b"iTXt", b"tEXt", b"zTXt")


def _png_chunk(kind: bytes, data: bytes) -> bytes:
    return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))


def _itxt(keyword: str, text: str) -> bytes:
    """An uncompressed iTXt chunk, as Pillow's ``PngInfo.add_itxt`` writes one (no language, no translated key)."""
    return _png_chunk(b"iTXt", keyword.encode("latin-1") + b"\0\0\0\0\0" + text.encode("utf-8"))


def with_texts(png: bytes, texts: dict[str, str]) -> bytes:
    """The PNG ``png`` with the text chunks of ``texts``' keywords holding these texts instead (added before IEND
    where it had none); every other chunk, the pixels' included, byte for byte. ValueError: not a whole PNG."""
    if not png.startswith(PNG_SIGNATURE):
        raise ValueError("not a PNG")
    out, at, left = [PNG_SIGNATURE], len(PNG_SIGNATURE), dict(texts)
    while at < len(png):
        if at + 12 > len(png):
            raise ValueError("a PNG cut short")
        (length,), kind = struct.unpack(">I", png[at:at + 4]), png[at + 4:at + 8]
        end = at + 12 + length
        if kind in TEXT_CHUNKS:
            keyword = png[at + 8:at + 8 + length].split(b"\0", 1)[0].decode("latin-1")
            if keyword in texts:  # replaced (the first of its keyword) or dropped (a second)
                if keyword in left:
                    out.append(_itxt(keyword, left.pop(keyword)))
                at = end
                continue
        if kind == b"IEND":
            out += [_itxt(keyword, text) for keyword, text in left.items()]
            left = {}
        out.append(png[at:end])
        at = end
    if left:
        raise ValueError("a PNG without its IEND chunk")
    return b"".join(out)


def stamp_measurements(run_dir: Path, records: list[ImageRecord]) -> None:
    """Each written image's PNG gains its metric values, once the metrics are in: a text chunk per value (named as
    images.json's field) and the values at the end of the ``parameters`` line; the image data stays byte for byte
    (its chunks are copied, not encoded again), and a PNG is replaced whole or not at all."""
    for record in records:
        values = measured_chunks(record)
        path = run_dir / record.file if record.file else None
        if not values or path is None or not path.is_file():
            continue
        stamped = with_texts(path.read_bytes(), {**values, "parameters": a1111_parameters(record)})
        with replaced(path) as file:
            file.write(stamped)


def save_png(image: Image.Image, path: Path, record: ImageRecord) -> None:
    """``image`` as a PNG whose text chunks are its record (and A1111's ``parameters``)."""
    info = PngInfo()
    for key, value in record.to_json().items():
        info.add_itxt(key, "" if value is None else str(value))
    info.add_itxt("parameters", a1111_parameters(record))
    save_whole(image, path, pnginfo=info)


def save_whole(image: Image.Image, path: Path, **options: Any) -> None:
    """Save ``image`` as a PNG in place of ``path`` (files.replaced: never through a link); if that fails (a full
    disk), no half-written file is left to be taken for one."""
    try:
        with replaced(path) as file:
            image.save(file, format="PNG", **options)
    except BaseException:
        path.unlink(missing_ok=True)
        raise


def read_png_record(path: Path, run_dir: Path) -> ImageRecord:
    """An image's images.json record, read back from its PNG text chunks (what save_png wrote)."""
    with Image.open(path) as image:
        chunks = dict(image.text)  # type: ignore[attr-defined]  # a PNG: PIL types Image.open as ImageFile
    chunks.pop("parameters", None)
    record = ImageRecord.from_text(chunks)
    record.file = path.relative_to(run_dir).as_posix()
    return record


def records_from_pngs(run_dir: Path) -> tuple[list[ImageRecord], list[str]]:
    """images.json rebuilt from the PNGs a run wrote (a run whose process died before writing it),
    and the PNGs that could not be read (one cut short by the kill)."""
    records, unreadable = [], []
    pngs = sorted((run_dir / IMAGES_DIR).glob("*.png")) if (run_dir / IMAGES_DIR).is_dir() else []
    for png in pngs:
        try:
            records.append(read_png_record(png, run_dir))
        except (OSError, ValueError, SyntaxError):
            unreadable.append(png.relative_to(run_dir).as_posix())
    return sorted(records, key=lambda r: 0 if r.index is None else r.index), unreadable


def grid_shape(count: int, rows: Optional[int] = None, cols: Optional[int] = None) -> tuple[int, int]:
    """Rows x cols for ``count`` images: as given, else the most square exact factorisation
    (8 -> 2 x 4), else a near-square grid with empty cells at the end."""
    if rows and cols:
        return rows, cols
    if rows:
        return rows, math.ceil(count / rows)
    if cols:
        return math.ceil(count / cols), cols
    side = math.ceil(math.sqrt(count))
    best = max(d for d in range(1, math.isqrt(count) + 1) if count % d == 0)
    if count // best <= 2 * side:
        return best, count // best
    return math.ceil(count / side), side


def make_grid(images: Sequence[Image.Image], rows: int, cols: int) -> Image.Image:
    """The images row by row in an RGB grid of ``rows`` x ``cols`` cells of the first image's size, the cells past
    the images black (as diffusers' ``make_image_grid`` lays them out)."""
    width, height = images[0].size
    grid = Image.new("RGB", (cols * width, rows * height))
    for number, image in enumerate(images):
        grid.paste(image, box=(number % cols * width, number // cols * height))
    return grid


class DamagedRecord(UserError):
    """A run's record file that is missing, not JSON, or JSON of the wrong kind: one line naming it."""

    def __init__(self, path: Path, problem: str, wanted: str):
        super().__init__(str(path), problem, wanted)


_KINDS: dict[type, str] = {dict: "a JSON object", list: "a list of image records (JSON objects)"}


def _kind_of(value: Any) -> str:
    return {type(None): "null", bool: "a boolean", int: "a number", float: "a number", str: "a string",
            list: "a list", dict: "an object"}.get(type(value), type(value).__name__)


def read_record(path: Path, kind: type = dict) -> Any:
    """A run's record file (status.json, images.json, ...) as the ``kind`` it must be: a JSON object, or
    (``list``) a list of objects; :class:`DamagedRecord` naming the file otherwise -- truncated, ``null``,
    a list where an object belongs."""
    try:
        value = read_json(path)
    except FileNotFoundError:
        raise DamagedRecord(path, "is missing", _KINDS[kind]) from None
    except UnreadableRecord as exc:
        raise DamagedRecord(path, str(exc), _KINDS[kind]) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        detail = one_line(exc, 120)
        raise DamagedRecord(path, f"cannot be read as JSON, damaged or cut short ({type(exc).__name__}: {detail})",
                            _KINDS[kind]) from None
    if not isinstance(value, kind) or (isinstance(value, list) and kind is list
                                       and not all(isinstance(item, dict) for item in value)):
        what = _kind_of(value) if not isinstance(value, list) or kind is not list else "a list holding other things"
        raise DamagedRecord(path, f"is {what}", _KINDS[kind])
    return value


def read_json_or_empty(path: Path) -> dict[str, Any]:
    """A record file of a run that may be absent, unreadable or damaged (a run killed mid-write, a
    directory copied in part): ``{}`` then -- also where it holds JSON that is no object -- so listings
    and resume show what is there."""
    try:
        return read_record(path)
    except DamagedRecord:
        return {}


def write_image_records(run_dir: Path, records: list[ImageRecord]) -> None:
    """A run's images.json."""
    write_json(run_dir / IMAGES, [record.to_json() for record in records])


def read_timings(run_dir: Path) -> RunTimings:
    """A run's timings.json; empty where it is absent or damaged (as :func:`read_json_or_empty`)."""
    return RunTimings.from_json(read_json_or_empty(run_dir / TIMINGS))


def read_quality(run_dir: Path) -> Quality:
    """A run's quality.json; empty where it is absent or damaged (as :func:`read_json_or_empty`)."""
    return Quality.from_json(read_json_or_empty(run_dir / QUALITY))


def choice_parts(label: str, name: Optional[str], settings: Optional[str]) -> list[str]:
    """The infotext's ``LABEL: NAME`` and ``LABEL SETTING: VALUE`` for a guider or a step cache (``settings``: the
    record's "KEY=VALUE ..."; config/infotext.py reads them back); none where the record names none (classifier-free
    guidance, no cache)."""
    if not name:
        return []
    pairs = (item.partition("=") for item in (settings or "").split())
    return [f"{label}: {name}", *(f"{label} {key}: {value}" for key, _, value in pairs)]


def image_meta(plan: Plan, height: int, width: int, guidance: str = "cfg", shift: Optional[float] = None,
               first_pass: Optional[tuple[int, int]] = None) -> ImageRecord:
    """What every image of the run shares, for its PNG text chunks and images.json: a record without the
    image's own fields (write_images adds them). A field that does not apply is None, and left out.
    ``guidance``: how the model reads the guidance value (engine/families.py): "cfg" (classifier-free guidance,
    ``guidance_scale``), "distilled" (FLUX.1 [dev], ``distilled_guidance``; ``guidance_scale`` is then true CFG's
    scale where it ran) or "none" ([schnell]); ``shift``: SD 3's scheduler shift (engine/families.py); ``first_pass``:
    (height, width) of Hires. fix's first pass (``height`` and ``width`` are the images')."""
    a1111_name, schedule_type = plan.sampling.a1111
    return ImageRecord(
        negative_prompt=plan.negative,
        seed=plan.seed,
        steps=plan.num_inference_steps,
        guidance_scale=plan.guidance_scale if guidance == "cfg" else plan.true_cfg_scale,  # FLUX.1: true CFG's
        distilled_guidance=plan.guidance_scale if guidance == "distilled" else None,
        # A diffusers scheduler's name; with a k sampler its sigma schedule (ComfyUI's "scheduler")
        scheduler=plan.sampling.sigmas or plan.scheduler.name,
        sampler=a1111_name,
        schedule_type=schedule_type or None,
        unipc_variant=plan.sampling.a1111_settings["UniPC variant"] if plan.sampling.a1111_settings else None,
        eta=plan.sampling.eta,
        clip_skip=plan.clip_skip if plan.clip_skip > 1 else None,
        prompt_syntax=plan.syntax if plan.syntax != "plain" else None,
        mode=plan.generation,
        strength=plan.strength,
        reference_images=", ".join(Path(image.path).name for image in plan.inputs.references) or None,
        controlnet=plan.controlnet or None,
        conditioning_scale=plan.conditioning_scale if plan.controlnet else None,
        control_mode=plan.control_mode,
        control_guidance_start=plan.control_window[0] if plan.controlnet and plan.control_window != (0.0, 1.0) else None,
        control_guidance_end=plan.control_window[1] if plan.controlnet and plan.control_window != (0.0, 1.0) else None,
        model=plan.model.name,
        family=plan.family if plan.family != families.DEFAULT else None,
        model_path=str(plan.model.pretrained_model_name_or_path),
        dtype=plan.dtype.weights_dtype.name,
        height=height,
        width=width,
        lora=lora_label(plan.lora) if plan.lora else None,
        checkpoint=(f"{Path(plan.checkpoint.path).name}:sha256={plan.checkpoint.sha256[:12]}"
                    if plan.checkpoint else None),
        vae=f"{Path(plan.vae.path).name}:sha256={plan.vae.sha256[:12]}" if plan.vae else None,
        embeddings="; ".join(f"{e.name}:sha256={e.sha256[:12]}" for e in plan.embeddings) or None,
        shift=shift,
        guidance_rescale=plan.guidance_rescale,
        guider=None if plan.guider.plain else plan.guider.name,
        guider_settings=" ".join(f"{key}={setting_text(value)}" for key, value in plan.guider.recorded) or None,
        guider_layers=list(plan.guider.layers) or None,
        cache=None if plan.cache.plain else plan.cache.name,
        cache_settings=" ".join(f"{key}={setting_text(value)}" for key, value in plan.cache.settings) or None,
        quantize=None if plan.quantize == QUANTIZE_DEFAULT else plan.quantize,
        **(hires_fields(plan.hires, first_pass) if plan.hires else {}),
        refiner=f"{plan.refiner.name}:sha256={plan.refiner.sha256[:12]}" if plan.refiner else None,
        refiner_switch=plan.refiner.switch if plan.refiner else None,
    )


def hires_fields(hires: Any, first_pass: Optional[tuple[int, int]]) -> dict[str, Any]:
    """The records' Hires. fix fields (``hires``: the plan's config/hires.Hires)."""
    height, width = first_pass or (None, None)
    sampler, schedule = hires.sampling.a1111 if hires.sampling else (None, None)
    return {"hires_scale": hires.scale, "hires_steps": hires.steps,
            "hires_upscaler": hires.a1111_upscaler, "hires_strength": hires.strength,
            "first_pass_height": height, "first_pass_width": width, "hires_sampler": sampler,
            "hires_schedule_type": schedule, "hires_guidance_scale": hires.guidance}


def lora_label(adapters: tuple[LoraEntry, ...]) -> str:
    """``style.safetensors:0.8:sha256=ab12cd34ef56; ...``: each adapter, its scale and content hash."""
    return "; ".join(f"{Path(a.path).name}:{a.scale:g}:sha256={a.sha256[:12]}" for a in adapters)


def write_images(run_dir: Path, plan: Plan, batches: Iterator, meta: ImageRecord,
                 records: list[ImageRecord], non_finite: Collection[int] = ()) -> tuple[list, float]:
    """Each batch's kept images to images/ as it arrives, their records appended to ``records``
    (so an interruption keeps what was made, and says what it was); (images, seconds spent).
    ``non_finite``: the indices of images with NaN or infinite pixels, known when their batch arrives."""
    images, write_s = [], 0.0
    if plan.output.save_images:
        (run_dir / IMAGES_DIR).mkdir(exist_ok=True)
    for batch, pixels in enumerate(batches):
        started = time.perf_counter()
        slots = plan.images[batch * plan.images_per_batch:(batch + 1) * plan.images_per_batch]
        for slot, array in zip(slots, pixels, strict=True):
            if not slot.kept:
                continue
            image = Image.fromarray(array)
            init, mask, control = input_files(plan, slot.prompt_index)
            file = image_file(slot.index, plan.seed)
            record = dataclasses.replace(
                meta, index=slot.index, batch=slot.batch, device=slot.device, prompt=slot.prompt, init_image=init,
                mask_image=mask, control_image=control, file=file, pixels_sha256=pixel_hash(array),
                non_finite=slot.index in non_finite, extra=dict(meta.extra))
            if plan.output.save_images:
                save_png(image, run_dir / file, record)
            records.append(record)
            images.append(image)
        write_s += time.perf_counter() - started
    return images, write_s


def input_files(plan: Plan, prompt_index: int) -> tuple[Optional[str], Optional[str], Optional[str]]:
    """The file names of the mode's input images an image was made from (its prompt's pair): its init image,
    mask and control image, each None where the mode has none."""
    from sdjax_runner.config.input_images import paired

    def name(images) -> Optional[str]:
        return Path(paired(images, prompt_index).path).name if images else None

    return name(plan.inputs.init), name(plan.inputs.mask), name(plan.inputs.control)


def input_panels(plan: Plan, height: int, width: int) -> list[Image.Image]:
    """The mode's distinct input images fitted to the output size, as the program reads them (init images,
    masks, control images), for the grid and the sweep's contact sheet."""
    from sdjax_runner.config.input_images import fitted

    panels = []
    for image in plan.inputs.all():
        pixels = fitted(image, height, width, plan.resize_mode)
        panels.append(Image.fromarray(pixels[..., 0] if pixels.shape[-1] == 1 else pixels).convert("RGB"))
    return panels


def with_inputs(grid: Image.Image, panels: list[Image.Image], rows: int) -> Image.Image:
    """``grid`` with the input ``panels`` in columns on its left, a gap of a cell's tenth between."""
    if not panels:
        return grid
    cell_w = panels[0].width
    side = make_grid(panels, min(rows, len(panels)), math.ceil(len(panels) / rows))
    gap = max(2, cell_w // 10)
    out = Image.new("RGB", (side.width + gap + grid.width, max(side.height, grid.height)), "white")
    out.paste(side, (0, 0))
    out.paste(grid.convert("RGB"), (side.width + gap, 0))
    return out


def write_run_files(run_dir: Path, plan: Plan, records: list[ImageRecord], images: list) -> float:
    """images.json, the metric values into each image's PNG (:func:`stamp_measurements`) and grid.png (the mode's
    input images in its left columns); returns the seconds it took."""
    started = time.perf_counter()
    write_image_records(run_dir, records)
    if plan.output.save_images:
        stamp_measurements(run_dir, records)
    if plan.output.grid:
        rows, cols = grid_shape(len(images), plan.output.grid_rows, plan.output.grid_cols)
        panels = input_panels(plan, images[0].height, images[0].width) if images else []
        save_whole(with_inputs(make_grid(images, rows, cols), panels, rows), run_dir / GRID)
    return time.perf_counter() - started
