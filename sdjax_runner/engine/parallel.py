"""The parallel modes a run can select (``parallelism.mode``), each one strategy: how the params and the
inputs are placed on the devices, and how the generation program (:mod:`.program`) is lowered for them."""

from __future__ import annotations

from sdjax_runner.engine.generate import Generator
from sdjax_runner.engine.pmap import PmapGenerator
from sdjax_runner.engine.sharded import ShardedGenerator

PARALLEL: dict[str, type[Generator]] = {"pmap": PmapGenerator, "sharded": ShardedGenerator}
