"""The built-in models are written by the runner's own code (sdjax_runner/models/published_layout.py), byte for byte
the folders diffusers' and transformers' ``save_pretrained`` wrote for them (tests/helpers/library_builtin.py, the
libraries' Flax classes), and building one imports neither library (issue #60)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from sdjax_runner.config.schema import BUILTIN_MODELS

TINY = [name for name in BUILTIN_MODELS if "arch" not in name]


def files(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@pytest.mark.slow
@pytest.mark.parametrize("name", TINY)
def test_each_tiny_builtin_is_the_folder_the_libraries_wrote(tmp_path, name):
    from helpers.library_builtin import build
    from sdjax_runner.models.builtin import build_builtin

    ours = files(build_builtin(name, tmp_path / "ours"))
    theirs = files(build(name, tmp_path / "theirs"))
    assert sorted(ours) == sorted(theirs)
    assert len(ours) >= 2 and any(n.endswith(".msgpack") for n in ours)  # configs and weights, compared
    different = [n for n in ours if ours[n] != theirs[n]]
    assert not different, different


def test_the_tiny_builtins_are_all_compared():
    """Every built-in but the full-size ones (minutes and tens of GB to write) is in the comparison above; the
    full-size ones are the same writers on other numbers."""
    assert set(TINY) == {"tiny-random", "tiny-random-xl", "tiny-random-inpaint", "tiny-random-clip",
                         "tiny-random-controlnet", "tiny-random-flux", "tiny-random-flux-schnell",
                         "tiny-random-flux-kontext", "tiny-random-flux-fill", "tiny-random-flux-control",
                         "tiny-random-flux-controlnet", "tiny-random-flux-controlnet-union", "tiny-random-sd3",
                         "tiny-random-sd3-controlnet", "tiny-random-sd3-controlnet-single",
                         "tiny-random-sd3-controlnet-inpaint"}


def test_building_a_builtin_imports_no_diffusers_transformers_or_torch(tmp_path):
    code = ("import sys; from pathlib import Path; from sdjax_runner.models.builtin import build_builtin\n"
            f"for name in ('tiny-random-xl', 'tiny-random-clip', 'tiny-random-sd3'):\n"
            f"    build_builtin(name, Path({str(tmp_path)!r}) / name)\n"
            "print(sorted({m.split('.')[0] for m in sys.modules} & {'diffusers', 'transformers', 'torch'}))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "[]"
    assert (tmp_path / "tiny-random-sd3" / "text_encoder_3" / "flax_model.msgpack").is_file()
