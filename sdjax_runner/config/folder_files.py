"""A model, VAE or refiner folder's own files, checked before any library reads them.

diffusers', transformers' and the tokenizers' loaders read a folder's JSON and text files whole and without a
bound, follow whatever names a shard index gives, and build modules as large as a config.json says. A folder is
data someone may have handed you, so before any of them runs, :func:`check_folder` reads each file they would
read -- ``model_index.json``, each component's ``config.json`` / ``scheduler_config.json``, the tokenizers'
files, the shard indexes -- and refuses, in one line naming the file:

* a file that is not a regular file (a FIFO would hang the reader, ``/dev/zero`` fill memory) or is larger than
  such a file ever is (:data:`TEXT_BYTES`);
* JSON that is not JSON, or nests deeper than :data:`files.MAX_DEPTH` levels (a RecursionError deep inside a
  library otherwise; through transformers, a tokenizer that loads as ``False``);
* a shard index whose ``weight_map`` names a file outside its own folder (``../x``, an absolute path): nothing
  outside the folder is read, and no byte of such a file reaches an error line;
* a config whose sizes no published model comes near (:data:`SIZE_BOUNDS`: ``num_layers: 1e9`` cost 44-80 s and
  3 GB before a MemoryError).
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path, PurePosixPath
from typing import Any

from sdjax_runner.errors import UserError
from sdjax_runner.files import UnreadableRecord, read_json

# The largest text file a published pipeline folder holds is T5's tokenizer.json (2.4 MB) or CLIP's vocab.json
# (1.6 MB); configs are a few kB. A bound well above all, far below what hurts (the loader's own, MAX_TEXT_BYTES of
# models/model_index.py, which checks a hub snapshot's files again as they are fetched).
TEXT_BYTES = 64 << 20
TEXT_SUFFIXES = (".json", ".txt", ".model")
MAX_FILES = 10_000  # files looked at in one folder: a pipeline holds a few dozen
# Config sizes: the largest a published model has, times a margin (FLUX.1: 19 + 38 blocks, T5-XXL 24 layers,
# hidden 4096, ff 10240; SDXL 10 transformer layers per block; vocabularies 250k). A key not listed is not bounded.
SIZE_BOUNDS = {
    "num_layers": 1_000, "num_single_layers": 1_000, "num_hidden_layers": 1_000, "num_decoder_layers": 1_000,
    "layers_per_block": 100, "transformer_layers_per_block": 1_000, "num_attention_heads": 4_096,
    "num_heads": 4_096, "attention_head_dim": 4_096, "d_model": 65_536, "d_ff": 262_144, "d_kv": 4_096,
    "hidden_size": 65_536, "intermediate_size": 262_144, "joint_attention_dim": 65_536,
    "caption_projection_dim": 65_536, "pooled_projection_dim": 65_536, "cross_attention_dim": 65_536,
    "projection_dim": 65_536, "in_channels": 4_096, "out_channels": 4_096, "latent_channels": 4_096,
    "block_out_channels": 65_536, "sample_size": 65_536, "pos_embed_max_size": 4_096, "patch_size": 64,
    "vocab_size": 4_000_000, "max_position_embeddings": 1_000_000, "num_train_timesteps": 100_000,
    "relative_attention_num_buckets": 4_096, "relative_attention_max_distance": 1_000_000,
    "norm_num_groups": 4_096, "addition_time_embed_dim": 65_536, "projection_class_embeddings_input_dim": 1_000_000,
}


def check_folder(folder: Path, key: str, allowed: str) -> None:
    """Every file of ``folder`` that a loader reads as text (see the module docstring); UserError naming ``key``
    (model.pretrained_model_name_or_path, model.vae, model.refiner) and ``allowed`` otherwise."""
    for path in _text_files(folder, key, allowed):
        try:
            info = os.stat(path)
            if not stat.S_ISREG(info.st_mode):
                raise UnreadableRecord("is not a regular file")
            if info.st_size > TEXT_BYTES:
                raise UnreadableRecord(f"has {info.st_size / 1e6:.1f} MB (allowed: at most {TEXT_BYTES >> 20} MB)")
            if path.suffix != ".json":
                continue
            value = read_json(path, TEXT_BYTES)
        except UnreadableRecord as exc:
            raise UserError(key, f"{path} {exc}", allowed) from None
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            raise UserError(key, f"{path} is not JSON ({type(exc).__name__})", allowed) from None
        if path.name.endswith(".index.json") or ".index." in path.name:
            shard_names(path, value, key, allowed)
        elif path.name == "config.json":
            _check_sizes(path, value, key, allowed)


def shard_names(index: Path, value: Any, key: str, allowed: str) -> list[str]:
    """The shard files a safetensors or msgpack index's ``weight_map`` lists, each a file name in the index's own
    folder; UserError for one that is not (``../x``, ``/etc/x``, ``sub/x``) or an index without a weight map."""
    weight_map = value.get("weight_map") if isinstance(value, dict) else None
    if not isinstance(weight_map, dict) or not all(isinstance(v, str) for v in weight_map.values()):
        raise UserError(key, f"{index} has no weight_map of file names", allowed)
    names = sorted(set(weight_map.values()))
    for name in names:
        parts = PurePosixPath(name.replace("\\", "/")).parts
        if len(parts) != 1 or parts[0] in ("", ".", "..") or "\x00" in name:
            raise UserError(key, f"{index} names the shard {name[:120]!r}, which is not a file in its own folder; "
                            "nothing outside a model folder is read", "shard file names beside their index")
    return names


def read_index(index: Path, key: str, allowed: str) -> list[Path]:
    """The shard files of the index file ``index``, read bounded and checked (:func:`shard_names`)."""
    try:
        value = read_json(index, TEXT_BYTES)
    except UnreadableRecord as exc:
        raise UserError(key, f"{index} {exc}", allowed) from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise UserError(key, f"{index} is not JSON ({type(exc).__name__})", allowed) from None
    return [index.parent / name for name in shard_names(index, value, key, allowed)]


def _text_files(folder: Path, key: str, allowed: str) -> Iterator[Path]:
    """The files under ``folder`` (two levels: the pipeline's and each component's) a loader reads as text."""
    seen = 0
    for directory in (folder, *sorted(p for p in _entries(folder) if p.is_dir())):
        for path in sorted(_entries(directory)):
            seen += 1
            if seen > MAX_FILES:
                raise UserError(key, f"{folder} holds over {MAX_FILES} files: not a model folder", allowed)
            if path.suffix in TEXT_SUFFIXES and not path.is_dir():
                yield path


def _entries(directory: Path) -> list[Path]:
    try:
        return list(directory.iterdir())
    except OSError:
        return []


def _check_sizes(path: Path, config: Any, key: str, allowed: str) -> None:
    if not isinstance(config, dict):
        raise UserError(key, f"{path} is not a JSON object", allowed)
    for name, bound in SIZE_BOUNDS.items():
        value = config.get(name)
        values = value if isinstance(value, list) else [value]
        for item in values:
            if isinstance(item, bool) or not isinstance(item, (int, float)):
                continue
            if not (item >= 0 and item <= bound):  # (NaN fails too)
                raise UserError(key, f"{path} sets {name} to {str(value)[:80]}, past any published model's",
                                f"{name} of at most {bound}")



# The most a weights file of each kind may hold before it is hashed or read (a 1 TB sparse "VAE" hung the plan
# hashing its zeros): far above every published file -- a VAE's 335 MB in float32, SDXL's refiner UNet 9.1 GB and
# its second text encoder 2.8 GB, FLUX.1 LoRAs of a few GB, textual-inversion embeddings of kilobytes.
WEIGHT_BOUNDS = {"vae": 4 << 30, "refiner": 32 << 30, "lora": 16 << 30, "embedding": 64 << 20}


def bounded_weights(files: list[Path], kind: str, key: str) -> list[Path]:
    """``files`` (the weights of a ``kind`` of WEIGHT_BOUNDS), each a regular file within the bound, or one line."""
    bound = WEIGHT_BOUNDS[kind]
    for file in files:
        info = os.stat(file)
        if not stat.S_ISREG(info.st_mode):
            raise UserError(key, f"{file} is not a regular file", f"a {kind} weights file")
        if info.st_size > bound:
            raise UserError(key, f"{file} has {info.st_size / 1e9:.1f} GB, more than any published {kind} file "
                            "holds; it is not hashed or read", f"a {kind} weights file of at most {bound / 1e9:.1f} GB")
    return files
