"""Make the PyTorch pickle references (issue #60: weights pickles read without torch) in ``tests/fixtures/torch_pickles/``.

Everything here is written by ``torch.save`` itself, the writer of the ``.bin`` / ``.pt`` / ``.ckpt`` files users
have, so the runner's reader (sdjax_runner/models/torch_pickle.py) is checked against PyTorch's format, not against
a writer of ours:

* ``cases.bin``: a state dict of ``torch.nn.Module.state_dict()``'s kind (an OrderedDict with ``_metadata``) whose
  tensors cover what the reader must get right: every storage dtype (float64/32/16, bfloat16, int64/32/16/8, uint8,
  bool), a parameter, a transposed (non-contiguous) tensor, two slices of one shared storage at offsets, a 0-d
  tensor, an empty one, a 4-d convolution weight. ``cases.npz`` holds the values torch reads back (bfloat16 as
  float32, which is exact) and ``cases.json`` each tensor's torch dtype and shape.
* ``checkpoint.ckpt``: a training checkpoint's layout, ``{"state_dict": {...}, "epoch": 3, "global_step": 12}``.
* ``legacy.bin``: the same small state dict in PyTorch's format before 1.6 (``_use_new_zipfile_serialization=False``),
  which the reader refuses in one line.
* ``text_encoder/pytorch_model.bin``: the runner's ``tiny-random`` CLIP text encoder as transformers'
  ``save_pretrained(safe_serialization=False)`` writes it (``torch.save`` of the state dict), from the PyTorch
  safetensors ``tests/helpers/pt_layout.write_pytorch_only`` makes of it (``--text-encoder``).

Run from the checkout's root, in the reference environment (torch, safetensors; versions in ``VERSIONS.json``)::

    /work/refvenv/bin/python tests/helpers/make_torch_pickles.py --text-encoder PT_DIR/text_encoder/model.safetensors

torch.save writes a random ``serialization_id`` into each archive, so the files differ between runs; the values do
not.
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
from pathlib import Path

import numpy as np
import torch
from safetensors.torch import load_file

OUT = Path(__file__).resolve().parents[1] / "fixtures" / "torch_pickles"


def cases() -> collections.OrderedDict:
    torch.manual_seed(0)
    module = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.GroupNorm(2, 4), torch.nn.Linear(4, 2))
    state = module.state_dict()  # an OrderedDict with _metadata, its tensors the parameters' own
    shared = torch.arange(12, dtype=torch.float16) / 7
    state.update({
        "dtype.float64": torch.randn(3, dtype=torch.float64),
        "dtype.float32": torch.randn(2, 3),
        "dtype.float16": torch.randn(5).half(),
        "dtype.bfloat16": torch.randn(2, 4).bfloat16(),
        "dtype.int64": torch.tensor([-(2**40), 0, 2**40]),
        "dtype.int32": torch.tensor([-7, 0, 7], dtype=torch.int32),
        "dtype.int16": torch.tensor([-300, 300], dtype=torch.int16),
        "dtype.int8": torch.tensor([-128, 127], dtype=torch.int8),
        "dtype.uint8": torch.tensor([0, 255], dtype=torch.uint8),
        "dtype.bool": torch.tensor([True, False, True]),
        "parameter": torch.nn.Parameter(torch.randn(3, 2)),
        "transposed": torch.randn(3, 5).t(),
        "shared.head": shared[1:4],
        "shared.tail": shared[6:].view(2, 3),
        "scalar": torch.tensor(2.5),
        "empty": torch.zeros(0, 4),
    })
    return state


def write(out: Path, text_encoder: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    state = cases()
    torch.save(state, out / "cases.bin")
    again = torch.load(out / "cases.bin", map_location="cpu", weights_only=True)
    np.savez(out / "cases.npz", **{name: (t.float() if t.dtype == torch.bfloat16 else t).detach().numpy()
                                   for name, t in again.items()})
    (out / "cases.json").write_text(json.dumps({name: {"dtype": str(t.dtype), "shape": list(t.shape)}
                                                for name, t in again.items()}, indent=1) + "\n")
    small = collections.OrderedDict((k, v) for k, v in state.items() if k.startswith("dtype.float"))
    torch.save({"state_dict": small, "epoch": 3, "global_step": 12}, out / "checkpoint.ckpt")
    torch.save(small, out / "legacy.bin", _use_new_zipfile_serialization=False)
    (out / "text_encoder").mkdir(exist_ok=True)
    torch.save(load_file(str(text_encoder)), out / "text_encoder" / "pytorch_model.bin")
    (out / "VERSIONS.json").write_text(json.dumps({"torch": torch.__version__, "numpy": np.__version__,
                                                   "python": platform.python_version()}, indent=1) + "\n")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--text-encoder", type=Path, required=True,
                        help="the tiny-random text encoder's model.safetensors (pt_layout.write_pytorch_only)")
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    write(args.out, args.text_encoder)


if __name__ == "__main__":
    main()
