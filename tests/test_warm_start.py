"""A warm start skips tracing: the compiled executable is stored under a key of everything that
determines the program, loaded by the next process, and never trusted when anything differs."""

import json
from pathlib import Path

from helpers.cli import run_cli

SHARDED = ["+experiment=smoke", "tracking=none", "parallelism=sharded"]


def _run(tmp_path: Path, cache: Path, name: str, *extra: str) -> dict:
    run_dir = tmp_path / name
    result = run_cli(*SHARDED, *extra, f"compilation_cache.dir={cache}", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    timings = json.loads((run_dir / "timings.json").read_text())
    hashes = [r["pixels_sha256"] for r in json.loads((run_dir / "images.json").read_text())]
    return dict(timings, hashes=hashes, log=result.stdout + result.stderr)


def test_a_warm_start_loads_the_stored_executable_and_makes_the_same_images(tmp_path):
    cache = tmp_path / "xla"
    first = _run(tmp_path, cache, "first")
    assert (first["compile_path"], first["executable_cache_hit"]) == ("traced", 0) and first["trace_s"] > 0
    [stored] = (cache / "executables").glob("*.pkl")
    [flops] = (cache / "executables").glob("*.flops.json")
    shapes = sorted((cache / "shapes").glob("*.json"))  # the UNet's and the VAE's: no init tracing when warm
    assert len(shapes) == 2

    warm = _run(tmp_path, cache, "warm")
    assert (warm["compile_path"], warm["executable_cache_hit"], warm["trace_s"]) == ("executable_cache", 1, 0.0)
    assert "the stored executable (no tracing)" in warm["log"]
    assert warm["hashes"] == first["hashes"]  # the same program: bit-identical images
    assert warm["flops_per_batch"] == first["flops_per_batch"] > 0  # counted once, kept with the program

    other = _run(tmp_path, cache, "other", "sampling.num_inference_steps=3")  # another program: another key
    assert other["compile_path"] == "traced" and len(list((cache / "executables").glob("*.pkl"))) == 2

    for damaged_file in [stored, flops] + shapes:  # damaged: ignored, traced and counted again, same images
        damaged_file.write_bytes(b"not what it should be")
    damaged = _run(tmp_path, cache, "damaged")
    assert damaged["compile_path"] == "traced" and "not usable" in damaged["log"]
    assert damaged["hashes"] == first["hashes"] and damaged["flops_per_batch"] == first["flops_per_batch"]
    assert json.loads(flops.read_text())["flops_per_batch"] == first["flops_per_batch"]  # rewritten

