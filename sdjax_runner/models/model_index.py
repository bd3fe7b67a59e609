"""A pipeline folder's ``model_index.json``, read as untrusted input.

The file names, for each component, a library and a class. diffusers' own loader imports whatever
library the file names -- and with ``python -m`` the working directory is on ``sys.path``, so a
model folder could run a Python file of its own. Here nothing is imported by a name in the file: the
libraries it may name are a fixed list, and a class must be one the runner reads with its own code
(models/loading.py's table of published class names). A malformed entry is one line naming the file and
the component.

Besides its components, a published index carries pipeline settings: SD 2.x and pipelines saved by
newer diffusers ``"requires_safety_checker": false``, SDXL ``"force_zeros_for_empty_prompt": true``
and ``"add_watermarker": null``, newer saves an ``"image_encoder": [null, null]`` slot. Those are
allowed by name and type (:data:`SETTINGS`); any other value that is not a ``[library, class]`` pair
is refused.
"""

from __future__ import annotations

import json
import os
import stat
from pathlib import Path
from typing import Any, Optional

from sdjax_runner.errors import UserError

KEY = "model.pretrained_model_name_or_path"
FILE = "model_index.json"
# The index, configs and tokenizer files are kilobytes to a few MB (CLIP's vocab.json: 1 MB). The
# libraries read such a file whole, so a larger one -- a sparse file costs no disk -- could take all
# of the host's memory before anything fails.
MAX_TEXT_BYTES = 64 * 2**20
# The libraries model_index.json may name ("stable_diffusion": the safety checker's).
LIBRARIES = ("diffusers", "transformers", "stable_diffusion")
# Pipeline settings a published model_index.json carries beside its components: name -> the types its
# value may have (diffusers' StableDiffusion[XL]Pipeline register them with register_to_config).
SETTINGS: dict[str, tuple[type, ...]] = {
    "requires_safety_checker": (bool,),  # SD 2.x; SD 1.x pipelines saved by newer diffusers
    "force_zeros_for_empty_prompt": (bool,),  # SDXL: no negative prompt -> zero embeddings (engine/encode.py)
    "add_watermarker": (bool, type(None)),  # SDXL: the invisible watermark of the PyTorch pipeline (not applied here)
    "is_distilled": (bool,),  # FLUX.2 [klein]: a step-distilled model runs without guidance (families/flux2)
}
# What the libraries read whole from a component folder besides weights: configs and tokenizer files.
# Other files a published folder ships (ONNX and OpenVINO exports: unet/model.onnx_data, openvino_model.xml)
# are never read, so they are not sized either.
TEXT_SUFFIXES = (".json", ".txt", ".model")
_CLASS_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_")


def _bad(directory: Path, what: str) -> UserError:
    return UserError(KEY, f"{directory / FILE}: {what}", "a diffusers-format pipeline folder")


def check_sizes(directory: Path, index: Optional[dict[str, Any]] = None) -> None:
    """Refuse, before it is read, a file that is too large for what it is: the index (``index``
    None) or, given the index, a file of a component folder it names -- an index, config or tokenizer
    file over MAX_TEXT_BYTES, a weights file that would take more than the host's memory to read."""
    from sdjax_runner.models.checkpoints import MEMORY_FACTORS, WEIGHT_SUFFIXES

    memory = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    folders = [] if index is None else [directory / name for name in components(index) if "/" not in name]
    paths = [directory / FILE] if index is None else [path for folder in folders for path in sorted(folder.glob("*"))]
    for path in paths:
        try:
            facts = path.stat()
        except OSError:  # absent, or a dangling link: the loader says what is missing
            continue
        if not stat.S_ISREG(facts.st_mode):
            continue
        size = facts.st_size
        if path.suffix in WEIGHT_SUFFIXES:
            needs = size * MEMORY_FACTORS.get(path.name, 1)
            if needs > memory:
                raise UserError(KEY, f"{path}: {size / 1e9:.1f} GB of weights, which take {needs / 1e9:.1f} GB "
                                f"to read, more than this host's {memory / 1e9:.1f} GB of memory",
                                "weights that fit in host memory")
        elif path.suffix in TEXT_SUFFIXES and size > MAX_TEXT_BYTES:
            raise UserError(KEY, f"{path}: {size / 1e9:.1f} GB, far too large for a config or tokenizer file",
                            f"at most {MAX_TEXT_BYTES // 2**20} MB; weights in .msgpack or .safetensors files")


def read(directory: Path) -> dict[str, Any]:
    """The parsed index: ``_class_name`` a string, each component ``[library, class]`` of a known
    library or ``[null, null]``; anything else is refused before anything is imported or loaded,
    and so is a file of the index or its component folders that is too large (check_sizes)."""
    path = directory / FILE
    check_sizes(directory)
    try:
        index = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise _bad(directory, f"cannot be read as JSON ({type(exc).__name__}: {str(exc).splitlines()[0][:120]})") from None
    if not isinstance(index, dict) or not isinstance(index.get("_class_name"), str):
        raise _bad(directory, "is not a pipeline index (no \"_class_name\" string)")
    for name, value in index.items():
        if name.startswith("_"):
            continue
        if name in SETTINGS:
            if not isinstance(value, SETTINGS[name]):
                allowed = " or ".join("true/false" if t is bool else "null" for t in SETTINGS[name])
                raise _bad(directory, f"setting {name!r} is {json.dumps(value)[:80]}, not {allowed}")
            continue
        entry(directory, index, name)
    check_sizes(directory, index)
    return index


def components(index: dict[str, Any]) -> list[str]:
    """The component names of a checked index (its settings and ``_`` keys left out), sorted."""
    return sorted(name for name in index if not name.startswith(("_", ".")) and name not in SETTINGS)


def setting(index: dict[str, Any], name: str, default: Any) -> Any:
    """A pipeline setting of a checked index, or ``default`` where the index has none (as diffusers'
    pipeline constructors default it)."""
    value = index.get(name)
    return default if value is None else value


def entry(directory: Path, index: dict[str, Any], name: str) -> Optional[tuple[str, str]]:
    """(library, class name) of component ``name``, or None where the index has none for it."""
    spec = index.get(name)
    if spec is None or (isinstance(spec, list) and len(spec) == 2 and spec[0] is None and spec[1] is None):
        return None
    if not (isinstance(spec, list) and len(spec) == 2 and all(isinstance(part, str) for part in spec)):
        raise _bad(directory, f"component {name!r} is {json.dumps(spec)[:80]}, not [library, class] (pipeline "
                   f"settings allowed beside the components: {', '.join(SETTINGS)})")
    library, class_name = spec
    if library not in LIBRARIES:
        raise _bad(directory, f"component {name!r} names library {library!r}, which is not loaded "
                   f"(allowed: {', '.join(LIBRARIES)})")
    if not class_name or not set(class_name) <= _CLASS_CHARS:
        raise _bad(directory, f"component {name!r} names class {class_name[:80]!r}, not a class name")
    return library, class_name


def component_class(directory: Path, name: str, library: str, class_name: str, readable: tuple[str, ...]) -> str:
    """The class the entry names (without "Flax"), which must be one the runner reads (``readable``:
    models/loading.READABLE_CLASSES, its own modules, tokenizers and image preprocessing). Nothing is imported by
    the name in the file."""
    bare = class_name.removeprefix("Flax")
    if bare not in readable:
        raise _bad(directory, f"component {name!r}: {library} has no loadable class {class_name!r}")
    return bare
