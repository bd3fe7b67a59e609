"""No code from the caches that someone else could have written: stored executables are signed with a
private per-cache key and checked (owner, permissions, signature) before anything of them is unpickled;
JAX's own entries are checked on each read; everything is created private even under ``umask 000``."""

import json
import os
import pickle
import shlex
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.cli import run_cli

pytestmark = pytest.mark.slow

SMOKE = ["+experiment=smoke", "tracking=none"]


class Planted:
    """A pickle that runs code when loaded: what someone who can write the cache would plant."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def _run(tmp_path, cache, name, umask=None):
    run_dir = tmp_path / name
    args = [*SMOKE, f"compilation_cache.dir={cache}", f"hydra.run.dir={run_dir}"]
    if umask is None:
        result = run_cli(*args, cwd=tmp_path)
    else:  # as a user whose shell has `umask 000`
        env = {k: v for k, v in os.environ.items() if k not in ("HYDRA_FULL_ERROR", "MLFLOW_TRACKING_URI")}
        command = f"umask {umask:03o}; exec {shlex.quote(sys.executable)} -m sdjax_runner " + shlex.join(args)
        result = subprocess.run(["bash", "-c", command], cwd=tmp_path, env=env, capture_output=True, text=True,
                                timeout=300)
    assert result.returncode == 0, result.stderr
    timings = json.loads((run_dir / "timings.json").read_text())
    quality = json.loads((run_dir / "quality.json").read_text())
    hashes = [r["pixels_sha256"] for r in json.loads((run_dir / "images.json").read_text())]
    return dict(timings, hashes=hashes, clip_path=quality["clip_score_compile_path"], log=result.stdout + result.stderr)


def sampling_and_decoding(cache: Path) -> tuple[list[Path], list[Path]]:
    """The stored generation programs (the executables with a FLOPs count beside them; the CLIP score's has none):
    the sampling programs and the decoding programs (``decoder-KEY.pkl``)."""
    generate = [p for p in (cache / "executables").glob("*.pkl") if p.with_suffix(".flops.json").is_file()]
    return ([p for p in generate if not p.name.startswith("decoder-")],
            [p for p in generate if p.name.startswith("decoder-")])


def test_stored_executables_are_signed_private_and_never_loaded_unverified(tmp_path):
    cache = tmp_path / "xla"
    first = _run(tmp_path, cache, "first", umask=0o000)
    assert first["compile_path"] == "traced"
    # Everything the caches made is private, although the process ran with umask 000.
    made = [cache, *cache.rglob("*")]
    assert len(made) > 5
    for path in made:
        mode = path.stat().st_mode
        assert not mode & (stat.S_IWGRP | stat.S_IWOTH), (path, oct(mode))
    key = cache / "executables" / ".signing-key"
    assert stat.S_IMODE(key.stat().st_mode) == 0o600 and len(key.read_bytes()) == 32
    [stored], [decoder] = sampling_and_decoding(cache)
    [clip] = set((cache / "executables").glob("*.pkl")) - {stored, decoder}
    assert stored.read_bytes().startswith(b"sdjax-executable-2\n")

    warm = _run(tmp_path, cache, "warm", umask=0o000)  # its own files pass its checks: a warm start
    assert warm["compile_path"] == "executable_cache" and warm["clip_path"] == "executable_cache"
    assert warm["hashes"] == first["hashes"]

    # A planted pickle (unsigned: the planter has no key) in place of the generate program, and one
    # flipped byte in the CLIP program: neither is unpickled; each is named, removed, traced and stored again.
    marker = tmp_path / "PLANTED_CODE_RAN"
    stored.write_bytes(pickle.dumps(Planted(marker)))
    signed = bytearray(clip.read_bytes())
    signed[len(signed) // 2] ^= 0x01
    clip.write_bytes(bytes(signed))
    planted = _run(tmp_path, cache, "planted")
    assert not marker.exists()
    assert f"compile: stored executable {stored.name} not usable: it does not carry this cache's signature" in planted["log"]
    assert f"compile: stored executable {clip.name} not usable: it does not carry this cache's signature" in planted["log"]
    assert planted["compile_path"] == "traced" and planted["clip_path"] == "traced"
    assert planted["hashes"] == first["hashes"]
    assert stored.read_bytes().startswith(b"sdjax-executable-2\n")  # stored again, signed

    # A stored executable, or JAX's own cache entry, that its group can write could have been replaced:
    # not read, whatever it holds.
    stored.chmod(0o664)
    entries = list(cache.glob("*-cache"))
    assert entries
    for entry in entries:
        entry.chmod(0o666)
    loose = _run(tmp_path, cache, "loose")
    assert f"compile: stored executable {stored.name} not usable: it can be written by other users" in loose["log"]
    assert "compilation_cache: entry " in loose["log"] and "can be written by other users: not read, removed" in loose["log"]
    assert loose["compile_path"] == "traced" and loose["hashes"] == first["hashes"]

    # A signing key others can read could sign a planted file: replaced, and what it signed traced again.
    key.chmod(0o644)
    rekeyed = _run(tmp_path, cache, "rekeyed")
    assert f"compile: signing key {key} can be read by other users: replaced" in rekeyed["log"]
    assert rekeyed["compile_path"] == "traced" and rekeyed["hashes"] == first["hashes"]
    assert stat.S_IMODE(key.stat().st_mode) == 0o600
    assert _run(tmp_path, cache, "after")["compile_path"] == "executable_cache"

    # A file that verifies but holds another program (the CLIP score's, signed by this cache): dropped when
    # loaded, not a failure at its first call.
    [stored], [decoder] = sampling_and_decoding(cache)
    [clip] = set((cache / "executables").glob("*.pkl")) - {stored, decoder}
    stored.write_bytes(clip.read_bytes())
    wrong = _run(tmp_path, cache, "wrong")
    assert f"compile: stored executable {stored.name} not usable: it takes other arguments than this program" \
        in wrong["log"]
    assert wrong["compile_path"] == "traced" and wrong["hashes"] == first["hashes"]

    # A parameter-shape record that is valid JSON but wrong: traced again and rewritten, not blamed on the model.
    records = sorted((cache / "shapes").glob("*.json"))
    assert records
    right = {}
    for record in records:
        shapes = json.loads(record.read_text())
        name = next(iter(shapes))
        right[record] = (name, shapes[name][0])
        shapes[name][0] = [dim + 1 for dim in shapes[name][0]]
        record.write_text(json.dumps(shapes))
        record.chmod(0o600)
    rewritten = _run(tmp_path, cache, "shapes")
    assert rewritten["hashes"] == first["hashes"] and "does not match its config.json" not in rewritten["log"]
    for record, (name, shape) in right.items():
        assert json.loads(record.read_text())[name][0] == shape  # rewritten with the traced shapes
