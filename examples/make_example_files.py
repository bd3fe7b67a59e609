"""Write the files the docs' LoRA and single-file examples name, from the built-in tiny model (seconds, no hub):

    python examples/make_example_files.py          (from the repository's root, the venv active)

writes examples/style.safetensors -- a kohya-layout LoRA for model=tiny-random (UNet attention, feed-forward
and text encoder layers, rank 2; A1111 and ComfyUI use this layout) -- and examples/tiny.safetensors --
model=tiny-random as one single-file checkpoint in the original LDM layout (fp16, as most are shared). Then:

    python -m sdjax_runner +experiment=smoke 'lora=[{path: examples/style.safetensors, scale: 0.8}]'
    python -m sdjax_runner +experiment=smoke model.checkpoint=examples/tiny.safetensors   # on tiny-random's configs
    python -m sdjax_runner -m +experiment=lora_scale   # conf/experiment/lora_scale.yaml

It uses the test suite's writers of those layouts (tests/helpers/), so it runs in a checkout."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def main(out: Path = ROOT / "examples") -> list[Path]:
    warnings.filterwarnings("ignore", message=".*(Flax|JAX) classes are deprecated")
    from hydra import compose, initialize_config_module

    from helpers.ldm_layout import write_single_file
    from helpers.lora_files import factors, write_kohya
    from sdjax_runner.config import schema
    from sdjax_runner.models.builtin import build_builtin

    schema.register()
    with initialize_config_module(config_module="sdjax_runner.conf", version_base="1.3"):
        model = compose(config_name="config", overrides=["+experiment=smoke"]).model  # where runs find it
    model_dir = build_builtin(model.builtin, Path(model.pretrained_model_name_or_path))
    written = [write_kohya(out / "style.safetensors", factors(model_dir, rank=2, seed=0), alpha=1.0),
               write_single_file(model_dir, out / "tiny.safetensors")]
    for path in written:
        print(f"wrote {path} ({path.stat().st_size / 1e3:.0f} kB)")
    return written


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "examples")
