"""Multi-host runs through JAX's own runtime: one process per host, initialised once.

Every process runs the same command; each feeds only its local devices (the sharded path
builds global arrays shard by shard), results are gathered, and process 0 alone writes files
and logs to the tracker. At the end the processes agree on the outcome, so all of them exit
with the same status.
"""

from __future__ import annotations

from typing import Optional

import numpy as np
from omegaconf import DictConfig

from sdjax_runner.config import checks
from sdjax_runner.errors import UserError

_initialized: Optional[tuple] = None  # the settings this process was initialised with


def initialize(parallelism: DictConfig) -> None:
    """``jax.distributed.initialize`` once per process, also across the jobs of a multirun."""
    global _initialized
    checks.distributed(parallelism)
    dist = parallelism.distributed
    if not dist.enabled:
        return
    settings = (dist.coordinator_address, dist.num_processes, dist.process_id)
    if _initialized is not None:
        if _initialized != settings:
            raise UserError("parallelism.distributed", "this process is already part of a JAX cluster with "
                            f"coordinator_address, num_processes, process_id = {_initialized}")
        return
    import jax

    if dist.coordinator_address is None:
        jax.distributed.initialize()  # TPU pods, SLURM, ... detect their own settings
    else:
        jax.distributed.initialize(dist.coordinator_address, dist.num_processes, dist.process_id)
    _initialized = settings


def is_writer() -> bool:
    import jax

    return jax.process_index() == 0


def agree(failed: bool) -> bool:
    """Whether any process failed; a no-op (``failed``) for a single process."""
    import jax

    if jax.process_count() == 1:
        return failed
    from jax.experimental import multihost_utils

    return bool(np.asarray(multihost_utils.process_allgather(np.int32(failed))).any())
