"""A model, VAE or refiner folder is data someone may have handed you (round five of the hostile trials): every
file a loader would read as text is checked before any library reads it -- bounded, a regular file, JSON that
nests within bounds, shard names inside the folder, config sizes no published model comes near. Each case is fed
the hostile file itself and must end in one line naming the file, exit 2, before anything loads, fast."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import pytest

from helpers.cli import assert_one_line_error, call_cli

FIXTURES = Path(__file__).parent / "fixtures"
REFINER = FIXTURES / "refiner" / "tiny-sdxl-refiner"
BASE = FIXTURES / "refiner" / "tiny-sdxl-base"
QUIET = ["tracking=none", "metrics.clip_score.enabled=false"]


def plant(folder: Path, name: str, how: str, secret: Path) -> Path:
    """Replace ``folder/name`` with the hostile thing ``how`` names."""
    path = folder / name
    if not how.startswith("sizes:"):
        path.unlink(missing_ok=True)
    if how == "fifo":
        os.mkfifo(path)
    elif how == "dev-zero":
        path.symlink_to("/dev/zero")
    elif how == "nested":
        path.write_text("[" * 50_000 + "]" * 50_000)
    elif how == "huge":
        with open(path, "wb") as file:
            file.truncate(80 << 20)  # sparse: 80 MB of zeros to a reader
    elif how.startswith("outside-index:"):
        path.write_text(json.dumps({"metadata": {}, "weight_map": {"a.weight": how.split(":", 1)[1].format(secret=secret)}}))
    elif how.startswith("sizes:"):
        config = json.loads(path.read_text()) if path.name == "config.json" else {}
        key, value = how.split(":", 2)[1:]
        config[key] = json.loads(value)
        path.write_text(json.dumps(config))
    return path


CASES = {
    "a FIFO for a text encoder's config": ("text_encoder/config.json", "fifo", "is not a regular file"),
    "/dev/zero for the index": ("model_index.json", "dev-zero", "is not a regular file"),
    "a VAE config nested 50,000 deep": ("vae/config.json", "nested", "is nested deeper than"),
    "a 80 MB tokenizer file": ("tokenizer/vocab.json", "huge", "has 83.9 MB (allowed: at most 64 MB)"),
    "a shard index naming ../": ("unet/diffusion_pytorch_model.safetensors.index.json", "outside-index:../../secret",
                                 "names the shard '../../secret', which is not a file in its own folder"),
    "a shard index naming an absolute path": ("vae/diffusion_pytorch_model.safetensors.index.json",
                                              "outside-index:{secret}", "names the shard '/"),
    "a billion UNet layers": ("unet/config.json", "sizes:layers_per_block:1000000000",
                              "sets layers_per_block to 1000000000, past any published model's (allowed: "
                              "layers_per_block of at most 100)"),
    "a text encoder of 1e9 layers": ("text_encoder/config.json", "sizes:num_hidden_layers:1e9",
                                     "sets num_hidden_layers to 1000000000.0, past any published model's"),
}


@pytest.fixture
def model_copy(tmp_path, tiny_model_dir) -> Path:
    copy = tmp_path / "model"
    shutil.copytree(tiny_model_dir, copy)
    return copy


@pytest.mark.parametrize("case", CASES)
def test_a_hostile_file_in_a_model_folder_is_one_line_before_anything_loads(tmp_path, model_copy, case):
    name, how, why = CASES[case]
    secret = tmp_path / "secret"
    secret.write_text("THE-SECRET-BYTES")
    path = plant(model_copy, name, how, secret)
    started = time.monotonic()
    result = call_cli("+experiment=smoke", *QUIET, "model=local", f"model.pretrained_model_name_or_path={model_copy}",
                      cwd=tmp_path)
    assert_one_line_error(result, f"error: model.pretrained_model_name_or_path: {path} {why}")
    assert time.monotonic() - started < 20 and "load:" not in result.stdout
    assert "THE-SECRET-BYTES" not in result.stdout + result.stderr


@pytest.mark.parametrize("how,why", [("fifo", "is not a regular file"), ("nested", "is nested deeper than"),
                                     ("sizes:layers_per_block:1e9", "sets layers_per_block to 1000000000.0")])
def test_a_hostile_vae_folder_is_one_line(tmp_path, model_copy, how, why):
    vae = tmp_path / "vae"
    shutil.copytree(model_copy / "vae", vae)
    path = plant(vae, "config.json", how, tmp_path / "secret")
    result = call_cli("+experiment=smoke", *QUIET, f"model.vae={vae}", cwd=tmp_path)
    assert_one_line_error(result, f"error: model.vae: {path} {why}")


def test_a_vae_folders_shards_stay_inside_it(tmp_path, model_copy):
    secret = tmp_path / "secret.safetensors"
    secret.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{}      THE-SECRET-BYTES")
    vae = tmp_path / "vae"
    shutil.copytree(model_copy / "vae", vae)
    (vae / "diffusion_flax_model.msgpack").unlink()
    index = plant(vae, "diffusion_pytorch_model.safetensors.index.json", "outside-index:{secret}", secret)
    result = call_cli("+experiment=smoke", *QUIET, f"model.vae={vae}", cwd=tmp_path)
    assert_one_line_error(result, f"error: model.vae: {index} names the shard '{secret}', which is not a file in its "
                          "own folder; nothing outside a model folder is read")
    assert "THE-SECRET-BYTES" not in result.stdout + result.stderr


@pytest.mark.parametrize("name,how,why", [
    ("model_index.json", "dev-zero", "is not a regular file"),  # read 3.7 GB before
    ("model_index.json", "fifo", "is not a regular file"),  # hung before
    ("unet/config.json", "sizes:num_attention_heads:1e12", "sets num_attention_heads to 1000000000000.0"),
    ("tokenizer_2/vocab.json", "nested", "is nested deeper than"),
])
def test_a_hostile_refiner_folder_is_one_line(tmp_path, name, how, why):
    refiner = tmp_path / "refiner"
    shutil.copytree(REFINER, refiner)
    path = plant(refiner, name, how, tmp_path / "secret")
    started = time.monotonic()
    result = call_cli("model.name=tiny-sdxl", f"model.pretrained_model_name_or_path={BASE}", "scheduler=euler",
                      "sampling.num_inference_steps=4", "sampling.height=32", "sampling.width=32", *QUIET,
                      f"model.refiner={refiner}", cwd=tmp_path)
    assert_one_line_error(result, f"error: model.refiner: {path} {why}")
    assert time.monotonic() - started < 20


def sparse(path: Path, size: int, header: bytes = b"") -> Path:
    with open(path, "wb") as file:
        file.write(header)
        file.truncate(size)
    return path


def test_weights_past_any_published_files_size_are_refused_before_they_are_hashed(tmp_path, model_copy):
    """A 1 TB sparse "VAE" hung the plan hashing its zeros; each kind has its bound, checked first."""
    vae = sparse(tmp_path / "vae.safetensors", 1 << 40)
    header = json.dumps({"lora_unet_x.lora_down.weight": {"dtype": "U8", "shape": [20 << 30],
                                                          "data_offsets": [0, 20 << 30]}}).encode()
    lora = sparse(tmp_path / "lora.safetensors", 8 + len(header) + (20 << 30), len(header).to_bytes(8, "little") + header)
    refiner = tmp_path / "refiner"
    shutil.copytree(REFINER, refiner)
    unet = refiner / "unet" / "diffusion_pytorch_model.safetensors"
    unet.unlink()
    sparse(unet, 40 << 30)
    cases = [
        (["+experiment=smoke", f"model.vae={vae}"], f"error: model.vae: {vae} has 1099.5 GB, more than any published "
         "vae file holds; it is not hashed or read (allowed: a vae weights file of at most 4.3 GB)"),
        (["+experiment=smoke", f"+lora=[{{path: '{lora}'}}]"], f"error: lora.0.path: {lora} has 21.5 GB"),
        (["model.name=tiny-sdxl", f"model.pretrained_model_name_or_path={BASE}", "scheduler=euler",
          f"model.refiner={refiner}"], f"error: model.refiner: {unet} has 42.9 GB"),
    ]
    for overrides, expected in cases:
        started = time.monotonic()
        assert_one_line_error(call_cli(*overrides, *QUIET, cwd=tmp_path), expected)
        assert time.monotonic() - started < 10


@pytest.mark.slow
def test_a_large_file_that_is_no_adapter_of_the_model_is_refused_from_its_header(tmp_path):
    """A 1.5 GB "LoRA" took 1.8 GB of memory before it was refused: its tensors were converted to float32 before
    they were matched to the model. Now the file is mapped, not read, and matched from its header."""
    import json as json_

    lora = tmp_path / "big.safetensors"
    header = json_.dumps({"lora_unet_nowhere.lora_down.weight": {"dtype": "F32", "shape": [64, 1 << 22],
                                                                 "data_offsets": [0, 1 << 30]}}).encode()
    with open(lora, "wb") as file:  # 1 GB of float32 zeros, written sparse
        file.write(len(header).to_bytes(8, "little") + header)
        file.truncate(8 + len(header) + (1 << 30))
    # VmHWM: this process's own peak (ru_maxrss is kept across exec, so a child of a large test worker inherits its)
    script = ("import sys; from sdjax_runner.models import lora; "
              "import numpy as np; params = {'unet': {'x': {'kernel': np.zeros((4, 4), np.float32)}}}\n"
              "try: lora.read(sys.argv[1], params, 'lora.0.path')\n"
              "except Exception as exc: print(type(exc).__name__, exc)\n"
              "print(next(l.split()[1] for l in open('/proc/self/status') if l.startswith('VmHWM:')))")
    import subprocess
    import sys

    result = subprocess.run([sys.executable, "-c", script, str(lora)], capture_output=True, text=True, cwd=tmp_path)
    said, peak_kb = result.stdout.strip().rsplit("\n", 1)
    assert "UserError" in said and "1 module(s) match no kernel of unet in this model, e.g. nowhere" in said, said
    assert int(peak_kb) < 700 << 10, f"a 1 GB file that is no adapter took a {int(peak_kb) >> 10} MB peak"


@pytest.mark.slow
def test_weights_with_nan_are_one_line_at_load_not_black_images(tmp_path, model_copy):
    """Round five: NaN weights made black images whose warning blamed the guidance."""
    import numpy as np
    from flax.serialization import msgpack_restore, msgpack_serialize
    from flax.traverse_util import flatten_dict, unflatten_dict

    file = model_copy / "unet" / "diffusion_flax_model.msgpack"
    flat = flatten_dict(msgpack_restore(file.read_bytes()))
    path = next(p for p in sorted(flat) if p[-1] == "kernel")
    flat[path] = np.array(flat[path], copy=True)
    flat[path].flat[0] = np.nan
    file.write_bytes(msgpack_serialize(unflatten_dict(flat)))
    run_dir = tmp_path / "run"
    result = call_cli("+experiment=smoke", *QUIET, "model=local", f"model.pretrained_model_name_or_path={model_copy}",
                      f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert_one_line_error(result, f"error: model.pretrained_model_name_or_path: {model_copy} has NaN or infinite "
                          f"values in unet/{'/'.join(path)}: its images would be black (allowed: finite weights")
    assert not list(run_dir.rglob("*.png"))
