"""The built-in models: random-weight pipelines the project builds itself, tiny ones for tests and
full-size ones for benchmarks. Each family's package has its own (``families/<name>/models/builtin.py``'s
``BUILDS``: SD 1.x/2.x/XL's ``tiny-random[-xl|-inpaint]``, ``sd-v1-arch``, ``sdxl-arch`` and
``tiny-random-controlnet``; FLUX.1's ``tiny-random-flux[-schnell]`` and ``flux-dev-arch``; SD 3's
``tiny-random-sd3`` and ``sd3.5-large-arch``), gathered here with the one every family shares:

* ``tiny-random-clip``: a small random CLIP (text and vision towers, the CLIP tokenizer and image processor) for
  the CLIP score metric in tests and the smoke run.

Each is written once, in diffusers' and transformers' published layout (models/published_layout.py: the files
their ``save_pretrained`` wrote, byte for byte, with neither library), and afterwards loaded exactly like a hub
model, so the runner's real loading path is what the tests exercise. Everything is derived from fixed
seeds (models/builtin_parts.py): two builds produce identical files.
"""

from __future__ import annotations

import functools
import logging
import os
import shutil
import socket
import tempfile
from importlib import import_module
from pathlib import Path
from typing import Any

from sdjax_runner.config.schema import BUILTIN_MODELS
from sdjax_runner.errors import UserError
from sdjax_runner.families import NAMES
from sdjax_runner.models.builtin_parts import SEED, Builtin, random_params, write_clip_tokenizer

log = logging.getLogger("sdjax_runner")

# A small CLIP (metrics/clip_score.py), with the SD models' tokenizer.
CLIP_SPECS: dict[str, dict[str, Any]] = {
    "tiny-random-clip": dict(
        text=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4),
        vision=dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4, image_size=32,
                    patch_size=8),
        projection_dim=32,
    ),
}


def _build_clip_into(directory: Path, spec: dict) -> None:
    from sdjax_runner.models import published_layout
    from sdjax_runner.models.checkpoints import param_shapes
    from sdjax_runner.models.nn.clip import CLIPModel

    size = write_clip_tokenizer(directory)
    text = dict(spec["text"], vocab_size=size, max_position_embeddings=77, bos_token_id=size - 2,
                eos_token_id=size - 1, pad_token_id=size - 1)
    config = published_layout.clip_model_config(text, spec["vision"], spec["projection_dim"])
    shapes = param_shapes(CLIPModel.from_config(config), "transformers")
    published_layout.transformers_model(directory, "CLIPModel", config, random_params(shapes, SEED + 10))
    published_layout.clip_image_processor(directory, spec["vision"]["image_size"])


# Each family's built-ins are a module of the models layer inside its package (families/<name>/models/builtin.py)
BUILDS: dict[str, Builtin] = {
    **{name: built for family in NAMES
       for name, built in import_module(f"sdjax_runner.families.{family}.models.builtin").BUILDS.items()},
    **{name: Builtin(functools.partial(_build_clip_into, spec=spec), "clip") for name, spec in CLIP_SPECS.items()}}
if sorted(BUILDS) != sorted(BUILTIN_MODELS):  # config/schema.py names them
    raise RuntimeError(f"models/builtin.py builds {sorted(BUILDS)}, config/schema.py lists {sorted(BUILTIN_MODELS)}")


def build_builtin(name: str, target: Path) -> Path:
    """Create built-in model ``name`` at ``target`` (atomically; an existing build is kept)."""
    target = Path(target)
    marker = BUILDS[name].marker  # builds appear whole (staged, renamed)
    if (target / marker).exists():
        return target
    if target.exists() and any(target.iterdir()):
        raise UserError("model.pretrained_model_name_or_path", f"{target} exists but is not a complete built-in "
                        f"model (no {marker}); remove it and run again to rebuild it")
    log.info("build: built-in model %s (random weights, once) into %s ...", name, target)
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_abandoned_builds(target)
    # Staged under a name that says who builds it: a build whose process died is found and removed.
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}.{socket.gethostname()}.{os.getpid()}.",
                                    dir=target.parent))
    try:
        BUILDS[name].build(staging)
        try:
            os.rename(staging, target)
        except OSError:
            # Another process finished the same build first; theirs is identical.
            if not (target / marker).exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return target


def remove_abandoned_builds(target: Path) -> list[Path]:
    """Staging folders of builds of ``target`` on this host whose process is gone (killed mid-build)."""
    removed = []
    for staging in target.parent.glob(f".{target.name}.{socket.gethostname()}.*"):
        pid = staging.name[len(f".{target.name}.{socket.gethostname()}."):].split(".", 1)[0]
        if not (pid.isascii() and pid.isdigit()) or int(pid) == os.getpid():
            continue
        try:
            os.kill(int(pid), 0)
        except ProcessLookupError:
            shutil.rmtree(staging, ignore_errors=True)
            removed.append(staging)
        except PermissionError:
            pass
    return removed
