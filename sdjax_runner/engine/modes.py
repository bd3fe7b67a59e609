"""The parallel modes a run can select (``parallelism.mode``), each one strategy: placement and lowering."""

from __future__ import annotations

from sdjax_runner.engine.generate import Generator
from sdjax_runner.engine.pmap import PmapGenerator
from sdjax_runner.engine.sharded import ShardedGenerator

MODES: dict[str, type[Generator]] = {"pmap": PmapGenerator, "sharded": ShardedGenerator}
