"""PyTorch pickles read without torch and without running anything from the file (sdjax_runner/models/torch_pickle.py),
against files ``torch.save`` wrote (tests/helpers/make_torch_pickles.py; torch's version in the fixture's
VERSIONS.json). The test environment has no torch: what passes here passes without it."""

from __future__ import annotations

import importlib.util
import json
import pickle
import shutil
import struct
import zipfile
from pathlib import Path

import numpy as np
import pytest

from helpers.cli import assert_one_line_error, run_cli
from helpers.images import images_of
from helpers.pt_layout import pytorch_state_dict, write_pytorch_only
from sdjax_runner.models import torch_pickle

FIXTURES = Path(__file__).parent / "fixtures" / "torch_pickles"


def read(file: Path) -> dict[str, np.ndarray]:
    return {name: load() for name, load in torch_pickle.pickled_tensors([file])}


def test_the_test_environment_has_no_torch():
    assert importlib.util.find_spec("torch") is None  # so every read below is without it


def test_every_tensor_is_what_torch_reads_back():
    expected = np.load(FIXTURES / "cases.npz", allow_pickle=False)
    described = json.loads((FIXTURES / "cases.json").read_text())
    got = read(FIXTURES / "cases.bin")
    assert list(got) == list(described)  # every tensor, in the file's order
    for name, values in got.items():
        torch_dtype = described[name]["dtype"].removeprefix("torch.")
        assert values.dtype == np.dtype("float32" if torch_dtype == "bfloat16" else torch_dtype), name
        assert list(values.shape) == described[name]["shape"], name
        np.testing.assert_array_equal(values, expected[name], err_msg=name)
        assert values.flags.owndata or values.base is None or values.base.flags.owndata  # a copy, not a view
    # the cases the file holds: views of one shared storage at offsets, a transposed tensor, 0-d and empty ones
    assert got["shared.tail"].shape == (2, 3) and got["transposed"].shape == (5, 3)
    assert got["scalar"].shape == () and got["empty"].shape == (0, 4)


def test_a_training_checkpoints_tensors_are_named_by_their_path():
    got = read(FIXTURES / "checkpoint.ckpt")
    expected = np.load(FIXTURES / "cases.npz", allow_pickle=False)
    assert sorted(got) == ["state_dict.dtype.float16", "state_dict.dtype.float32", "state_dict.dtype.float64"]
    for name, values in got.items():
        np.testing.assert_array_equal(values, expected[name.removeprefix("state_dict.")])


def _archive(tmp_path: Path, payload: bytes, storages: dict[str, bytes] | None = None) -> Path:
    """A zip laid out as torch.save lays one out, with ``payload`` as its data.pkl."""
    file = tmp_path / "crafted.bin"
    with zipfile.ZipFile(file, "w") as archive:
        archive.writestr("crafted/data.pkl", payload)
        archive.writestr("crafted/byteorder", "little")
        for key, data in (storages or {}).items():
            archive.writestr(f"crafted/data/{key}", data)
    return file


def test_a_pickle_that_would_run_code_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "ran"

    class Payload:  # unpickled by pickle.load, it would call os.system and touch the marker
        def __reduce__(self):
            import os

            return os.system, (f"touch {marker}",)

    crafted = _archive(tmp_path, pickle.dumps({"weight": Payload()}, protocol=2))
    with pytest.raises(torch_pickle.NotAStateDict, match=r"it names (posix|os)\.system, which is not part of a state"):
        read(crafted)
    assert not marker.exists()
    # the same through builtins.eval, and a storage id that is no storage
    evil = pickle.dumps({"weight": eval}, protocol=2)
    with pytest.raises(torch_pickle.NotAStateDict, match=r"(__builtin__|builtins)\.eval"):
        read(_archive(tmp_path, evil))


def _tensor_pickle(offset: int, size: int, numel: int) -> bytes:
    """data.pkl of ``{"w": tensor}`` in torch.save's opcodes (pickletools.dis of the fixture's cases.bin shows the
    same): _rebuild_tensor_v2(storage of ``numel`` float32s, ``offset``, (``size``,), (1,), False, OrderedDict())."""
    def text(value: str) -> bytes:
        return b"X" + struct.pack("<I", len(value)) + value.encode()

    def name(module: str, attribute: str) -> bytes:
        return b"c" + f"{module}\n{attribute}\n".encode()

    def small(n: int) -> bytes:
        return b"K" + bytes([n])

    storage = b"(" + text("storage") + name("torch", "FloatStorage") + text("0") + text("cpu") + small(numel) + b"tQ"
    arguments = (b"(" + storage + small(offset) + small(size) + b"\x85" + small(1) + b"\x85" + b"\x89"
                 + name("collections", "OrderedDict") + b")R" + b"t")
    return b"\x80\x02}" + text("w") + name("torch._utils", "_rebuild_tensor_v2") + arguments + b"Rs."


def test_a_view_past_its_storage_and_files_torch_did_not_write_are_refused(tmp_path):
    storage = {"0": np.arange(4, dtype=np.float32).tobytes()}  # 4 float32s
    with pytest.raises(torch_pickle.NotAStateDict, match="reaches element 5, past the 4 the storage holds"):
        read(_archive(tmp_path, _tensor_pickle(offset=2, size=4, numel=4), storage))  # elements 2..5 of 4
    assert read(_archive(tmp_path, _tensor_pickle(offset=1, size=3, numel=4), storage))["w"].tolist() == [1, 2, 3]
    with pytest.raises(torch_pickle.NotAStateDict, match=r"PyTorch's format before 1\.6"):
        read(FIXTURES / "legacy.bin")
    plain = tmp_path / "plain.pt"
    plain.write_bytes(pickle.dumps({"w": [1.0, 2.0]}))
    with pytest.raises(torch_pickle.NotAStateDict, match="not a zip archive"):
        read(plain)
    other = tmp_path / "other.zip"
    with zipfile.ZipFile(other, "w") as archive:
        archive.writestr("readme.txt", "hello")
    with pytest.raises(torch_pickle.NotAStateDict, match=r"not one torch\.save wrote"):
        read(other)
    with pytest.raises(torch_pickle.NotAStateDict, match="cannot be read as a state dict"):
        read(_archive(tmp_path, b"\x80\x02}q\x00"))  # cut short


def test_the_fixtures_text_encoder_is_the_tiny_models(tiny_model_dir):
    """The committed pytorch_model.bin is the tiny-random text encoder as transformers saves it; a change of the
    built-in model shows here first (then run tests/helpers/make_torch_pickles.py again)."""
    from flax.serialization import msgpack_restore

    params = msgpack_restore((tiny_model_dir / "text_encoder" / "flax_model.msgpack").read_bytes())
    expected = pytorch_state_dict(params, "transformers")
    got = read(FIXTURES / "text_encoder" / "pytorch_model.bin")
    assert sorted(got) == sorted(expected)
    for name, values in got.items():
        np.testing.assert_array_equal(values, np.asarray(expected[name]), err_msg=name)


def test_a_pickled_component_is_read_with_allow_pickle_and_gives_the_same_images(smoke_run, tmp_path, tiny_model_dir):
    _, flax_run, _ = smoke_run
    model = write_pytorch_only(tiny_model_dir, tmp_path / "pt", components=("text_encoder",),
                               as_pickle=("text_encoder",))
    for stale in (model / "text_encoder").glob("*.bin"):
        stale.unlink()
    shutil.copy(FIXTURES / "text_encoder" / "pytorch_model.bin", model / "text_encoder")
    common = ("+experiment=smoke", "model=local", f"model.pretrained_model_name_or_path={model}", "tracking=none")
    refused = run_cli(*common, f"hydra.run.dir={tmp_path / 'refused'}", cwd=tmp_path)
    assert_one_line_error(refused, "error: model.allow_pickle: text_encoder/ has only pickle weights "
                                   "(pytorch_model.bin); unpickling can run code, so they are not loaded")
    result = run_cli(*common, "model.allow_pickle=true", f"hydra.run.dir={tmp_path / 'run'}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    got, expected = images_of(tmp_path / "run"), images_of(flax_run)
    assert len(got) == 8 and all(np.array_equal(a, b) for a, b in zip(got, expected, strict=True))
    # a file in the folder that torch did not write: one line naming the folder and what it is
    (model / "text_encoder" / "pytorch_model.bin").write_bytes(pickle.dumps({"w": [1.0]}))
    broken = run_cli(*common, "model.allow_pickle=true", f"hydra.run.dir={tmp_path / 'broken'}", cwd=tmp_path)
    assert_one_line_error(broken, "error: model.allow_pickle: text_encoder/ is not read: it is not a zip archive")
