"""Textual-inversion embeddings (prompts.embeddings, issue #49), checked against NumPy computations of the text
encoder's input embeddings: an embedding whose vectors are the token-embedding rows of "red cube" (read from the
model's own table in NumPy) makes "a cubes on a table" the prompt "a red cube on a table" -- the same input
embeddings, so the same hidden states and, through the command line, the same images bit for bit; vectors of any
value give the hidden states of a text encoder whose vocabulary was extended by them (diffusers'
``load_textual_inversion``: new tokens, their rows appended to the table)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli

PHRASE = "red cube"
QUIET = ["tracking=none", "metrics.clip_score.enabled=false", "sampling.num_inference_steps=3",
         "parallelism.num_devices=2", "compilation_cache.executables=false"]


def _load(folder: Path):
    from sdjax_runner.config.schema import DtypeConfig, ModelConfig
    from sdjax_runner.models.loaders import load_model

    return load_model(ModelConfig(name="tiny", pretrained_model_name_or_path=str(folder)), DtypeConfig(name="fp32"))


def _rows(loaded, component: str, tokenizer) -> np.ndarray:
    """The token-embedding rows of PHRASE's tokens, read from the model's table in NumPy."""
    table = np.asarray(loaded.host_weights[component]["text_model"]["embeddings"]["token_embedding"]["embedding"])
    return table[tokenizer(PHRASE, add_special_tokens=False).input_ids]


@pytest.fixture(scope="module")
def sd(tiny_model_dir, tmp_path_factory):
    from safetensors.numpy import save_file

    loaded = _load(tiny_model_dir)
    root = tmp_path_factory.mktemp("embeddings")
    save_file({"emb_params": _rows(loaded, "text_encoder", loaded.pipeline.tokenizer)}, str(root / "cubes.safetensors"))
    rng = np.random.default_rng(0)
    width = loaded.pipeline.text_encoder.config.hidden_size
    save_file({"<shiny>": rng.standard_normal(width).astype(np.float32)}, str(root / "shiny.safetensors"))
    (root / "more").mkdir()
    save_file({"emb_params": rng.standard_normal((3, width)).astype(np.float32)}, str(root / "more" / "three.safetensors"))
    return loaded, root


def _entries(root: Path):
    from sdjax_runner.config.plan import embedding_records

    return embedding_records([str(root)])


def test_names_become_placeholder_ids_and_other_prompts_keep_the_guides_ids(sd):
    from sdjax_runner.engine.tokens import PromptTokens
    from sdjax_runner.models import embeddings

    loaded, root = sd
    pipeline = loaded.pipeline
    entries = _entries(root)
    assert [e.name for e in entries] == ["cubes", "three", "shiny"]  # the folder read recursively, in path order
    found = embeddings.load(entries, pipeline)
    tokens = PromptTokens(pipeline, "plain", found)
    vocabulary = pipeline.text_encoder.config.vocab_size
    plain = np.asarray(pipeline.prepare_inputs(["a table", "a photo of three, shiny"]))
    ids, _ = tokens(["a table", "a photo of three, shiny"], 0)
    assert np.array_equal(ids[0], plain[0])  # no name: the guide's ids
    tokenizer = pipeline.tokenizer
    cubes = len(tokenizer(PHRASE, add_special_tokens=False).input_ids)
    assert found.rows == {"cubes": (0, cubes), "three": (cubes, 3), "shiny": (cubes + 3, 1)}
    expected = ([tokenizer.bos_token_id] + tokenizer("a photo of", add_special_tokens=False).input_ids
                + [vocabulary + cubes + i for i in range(3)]  # three's rows, after cubes'
                + tokenizer(",", add_special_tokens=False).input_ids + [vocabulary + cubes + 3, tokenizer.eos_token_id])
    assert list(ids[1][:len(expected)]) == expected
    assert set(ids[1][len(expected):]) == {tokenizer.pad_token_id}


def test_input_embeddings_are_the_vectors_numpy_reads(sd):
    import jax.numpy as jnp

    from sdjax_runner.engine.encode import encode
    from sdjax_runner.engine.tokens import PromptTokens
    from sdjax_runner.models import embeddings

    loaded, root = sd
    pipeline, weights = loaded.pipeline, loaded.host_weights
    found = embeddings.load(_entries(root), pipeline)
    params = dict(weights, embeddings={k: jnp.asarray(v) for k, v in found.tables.items()})
    tokens = PromptTokens(pipeline, "plain", found)

    def states(texts, with_embeddings=True):
        ids, _ = (tokens if with_embeddings else PromptTokens(pipeline, "plain"))(texts, 0)
        return np.asarray(encode(pipeline, params if with_embeddings else weights, jnp.asarray(ids)).context[1:])

    # the vectors of "red cube" itself: the prompt's own input embeddings, so its hidden states exactly
    assert np.array_equal(states(["a cubes on a table"]), states(["a red cube on a table"], False))
    # other vectors: a text encoder whose vocabulary is extended by them (rows appended, new ids), in NumPy
    table = np.asarray(weights["text_encoder"]["text_model"]["embeddings"]["token_embedding"]["embedding"])
    extended = np.concatenate([table, found.tables["text_encoder"]])
    ids, _ = tokens(["a shiny photo of three"], 0)
    assert ids.max() >= table.shape[0]
    wide = dict(weights["text_encoder"])
    wide["text_model"] = dict(wide["text_model"], embeddings=dict(
        wide["text_model"]["embeddings"], token_embedding={"embedding": jnp.asarray(extended)}))
    extended_encoder = pipeline.text_encoder.clone(vocab_size=extended.shape[0])
    reference = np.asarray(extended_encoder.apply({"params": wide}, jnp.asarray(ids)).last_hidden_state)
    assert np.allclose(states(["a shiny photo of three"]), reference, atol=1e-6)
    assert not np.allclose(reference, states(["a shiny photo of three"], False), atol=1e-3)


def test_an_embedding_in_a_prompt_gives_the_images_of_its_words(tmp_path, sd):
    _, root = sd
    cubes = root / "cubes.safetensors"
    sweep = tmp_path / "sweep"
    result = run_cli("-m", "+experiment=smoke", *QUIET, f"prompts.embeddings=[{cubes}]", "prompts.negative=cubes",
                     "prompts.texts=['a cubes on a table'],['(cubes:1.3) BREAK on a table']", "prompts.syntax=plain,a1111",
                     f"hydra.sweep.dir={sweep}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    words = tmp_path / "words"
    plain = run_cli("-m", "+experiment=smoke", *QUIET, "prompts.negative=red cube",
                    "prompts.texts=['a red cube on a table'],['(red cube:1.3) BREAK on a table']",
                    "prompts.syntax=plain,a1111", f"hydra.sweep.dir={words}", cwd=tmp_path)
    assert plain.returncode == 0, plain.stderr[-3000:]
    for job in range(4):
        ours = [r["pixels_sha256"] for r in json.loads((sweep / str(job) / "images.json").read_text())]
        theirs = [r["pixels_sha256"] for r in json.loads((words / str(job) / "images.json").read_text())]
        assert ours == theirs, job
    records = json.loads((sweep / "0" / "images.json").read_text())
    assert records[0]["embeddings"].startswith("cubes:sha256=")
    with Image.open(sweep / "0" / records[0]["file"]) as image:
        assert f'TI hashes: "cubes: {records[0]["embeddings"].rpartition("=")[2]}"' in image.text["parameters"]
    timings = json.loads((sweep / "2" / "timings.json").read_text())  # job 0's syntax, the other prompt
    assert timings["compile_reused"] == 1  # another prompt, the same table: one program


def test_sdxl_embeddings_carry_both_encoders_vectors(tmp_path, tiny_xl_dir):
    from safetensors.numpy import save_file

    loaded = _load(tiny_xl_dir)
    pipeline = loaded.pipeline
    file = tmp_path / "cubes.safetensors"
    save_file({"clip_l": _rows(loaded, "text_encoder", pipeline.tokenizer),
               "clip_g": _rows(loaded, "text_encoder_2", pipeline.tokenizer_2)}, str(file))
    common = ["+experiment=smoke", "model=tiny-random-xl", *QUIET, "sampling.num_inference_steps=4"]
    ours = run_cli(*common, f"prompts.embeddings=[{file}]", "prompts.texts=[a cubes on a table]", "hydra.run.dir=ours",
                   cwd=tmp_path)
    assert ours.returncode == 0, ours.stderr[-3000:]
    theirs = run_cli(*common, "prompts.texts=[a red cube on a table]", "hydra.run.dir=theirs", cwd=tmp_path)
    assert theirs.returncode == 0, theirs.stderr[-3000:]
    hashes = [[r["pixels_sha256"] for r in json.loads((tmp_path / name / "images.json").read_text())]
              for name in ("ours", "theirs")]
    assert hashes[0] == hashes[1]
    sd15 = tmp_path / "sd15.safetensors"
    save_file({"emb_params": np.zeros((2, 32), np.float32)}, str(sd15))
    result = run_cli(*common, f"prompts.embeddings=[{sd15}]", "hydra.run.dir=sd15", cwd=tmp_path)
    assert_one_line_error(result, "error: prompts.embeddings: sd15.safetensors holds emb_params; an SDXL model needs "
                                  "an SDXL embedding (allowed: a file with clip_l and clip_g vectors)")


def test_embeddings_that_cannot_be_read_are_one_line(tmp_path, sd):
    from safetensors.numpy import save_file

    _, root = sd
    pickled = tmp_path / "old.pt"
    pickled.write_bytes(b"not read")
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none", f"prompts.embeddings=[{pickled}]",
                                   cwd=tmp_path),
                          "error: prompts.embeddings: old.pt is not a .safetensors file; pickled embeddings")
    twin = tmp_path / "twin"
    twin.mkdir()
    (twin / "cubes.safetensors").write_bytes((root / "cubes.safetensors").read_bytes())
    assert_one_line_error(call_cli("+experiment=smoke", "tracking=none",
                                   f"prompts.embeddings=[{root / 'cubes.safetensors'},{twin}]", cwd=tmp_path),
                          "error: prompts.embeddings: two embeddings are named 'cubes'")
    assert_one_line_error(call_cli("+experiment=smoke", "model=tiny-random-flux", "tracking=none",
                                   f"prompts.embeddings=[{root}]", cwd=tmp_path),
                          "error: prompts.embeddings: 1 path(s): textual-inversion embeddings are the SD family's")
    wide = tmp_path / "wide.safetensors"
    save_file({"emb_params": np.zeros((2, 7), np.float32)}, str(wide))
    result = run_cli("+experiment=smoke", *QUIET, f"prompts.embeddings=[{wide}]", "hydra.run.dir=wide", cwd=tmp_path)
    assert_one_line_error(result, "error: prompts.embeddings: wide.safetensors: vectors of shape (2, 7) for "
                                  "text_encoder, whose token embeddings are 32 wide")
