"""Textual-inversion embeddings (``prompts.embeddings``), torch-free, as A1111 reads them: each ``.safetensors``
file is an embedding named by its file stem, and a prompt that names it gets its vectors.

File layouts (A1111's ``textual_inversion.load_from_file`` for safetensors):

* one tensor under any key -- A1111's ``emb_params`` ``(vectors, width)``, diffusers' ``{"<token>": (width,)}``
  -- for the text encoder of SD 1.x (width 768) or SD 2.x (1024);
* SDXL's ``clip_l`` ``(vectors, 768)`` and ``clip_g`` ``(vectors, 1280)``, one per text encoder.

Pickled ``.pt`` / ``.bin`` embeddings are refused (config/weight_files.embedding_files): unpickling runs code.

How a prompt gets the vectors: every embedding takes ``vectors`` rows of a table per text encoder (in the order
the files are named). Tokenizing, a run of token ids equal to the embedding name's own tokens (A1111's match) is
replaced by ``vectors`` ids past the encoder's vocabulary, ``vocabulary + row`` (:meth:`Embeddings.replace`);
encoding, the text encoder reads a harmless id there and its token embedding at those positions is the table's
row (engine/encode.py). The table is an input of the program: other embeddings of the same sizes reuse it.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from sdjax_runner.console import error_line
from sdjax_runner.errors import UserError

KEY = "prompts.embeddings"


@dataclass(frozen=True)
class Embeddings:
    """Loaded embeddings for one pipeline: ``tables`` by text encoder component (``(rows, width)`` float32), each
    name's ``(first row, vectors)`` and each tokenizer's ids of each name (A1111's match)."""

    tables: dict[str, np.ndarray]
    rows: dict[str, tuple[int, int]]
    name_ids: list[dict[str, tuple[int, ...]]]  # per tokenizer: name -> its token ids (no start/end)
    vocabularies: list[int]  # per tokenizer: its text encoder's vocabulary size (placeholder ids start there)

    @property
    def shapes(self) -> tuple:
        """What the program's shape depends on: each table's shape."""
        return tuple((name, table.shape) for name, table in sorted(self.tables.items()))

    def replace(self, which: int, ids: list[int]) -> list[int]:
        """``ids`` (tokenizer ``which``'s, no start/end) with each run equal to an embedding name's ids replaced by
        its placeholder ids, longest names first at each position (as A1111's ``find_embedding_at_position``)."""
        names = sorted(self.name_ids[which].items(), key=lambda item: -len(item[1]))
        out: list[int] = []
        position = 0
        while position < len(ids):
            for name, own in names:
                if own and tuple(ids[position:position + len(own)]) == own:
                    first, count = self.rows[name]
                    out.extend(self.vocabularies[which] + first + i for i in range(count))
                    position += len(own)
                    break
            else:
                out.append(ids[position])
                position += 1
        return out


def encoders(pipeline: Any) -> list[tuple[str, Any, Any]]:
    """(component, text encoder, tokenizer) of an SD pipeline, in tokenizer order."""
    out = [("text_encoder", pipeline.text_encoder, pipeline.tokenizer)]
    if hasattr(pipeline, "text_encoder_2"):
        out.append(("text_encoder_2", pipeline.text_encoder_2, pipeline.tokenizer_2))
    return out


def load(entries: tuple, pipeline: Any) -> Embeddings:
    """``entries`` (config/plan.EmbeddingEntry: name, path, sha256) read for ``pipeline``'s text encoders; each bad
    file one line naming it."""
    from sdjax_runner.files import file_sha256
    from sdjax_runner.tensor_files import read_safetensors

    parts = encoders(pipeline)
    widths = {name: int(encoder.config.hidden_size) for name, encoder, _ in parts}
    vectors: dict[str, list[np.ndarray]] = {name: [] for name in widths}
    rows: dict[str, tuple[int, int]] = {}
    start = 0
    for entry in entries:
        path = Path(entry.path)
        try:
            tensors = {key: np.asarray(value, dtype=np.float32) for key, value in read_safetensors(path).items()}
        except Exception as exc:  # the file is input: one line
            raise UserError(KEY, f"{path.name} is not a readable safetensors file ({error_line(exc, 160)})",
                            "a textual-inversion .safetensors file") from None
        if file_sha256(path) != entry.sha256:
            raise UserError(KEY, f"{path} changed since the run was planned; it is not run under the old file's hash",
                            "run again")
        per_encoder = _vectors(path.name, tensors, widths)
        count = next(iter(per_encoder.values())).shape[0]
        for name in widths:
            vectors[name].append(per_encoder[name])
        rows[entry.name] = (start, count)
        start += count
    tables = {name: np.concatenate(parts_, axis=0) for name, parts_ in vectors.items()}
    name_ids = [{entry.name: tuple(tokenizer(entry.name, add_special_tokens=False).input_ids) for entry in entries}
                for _, _, tokenizer in parts]
    vocabularies = [int(encoder.config.vocab_size) for _, encoder, _ in parts]
    return Embeddings(tables, rows, name_ids, vocabularies)


def _vectors(file: str, tensors: dict[str, np.ndarray], widths: dict[str, int]) -> dict[str, np.ndarray]:
    """The file's vectors for each text encoder, ``(vectors, width)``, checked against the encoders' widths."""
    expected = " and ".join(f"{name} {width}" for name, width in widths.items())
    if len(widths) == 2:  # SDXL: clip_l for text_encoder, clip_g for text_encoder_2
        if not {"clip_l", "clip_g"} <= set(tensors):
            raise UserError(KEY, f"{file} holds {', '.join(sorted(tensors))[:120] or 'no tensors'}; an SDXL model "
                            "needs an SDXL embedding", "a file with clip_l and clip_g vectors")
        found = {"text_encoder": tensors["clip_l"], "text_encoder_2": tensors["clip_g"]}
    else:
        if len(tensors) != 1:
            raise UserError(KEY, f"{file} holds {len(tensors)} tensors ({', '.join(sorted(tensors))[:120]})",
                            "one tensor (A1111's emb_params, diffusers' <token>), as SD 1.x/2.x embeddings have")
        found = {"text_encoder": next(iter(tensors.values()))}
    out = {}
    for name, array in found.items():
        matrix = array[None] if array.ndim == 1 else array
        if matrix.ndim != 2 or matrix.shape[1] != widths[name] or matrix.shape[0] < 1:
            raise UserError(KEY, f"{file}: vectors of shape {tuple(array.shape)} for {name}, whose token embeddings "
                            f"are {widths[name]} wide", f"an embedding made for this model ({expected} wide)")
        if not np.isfinite(matrix).all():
            raise UserError(KEY, f"{file}: its vectors are not all finite numbers", "a textual-inversion file")
        out[name] = matrix
    if len({matrix.shape[0] for matrix in out.values()}) != 1:
        raise UserError(KEY, f"{file}: clip_l and clip_g hold different vector counts",
                        "as many clip_l as clip_g vectors")
    return out
