"""A warm start skips tracing: the compiled executable is stored under a key of everything that
determines the program, loaded by the next process, and never trusted when anything differs."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import ONE_DEVICE, run_cli

SMOKE = ["+experiment=smoke", "tracking=none"]


def _run(tmp_path: Path, cache: Path, name: str, *extra: str, devices: tuple[str, ...] = ONE_DEVICE) -> dict:
    """A smoke run with ``cache``; on one device (the cache is the subject) unless ``devices`` says otherwise."""
    run_dir = tmp_path / name
    result = run_cli(*SMOKE, *devices, *extra, f"compilation_cache.dir={cache}", f"hydra.run.dir={run_dir}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    timings = json.loads((run_dir / "timings.json").read_text())
    records = json.loads((run_dir / "images.json").read_text())
    quality = json.loads((run_dir / "quality.json").read_text())
    return dict(timings, hashes=[r["pixels_sha256"] for r in records], clip_scores=[r["clip_score"] for r in records],
                clip_path=quality["clip_score_compile_path"], log=result.stdout + result.stderr)


def _generate_programs(cache: Path) -> list[Path]:
    """Stored sampling programs: the executables with a FLOPs count beside them (the CLIP score's has none) but the
    decoding programs (:func:`_decoders`)."""
    return [p for p in (cache / "executables").glob("*.pkl") if p.with_suffix(".flops.json").is_file()
            and not p.name.startswith("decoder-")]


def _decoders(cache: Path) -> list[Path]:
    """Stored decoding programs (one per model, parallel mode and latent size: every sampling program's)."""
    return list((cache / "executables").glob("decoder-*.pkl"))


@pytest.mark.slow
def test_a_warm_start_loads_the_stored_executable_and_makes_the_same_images(tmp_path):
    # The default parallel mode: the guide's pmap.
    cache = tmp_path / "xla"
    first = _run(tmp_path, cache, "first")
    assert (first["compile_path"], first["executable_cache_hit"]) == ("traced", 0) and first["trace_s"] > 0
    assert first["clip_path"] == "traced"
    [stored] = _generate_programs(cache)
    [flops] = [path for path in (cache / "executables").glob("*.flops.json") if not path.name.startswith("decoder-")]
    [decoder] = _decoders(cache)
    [clip_program] = set((cache / "executables").glob("*.pkl")) - {stored, decoder}
    # the UNet's, the VAE's, the text encoder's and the CLIP score model's (every Flax file is checked against its
    # module's shapes): no init tracing when warm
    shapes = sorted((cache / "shapes").glob("*.json"))
    assert len(shapes) == 4

    warm = _run(tmp_path, cache, "warm")
    assert (warm["compile_path"], warm["executable_cache_hit"], warm["trace_s"]) == ("executable_cache", 1, 0.0)
    assert "the stored executable (no tracing)" in warm["log"] and "compile: the decoder" in warm["log"]
    assert "stored (no tracing)" in warm["log"].split("compile: the decoder")[1].splitlines()[0]
    assert warm["hashes"] == first["hashes"]  # the same program: bit-identical images
    assert warm["flops_per_batch"] == first["flops_per_batch"] > 0  # counted once, kept with the program
    # The CLIP score's program too: the weights file read as it is, no model built, no tracing; same scores.
    assert warm["clip_path"] == "executable_cache" and warm["clip_scores"] == first["clip_scores"]

    other = _run(tmp_path, cache, "other", "sampling.num_inference_steps=3")  # another program: another key
    assert other["compile_path"] == "traced" and len(_generate_programs(cache)) == 2
    # ... and the same decoder: the stored one (no tracing), for every sampling program of the model at this size
    assert _decoders(cache) == [decoder]
    assert "stored (no tracing)" in other["log"].split("compile: the decoder")[1].splitlines()[0]
    assert other["clip_path"] == "executable_cache"  # the same 8 images to score: the same scoring program

    # The generate program's file holding the CLIP score's (signed by this cache, compiled for all 8 devices where
    # this run uses one: XLA would end the process loading it), the rest damaged: each ignored, traced and counted
    # again, the same images.
    stored.write_bytes(clip_program.read_bytes())
    for damaged_file in [flops, clip_program] + shapes:
        damaged_file.write_bytes(b"not what it should be")
    damaged = _run(tmp_path, cache, "damaged")
    assert f"stored executable {stored.name} not usable: it was compiled for 8 devices, this program runs on 1" \
        in damaged["log"]
    assert damaged["compile_path"] == "traced" and "not usable" in damaged["log"]
    assert damaged["hashes"] == first["hashes"] and damaged["flops_per_batch"] == first["flops_per_batch"]
    assert damaged["clip_path"] == "traced" and damaged["clip_scores"] == first["clip_scores"]
    # rewritten: the sampling program's count; with the decoder's (one device's batch) the run's
    assert json.loads(flops.read_text())["flops_per_batch"] + json.loads(
        decoder.with_suffix(".flops.json").read_text())["flops_per_batch"] == first["flops_per_batch"]



def test_the_same_xla_flags_in_another_order_key_the_same_program(monkeypatch):
    """parallelism.host_device_count appends the device count to XLA_FLAGS where they give another one; a program
    stored by a process whose flags said it first is still found by one whose flags say it last (XLA reads the last
    value of each flag, whatever the order)."""
    from sdjax_runner.engine.executable_cache import key, xla_flag_settings
    from sdjax_runner.engine.runtime import use_host_devices

    assert xla_flag_settings("--b=1 --a=2 --b=3") == xla_flag_settings("--a=2 --b=3") == ["--a=2", "--b=3"]
    assert xla_flag_settings("--b=1 --a=2") != xla_flag_settings("--b=3 --a=2")
    import jax

    devices, args = jax.devices()[:1], (np.zeros((2, 3), np.float32),)
    keys = []
    for flags in ("--xla_force_host_platform_device_count=8 --xla_cpu_enable_fast_math=false",
                  "--xla_cpu_enable_fast_math=false --xla_force_host_platform_device_count=8"):
        monkeypatch.setenv("XLA_FLAGS", flags)
        keys.append(key(["a program"], args, devices))
    monkeypatch.setenv("XLA_FLAGS", "--xla_cpu_enable_fast_math=true --xla_force_host_platform_device_count=8")
    assert keys[0] == keys[1] != key(["a program"], args, devices)
    # Before JAX starts, a count the flags already give leaves them as they are (in this process JAX has
    # started: the function then only compares, so its flag arithmetic is checked on a stand-in).
    monkeypatch.setattr("sdjax_runner.engine.runtime.jax_started", lambda: False)
    for given, count, expected in [
            ("--xla_force_host_platform_device_count=8 --x=1", 8, "--xla_force_host_platform_device_count=8 --x=1"),
            ("--xla_force_host_platform_device_count=8 --x=1", 4, "--x=1 --xla_force_host_platform_device_count=4"),
            ("--x=1", 2, "--x=1 --xla_force_host_platform_device_count=2")]:
        monkeypatch.setenv("XLA_FLAGS", given)
        use_host_devices(count)
        assert os.environ["XLA_FLAGS"] == expected


def _cache_bytes(cache: Path) -> int:
    """What compilation_cache.max_size_gb bounds: JAX's entries and the stored executables."""
    return sum(p.stat().st_size for p in [*cache.glob("*-cache"), *(cache / "executables").glob("*.pkl")])


@pytest.mark.slow
def test_the_sharded_path_keeps_its_executable_too_and_the_cache_stays_within_its_bound(tmp_path):
    cache = tmp_path / "xla"
    first = _run(tmp_path, cache, "first", "parallelism=sharded", devices=())
    warm = _run(tmp_path, cache, "warm", "parallelism=sharded", devices=())
    assert (first["compile_path"], warm["compile_path"]) == ("traced", "executable_cache")
    assert warm["hashes"] == first["hashes"]
    [sharded] = _generate_programs(cache)

    # pmap: the same images, but other programs (~1.5 MB, as the sharded one, and its decoder, 0.5 MB). Under a 3 MB
    # bound the least recently used entries go -- the sharded program, loaded before its decoder -- and the CLIP
    # score's program, used by this run too, stays.
    bounded = "compilation_cache.max_size_gb=0.003"
    pmap = _run(tmp_path, cache, "pmap", bounded, devices=())
    assert pmap["compile_path"] == "traced" and pmap["hashes"] == first["hashes"]
    assert pmap["clip_path"] == "executable_cache"
    assert not sharded.exists() and not sharded.with_suffix(".flops.json").exists()
    assert len(_generate_programs(cache)) == 1 and len(_decoders(cache)) == 2
    assert len(list((cache / "executables").glob("*.pkl"))) == 4
    assert _cache_bytes(cache) <= 3_000_000
    again = _run(tmp_path, cache, "again", bounded, devices=())  # what stayed is what the next run uses
    assert (again["compile_path"], again["clip_path"]) == ("executable_cache", "executable_cache")
    assert again["hashes"] == first["hashes"] and _cache_bytes(cache) <= 3_000_000


def test_trimming_removes_the_least_recently_used_entries_with_their_companions(tmp_path):
    from omegaconf import OmegaConf

    from sdjax_runner.engine.compile_cache import trim

    root = tmp_path / "xla"
    (root / "executables").mkdir(parents=True)
    files = {"old-cache": 400, "old-atime": 8, "read_lately-cache": 400, "read_lately-atime": 8,
             "executables/stale.pkl": 500, "executables/stale.flops.json": 30, "executables/loaded.pkl": 500,
             "shapes.json": 10_000}  # not an entry: never counted or removed
    for number, (name, size) in enumerate(files.items()):
        (root / name).write_bytes(b"x" * size)
        os.utime(root / name, ns=(number * 10**9, number * 10**9))
    os.utime(root / "read_lately-cache", ns=(100 * 10**9, 1 * 10**9))  # read after everything else
    # Writes in progress (renamed into place when whole): a killed writer's, untouched for hours, goes;
    # one being written now stays.
    for name in (".killed-cache.123.tmp", "executables/killed.pkl.123.tmp", ".writing-cache.456.tmp"):
        (root / name).write_bytes(b"x" * 5000)
    for name in (".killed-cache.123.tmp", "executables/killed.pkl.123.tmp"):
        os.utime(root / name, ns=(10**9, 10**9))
    cache = OmegaConf.create({"enabled": True, "dir": str(root), "max_size_gb": 1000 / 1e9})

    removed = trim(cache)
    assert sorted(p.name for p in removed) == [".killed-cache.123.tmp", "killed.pkl.123.tmp", "old-cache",
                                               "stale.pkl"]  # 1800 bytes of entries -> 900
    assert sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file()) == [
        ".writing-cache.456.tmp", "executables/loaded.pkl", "read_lately-atime", "read_lately-cache", "shapes.json"]
    assert trim(cache) == []  # within the bound now
    assert trim(OmegaConf.merge(cache, {"max_size_gb": None, "enabled": True})) == []
    assert trim(OmegaConf.merge(cache, {"max_size_gb": 1e-12, "enabled": False})) == []


def test_the_cache_bound_is_checked_before_anything_runs():
    import pytest

    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan
    from sdjax_runner.errors import UserError

    for bad in ("0", "-1", "nan", "inf"):
        with pytest.raises(UserError, match=r"compilation_cache.max_size_gb"):
            make_plan(admit(compose_cfg(["+experiment=smoke", f"compilation_cache.max_size_gb={bad}"])),
                      available_devices=8)
    with pytest.raises(UserError, match=r"compilation_cache.min_compile_time_s"):
        make_plan(admit(compose_cfg(["+experiment=smoke", "compilation_cache.min_compile_time_s=-1"])), available_devices=8)


@pytest.mark.slow
def test_a_stored_executable_that_fails_when_run_is_removed_and_traced_instead(tmp_path):
    cache = tmp_path / "xla"
    first = _run(tmp_path, cache, "first", "compilation_cache.executables=false")  # JAX's persistent cache only
    # How a bad file comes about: a program that JAX's persistent cache served, stored whole, reloads
    # without that entry's kernels and fails at its first call. The runner never stores one (it compiles
    # programs to be stored afresh and checks); a process with those two guards switched off does.
    script = f"""
import contextlib, sys
from sdjax_runner.engine import compile_cache
compile_cache.bypassed = lambda: contextlib.nullcontext(False)
compile_cache.hits = lambda: 0
sys.argv = ["sdjax_runner", *{SMOKE + list(ONE_DEVICE)!r}, "compilation_cache.dir={cache}", "hydra.run.dir={tmp_path / 'bad'}"]
from sdjax_runner.commands.run import main
main()
"""
    subprocess.run([sys.executable, "-c", script], cwd=tmp_path, check=True, capture_output=True, timeout=300)
    # the sampling, decoding and CLIP score programs
    assert len(list((cache / "executables").glob("*.pkl"))) == 3 and len(_decoders(cache)) == 1

    after = _run(tmp_path, cache, "after")
    assert after["compile_path"] == "traced" and after["clip_path"] == "traced"
    assert "the stored executable failed at its first call" in after["log"]
    assert "the stored CLIP score program failed at its first call" in after["log"]
    assert after["hashes"] == first["hashes"] and after["clip_scores"] == first["clip_scores"]
    again = _run(tmp_path, cache, "again")  # the bad files were replaced by good ones
    assert (again["compile_path"], again["clip_path"]) == ("executable_cache", "executable_cache")
    assert again["hashes"] == first["hashes"] and again["clip_scores"] == first["clip_scores"]
