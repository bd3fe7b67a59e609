"""PyTorch's pickled weights (``.bin``, ``.pt``, ``.pth``, ``.ckpt`` as ``torch.save`` writes them since PyTorch 1.6: a
zip archive of ``data.pkl`` and one file per storage) read without torch and without running code from the file.

A pickle is a program: its GLOBAL opcodes name any importable callable and its REDUCE opcodes call it, which is why
the runner refuses pickles unless ``model.allow_pickle`` says otherwise. Even then nothing in the file is imported:
:class:`_StateDictUnpickler` resolves only the handful of names a state dict is made of -- ``OrderedDict``, the
storage types, ``torch._utils._rebuild_tensor_v2`` and ``_rebuild_parameter`` -- to functions of this module that
record where each tensor lies, and refuses every other name in one line. It admits what torch's own
``torch.load(weights_only=True)`` admits for a state dict, less the rarer types (quantized and sparse tensors, which
no diffusion checkpoint holds).

A tensor is read when its loader is called: its storage's bytes from the archive, viewed with its offset, shape and
strides (checked to lie inside the storage), copied out; bfloat16 comes back as float32 (NumPy has no bfloat16 of
its own), as the loader did when torch read these files. ``tests/test_torch_pickle.py`` checks every value against
files ``torch.save`` wrote (tests/helpers/make_torch_pickles.py).
"""

from __future__ import annotations

import collections
import functools
import pickle
import zipfile
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

# torch.save's storage types (torch/storage.py) -> the NumPy dtype of their elements.
STORAGE_DTYPES = {
    "DoubleStorage": "float64", "FloatStorage": "float32", "HalfStorage": "float16", "BFloat16Storage": "bfloat16",
    "LongStorage": "int64", "IntStorage": "int32", "ShortStorage": "int16", "CharStorage": "int8",
    "ByteStorage": "uint8", "BoolStorage": "bool",
}


class NotAStateDict(ValueError):
    """The file is not PyTorch weights this reader takes (the message says what it is, and names no traceback)."""


@dataclass(frozen=True)
class _StorageType:
    dtype: str


@dataclass(frozen=True)
class _Storage:
    key: str  # its file in the archive: data/<key>
    dtype: str
    numel: int


@dataclass(frozen=True)
class StoredTensor:
    """Where a tensor lies in the archive: which storage, from which element, with which shape and strides."""

    storage: _Storage
    offset: int
    shape: tuple[int, ...]
    stride: tuple[int, ...]

    def check(self) -> None:
        """The view lies inside its storage (a file that claims otherwise is refused before anything is read)."""
        if any(not isinstance(n, int) or n < 0 for n in (self.offset, *self.shape, *self.stride)) \
                or len(self.shape) != len(self.stride):
            raise NotAStateDict(f"a tensor of storage {self.storage.key} has a malformed shape {self.shape}, stride "
                                f"{self.stride} or offset {self.offset}")
        if 0 in self.shape:
            return
        last = self.offset + sum((size - 1) * step for size, step in zip(self.shape, self.stride, strict=True))
        if last >= self.storage.numel:
            raise NotAStateDict(f"a tensor of storage {self.storage.key} reaches element {last}, past the "
                                f"{self.storage.numel} the storage holds")

    def array(self, archive: zipfile.ZipFile, prefix: str, big_endian: bool) -> np.ndarray:
        """The tensor's values as a NumPy array of its own (float32 for bfloat16)."""
        dtype = _numpy_dtype(self.storage.dtype)
        if big_endian:
            dtype = dtype.newbyteorder(">")
        data = archive.read(f"{prefix}/data/{self.storage.key}")
        if len(data) < self.storage.numel * dtype.itemsize:
            raise NotAStateDict(f"storage {self.storage.key} holds {len(data)} bytes, fewer than its "
                                f"{self.storage.numel} elements need")
        flat = np.frombuffer(data, dtype=dtype, count=self.storage.numel)
        if 0 in self.shape:
            values = np.zeros(self.shape, dtype)
        else:
            strides = tuple(step * dtype.itemsize for step in self.stride)
            values = np.lib.stride_tricks.as_strided(flat[self.offset:], self.shape, strides, writeable=False)
        values = np.array(values, dtype=dtype.newbyteorder("=") if big_endian else dtype)
        return values.astype(np.float32) if self.storage.dtype == "bfloat16" else values


def _numpy_dtype(name: str) -> np.dtype:
    if name == "bfloat16":
        import ml_dtypes  # (JAX's own dependency)

        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def _rebuild_tensor(storage: Any, offset: Any, shape: Any, stride: Any, *_: Any) -> StoredTensor:
    """torch._utils._rebuild_tensor_v2's stand-in: where the tensor lies, nothing read yet."""
    if not isinstance(storage, _Storage):
        raise NotAStateDict("a tensor names no storage of the archive")
    tensor = StoredTensor(storage, offset, tuple(shape), tuple(stride))
    tensor.check()
    return tensor


def _rebuild_parameter(data: Any, *_: Any) -> Any:
    """torch._utils._rebuild_parameter(_with_state)'s stand-in: a parameter is its tensor."""
    return data


_ALLOWED: dict[tuple[str, str], Any] = {
    ("collections", "OrderedDict"): collections.OrderedDict,
    ("torch._utils", "_rebuild_tensor_v2"): _rebuild_tensor,
    ("torch._utils", "_rebuild_parameter"): _rebuild_parameter,
    ("torch._utils", "_rebuild_parameter_with_state"): _rebuild_parameter,
    **{("torch", name): _StorageType(dtype) for name, dtype in STORAGE_DTYPES.items()},
}


class _StateDictUnpickler(pickle.Unpickler):
    """An unpickler that imports nothing: the names of :data:`_ALLOWED` map to this module's stand-ins, the
    persistent ids to the archive's storages; any other name is refused."""

    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise NotAStateDict(f"it names {module}.{name}, which is not part of a state dict of tensors (only "
                                "tensors, parameters and dictionaries are read; nothing in the file is "
                                "imported or run)") from None

    def persistent_load(self, pid: Any) -> _Storage:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"
                and isinstance(pid[1], _StorageType) and isinstance(pid[2], str) and isinstance(pid[4], int)):
            raise NotAStateDict(f"it holds a persistent id {str(pid)[:80]} that is not one of torch.save's storages")
        return _Storage(pid[2], pid[1].dtype, pid[4])


def _prefix(archive: zipfile.ZipFile) -> str:
    pickles = [name for name in archive.namelist() if name.endswith("/data.pkl") and name.count("/") == 1]
    if len(pickles) != 1:
        raise NotAStateDict("it is a zip archive but not one torch.save wrote (no single <name>/data.pkl)")
    return pickles[0].split("/", 1)[0]


def _tensors_of(tree: Any, prefix: str = "") -> Iterator[tuple[str, StoredTensor]]:
    """(name, tensor) of every tensor in a state dict; nested dictionaries' names joined with dots (a training
    checkpoint's ``state_dict`` and its other entries, of which only the tensors count)."""
    if isinstance(tree, StoredTensor):
        yield prefix, tree
    elif isinstance(tree, dict):
        for key, value in tree.items():
            yield from _tensors_of(value, f"{prefix}.{key}" if prefix else str(key))


def read_state_dict(file: Path) -> tuple[zipfile.ZipFile, str, bool, dict[str, StoredTensor]]:
    """The open archive of ``file``, its prefix, whether it is big-endian, and its tensors by name (none read yet).
    NotAStateDict where the file is not one (a PyTorch before 1.6's format, another pickle, a damaged archive)."""
    if not zipfile.is_zipfile(file):
        raise NotAStateDict("it is not a zip archive: PyTorch's format before 1.6 or another pickle, which this "
                            "reader does not take (load it with torch once and save it as safetensors)")
    archive = zipfile.ZipFile(file)
    try:
        prefix = _prefix(archive)
        order = archive.read(f"{prefix}/byteorder").decode().strip() \
            if f"{prefix}/byteorder" in archive.namelist() else "little"
        with archive.open(f"{prefix}/data.pkl") as stream:
            tree = _StateDictUnpickler(stream).load()
        tensors = dict(_tensors_of(tree))
    except (NotAStateDict, zipfile.BadZipFile, KeyError) as exc:
        archive.close()
        raise NotAStateDict(str(exc)) from None
    except (pickle.UnpicklingError, EOFError, ValueError, TypeError, AttributeError, IndexError) as exc:
        archive.close()
        raise NotAStateDict(f"its data.pkl cannot be read as a state dict ({type(exc).__name__}: "
                            f"{str(exc)[:120]})") from None
    return archive, prefix, order == "big", tensors


def pickled_tensors(files: Iterable[Path]) -> Iterator[tuple[str, Callable[[], np.ndarray]]]:
    """(name, loader) of every tensor of ``files`` (a model's shards, in order), each read when its loader is called
    while the iteration is at it."""
    for file in files:
        archive, prefix, big_endian, tensors = read_state_dict(file)
        with archive:
            for name, tensor in tensors.items():
                yield name, functools.partial(tensor.array, archive, prefix, big_endian)
