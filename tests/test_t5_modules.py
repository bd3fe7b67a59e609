"""The runner's own T5 (issue 60) against transformers 4.57, the reference: the encoder
(sdjax_runner/models/nn/t5.py) against ``FlaxT5EncoderModel`` -- the parameter tree of T5 v1.1 XXL (FLUX.1's and
SD 3's), the same random parameters for the same key, and bit-equal outputs under ``jax.jit`` on shrunk configs
(gated-gelu and relu, a mask with zeros, sequences long enough for the farthest buckets) -- and the tokenizer
(sdjax_runner/models/nn/t5_tokenizer.py) against ``T5TokenizerFast``: ids and masks on thousands of prompts with
the repository's T5 tokenizer folders and a unigram vocabulary trained here on the docs, in the layouts published
folders have (the hub's, transformers' older config format, sentinels missing from tokenizer.json)."""

from __future__ import annotations

import ast
import json
import pickle
import random
import re
import shutil
import types
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax.traverse_util import flatten_dict

from sdjax_runner.families.flux.models.t5 import t5_encoder, t5_tokenizer
from sdjax_runner.models.nn.t5 import T5EncoderModel, feed_forward_kind, relative_position_bucket
from sdjax_runner.models.nn.t5_tokenizer import T5Tokenizer

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT / "tests" / "fixtures"
TOKENIZER_FOLDERS = {"flux": FIXTURES / "flux" / "tiny-flux-dev" / "tokenizer_2",
                     "sd3": FIXTURES / "sd3" / "tiny-sd3" / "tokenizer_3"}

# black-forest-labs/FLUX.1-dev's text_encoder_2/config.json as the hub publishes it (google/t5-v1_1-xxl's encoder);
# SD 3 medium's text_encoder_3/config.json differs in torch_dtype and transformers_version.
FLUX_T5_XXL = {
    "_name_or_path": "google/t5-v1_1-xxl", "architectures": ["T5EncoderModel"], "classifier_dropout": 0.0,
    "d_ff": 10240, "d_kv": 64, "d_model": 4096, "decoder_start_token_id": 0, "dense_act_fn": "gelu_new",
    "dropout_rate": 0.1, "eos_token_id": 1, "feed_forward_proj": "gated-gelu", "initializer_factor": 1.0,
    "is_encoder_decoder": True, "is_gated_act": True, "layer_norm_epsilon": 1e-06, "model_type": "t5",
    "num_decoder_layers": 24, "num_heads": 64, "num_layers": 24, "output_past": True, "pad_token_id": 0,
    "relative_attention_max_distance": 128, "relative_attention_num_buckets": 32, "tie_word_embeddings": False,
    "torch_dtype": "bfloat16", "transformers_version": "4.43.3", "use_cache": True, "vocab_size": 32128,
}
SD3_T5_XXL = {**FLUX_T5_XXL, "torch_dtype": "float16", "transformers_version": "4.41.2"}
# google-t5/t5-small's config.json: the original T5 (relu), with its generation settings
T5_SMALL = {
    "architectures": ["T5ForConditionalGeneration"], "d_ff": 2048, "d_kv": 64, "d_model": 512,
    "decoder_start_token_id": 0, "dropout_rate": 0.1, "eos_token_id": 1, "initializer_factor": 1.0,
    "is_encoder_decoder": True, "layer_norm_epsilon": 1e-06, "model_type": "t5", "n_positions": 512,
    "num_heads": 8, "num_layers": 6, "output_past": True, "pad_token_id": 0, "relative_attention_num_buckets": 32,
    "task_specific_params": {"summarization": {"early_stopping": True, "length_penalty": 2.0, "max_length": 200,
                                               "min_length": 30, "no_repeat_ngram_size": 3, "num_beams": 4,
                                               "prefix": "summarize: "}},
    "vocab_size": 32128,
}
# Shrunk configs for the outputs: gated-gelu (T5 v1.1) with the default buckets, relu (original T5) with few
# buckets and a short max_distance, gated-silu; and a config.json whose dense_act_fn overrides feed_forward_proj.
SHRUNK: dict[str, dict[str, Any]] = {
    "gated-gelu": dict(vocab_size=300, d_model=32, d_kv=8, d_ff=64, num_layers=3, num_heads=4,
                       feed_forward_proj="gated-gelu"),
    "relu": dict(vocab_size=300, d_model=24, d_kv=6, d_ff=40, num_layers=2, num_heads=3, feed_forward_proj="relu",
                 relative_attention_num_buckets=8, relative_attention_max_distance=20, layer_norm_epsilon=1e-5),
    "gated-silu": dict(vocab_size=300, d_model=16, d_kv=4, d_ff=48, num_layers=2, num_heads=4,
                       feed_forward_proj="gated-silu", relative_attention_num_buckets=16,
                       relative_attention_max_distance=64),
    "dense_act_fn set": dict(vocab_size=300, d_model=16, d_kv=8, d_ff=32, num_layers=2, num_heads=2,
                             feed_forward_proj="gated-gelu", dense_act_fn="gelu", is_gated_act=True),
}


def transformers_bucket_function():
    """transformers 4.57's own ``FlaxT5Attention._relative_position_bucket``, compiled from its source file (a mend
    may have replaced the class attribute in this process), run with a ``jnp`` whose ``clip`` takes ``a_max``
    again (JAX 0.10 removed the keyword; ``clip``'s ``max`` is the same bound)."""
    from transformers.models.t5 import modeling_flax_t5

    tree = ast.parse(Path(modeling_flax_t5.__file__).read_text(encoding="utf-8"))
    attention = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "FlaxT5Attention")
    function = next(n for n in attention.body if isinstance(n, ast.FunctionDef)
                    and n.name == "_relative_position_bucket")
    function.decorator_list = []
    shim = types.SimpleNamespace(**{name: getattr(jnp, name) for name in dir(jnp) if not name.startswith("__")})
    shim.clip = lambda x, a_min=None, a_max=None: jnp.clip(x, a_min, a_max)
    namespace: dict = {"jnp": shim}
    exec(compile(ast.Module([function], []), modeling_flax_t5.__file__, "exec"), namespace)
    return namespace["_relative_position_bucket"]


@pytest.fixture
def flax_t5(monkeypatch):
    """transformers' FlaxT5EncoderModel, runnable on current JAX with its own bucket code (see above)."""
    from transformers import FlaxT5EncoderModel, T5Config
    from transformers.models.t5.modeling_flax_t5 import FlaxT5Attention

    monkeypatch.setattr(FlaxT5Attention, "_relative_position_bucket", staticmethod(transformers_bucket_function()))

    def build(config: dict, dtype=jnp.float32):
        return FlaxT5EncoderModel(T5Config(**config), _do_init=False, dtype=dtype)

    return build


def shapes(tree) -> dict:
    return {"/".join(path): (leaf.shape, np.dtype(leaf.dtype)) for path, leaf in flatten_dict(tree).items()}


# -- the encoder -------------------------------------------------------------------------------------------------

def test_t5_xxl_parameter_tree_is_transformers_path_for_path(flax_t5):
    """FLUX.1's / SD 3's T5 v1.1 XXL: every path, shape and dtype of transformers' tree (traced, no memory), and
    FLUX.1-dev's published parameter count for its text_encoder_2 (4,762,310,656)."""
    key = jax.random.PRNGKey(0)
    theirs = flax_t5(FLUX_T5_XXL)
    expected = shapes(jax.eval_shape(lambda k: theirs.init_weights(k, (1, 1)), key))
    ours = shapes(jax.eval_shape(T5EncoderModel.from_config(FLUX_T5_XXL).init_weights, key))
    assert ours == expected
    assert sum(int(np.prod(shape)) for shape, _ in ours.values()) == 4_762_310_656
    assert ours["encoder/block/0/layer/0/SelfAttention/relative_attention_bias/embedding"][0] == (32, 64)
    assert "encoder/block/1/layer/0/SelfAttention/relative_attention_bias/embedding" not in ours
    assert ours["encoder/block/23/layer/1/DenseReluDense/wi_1/kernel"][0] == (4096, 10240)
    assert ours["shared/embedding"][0] == (32128, 4096) and ours["encoder/final_layer_norm/weight"][0] == (4096,)


@pytest.mark.parametrize("name", ["gated-gelu", pytest.param("relu", marks=pytest.mark.slow)])
def test_init_weights_are_transformers_for_the_same_key(flax_t5, name):
    reference, own = flax_t5(SHRUNK[name]), T5EncoderModel.from_config(SHRUNK[name])
    both = jax.jit(lambda k: (reference.init_weights(k, (1, 1)), own.init_weights(k)))(jax.random.PRNGKey(7))
    theirs, ours = map(flatten_dict, both)
    assert ours.keys() == theirs.keys()
    assert all(np.array_equal(ours[k], theirs[k]) for k in ours)


def _inputs(vocab: int, length: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Two rows of ids: the second padded (mask 0) from two thirds on, and a masked token in the middle of both."""
    rng = np.random.RandomState(seed)
    ids = rng.randint(0, vocab, (2, length)).astype(np.int64)
    mask = np.ones_like(ids)
    mask[1, 2 * length // 3:] = 0
    mask[:, length // 4] = 0
    return ids, mask


@pytest.mark.parametrize("name", ["gated-gelu", "relu", *(pytest.param(name, marks=pytest.mark.slow)
                                                          for name in ("gated-silu", "dense_act_fn set"))])
@pytest.mark.slow
def test_outputs_are_flax_t5s_bit_for_bit(flax_t5, name):
    """The same random weights, ids and mask: the last state and every hidden state equal under jax.jit, float32
    (the tolerance asserted is 1e-6 of the largest value; the outputs are in fact identical). 200 tokens: offsets
    past max_distance, so the last bucket and every logarithmic one are used."""
    config = SHRUNK[name]
    theirs = flax_t5(config)
    ours = T5EncoderModel.from_config(config)
    params = ours.init_weights(jax.random.PRNGKey(1))  # transformers' for the key (tested above)
    ids, mask = _inputs(config["vocab_size"], 200, seed=2)

    @jax.jit
    def reference(params, ids, mask):
        out = theirs(ids, mask, params=params, output_hidden_states=True)
        return out.last_hidden_state, out.hidden_states

    @jax.jit
    def own(params, ids, mask):
        out = ours.apply({"params": params}, ids, mask, output_hidden_states=True)
        return out.last_hidden_state, out.hidden_states

    expected, expected_states = reference(params, ids, mask)
    got, got_states = own(params, ids, mask)
    assert got.shape == (2, 200, config["d_model"]) and got.dtype == jnp.float32
    assert np.abs(np.asarray(got) - np.asarray(expected)).max() <= 1e-6 * np.abs(np.asarray(expected)).max()
    assert np.array_equal(got, expected)
    assert len(got_states) == len(expected_states) == config["num_layers"] + 1
    assert all(np.array_equal(a, b) for a, b in zip(got_states, expected_states, strict=True))
    if name == "relu":  # no mask: transformers' wrapper passes ones, and so does ours
        no_mask = jax.jit(lambda p, i: ours.apply({"params": p}, i)[0])(params, ids)
        assert np.array_equal(no_mask, jax.jit(lambda p, i: theirs(i, params=p)[0])(params, ids))


@pytest.mark.slow
def test_bfloat16_outputs_are_flax_t5s(flax_t5):
    config = SHRUNK["gated-gelu"]
    theirs = flax_t5(config, dtype=jnp.bfloat16)
    ours = T5EncoderModel.from_config(config, dtype=jnp.bfloat16)
    params = ours.init_weights(jax.random.PRNGKey(3))
    ids, mask = _inputs(config["vocab_size"], 160, seed=4)
    expected = jax.jit(lambda p, i, m: theirs(i, m, params=p)[0])(params, ids, mask)
    got = jax.jit(lambda p, i, m: ours.apply({"params": p}, i, m)[0])(params, ids, mask)
    assert got.dtype == expected.dtype == jnp.float32  # the final RMS norm's output is float32, as there
    assert np.array_equal(got, expected)


@pytest.mark.parametrize("buckets, distance", [(32, 128), (8, 20), (16, 64), (6, 7)])
def test_relative_position_buckets_are_transformers_code_with_the_keyword_jax_removed(buckets, distance):
    reference = transformers_bucket_function()
    positions = jnp.arange(-1500, 1501, dtype="i4")
    for bidirectional in (True, False):
        ours = relative_position_bucket(positions, bidirectional, buckets, distance)
        theirs = reference(positions, bidirectional, buckets, distance)
        assert ours.dtype == jnp.int32 and np.array_equal(ours, theirs)
    both = np.asarray(relative_position_bucket(positions, True, buckets, distance))
    half, exact = buckets // 2, buckets // 4
    assert both[1500] == 0 and both[1501] == half + 1 and both[1500 - exact + 1] == exact - 1
    assert both[0] == half - 1 and both[-1] == buckets - 1  # the farthest offsets share the last bucket
    assert set(both[1500:]) == set(range(half + 1, buckets)) | {0}  # every bucket of the positive half used
    assert set(both[:1501]) == set(range(half))  # and of the negative half


def test_the_flux_module_builds_the_encoder_and_reads_tokenizers_without_transformers():
    encoder = t5_encoder(SHRUNK["relu"])
    assert isinstance(encoder, T5EncoderModel) and encoder.config.d_model == 24
    assert isinstance(t5_tokenizer(TOKENIZER_FOLDERS["flux"]), T5Tokenizer)
    source = (ROOT / "sdjax_runner" / "models" / "nn" / "t5.py").read_text() + \
        (ROOT / "sdjax_runner" / "models" / "nn" / "t5_tokenizer.py").read_text()
    assert not re.search(r"^\s*(from|import)\s+(transformers|diffusers|torch)\b", source, re.MULTILINE)


# -- from_config -------------------------------------------------------------------------------------------------

def _config_files() -> list[Path]:
    return sorted(p for p in FIXTURES.rglob("config.json")
                  if json.loads(p.read_text()).get("model_type") == "t5")


@pytest.mark.parametrize("config", [FLUX_T5_XXL, SD3_T5_XXL, T5_SMALL, *map(str, _config_files()),
                                    *SHRUNK.values()],
                         ids=["flux-xxl", "sd3-xxl", "t5-small", *(str(p.relative_to(FIXTURES).parent)
                                                                   for p in _config_files()), *SHRUNK])
def test_published_configs_are_read_as_transformers_reads_them(config):
    from transformers import T5Config

    if isinstance(config, str):
        config = json.loads(Path(config).read_text())
    module = T5EncoderModel.from_config(config)
    reference = T5Config(**config)
    for key in ("vocab_size", "d_model", "d_kv", "d_ff", "num_layers", "num_heads", "relative_attention_num_buckets",
                "relative_attention_max_distance", "layer_norm_epsilon", "feed_forward_proj", "dense_act_fn",
                "is_gated_act"):
        assert module.config[key] == getattr(reference, key), key
    assert module.sizes.activation == reference.dense_act_fn and module.sizes.gated == reference.is_gated_act
    assert T5EncoderModel.from_config(module.config).config == module.config  # .config round-trips


def test_the_fixture_folders_are_t5_configs():
    assert len(_config_files()) >= 3


@pytest.mark.parametrize("change, message", [
    (dict(scalable_attention=True), "unknown key"),  # UMT5's per-layer bias
    (dict(model_type="umt5"), "model_type"),
    (dict(feed_forward_proj="gated-gelu-x"), "feed_forward_proj"),
    (dict(feed_forward_proj="fast-gelu"), "feed_forward_proj"),
    (dict(feed_forward_proj="gated-nope", dense_act_fn=None), "dense_act_fn 'nope'"),
    (dict(dense_act_fn="softplus"), "dense_act_fn 'softplus'"),
    (dict(d_model=0), "d_model 0"),
    (dict(num_heads="4"), "num_heads '4'"),
    (dict(relative_attention_num_buckets=2), "no exact bucket"),
    (dict(is_gated_act="yes"), "is_gated_act"),
    (dict(layer_norm_epsilon=-1.0), "layer_norm_epsilon"),
    (dict(hidden_size=0), "d_model 0"),  # T5Config's alias of d_model
])
def test_configs_it_cannot_run_are_refused(change, message):
    config = {k: v for k, v in {**FLUX_T5_XXL, **change}.items() if v is not None}
    with pytest.raises(ValueError, match=message):
        T5EncoderModel.from_config(config)


def test_t5configs_other_names_read_and_set_the_keys_as_there():
    """T5Config's attribute_map: ``config.hidden_size`` is d_model (SD 3's single-file loader reads it for each
    text encoder), and a config.json with ``hidden_size`` sets d_model -- over d_model itself, as T5Config does."""
    from transformers import T5Config

    module = T5EncoderModel.from_config(FLUX_T5_XXL)
    assert (module.config.hidden_size, module.config.num_attention_heads, module.config.num_hidden_layers,
            module.config.head_dim) == (4096, 64, 24, 64)
    assert "hidden_size" not in module.config  # the keys are T5Config's own names
    aliased = {**SHRUNK["relu"], "hidden_size": 48, "num_attention_heads": 6, "num_hidden_layers": 1, "head_dim": 8}
    reference = T5Config(**aliased)
    ours = T5EncoderModel.from_config(aliased).sizes
    assert (ours.d_model, ours.d_kv, ours.num_layers, ours.num_heads) == \
        (reference.d_model, reference.d_kv, reference.num_layers, reference.num_heads) == (48, 8, 1, 6)
    with pytest.raises(AttributeError):
        module.config.width  # noqa: B018


def test_feed_forward_kinds_follow_t5config():
    assert feed_forward_kind("gated-gelu") == ("gelu_new", True)
    assert feed_forward_kind("gated-silu") == ("silu", True)
    assert feed_forward_kind("relu") == ("relu", False)
    with pytest.raises(ValueError):
        feed_forward_kind(None)


# -- the tokenizer -----------------------------------------------------------------------------------------------

FRAGMENTS = ["</s>", "<pad>", "<unk>", "<extra_id_0>", "<extra_id_7>", "<extra_id_99>", "<extra_id_100>",
             "a</s>b", "x<pad>y", "</s></s>", "<extra_id_1>text", "▁", "▁▁word", "(masterpiece:1.2)",
             "((best quality))", "[cat|dog]", "don't", "it's", "8k", "3.14159", "1,000,000", "x-ray", "café", "naïve",
             "Ærøskøbing", "東京タワー", "서울", "Москва", "القاهرة", "ελληνικά", "🙂", "🐱‍👤", "👍🏽", "❤️", "🇯🇵",
             "  ", "   ", "\t", "\n", "\r\n", "\u00a0", "\u3000", "\u200b", "...", "!!!", "?!", "--", "__init__",
             "#hashtag", "@user", "$100", "50%", "a+b=c", "İstanbul", "ß", "ﬁnance", "Å", "e\u0301", "½", "²", "Ⅻ",
             "٣", "\uff21\uff22\uff23", "ｶﾀｶﾅ", "〜", "“quoted”", "\u2018single\u2019", "—", "…"]


def words_of_the_docs() -> list[str]:
    text = " ".join(path.read_text(encoding="utf-8") for path in sorted((ROOT / "docs").rglob("*.md")))
    return re.findall(r"[A-Za-z][A-Za-z'-]{1,14}", text)


def prompts(count: int, seed: int = 0) -> list[str]:
    """``count`` prompts of what users type (words of the docs, the fragments above, odd separators and
    whitespace, up to several hundred tokens), then the fragments alone and a few extremes."""
    rng = random.Random(seed)
    words = words_of_the_docs()
    out = []
    for _ in range(count):
        parts = []
        for _ in range(rng.choice([1, 3, 8, 20, 60, 150])):  # up to well past 256 tokens
            parts.append(rng.choice(FRAGMENTS) if rng.random() < 0.25 else rng.choice(words))
            if rng.random() < 0.2:
                parts[-1] = parts[-1].upper() if rng.random() < 0.5 else parts[-1].capitalize()
        separators = [" ", ", ", ",", "  ", " | ", "\n", "\t", ""]
        lead = rng.choice(["", " ", "  ", "\n", "\t"])
        trail = rng.choice(["", " ", "  ", "\n"])
        out.append(lead + "".join(p + rng.choice(separators) for p in parts).rstrip(", |") + trail)
    return out + FRAGMENTS + ["", " ", "a" * 700, "🙂" * 300, "word " * 600, "<extra_id_0>" * 20]


RUNNERS_CALL: dict[str, Any] = dict(padding="max_length", max_length=77, truncation=True)  # FLUX.1's and SD 3's prompt_ids
CALLS: list[dict[str, Any]] = [dict(padding="max_length", max_length=256, truncation=True), dict(), dict(add_special_tokens=False),
         dict(padding="max_length", max_length=1, truncation=True), dict(padding=True, truncation=True, max_length=40),
         dict(max_length=12), dict(truncation=True), dict(padding="max_length")]


def compare(folder: Path, texts: list[str], others: int = 500, batch: int = 100) -> list[str]:
    """Every difference between ours and T5TokenizerFast on ``texts``: the special tokens and their ids, the
    vocabulary, then ids and masks of the runner's call on every text and of each other call in :data:`CALLS` on
    the first ``others`` and the fragments (in batches and on single texts), and decoding."""
    from transformers import T5TokenizerFast

    theirs, ours = T5TokenizerFast.from_pretrained(folder), T5Tokenizer.from_folder(folder)
    differences = []
    for name in ("eos_token", "pad_token", "unk_token", "eos_token_id", "pad_token_id", "unk_token_id",
                 "bos_token_id", "model_max_length", "all_special_tokens"):
        if getattr(ours, name) != getattr(theirs, name):
            differences.append(f"{name}: {getattr(ours, name)!r} vs {getattr(theirs, name)!r}")
    if ours.get_vocab() != theirs.get_vocab() or len(ours) != len(theirs):
        differences.append("the vocabulary")
    some = texts[:others] + FRAGMENTS
    for kwargs in [RUNNERS_CALL, *CALLS]:
        chosen = texts if kwargs is RUNNERS_CALL else some
        for start in range(0, len(chosen), batch):
            part = chosen[start:start + batch]
            a, b = ours(part, **kwargs), theirs(part, **kwargs)
            if a.input_ids != b.input_ids or a.attention_mask != b.attention_mask:
                rows = [t for t, x, y in zip(part, a.input_ids, b.input_ids, strict=True) if x != y]
                differences.append(f"{kwargs} on {rows[:3]!r}" if rows else f"{kwargs}: the masks")
    for text in some[::5]:
        for kwargs in (RUNNERS_CALL, *CALLS[:3]):
            if ours(text, **kwargs).input_ids != theirs(text, **kwargs).input_ids:
                differences.append(f"{kwargs} on the single text {text!r}")
    kwargs = dict(padding="max_length", max_length=64, truncation=True, return_tensors="np")
    a, b = ours(texts[:32], **kwargs), theirs(texts[:32], **kwargs)
    if not (np.array_equal(a.input_ids, b["input_ids"]) and np.array_equal(a["attention_mask"], b.attention_mask)
            and a.input_ids.dtype == b.input_ids.dtype):
        differences.append("return_tensors='np'")
    for ids in b.input_ids:
        for skip in (False, True):
            if ours.decode(ids, skip_special_tokens=skip) != theirs.decode(ids, skip_special_tokens=skip):
                differences.append(f"decoding {ids.tolist()} (skip_special_tokens={skip})")
    return differences


@pytest.mark.slow
def test_the_repositorys_t5_tokenizer_gives_t5tokenizerfasts_ids_on_3000_prompts():
    texts = prompts(3000)
    assert len(texts) > 3000
    assert compare(TOKENIZER_FOLDERS["flux"], texts) == []


def test_sd3s_tokenizer_folder_reads_the_same():
    assert compare(TOKENIZER_FOLDERS["sd3"], prompts(300, seed=1)) == []


@pytest.fixture(scope="module")
def trained_vocabulary(tmp_path_factory) -> Path:
    """A T5-shaped unigram tokenizer of ~2,000 pieces learnt from the docs by the tokenizers library, with the
    layout older T5 tokenizer.json files have (NFKC standing in for sentencepiece's nmt_nfkc map, then whitespace
    split and a Metaspace with ``add_prefix_space``), saved by T5TokenizerFast with its 100 sentinels."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
    from transformers import T5TokenizerFast

    trainer = trainers.UnigramTrainer(vocab_size=2000, show_progress=False)
    learnt = Tokenizer(models.Unigram())
    learnt.normalizer = normalizers.NFKC()
    learnt.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="always")
    learnt.train_from_iterator([" ".join(words_of_the_docs()), *FRAGMENTS * 3], trainer)
    pieces = [(piece, score) for piece, score in json.loads(learnt.to_str())["model"]["vocab"]
              if piece not in ("<pad>", "</s>", "<unk>")]
    # T5's layout: <pad>, </s>, <unk> first (ids 0, 1, 2), then the pieces
    tokenizer = Tokenizer(models.Unigram([("<pad>", 0.0), ("</s>", 0.0), ("<unk>", 0.0), *pieces], unk_id=2))
    tokenizer.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(" {2,}", " ")])
    tokenizer.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                       pre_tokenizers.Metaspace(replacement="▁",
                                                                                prepend_scheme="always")])
    tokenizer.decoder = decoders.Metaspace(replacement="▁", prepend_scheme="always")
    tokenizer.post_processor = processors.TemplateProcessing(single="$A </s>", pair="$A </s> $B </s>",
                                                            special_tokens=[("</s>", 1)])
    assert tokenizer.get_vocab_size() > 1500 and tokenizer.token_to_id("</s>") == 1
    folder = tmp_path_factory.mktemp("t5") / "tokenizer_2"
    T5TokenizerFast(tokenizer_object=tokenizer, eos_token="</s>", unk_token="<unk>", pad_token="<pad>",
                    model_max_length=512).save_pretrained(folder)
    return folder


@pytest.mark.slow
def test_a_trained_vocabulary_gives_t5tokenizerfasts_ids_on_3000_prompts(trained_vocabulary):
    texts = prompts(3000, seed=5)
    assert compare(trained_vocabulary, texts) == []
    ours = T5Tokenizer.from_folder(trained_vocabulary)
    assert ours.get_vocab()["<extra_id_0>"] >= 1500  # the sentinels after the pieces


def test_a_trained_vocabulary_as_transformers_saves_it(trained_vocabulary):
    assert compare(trained_vocabulary, prompts(300, seed=9)) == []


def test_google_t5_v1_1s_older_config_format_reads_the_same(trained_vocabulary, tmp_path):
    """google/t5-v1_1-xxl's tokenizer_config.json (no added_tokens_decoder: transformers reads
    special_tokens_map.json over it and takes tokenizer.json's added tokens)."""
    old = shutil.copytree(trained_vocabulary, tmp_path / "old")
    sentinels = [f"<extra_id_{i}>" for i in range(100)]
    (old / "tokenizer_config.json").write_text(json.dumps({
        "additional_special_tokens": sentinels, "eos_token": "</s>", "extra_ids": 100, "model_max_length": 512,
        "name_or_path": "google/t5-v1_1-xxl", "pad_token": "<pad>", "sp_model_kwargs": {},
        "special_tokens_map_file": "special_tokens_map.json", "tokenizer_class": "T5Tokenizer", "unk_token": "<unk>"}))
    (old / "special_tokens_map.json").write_text(json.dumps({
        "additional_special_tokens": sentinels, "eos_token": "</s>", "pad_token": "<pad>", "unk_token": "<unk>"}))
    assert compare(old, prompts(200, seed=10)) == []


def test_sentinels_missing_from_tokenizer_json_are_added_as_transformers_adds_them(trained_vocabulary, tmp_path):
    """A config without extra_ids (T5TokenizerFast's default: 100) and a tokenizer.json without the sentinels:
    transformers adds them after the pieces, with new ids; then no tokenizer_config.json at all (no
    model_max_length: nothing is padded or cut to it)."""
    bare = shutil.copytree(trained_vocabulary, tmp_path / "bare")
    serialized = json.loads((bare / "tokenizer.json").read_text())
    serialized["added_tokens"] = [t for t in serialized["added_tokens"] if "extra_id" not in t["content"]]
    (bare / "tokenizer.json").write_text(json.dumps(serialized))
    (bare / "tokenizer_config.json").write_text(json.dumps({"model_max_length": 512}))
    (bare / "special_tokens_map.json").unlink()
    texts = prompts(150, seed=12) + ["<extra_id_5> and <extra_id_99>"]
    assert compare(bare, texts) == []
    ours = T5Tokenizer.from_folder(bare)
    assert ours.get_vocab()["<extra_id_0>"] == len(ours) - 100
    assert ours("<extra_id_5>").input_ids == [ours.get_vocab()["<extra_id_5>"], ours.eos_token_id]

    (bare / "tokenizer_config.json").unlink()
    assert T5Tokenizer.from_folder(bare).model_max_length == int(1e30)
    assert compare(bare, texts[:60]) == []


def test_the_built_in_models_tokenizer_reads_the_same(tmp_path):
    """model=tiny-random-flux's tokenizer_2/ (models/builtin.py: a word-level unigram, saved with extra_ids 0)."""
    from sdjax_runner.models.builtin_parts import write_t5_tokenizer

    write_t5_tokenizer(tmp_path / "tokenizer_2")
    assert compare(tmp_path / "tokenizer_2", prompts(200, seed=13)) == []


def test_add_prefix_space_reads_tokenizer_json_where_it_already_prepends_and_is_refused_where_not(tmp_path):
    """The hub's FLUX.1 tokenizer_2/ sets add_prefix_space true, and its tokenizer.json prepends "always": read as
    it is (what transformers' rebuild from spiece.model gives). A config asking for another scheme needs that
    rebuild (sentencepiece): refused, as is a folder with spiece.model and no tokenizer.json."""
    from transformers import T5TokenizerFast

    folder = shutil.copytree(TOKENIZER_FOLDERS["flux"], tmp_path / "tokenizer_2")
    reference = T5TokenizerFast.from_pretrained(folder)  # without the setting: tokenizer.json as it is
    config = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_prefix_space": True}))
    texts = prompts(200, seed=11)
    kwargs: dict[str, Any] = dict(padding="max_length", max_length=32, truncation=True)
    assert t5_tokenizer(folder)(texts, **kwargs).input_ids == reference(texts, **kwargs).input_ids
    for prefix, legacy in ((False, True), (True, False)):
        (folder / "tokenizer_config.json").write_text(json.dumps({**config, "add_prefix_space": prefix,
                                                                  "legacy": legacy}))
        with pytest.raises(ValueError, match="add_prefix_space"):
            T5Tokenizer.from_folder(folder)
    (folder / "tokenizer.json").unlink()
    with pytest.raises(ValueError, match=r"spiece\.model but no tokenizer\.json"):
        T5Tokenizer.from_folder(folder)
    (folder / "spiece.model").unlink()
    with pytest.raises(ValueError, match=r"no tokenizer\.json"):
        T5Tokenizer.from_folder(folder)


def test_the_runners_call_gives_arrays_of_the_reference_ids():
    """FLUX.1's prompt_ids: ``tokenizer_2(texts, padding="max_length", max_length=L, truncation=True,
    return_tensors="np")`` -- (batch, L) int64, the end token kept at the cut, padding after it."""
    ours = T5Tokenizer.from_folder(TOKENIZER_FOLDERS["flux"])
    out = ours(["a cat", "word " * 100], padding="max_length", max_length=16, truncation=True, return_tensors="np")
    assert out.input_ids.shape == out.attention_mask.shape == (2, 16) and out.input_ids.dtype == np.int64
    end = ours.eos_token_id
    assert out.input_ids[1, -1] == end and out.attention_mask[1].all()
    row = out.input_ids[0].tolist()
    assert row[row.index(end) + 1:] == [ours.pad_token_id] * (15 - row.index(end))
    assert out.attention_mask[0].tolist() == [1] * (row.index(end) + 1) + [0] * (15 - row.index(end))
    copied = pickle.loads(pickle.dumps(ours))  # the per-call lock is not copied: a new one
    assert copied(["a cat"], padding="max_length", max_length=16).input_ids == out.input_ids[:1].tolist()
    with pytest.raises(ValueError, match="return_tensors"):
        ours("a", return_tensors="pt")
    with pytest.raises(ValueError, match="padding"):
        ours("a", padding="sideways")
