"""Compiled executables kept across processes, so a warm start skips tracing and lowering too.

JAX's persistent compilation cache skips XLA's compile, but a new process still traces and lowers
the whole sampling loop (seconds for a tiny model, much more for a full-size one) just to find the
cache entry. Here the compiled executable itself is serialized
(``jax.experimental.serialize_executable``) under a key of everything that determines the program:

    inputs     the pytree structure, shapes, dtypes and shardings of every argument
    program    for generation: parallel mode, steps, height, width, attention, the pipeline,
               UNet, VAE and text encoder configs, the scheduler and its config; for the CLIP
               score (metrics/clip_score.py): the CLIP model's class and config
    machine    platform, device kind and ids, process count, XLA_FLAGS, x64
    code       jax, jaxlib, flax, diffusers, transformers, numpy and Python versions, and a hash of
               this package's source

Anything that differs gives another key: the run traces as before and stores its executable. A
file that cannot be read or loaded is ignored the same way, and one that loads but fails at its
first call is removed and the program traced instead (the run says which path it took in
``timings.json``: ``compile_path``). The files live in ``compilation_cache.dir/executables/``,
which the config checks already require to be writable only by its owner (the same ownership check
as JAX's cache), since loading one runs what it holds. Beside each generate program's key, the
FLOPs of a batch are kept (``<key>.flops.json``), so a warm start needs no second lowering to
count them.

What is kept, and why not more (measured with jaxlib 0.10.2 on CPU):

- only programs XLA compiled in this process: an executable that JAX's persistent compilation
  cache served serializes without the kernels that cache entry loaded, and a new process that
  loads it fails at its first call (``NOT_FOUND: Function add_select_fusion not found``). So a
  program whose key is not stored yet is compiled afresh, past the persistent cache (one full XLA
  compile per program and code version), and then stored;
- both parallel modes: JAX (since 0.10) runs ``jax.pmap`` as ``jit`` of a ``shard_map``, so the guide's
  pmapped program compiles to an executable that serializes like the sharded path's (the
  tests check that a stored one makes the traced one's images bit for bit, in both modes);
- only single-process runs: a multi-host program is tied to its peers.
"""

from __future__ import annotations

import functools
import hashlib
import hmac
import json
import logging
import os
import pickle
import platform
from pathlib import Path
from typing import Any, Optional

from sdjax_runner import process
from sdjax_runner.console import one_line
from sdjax_runner.files import private_folder, untrusted, write_private

log = logging.getLogger("sdjax_runner")

SUBDIR = "executables"
FORMAT = 2  # bump when what is stored changes (2: signed)
# A stored executable is MAGIC, then the HMAC-SHA256 of the rest under this cache's key, then the pickle.
# JAX's deserialize_and_load unpickles too, so nothing of a file is unpickled before its signature checks:
# a file planted by someone without the key, or damaged (one flipped byte), is never loaded.
MAGIC = b"sdjax-executable-2\n"
KEY_FILE = ".signing-key"  # 32 random bytes, mode 0600, made by the first process that stores an executable


def bound(max_bytes: Optional[int]) -> None:
    """Store no executable larger than ``max_bytes`` (the whole cache's bound, see compile_cache.trim)."""
    process.current().executable_max_bytes = max_bytes


@functools.cache
def source_hash() -> str:
    """SHA-256 of this package's Python source: code changes make new keys (read once per process)."""
    digest = hashlib.sha256()
    root = Path(__file__).resolve().parents[1]
    for path in sorted(root.rglob("*.py")):
        digest.update(path.relative_to(root).as_posix().encode())
        digest.update(path.read_bytes())
    return digest.hexdigest()


def key(program: list, args: tuple, devices: list) -> str:
    """The key of a program: ``program`` (what, besides its arguments, determines it) compiled for
    ``args`` on ``devices``, with this machine's and this code's facts."""
    import jax

    from sdjax_runner.versions import package_versions

    leaves, tree = jax.tree_util.tree_flatten(args)
    facts = {
        "format": FORMAT,
        "tree": str(tree),
        "leaves": [(tuple(leaf.shape), str(leaf.dtype), str(getattr(leaf, "sharding", ""))) for leaf in leaves],
        "program": program,
        "machine": [[d.platform, d.device_kind, d.id, d.process_index] for d in devices]
                   + [jax.process_count(), xla_flag_settings(os.environ.get("XLA_FLAGS", "")),
                      bool(jax.config.jax_enable_x64)],
        "code": [package_versions(), platform.python_version(), source_hash()],
    }
    return hashlib.sha256(json.dumps(facts, sort_keys=True, default=str).encode()).hexdigest()


def xla_flag_settings(flags: str) -> list[str]:
    """``XLA_FLAGS`` as the settings XLA reads from it: each flag's last value, in name order -- the same flags in
    another order (a device count set after the other flags, by the runner or a user) are the same program."""
    settings = {}
    for flag in flags.split():
        settings[flag.split("=", 1)[0]] = flag
    return [settings[name] for name in sorted(settings)]


def program_key(generator: Any, args: tuple) -> str:
    """The key of the generate program ``generator`` would compile for ``args``: its program spec
    (engine/program.py: every static setting), the model's structure and the arguments' layout."""
    import dataclasses

    from sdjax_runner.engine.families import FAMILIES

    program = [dataclasses.astuple(generator.spec), *FAMILIES[generator.spec.family].structure(generator.pipeline)]
    return key(program, args, generator.devices)


DECODER = "decoder-"  # before a decoding program's key (its .pkl and .flops.json files)


def decoder_key(generator: Any, args: tuple) -> str:
    """The key of the decoding program ``generator`` would compile for ``args``: its parallel mode, the placement of
    the weights, the attention and the model's structure (the decoder is the same for every sampling program of a
    model at one size); ``decoder-`` before the hash names its files for what they are."""
    from sdjax_runner.engine.families import FAMILIES

    spec = generator.spec
    program = ["decode", type(generator).__name__, spec.family, spec.parallel, spec.params, spec.attention,
               *FAMILIES[spec.family].structure(generator.pipeline)]
    return DECODER + key(program, args, generator.devices)


def _path(directory: str, key: str) -> Path:
    return Path(directory).expanduser() / SUBDIR / f"{key}.pkl"


def signing_key(directory: str) -> Optional[bytes]:
    """This cache's signing key, made if there is none; one that fails the checks (another user's, readable
    or writable by others, damaged) is replaced -- every executable signed with it is then traced again."""
    root = Path(directory).expanduser()
    folder = root / SUBDIR
    path = folder / KEY_FILE
    keys = process.current().signing_keys  # read once per process
    if keys.get(str(path)):
        return keys[str(path)]
    for _ in range(3):
        if os.path.lexists(path):
            why = untrusted(path, root)
            if why is None and os.lstat(path).st_mode & 0o077:
                why = "can be read by other users"
            data = path.read_bytes() if why is None else b""
            if why is None and len(data) == 32:
                keys[str(path)] = data
                return data
            log.warning("compile: signing key %s %s: replaced; the executables it signed are traced again", path,
                        why or "is damaged")
            path.unlink(missing_ok=True)
        try:
            private_folder(folder)
            tmp = folder / f".{KEY_FILE}.{os.getpid()}.tmp"
            write_private(tmp, os.urandom(32))
            try:
                os.link(tmp, path)  # appears whole, or not at all if another process made one first
            except FileExistsError:
                pass
            finally:
                tmp.unlink(missing_ok=True)
        except OSError as exc:
            log.info("compile: no signing key for stored executables (%s); none are kept", exc.strerror)
            return None
    return None


def _signature(key: bytes, payload: bytes) -> bytes:
    return hmac.new(key, payload, hashlib.sha256).digest()


def _verified(directory: str, path: Path) -> tuple[Optional[bytes], Optional[str]]:
    """(the stored pickle, None) if ``path`` passes the checks and carries this cache's signature, else
    (None, why not)."""
    why = untrusted(path, Path(directory).expanduser())
    if why:
        return None, why
    raw = path.read_bytes()
    key = signing_key(directory)
    if key is None:
        return None, "cannot be verified (no signing key)"
    signature, payload = raw[len(MAGIC):len(MAGIC) + 32], raw[len(MAGIC) + 32:]
    if not raw.startswith(MAGIC) or not hmac.compare_digest(signature, _signature(key, payload)):
        return None, "does not carry this cache's signature (damaged, or not written by this cache)"
    return payload, None


def fits(compiled: Any, args: tuple) -> bool:
    """Whether ``compiled`` takes exactly ``args``: the same tree, and leaves of the same shapes and dtypes."""
    import jax
    import numpy as np

    if compiled.in_tree != jax.tree_util.tree_structure((tuple(args), {})):
        return False
    expected = [(tuple(np.shape(leaf)), np.dtype(jax.dtypes.canonicalize_dtype(leaf.dtype)))  # host int64 -> int32
                for leaf in jax.tree_util.tree_leaves(args)]
    return expected == [(tuple(a.shape), np.dtype(a.dtype)) for a in jax.tree_util.tree_leaves(compiled.args_info)]


def load(directory: str, key: str, devices: list, args: tuple) -> Optional[Any]:
    """The executable stored under ``key`` for a call with ``args``, or None (absent, unreadable,
    refused, or a program that takes other arguments)."""
    from jax.experimental.serialize_executable import deserialize_and_load

    path = _path(directory, key)
    if not os.path.lexists(path):
        return None
    try:
        payload, why = _verified(directory, path)
    except OSError as exc:
        payload, why = None, f"cannot be read ({exc.strerror})"
    if payload is None:  # then ``why`` says why
        log.warning("compile: stored executable %s not usable: it %s; removed, tracing instead", path.name, why)
        discard(directory, key)
        return None
    try:
        stored = pickle.loads(payload)
        # Checked before XLA sees it: XLA ends the process (no exception) on a program for another device count.
        if "num_devices" not in stored:
            log.info("compile: stored executable %s was kept by an earlier runner (no device count); tracing",
                     path.name)
            discard(directory, key)
            return None
        if stored["num_devices"] != len(devices):
            log.warning("compile: stored executable %s not usable: it was compiled for %s devices, this program runs "
                        "on %d; removed, tracing instead", path.name, stored["num_devices"], len(devices))
            discard(directory, key)
            return None
        compiled = deserialize_and_load(stored["executable"], stored["in_tree"], stored["out_tree"],
                                        execution_devices=devices)
    except Exception as exc:  # a damaged or foreign file: trace instead, and overwrite it
        log.info("compile: stored executable %s not usable (%s: %s); tracing", path.name, type(exc).__name__,
                 one_line(exc, 120))
        return None
    if not fits(compiled, args):  # another program under this key: it would fail at its first call
        log.warning("compile: stored executable %s not usable: it takes other arguments than this program; "
                    "removed, tracing instead", path.name)
        discard(directory, key)
        return None
    try:
        os.utime(path)  # used now: among the last to go when the cache is over its bound
    except OSError:
        pass
    return compiled


def discard(directory: str, key: str) -> None:
    """Remove the executable stored under ``key`` (one that loaded but failed when run)."""
    try:
        _path(directory, key).unlink(missing_ok=True)
    except OSError:
        pass


def save(directory: str, key: str, compiled: Any, devices: list) -> bool:
    """Store ``compiled``, a program for ``devices`` (atomically); False if it cannot be serialized or written (the
    run goes on)."""
    from jax.experimental.serialize_executable import serialize

    path = _path(directory, key)
    try:
        executable, in_tree, out_tree = serialize(compiled)
        data = pickle.dumps({"executable": executable, "in_tree": in_tree, "out_tree": out_tree,
                             "num_devices": len(devices)})
        largest = process.current().executable_max_bytes
        if largest is not None and len(data) > largest:
            log.info("compile: executable not kept (%.1f MB is more than compilation_cache.max_size_gb)", len(data) / 1e6)
            return False
        signer = signing_key(directory)
        if signer is None:
            return False
        write_private(path, MAGIC + _signature(signer, data) + data)
    except Exception as exc:
        log.info("compile: executable not kept (%s: %s)", type(exc).__name__, one_line(exc, 120))
        return False
    return True


def _flops_path(directory: str, key: str) -> Path:
    return Path(directory).expanduser() / SUBDIR / f"{key}.flops.json"


def load_flops(directory: str, key: str) -> Optional[float]:
    """The FLOPs of one batch of program ``key``, if an earlier process counted them."""
    path = _flops_path(directory, key)
    if os.path.lexists(path) and untrusted(path, Path(directory).expanduser()):
        path.unlink(missing_ok=True)  # counted again and rewritten
        return None
    try:
        flops = json.loads(path.read_text(encoding="utf-8"))["flops_per_batch"]
        return float(flops) if flops is not None else None
    except (OSError, ValueError, KeyError, TypeError):
        return None


def save_flops(directory: str, key: str, flops: Optional[float]) -> None:
    """Keep the FLOPs of one batch of program ``key`` (atomically; a failure only costs a lowering later)."""
    path = _flops_path(directory, key)
    if flops is None or load_flops(directory, key) == flops:
        return
    try:
        private_folder(path.parent)
        write_private(path, json.dumps({"flops_per_batch": flops}).encode())
    except OSError:
        pass
