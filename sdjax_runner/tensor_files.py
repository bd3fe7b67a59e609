"""safetensors files read with NumPy alone, bfloat16 included. The safetensors library's NumPy reader does not
know bfloat16 (``data type 'bfloat16' not understood``), the dtype most published checkpoints, fine-tunes and
LoRAs of today are in; this reader gives every dtype safetensors writes, as NumPy arrays (bfloat16 and the
float8s through ml_dtypes, which JAX depends on).

The format: an 8-byte little-endian header length, a JSON header ``{name: {"dtype", "shape", "data_offsets":
[begin, end]}}`` (and an optional ``__metadata__``), then the data, little-endian. A file is memory-mapped and
each tensor is a read-only view, read from disk when it is used (a 10 GB checkpoint costs no memory until its
tensors are converted, one at a time). Anything that does not hold to the format is :class:`UnreadableTensors`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Union

import numpy as np

# safetensors' dtype names -> NumPy's.
DTYPES = {"F64": "float64", "F32": "float32", "F16": "float16", "BF16": "bfloat16", "F8_E4M3": "float8_e4m3fn",
          "F8_E5M2": "float8_e5m2", "I64": "int64", "I32": "int32", "I16": "int16", "I8": "int8", "U64": "uint64",
          "U32": "uint32", "U16": "uint16", "U8": "uint8", "BOOL": "bool"}
MAX_HEADER = 100 * 2**20  # the safetensors library's own bound on the JSON header


class UnreadableTensors(ValueError):
    """A file that is not a safetensors file, or whose header does not fit its data (one line)."""


def numpy_dtype(name: str) -> np.dtype:
    """The NumPy dtype of a safetensors dtype's NumPy name (``bfloat16`` through ml_dtypes)."""
    if name in ("bfloat16", "float8_e4m3fn", "float8_e5m2"):
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))
    return np.dtype(name).newbyteorder("<")


def read_safetensors(file: Union[str, Path]) -> dict[str, np.ndarray]:
    """The file's tensors as ``{name: array}``, memory-mapped (read-only views)."""
    file = Path(file)
    size = file.stat().st_size
    with open(file, "rb") as handle:
        prefix = handle.read(8)
        length = int.from_bytes(prefix, "little") if len(prefix) == 8 else -1
        if not 0 < length <= min(MAX_HEADER, size - 8):
            raise UnreadableTensors(f"{file.name} is not a safetensors file (its header length is {length})")
        header = _header(handle.read(length), file.name)
    data = np.memmap(file, dtype=np.uint8, mode="r") if size > 8 + length else np.zeros(0, np.uint8)
    return _tensors(header, data, 8 + length, file.name)


def tensors_from_bytes(data: bytes, name: str = "the file") -> dict[str, np.ndarray]:
    """A safetensors file's bytes (read once, e.g. to be hashed too) as ``{name: array}`` views of them."""
    length = int.from_bytes(data[:8], "little") if len(data) >= 8 else -1
    if not 0 < length <= min(MAX_HEADER, len(data) - 8):
        raise UnreadableTensors(f"{name} is not a safetensors file (its header length is {length})")
    return _tensors(_header(data[8: 8 + length], name), np.frombuffer(data, dtype=np.uint8), 8 + length, name)


def _header(raw: bytes, name: str) -> dict:
    try:
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise UnreadableTensors(f"{name} is not a safetensors file (its header is not JSON)") from None
    if not isinstance(header, dict):
        raise UnreadableTensors(f"{name} is not a safetensors file (its header is not a JSON object)")
    return header


def _tensors(header: dict, data: np.ndarray, start: int, name: str) -> dict[str, np.ndarray]:
    tensors: dict[str, np.ndarray] = {}
    available = len(data) - start
    for key, info in header.items():
        if key == "__metadata__":
            continue
        try:
            dtype = numpy_dtype(DTYPES[info["dtype"]])
            shape = tuple(int(n) for n in info["shape"])
            begin, end = (int(n) for n in info["data_offsets"])
        except (KeyError, TypeError, ValueError):
            raise UnreadableTensors(f"{name}: {key} has an unreadable entry {info!r:.200}") from None
        count = int(np.prod(shape, dtype=np.int64))
        if min(shape, default=0) < 0 or not 0 <= begin <= end <= available or end - begin != count * dtype.itemsize:
            raise UnreadableTensors(f"{name}: {key} ({info['dtype']} {list(shape)}) does not fit its bytes "
                                    f"[{begin}, {end}) of the {available} the file has")
        tensors[key] = data[start + begin:start + end].view(dtype).reshape(shape)
    return tensors
