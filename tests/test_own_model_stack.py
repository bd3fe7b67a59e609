"""Issue #60: the runtime runs on its own modules. A run of an SD pipeline and of a FLUX.1 pipeline in the published
PyTorch layout imports neither diffusers nor transformers nor torch (a process of its own: what it imports is what is
tested), and the loaded pipelines hold the runner's own modules, tokenizers and schedulers. Flax weights that
transformers wrote in shards load as the whole file does."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import jax
import numpy as np
import pytest

FIXTURES = Path(__file__).resolve().parent / "fixtures"
LIBRARIES = {"diffusers", "transformers", "torch"}


def _imported(stderr: str) -> set[str]:
    return {line.split("|")[-1].strip() for line in stderr.splitlines() if line.startswith("import time:")}


@pytest.mark.slow
@pytest.mark.parametrize("model", ["tiny-sd", "tiny-flux-dev"])
def test_a_run_imports_no_diffusers_transformers_or_torch(tmp_path, tiny_model_dir, model):
    """(The session's built-in folder, and the committed PyTorch-layout FLUX.1 folder, are run as a user's local
    folders; building a built-in imports neither library either: tests/test_builtin_writer.py.)"""
    folder = tiny_model_dir if model == "tiny-sd" else FIXTURES / "flux" / model
    experiment = "smoke" if model == "tiny-sd" else "flux_smoke"
    result = subprocess.run([sys.executable, "-X", "importtime", "-m", "sdjax_runner", f"+experiment={experiment}",
                             "model=local", f"model.pretrained_model_name_or_path={folder}",
                             "metrics.clip_score.enabled=false", "tracking=none", f"hydra.run.dir={tmp_path / 'run'}"],
                            cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    imported = _imported(result.stderr)
    assert "jax" in imported and "flax" in imported and "tokenizers" in imported  # it ran a model
    assert not {name.split(".")[0] for name in imported} & LIBRARIES, sorted(
        name for name in imported if name.split(".")[0] in LIBRARIES)[:5]
    assert len(list((tmp_path / "run").rglob("*.png"))) >= 2  # the images and their grid


@pytest.mark.slow
def test_neither_diffusers_nor_transformers_is_a_dependency_of_the_runtime():
    """So transformers 5 (no Flax) installs beside the runner (checked on 2026-11-28: ``pip install --dry-run .
    "transformers>=5"`` resolves, transformers 5.15.1); the test extra keeps their last Flax releases as references."""
    import tomllib

    project = tomllib.loads((Path(__file__).resolve().parents[1] / "pyproject.toml").read_text())["project"]

    def names(requirements: list[str]) -> set[str]:
        return {re.split(r"[<>=!\[; ]", requirement, maxsplit=1)[0].lower() for requirement in requirements}

    assert len(project["dependencies"]) > 10
    assert not names(project["dependencies"]) & LIBRARIES
    assert names(project["optional-dependencies"]["test"]) >= {"diffusers", "transformers"}
    assert "torch" not in names(project["optional-dependencies"]["test"])


def test_the_loaded_sd_pipeline_is_the_runners_own(tiny_model_dir, tiny_xl_dir):
    from helpers.configs import compose_cfg
    from sdjax_runner.families.sd.models.pipeline import SDPipeline, SDXLPipeline
    from sdjax_runner.models.loaders import load_model

    for folder, cls in ((tiny_model_dir, SDPipeline), (tiny_xl_dir, SDXLPipeline)):
        cfg = compose_cfg(["model=local", f"model.pretrained_model_name_or_path={folder}"])
        pipeline = load_model(cfg.model, cfg.dtype).pipeline
        assert type(pipeline) is cls
        modules = [pipeline.unet, pipeline.vae, pipeline.text_encoder, pipeline.tokenizer,
                   *([pipeline.text_encoder_2, pipeline.tokenizer_2] if cls is SDXLPipeline else [])]
        assert all(type(module).__module__.startswith("sdjax_runner.") for module in modules), modules
    assert pipeline.text_encoder_2.with_projection and not pipeline.text_encoder.with_projection


def test_flax_weights_in_transformers_shards_load_as_the_whole_file(tmp_path):
    """transformers writes a large Flax model as ``flax_model-0000N-of-0000M.msgpack`` files of flat ``a/b/c`` keys
    and ``flax_model.msgpack.index.json``: read as the single file is."""
    import json

    from flax.serialization import msgpack_serialize
    from flax.traverse_util import flatten_dict

    from sdjax_runner.models.checkpoints import read_flax
    from sdjax_runner.models.nn.clip import CLIPTextModel

    module = CLIPTextModel(vocab_size=50, hidden_size=16, intermediate_size=32, num_hidden_layers=2,
                           num_attention_heads=2, max_position_embeddings=12, eos_token_id=2)
    rng = np.random.default_rng(0)
    params = jax.tree_util.tree_map(lambda s: rng.standard_normal(s.shape).astype(np.float32),
                                    jax.eval_shape(module.init_weights, jax.random.PRNGKey(0)))
    whole = tmp_path / "whole" / "flax_model.msgpack"
    whole.parent.mkdir()
    whole.write_bytes(msgpack_serialize(params))
    flat = {"/".join(key): value for key, value in flatten_dict(params).items()}
    names = sorted(flat)
    shards = {"flax_model-00001-of-00002.msgpack": names[: len(names) // 2],
              "flax_model-00002-of-00002.msgpack": names[len(names) // 2:]}
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    for shard, keys in shards.items():
        (sharded / shard).write_bytes(msgpack_serialize({key: flat[key] for key in keys}))
    weight_map = {key: shard for shard, keys in shards.items() for key in keys}
    (sharded / "flax_model.msgpack.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    expected = flatten_dict(read_flax(whole, module, "transformers"))
    got = flatten_dict(read_flax(sharded / "flax_model.msgpack", module, "transformers"))
    assert got.keys() == expected.keys() == flatten_dict(params).keys()
    assert all(np.array_equal(got[key], expected[key]) for key in expected)


@pytest.mark.parametrize(("saved", "sample_size", "read"), [("0.6.0", 32, 64), ("0.8.0.dev0", 32, 64),
                                                             ("0.9.0", 32, 32), ("0.6.0", 96, 96), (None, 32, 32)])
def test_a_unet_saved_before_diffusers_0_9_with_a_small_sample_size_is_read_as_64(tmp_path, saved, sample_size, read):
    """diffusers' Flax SD pipeline's rule (CompVis' SD 1.x configs say 32; their images are 512 px)."""
    import json

    import jax.numpy as jnp

    from sdjax_runner.models.loading import build_module

    (tmp_path / "unet").mkdir()
    config = {"sample_size": sample_size, **({"_diffusers_version": saved} if saved else {})}
    (tmp_path / "unet" / "config.json").write_text(json.dumps(config))
    # as the loader builds every UNet (a pipeline's, a refiner's) from its folder
    assert build_module(tmp_path / "unet", "UNet2DConditionModel", jnp.float32).config.sample_size == read


def test_applied_layers_read_their_parameters_without_tracing_initialisers():
    """models/nn/layers.py: applying a module traces no initialiser (linen's param would trace one per parameter:
    jax.eval_shape of it), gives linen's outputs, and a parameter of the wrong shape is linen's error still."""
    import flax.linen as nn
    from flax.errors import ScopeParamShapeError

    from sdjax_runner.models.nn import layers

    class Block(layers.Module):
        @nn.compact
        def __call__(self, x):
            x = layers.GroupNorm(num_groups=2)(layers.Conv(4, (3, 3))(x))
            return layers.Dense(3)(layers.LayerNorm()(x)) * self.param("gain", nn.initializers.ones, (3,))

    class LinenBlock(nn.Module):
        @nn.compact
        def __call__(self, x):
            x = nn.GroupNorm(num_groups=2)(nn.Conv(4, (3, 3))(x))
            return nn.Dense(3)(nn.LayerNorm()(x)) * self.param("gain", nn.initializers.ones, (3,))

    x = jax.random.normal(jax.random.PRNGKey(1), (1, 5, 5, 2))
    params = Block().init(jax.random.PRNGKey(0), x)
    linen_params = LinenBlock().init(jax.random.PRNGKey(0), x)
    assert jax.tree_util.tree_all(jax.tree_util.tree_map(np.array_equal, params, linen_params))  # the same names
    initialisers = []
    original = jax.eval_shape
    try:
        jax.eval_shape = lambda *a, **k: initialisers.append(a) or original(*a, **k)
        out = jax.jit(Block().apply).lower(params, x).compile()(params, x)
        assert initialisers == []
        jax.eval_shape = original
        linen_out = jax.jit(LinenBlock().apply).lower(linen_params, x).compile()(linen_params, x)
    finally:
        jax.eval_shape = original
    np.testing.assert_array_equal(out, linen_out)
    wrong = jax.tree_util.tree_map(lambda a: a, params)
    wrong["params"]["Dense_0"]["kernel"] = np.zeros((5, 3), np.float32)
    with pytest.raises(ScopeParamShapeError, match="Dense_0"):
        Block().apply(wrong, x)
