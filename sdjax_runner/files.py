"""Files written whole, and cache files checked before they are read: what every layer that keeps a file
(the caches, the run records) shares.

Every file is written whole: into a temporary file made new in the same folder (``mkstemp``: created
exclusively, so a link planted under any name there is never followed) and renamed over its name (a link at
the name itself is replaced, not written through). ``report`` and ``resume`` write into folders someone may
have handed you; nothing they write lands outside them.

Files read back from the caches are checked on every read: a stored executable or a JAX cache entry is
code this process runs, so another user who could plant one would run code as you. A cache file may be
read only if it is a regular file (not a link), and it and every folder from it up to the cache's top
folder belong to you (or root) and are writable by nobody else. The caches create their folders and files
private (0700 / 0600), whatever the umask, so a run under ``umask 000`` does not open them up. What fails
the check is named in one line, removed and rebuilt, never read.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import json
import logging
import os
import stat
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any, Optional

from sdjax_runner.console import one_line


def write_json(path: Path, data: Any, last_resort_in_place: bool = False) -> None:
    """``data`` as JSON, written as :func:`write_text` writes. ``last_resort_in_place``: on a disk too
    full for a second copy, overwrite the file itself (status.json must say how a run ended if it can)."""
    write_text(path, json.dumps(data, indent=2, sort_keys=True, default=str) + "\n", last_resort_in_place)


def write_text(path: Path, text: str, last_resort_in_place: bool = False) -> None:
    """Write atomically: a reader never sees half a file, and a failed write (a full disk) leaves
    the old file as it was and no temporary file behind."""
    try:
        with replaced(path, "w", encoding="utf-8") as file:
            file.write(text)
    except OSError:
        if not (last_resort_in_place and path.is_file() and not path.is_symlink()):
            raise
        fd = os.open(path, os.O_WRONLY | os.O_TRUNC | os.O_NOFOLLOW)
        with os.fdopen(fd, "w", encoding="utf-8") as file:
            file.write(text)


@contextlib.contextmanager
def replaced(path: Path, mode: str = "wb", private: bool = False, **open_args: Any) -> Iterator[IO[Any]]:
    """A file object whose content replaces ``path`` whole when the block ends: a temporary file created
    exclusively beside it (never a link's target) and renamed over ``path`` (a link there is replaced, not
    followed); if the block fails, ``path`` is as it was and the temporary file is gone. Mode: 0600 where
    ``private``, else what ``open`` would have given (0666 less the umask)."""
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, 0o600 if private else 0o666 & ~_umask())
        with os.fdopen(fd, mode, **open_args) as file:
            yield file
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise


def _umask() -> int:
    """This process's umask, read without changing it (Linux), else by setting and restoring it."""
    try:
        with open("/proc/self/status", encoding="ascii") as status:
            return next(int(line.split()[1], 8) for line in status if line.startswith("Umask:"))
    except (OSError, StopIteration, ValueError):
        mask = os.umask(0o022)
        os.umask(mask)
        return mask


class UnreadableRecord(ValueError):
    """A record file refused unread or unparsed: larger than its bound, not a regular file, nested too
    deep, a YAML alias or a tag that makes objects. The message is one line, without the path."""


JSON_BYTES = 256 << 20  # images.json of a run's largest allowed image count fits with room to spare
YAML_BYTES = 16 << 20  # Hydra's records (.hydra/*.yaml, multirun.yaml): a config, its prompts included
MAX_DEPTH = 64  # our records nest 5 deep; this keeps every reader's recursion far from Python's limit
MAX_YAML_NODES = 1_000_000


def read_bounded_text(path: Path, limit: int) -> str:
    """``path``'s text, refused unread if it is not a regular file (a FIFO is not waited on) or holds
    more than ``limit`` bytes. OSError where it cannot be opened, UnicodeDecodeError if not UTF-8."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as file:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise UnreadableRecord("is not a regular file")
        if info.st_size > limit:
            raise UnreadableRecord(f"has {info.st_size / 1e6:.1f} MB (allowed: a record of at most {limit >> 20} MB)")
        data = file.read(limit + 1)
    if len(data) > limit:
        raise UnreadableRecord(f"has over {limit >> 20} MB (allowed: a record of at most {limit >> 20} MB)")
    return data.decode("utf-8")


def read_json(path: Path, limit: int = JSON_BYTES) -> Any:
    """A JSON record, bounded in size (``limit`` bytes) and depth (:data:`MAX_DEPTH`):
    :class:`UnreadableRecord` (a ValueError) otherwise."""
    try:
        value = json.loads(read_bounded_text(path, limit))
    except RecursionError:
        raise UnreadableRecord(f"is nested deeper than Python can read (allowed: at most {MAX_DEPTH} levels)") from None
    _check_depth(value)
    return value


def _check_depth(value: Any) -> None:
    level = [value]
    for _ in range(MAX_DEPTH + 1):
        level = [child for node in level if isinstance(node, (dict, list))
                 for child in (node.values() if isinstance(node, dict) else node)]
        if not level:
            return
    raise UnreadableRecord(f"is nested deeper than {MAX_DEPTH} levels (allowed: at most {MAX_DEPTH})")


def read_yaml_text(path: Path, limit: int = YAML_BYTES) -> str:
    """A YAML record's text, checked before anything is built from it: bounded in size, depth and node
    count, and without aliases (``*name``: what Hydra and OmegaConf write never has them, and a few
    nested ones expand into gigabytes -- an alias bomb). The text is then safe to load with any safe
    loader (OmegaConf.create, yaml's CSafeLoader). :class:`UnreadableRecord` otherwise."""
    import yaml

    text = read_bounded_text(path, limit)
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)):
            if isinstance(event, yaml.AliasEvent):
                raise UnreadableRecord(f"uses a YAML alias (*{event.anchor}); records are written without them")
            if isinstance(event, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    raise UnreadableRecord(f"is nested deeper than {MAX_DEPTH} levels (allowed: at most {MAX_DEPTH})")
            elif isinstance(event, yaml.CollectionEndEvent):
                depth -= 1
            nodes += 1
            if nodes > MAX_YAML_NODES:
                raise UnreadableRecord(f"has over {MAX_YAML_NODES} YAML nodes")
    except yaml.YAMLError as exc:
        raise UnreadableRecord(f"is not valid YAML ({one_line(exc)})") from None
    return text


def read_yaml(path: Path, limit: int = YAML_BYTES) -> Any:
    """A YAML record as plain data (:func:`read_yaml_text`'s checks, then YAML's safe loader: a tag that
    would make a Python object, ``!!python/object``, is refused)."""
    import yaml

    text = read_yaml_text(path, limit)
    try:
        return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    except yaml.YAMLError as exc:
        raise UnreadableRecord(f"cannot be read as YAML ({one_line(exc)})") from None


def read_config_record(path: Path, limit: int = YAML_BYTES) -> Any:
    """A YAML record Hydra wrote (``.hydra/config.yaml``, ``overrides.yaml``, ``multirun.yaml``) as an
    OmegaConf object, read as :func:`read_yaml` reads (interpolations are kept, not resolved)."""
    import yaml
    from omegaconf import OmegaConf

    text = read_yaml_text(path, limit)
    try:
        return OmegaConf.create(text)
    except yaml.YAMLError as exc:
        raise UnreadableRecord(f"cannot be read as YAML ({one_line(exc)})") from None


OTHERS_WRITE = stat.S_IWGRP | stat.S_IWOTH


def _unsafe(info: os.stat_result) -> Optional[str]:
    if info.st_uid not in (os.getuid(), 0):
        return f"belongs to another user (uid {info.st_uid})"
    if info.st_mode & OTHERS_WRITE:
        return "can be written by other users"
    return None


def untrusted(path: Path, root: Path) -> Optional[str]:
    """Why ``path``, a file under the cache folder ``root``, must not be read -- or None."""
    try:
        info = os.lstat(path)
    except OSError as exc:
        return f"cannot be checked ({exc.strerror})"
    if not stat.S_ISREG(info.st_mode):
        return "is not a regular file"
    why = _unsafe(info)
    if why:
        return why
    top = os.path.realpath(root)
    folder = os.path.realpath(path.parent)
    while True:
        try:
            why = _unsafe(os.stat(folder))
        except OSError as exc:
            return f"cannot be checked ({exc.strerror})"
        if why:
            return f"is in {folder}, which {why}"
        if folder == top or os.path.dirname(folder) == folder or not folder.startswith(top):
            return None
        folder = os.path.dirname(folder)


def private_folder(path: Path) -> None:
    """Create ``path`` (and its missing parents) readable and writable by you alone."""
    missing = []
    while not path.exists():
        missing.append(path)
        path = path.parent
    for folder in reversed(missing):
        try:
            folder.mkdir(mode=0o700)
        except FileExistsError:
            pass


def write_private(path: Path, data: bytes) -> None:
    """Write ``path`` whole (a private temporary file, renamed) with mode 0600."""
    with replaced(path, "wb", private=True) as file:
        file.write(data)


def not_a_file(path: Path) -> Optional[str]:
    """Why ``path`` cannot be read as a file (``no such file``, or ``not a regular file``: a directory, a
    FIFO), or None."""
    if path.is_file():
        return None
    if path.is_symlink() and not path.exists():
        return "a symbolic link to nothing"
    return "not a regular file" if path.exists() else "no such file"


# What a folder path that cannot be made must be instead (the allowed part of its one-line error).
FOLDER_PATHS = "a path whose existing parts are folders"


def cannot_make_folder(path: Path) -> Optional[str]:
    """Why ``path`` cannot be made a folder -- one of it and its parents exists and is not a folder (ENOTDIR),
    e.g. ``P cannot be made: F is a file, not a folder`` -- or None."""
    for candidate in [path, *path.parents]:
        if os.path.lexists(candidate):
            if candidate.is_dir():
                return None
            what = "a symbolic link to nothing" if not candidate.exists() else "a file"
            return f"{path} cannot be made: {candidate} is {what}, not a folder"
    return None


def file_sha256(path: Path) -> str:
    """SHA-256 of a weights file (kept per process while the file is the same file, unchanged: its inode,
    size, mtime and ctime -- a copy over it that keeps the mtime still changes the ctime -- so a sweep
    hashes a multi-GB checkpoint once)."""
    info = Path(path).stat()
    return _sha256(str(path), info.st_size, info.st_mtime_ns, info.st_ino, info.st_ctime_ns)


@functools.lru_cache(maxsize=64)
def _sha256(path: str, size: int, mtime_ns: int, inode: int, ctime_ns: int) -> str:
    if size >= 200_000_000:
        logging.getLogger("sdjax_runner").info("hash: %s (%.1f GB) ...", Path(path).name, size / 1e9)
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        for chunk in iter(lambda: file.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()
