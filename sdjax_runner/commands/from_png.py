"""``python -m sdjax_runner from_png IMAGE.png [KEY=VALUE ...]``: make an image again from the A1111 infotext
it carries (its ``parameters`` text: A1111's PNGs and ours), or from ``--infotext TEXT``.

The infotext's prompt, negative prompt, steps, sampler and schedule type, CFG scale, seed, size, eta, clip
skip, model and dtype (one of ours by name; our PNGs' ``Dtype: float32`` is fp32) and (with ``mode=img2img
init_image=...``) denoising strength become overrides (config/infotext.py), each said on one line; what
cannot be honoured (a model hash, extensions' settings, the Batch and Device an image sat on) is one line
each. The metric values our PNGs carry (``CLIP score: 31.2``, metrics/registry.py's ``infotext`` keys) are
measurements, not settings: said as such, and the new image is scored anew where its metrics are on. The
command line's own overrides come after them, so they win, and the run goes on as ``python -m
sdjax_runner`` with all of them. Nothing runs from a file that carries no infotext."""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path
from typing import Optional

from sdjax_runner import console
from sdjax_runner.commands import command_parser
from sdjax_runner.config import infotext
from sdjax_runner.errors import UserError
from sdjax_runner.files import not_a_file


def read_infotext(path: Path) -> str:
    from PIL import Image, UnidentifiedImageError

    missing = not_a_file(path)
    if missing:
        raise UserError("IMAGE", f"{missing}: {path}", "a PNG written by A1111 or by this runner")
    try:
        with Image.open(path) as image:
            text = dict(getattr(image, "text", {}) or {}).get("parameters") or image.info.get("parameters")
    except Image.DecompressionBombError as exc:
        raise UserError("IMAGE", f"{path} is a decompression bomb ({console.one_line(exc)})",
                        "a PNG written by A1111 or by this runner") from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError) as exc:
        raise UserError("IMAGE", f"{path} cannot be read as an image ({console.one_line(exc, 120)})",
                        "a PNG written by A1111 or by this runner") from None
    if not text:
        raise UserError("IMAGE", f"{path} carries no A1111 'parameters' text", "a PNG written by A1111 or by this runner")
    return str(text)


def options(group: str) -> tuple[str, ...]:
    from importlib import resources

    return tuple(sorted(p.name.removesuffix(".yaml") for p in (resources.files("sdjax_runner.conf") / group).iterdir()
                        if p.name.endswith(".yaml")))


def without_measurements(info: infotext.Infotext) -> tuple[infotext.Infotext, list[str]]:
    """``info`` less the metric values it carries (each metric's ``infotext`` key), and those values as
    ``KEY: VALUE`` lines."""
    from sdjax_runner.metrics.registry import METRICS

    keys = {metric.infotext for metric in METRICS.values()}
    measured = [f"{key}: {infotext.shown_value(value)}" for key, value in info.settings.items() if key in keys]
    settings = {key: value for key, value in info.settings.items() if key not in keys}
    return dataclasses.replace(info, settings=settings), measured


def main(argv: Optional[list[str]] = None) -> int:
    parser = command_parser("from_png", __doc__)
    parser.add_argument("image", nargs="?", help="a PNG carrying A1111 infotext (its 'parameters' text)")
    parser.add_argument("--infotext", help="the infotext itself, instead of an image")
    parser.add_argument("overrides", nargs="*", help="more overrides, as for python -m sdjax_runner (they win)")
    args = parser.parse_args(argv)
    try:
        if args.infotext is not None:
            if args.image is not None:
                args.overrides.insert(0, args.image)
            if not args.infotext.strip():
                raise UserError("--infotext", "is empty", "an A1111 infotext: the prompt, then a line of settings")
            text = args.infotext
        elif args.image is None:
            raise UserError("IMAGE", "none given", "a PNG carrying A1111 infotext, or --infotext TEXT")
        else:
            text = read_infotext(Path(args.image).expanduser())
        info, measured = without_measurements(infotext.parse(text))
        given = {o.split("=", 1)[0].lstrip("+~") for o in args.overrides if "=" in o}
        translation = infotext.overrides(info, options("model"), options("dtype"), "init_image" in given,
                                         "controlnet.image" in given, "mask_image" in given)
    except UserError as error:
        console.error(error)
        return 2
    for line in translation.honoured:
        print(f"from_png: {line}", file=sys.stderr)
    for line in translation.not_honoured:
        print(f"from_png: not honoured: {line}", file=sys.stderr)
    for line in measured:
        print(f"from_png: measured, not a setting: {line}", file=sys.stderr)
    sys.argv = [sys.argv[0], *translation.overrides, *args.overrides]
    from sdjax_runner.commands.run import entry

    entry()
    return 0
