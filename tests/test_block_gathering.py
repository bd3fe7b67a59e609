"""parallelism.params=sharded for the flow transformers (FLUX.1, SD 3 / 3.5): each family's ``split_weights``
(families/flux/engine/family.py, families/sd3/engine/family.py) makes the transformer gather one block's split weights at a time.
Checked on the compiled per-device program itself, on 8 CPU devices: the same numbers as gathering every weight
whole as the program starts, in less memory -- XLA's plan holds one block whole, not all of them."""

from __future__ import annotations

import dataclasses
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sdjax_runner.engine.split import gather_tree, split_spec
from sdjax_runner.families.flux.engine import family as flux_family
from sdjax_runner.families.flux.models.transformer import FlaxFluxTransformer
from sdjax_runner.families.sd3.engine import family as sd3_family
from sdjax_runner.families.sd3.models.transformer import FlaxSD3Transformer

DEVICES = 8


@dataclasses.dataclass
class Holder:
    """What split_weights reads and replaces of a pipeline: its transformer."""

    transformer: Any


def sd3() -> tuple[Any, Any, dict]:
    """An SD 3.5 Medium-shaped MMDiT (q/k norm, dual attention in block 0; the last block context_pre_only) wide
    enough that its weights outweigh the activations of one 4x4 latent."""
    module = FlaxSD3Transformer(sample_size=4, patch_size=2, in_channels=16, num_layers=6, attention_head_dim=16,
                                num_attention_heads=8, joint_attention_dim=64, caption_projection_dim=128,
                                pooled_projection_dim=32, out_channels=16, pos_embed_max_size=4,
                                dual_attention_layers=(0,), qk_norm="rms_norm")
    inputs = dict(hidden_states=jnp.ones((1, 4, 4, 16)), encoder_hidden_states=jnp.ones((1, 3, 64)),
                  pooled_projections=jnp.ones((1, 32)), timestep=jnp.full((1,), 500.0))
    return module, sd3_family.split_weights, inputs


def flux() -> tuple[Any, Any, dict]:
    module = FlaxFluxTransformer(in_channels=16, num_layers=3, num_single_layers=3, attention_head_dim=16,
                                 num_attention_heads=8, joint_attention_dim=64, pooled_projection_dim=32,
                                 guidance_embeds=True, axes_dims_rope=(4, 6, 6))
    inputs = dict(hidden_states=jnp.ones((1, 4, 16)), encoder_hidden_states=jnp.ones((1, 3, 64)),
                  pooled_projections=jnp.ones((1, 32)), timestep=jnp.full((1,), 0.5), img_ids=jnp.zeros((4, 3)),
                  txt_ids=jnp.zeros((3, 3)), guidance=jnp.full((1,), 3.5))
    return module, flux_family.split_weights, inputs


@pytest.mark.slow
@pytest.mark.parametrize("build", [sd3, flux], ids=["sd3", "flux"])
def test_split_weights_are_gathered_one_block_at_a_time(build):
    module, split_weights, inputs = build()
    params = module.init_weights(jax.random.key(0))
    specs = {"transformer": jax.tree_util.tree_map(lambda leaf: split_spec(leaf.shape, DEVICES), params)}
    mesh = jax.make_mesh((DEVICES,), ("data",))
    blockwise, gathers_itself = split_weights(Holder(module), specs)
    gathered = {key for key in params if gathers_itself("transformer", key)}
    assert gathered and all("blocks_" in key for key in gathered) and len(gathered) < len(params)

    def program(by_block: bool):
        def per_device(p, batch):
            if by_block:
                p = {key: value if key in gathered else gather_tree(value, specs["transformer"][key])
                     for key, value in p.items()}
                return blockwise.transformer.apply({"params": p}, **batch)
            return module.apply({"params": gather_tree(p, specs["transformer"])}, **batch)

        mapped = jax.shard_map(per_device, mesh=mesh, in_specs=(specs["transformer"], jax.P()), out_specs=jax.P(),
                               check_vma=False)
        placed = jax.device_put(params, jax.tree_util.tree_map(lambda s: jax.NamedSharding(mesh, s),
                                                                 specs["transformer"]))
        compiled = jax.jit(mapped).lower(placed, inputs).compile()
        return np.asarray(compiled(placed, inputs)), compiled.memory_analysis().temp_size_in_bytes

    whole_out, whole_temp = program(by_block=False)
    block_out, block_temp = program(by_block=True)
    np.testing.assert_array_equal(block_out, whole_out)
    weight_bytes = sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(params))
    assert whole_temp > 0.9 * weight_bytes  # every weight whole at once
    assert block_temp < 0.5 * whole_temp  # one block's at a time
