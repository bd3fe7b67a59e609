"""What each quality metric costs per image at its published size, against what the image cost to make: XLA's FLOP
count of each program, on the runner's own modules with the published configs (shapes only: no weights are made or
read, nothing runs).

    CLIP score   openai/clip-vit-large-patch14: the image tower at 224 px and the text tower on 77 tokens
    PickScore    yuvalkirstain/PickScore_v1 (LAION's CLIP ViT-H/14, gelu): both towers
    aesthetic    CLIP ViT-L/14's image tower and the predictor's five layers (768 -> 1024 -> 128 -> 64 -> 16 -> 1)
    CMMD         openai/clip-vit-large-patch14-336: the image tower at 336 px (per image embedded)
    generation   SD 1.x's UNet (sd-v1-arch) at 512x512, one guided step (batch 2) x 50 steps

    python benchmarks/metric_flops.py --out docs/metric_flops.json

The count is XLA's HloCostAnalysis of each function lowered for one image on the CPU backend; the same programs on a
GPU do the same arithmetic (a GPU's count leaves out cuDNN/cuBLAS calls: engine/efficiency.py).
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_common import machine_facts

VIT_L_14 = {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24, "num_attention_heads": 16,
            "patch_size": 14, "image_size": 224, "hidden_act": "quick_gelu"}
TEXT_L = {"hidden_size": 768, "intermediate_size": 3072, "num_hidden_layers": 12, "num_attention_heads": 12,
          "hidden_act": "quick_gelu", "vocab_size": 49408, "eos_token_id": 49407}
CONFIGS = {
    "clip_vit_l_14": {"projection_dim": 768, "vision_config": VIT_L_14, "text_config": TEXT_L},
    "pickscore_vit_h_14": {"projection_dim": 1024,
                           "vision_config": {"hidden_size": 1280, "intermediate_size": 5120, "num_hidden_layers": 32,
                                             "num_attention_heads": 16, "patch_size": 14, "image_size": 224,
                                             "hidden_act": "gelu"},
                           "text_config": {"hidden_size": 1024, "intermediate_size": 4096, "num_hidden_layers": 24,
                                           "num_attention_heads": 16, "hidden_act": "gelu", "vocab_size": 49408,
                                           "eos_token_id": 49407}},
    "clip_vit_l_14_336": {"projection_dim": 768, "vision_config": dict(VIT_L_14, image_size=336), "text_config": TEXT_L},
}
AESTHETIC_WIDTHS = (768, 1024, 128, 64, 16, 1)


def _shapes(tree):
    import jax

    return jax.tree_util.tree_map(lambda leaf: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype), tree)


def clip_flops(name: str, text: bool, mlp: bool = False) -> float:
    """FLOPs of one image through CLIP ``name``'s image tower (and its text tower on 77 tokens; and the aesthetic
    predictor's layers)."""
    import jax
    import jax.numpy as jnp

    from sdjax_runner.models.nn.clip import CLIPModel

    config = CONFIGS[name]
    module = CLIPModel.from_config({"architectures": ["CLIPModel"], "model_type": "clip", **config})
    params = jax.eval_shape(module.init_weights, jax.random.PRNGKey(0))
    size = config["vision_config"]["image_size"]
    pixels = jax.ShapeDtypeStruct((1, 3, size, size), jnp.float32)
    ids = jax.ShapeDtypeStruct((1, 77), jnp.int32)
    layers = [jax.ShapeDtypeStruct((n_out, n_in), jnp.float32) for n_in, n_out in itertools.pairwise(AESTHETIC_WIDTHS)]

    def score(p, x, t, weights):
        image = module.apply({"params": p}, x, method="image_features")
        out = jnp.sum(image)
        if text:
            out = out + jnp.sum(module.apply({"params": p}, t, jnp.ones_like(t), method="text_features"))
        if mlp:
            h = image / jnp.linalg.norm(image, axis=-1, keepdims=True)
            for w in weights:
                h = h @ w.T
            out = out + jnp.sum(h)
        return out

    lowered = jax.jit(score).lower(_shapes(params), pixels, ids, layers if mlp else [])
    return float(lowered.cost_analysis()["flops"])


def generation_flops(steps: int = 50, size: int = 512) -> float:
    """FLOPs of one SD 1.x image at ``size``: one guided UNet call (batch 2) per step, x ``steps`` (the text
    encoder and VAE left out: a lower bound)."""
    import jax
    import jax.numpy as jnp

    from sdjax_runner.families.sd.models.builtin import architecture

    modules, shapes = architecture("sd-v1-arch")
    unet = modules["unet"]
    latents = jax.ShapeDtypeStruct((2, 4, size // 8, size // 8), jnp.float32)
    timesteps = jax.ShapeDtypeStruct((2,), jnp.int32)
    context = jax.ShapeDtypeStruct((2, 77, 768), jnp.float32)

    def step(p, x, t, c):
        return unet.apply({"params": p}, x, t, encoder_hidden_states=c).sample

    return steps * float(jax.jit(step).lower(_shapes(shapes["unet"]), latents, timesteps, context)
                         .cost_analysis()["flops"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    generation = generation_flops()
    rows = {
        "CLIP score (CLIP ViT-L/14, image + text)": clip_flops("clip_vit_l_14", text=True),
        "PickScore (CLIP ViT-H/14, image + text)": clip_flops("pickscore_vit_h_14", text=True),
        "aesthetic score (CLIP ViT-L/14 image + MLP)": clip_flops("clip_vit_l_14", text=False, mlp=True),
        "CMMD (CLIP ViT-L/14 at 336 px, image)": clip_flops("clip_vit_l_14_336", text=False),
    }
    print(f"{'per image':50s} {'GFLOP':>10s} {'of generation':>14s}")
    print(f"{'SD 1.x 512x512, 50 guided steps (UNet only)':50s} {generation / 1e9:10.1f} {1:14.4f}")
    for name, flops in rows.items():
        print(f"{name:50s} {flops / 1e9:10.1f} {flops / generation:14.4f}")
    if args.out:
        args.out.write_text(json.dumps({"machine": machine_facts(), "generation_flops": generation,
                                        "metrics_flops": rows}, indent=1) + "\n")


if __name__ == "__main__":
    main()
