"""Multi-host runs through JAX's own runtime: one process per host, initialised once.

Every process runs the same command; each feeds only its local devices (the sharded path
builds global arrays shard by shard), results are gathered, and process 0 alone writes files
and logs to the tracker. At the end the processes agree on the outcome, so all of them exit
with the same status.
"""

from __future__ import annotations

import socket
import time
from typing import Optional

import numpy as np

from sdjax_runner import process
from sdjax_runner.config import checks
from sdjax_runner.config.schema import ParallelismConfig
from sdjax_runner.errors import UserError


def initialize(parallelism: ParallelismConfig) -> None:
    """``jax.distributed.initialize`` once per process, also across the jobs of a multirun."""
    checks.distributed(parallelism)
    dist = parallelism.distributed
    if not dist.enabled:
        return
    settings = (dist.coordinator_address, dist.num_processes, dist.process_id)
    state = process.current()  # the settings this process was initialised with, if any
    if state.distributed is not None:
        if state.distributed != settings:
            raise UserError("parallelism.distributed", "this process is already part of a JAX cluster with "
                            f"coordinator_address, num_processes, process_id = {state.distributed}")
        return
    import jax

    if dist.coordinator_address is None:  # TPU pods, SLURM, ... detect their own settings
        jax.distributed.initialize(initialization_timeout=dist.timeout_s)
    else:
        # checks.distributed: the three are given together
        assert dist.num_processes is not None and dist.process_id is not None
        rendezvous(dist.coordinator_address, dist.num_processes, dist.process_id, dist.timeout_s)
        jax.distributed.initialize(dist.coordinator_address, dist.num_processes, dist.process_id,
                                   initialization_timeout=dist.timeout_s)
    state.distributed = settings


def rendezvous(address: str, num_processes: int, process_id: int, timeout_s: float) -> None:
    """Every process meets the coordinator (process 0) on its port before JAX's runtime starts, within
    ``timeout_s``; otherwise one line says who is missing. (JAX's own wait for a missing peer ends in a
    C++ abort that Python cannot catch.) Process 0 then frees the port for JAX's coordination service."""
    host, _, port = address.rpartition(":")
    deadline = time.monotonic() + timeout_s
    if num_processes == 1:
        return
    if process_id != 0:
        _meet_coordinator(host, int(port), process_id, deadline, address, timeout_s)
        return
    peers: dict[int, socket.socket] = {}
    try:
        with socket.create_server(("", int(port))) as server:
            while len(peers) < num_processes - 1:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    missing = sorted(set(range(1, num_processes)) - set(peers))
                    raise UserError("parallelism.distributed.timeout_s", f"{len(peers)} of {num_processes - 1} other "
                                    f"process(es) reached {address} within {timeout_s} s; missing process_id "
                                    f"{', '.join(map(str, missing))}", "start every process, or a larger timeout_s")
                server.settimeout(remaining)
                try:
                    conn, _ = server.accept()
                except TimeoutError:
                    continue
                peer = _hello(conn)
                if peer is None or peer in peers or not 0 < peer < num_processes:
                    conn.close()  # not one of ours (a port scan, a process of another run)
                    continue
                peers[peer] = conn
            for conn in peers.values():
                conn.sendall(_GO)
            for conn in peers.values():  # the peers close first: the port is not left in TIME_WAIT here
                conn.settimeout(10)
                try:
                    conn.recv(1)
                except OSError:
                    pass
    except OSError as exc:
        raise UserError("parallelism.distributed.coordinator_address", f"process 0 cannot listen on {address}: "
                        f"{exc.strerror or exc}", "a free port on this host") from None
    finally:
        for conn in peers.values():
            conn.close()


_HELLO = "sdjax-runner rendezvous "
_GO = b"go\n"


def _hello(conn: socket.socket) -> Optional[int]:
    conn.settimeout(5)
    try:
        words = conn.recv(64).decode("ascii", "replace")
    except OSError:
        return None
    if not words.startswith(_HELLO) or not words[len(_HELLO):].strip().isascii() \
            or not words[len(_HELLO):].strip().isdigit():
        return None
    return int(words[len(_HELLO):].strip())


def _meet_coordinator(host: str, port: int, process_id: int, deadline: float, address: str, timeout_s: float) -> None:
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise UserError("parallelism.distributed.timeout_s", f"process {process_id} found no coordinator "
                            f"(process 0) at {address} within {timeout_s} s", "start process 0, or a larger timeout_s")
        try:
            conn = socket.create_connection((host, port), timeout=min(2.0, remaining))
        except OSError:
            time.sleep(min(0.5, max(remaining, 0)))
            continue
        with conn:
            try:
                conn.sendall(f"{_HELLO}{process_id}\n".encode("ascii"))
                conn.settimeout(max(deadline - time.monotonic(), 0.1))
                if conn.recv(16) == _GO:
                    return
            except OSError:
                pass
        raise UserError("parallelism.distributed.timeout_s", f"the coordinator at {address} did not see every "
                        f"process within {timeout_s} s", "start every process, or a larger timeout_s")


def is_writer() -> bool:
    """Whether this process writes the outputs: process 0 of a cluster, or a process in none (known
    without starting JAX, so bad input can still be refused before it starts)."""
    if process.current().distributed is None:
        return True
    import jax

    return jax.process_index() == 0


def agree(failed: bool) -> bool:
    """Whether any process failed; a no-op (``failed``) for a single process."""
    import jax

    if jax.process_count() == 1:
        return failed
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(failed))).any())
