"""Weights split across devices (``parallelism.params=sharded``): where each weight is split, and how a device
makes it whole again inside the per-device program (engine/sharded.py places and lowers; a family may gather some
weights itself, block by block: families/flux/engine/family.py)."""

from __future__ import annotations

import numpy as np

MIN_SPLIT = 4096  # weights with fewer elements (norm scales, biases) stay replicated: splitting them saves nothing


def split_spec(shape: tuple, devices: int):
    """The PartitionSpec a weight of ``shape`` is placed with: ``data`` on its largest axis that ``devices``
    divides, or replicated (small, or no such axis)."""
    import jax

    if int(np.prod(shape)) < MIN_SPLIT:
        return jax.P()
    axes = sorted((axis for axis, size in enumerate(shape) if size % devices == 0), key=lambda a: (-shape[a], a))
    if not axes:
        return jax.P()
    parts: list = [None] * len(shape)
    parts[axes[0]] = "data"
    return jax.P(*parts)


def spec_of(leaf):
    """A placed leaf's PartitionSpec (replicated where it has none)."""
    import jax

    sharding = getattr(leaf, "sharding", None)
    return sharding.spec if isinstance(sharding, jax.NamedSharding) else jax.P()


def gather(leaf, spec):
    """Inside the per-device program: ``leaf`` whole, its ``data`` axis (if any) gathered from every device."""
    import jax

    for axis, name in enumerate(spec):
        if name == "data":
            return jax.lax.all_gather(leaf, "data", axis=axis, tiled=True)
    return leaf


def gather_tree(tree, specs):
    import jax

    return jax.tree_util.tree_map(gather, tree, specs, is_leaf=lambda node: isinstance(node, jax.P))
