"""A1111's prompt syntax (prompts.syntax=a1111): the parser on A1111's published doctests and rules, its
75-token chunks, the encoding against a NumPy re-computation of A1111's emphasis, and through the CLI: a
sweep over syntax and prompt lengths (images, compiles, PNG infotext, CLIP score), SDXL on both parallel
paths, and bad syntax as one line."""

from __future__ import annotations

import json
import re
import shlex
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from helpers.cli import assert_one_line_error, call_cli, run_cli
from helpers.configs import compose_cfg
from helpers.images import images_of
from sdjax_runner.config.overrides import literal as hydra_quoted
from sdjax_runner.config.prompt_syntax import CHUNK, SyntaxProblem, chunks, escape, parse_attention, plain_text


# A1111's doctests (modules/prompt_parser.py, parse_prompt_attention), verbatim.
@pytest.mark.parametrize("text, expected", [
    ("normal text", [["normal text", 1.0]]),
    ("an (important) word", [["an ", 1.0], ["important", 1.1], [" word", 1.0]]),
    ("(unbalanced", [["unbalanced", 1.1]]),
    ("\\(literal\\]", [["(literal]", 1.0]]),
    ("(unnecessary)(parens)", [["unnecessaryparens", 1.1]]),
    ("a (((house:1.3)) [on] a (hill:0.5), sun, (((sky))).",
     [["a ", 1.0], ["house", 1.5730000000000004], [" ", 1.1], ["on", 1.0], [" a ", 1.1], ["hill", 0.55],
      [", sun, ", 1.1], ["sky", 1.4641000000000006], [".", 1.1]]),
])
def test_a1111_doctests(text, expected):
    assert parse_attention(text) == expected


def test_break_and_chunks_follow_a1111s_rules():
    words = {f"w{i}": 100 + i for i in range(200)}
    comma, start, end, pad = 7, 1, 2, 0

    def tokenize(texts):
        return [[comma if w == "," else words.get(w, 99) for w in t.replace(",", " , ").split()] for t in texts]

    short = chunks("w1 w2 (w3:1.5)", tokenize, start, end, pad, comma)
    assert len(short) == 1 and len(short[0].tokens) == CHUNK + 2
    assert short[0].tokens[:5] == (start, 101, 102, 103, end) and set(short[0].tokens[5:]) == {pad}
    assert short[0].weights[:5] == (1.0, 1.0, 1.0, 1.5, 1.0)
    broken = chunks("w1 BREAK w2", tokenize, start, end, pad, comma)
    assert [c.tokens[:3] for c in broken] == [(start, 101, end), (start, 102, end)]
    # 70 words, a comma, then 10 more: the chunk is full at 75 with the comma 5 back, so the 4 words after
    # the comma move to the next chunk (comma_padding_backtrack 20).
    text = " ".join(f"w{i}" for i in range(70)) + " , " + " ".join(f"w{i}" for i in range(70, 80))
    long = chunks(text, tokenize, start, end, pad, comma)
    assert len(long) == 2
    assert long[0].tokens[71] == comma and long[0].tokens[72] == end
    assert long[1].tokens[1:11] == tuple(100 + i for i in range(70, 80))


# A1111's rules on input it reads leniently (its regex and branches), and the one it fails on.
@pytest.mark.parametrize("text, expected", [
    ("(red:abc) car", [["red:abc", 1.1], [" car", 1.0]]),  # no number: the colon is text, ")" closes (x1.1)
    ("a ]b) c", [["a ]b) c", 1.0]]),  # closing brackets with none open are text
    ("[[less]", [["less", 1 / 1.1 / 1.1]]),  # unclosed: closed at the end
    ("BREAK a", [["", 1.0], ["BREAK", -1.0], ["a", 1.0]]),  # BREAK at the start: an empty first chunk
    ("a\\b", [["ab", 1.0]]),  # a lone backslash escapes nothing and is dropped
    ("(a:-0.5)", [["a", -0.5]]),
    ("(a:+-1)", [["a:+-1", 1.1]]),  # not A1111's number pattern: text
])
def test_lenient_syntax_reads_as_a1111_reads_it(text, expected):
    got = parse_attention(text)
    assert [p for p, _ in got] == [p for p, _ in expected]
    assert [w for _, w in got] == pytest.approx([w for _, w in expected])


@pytest.mark.parametrize("text", ["(red:1.2.3)", "(red:.)", "(red:-.)"])
def test_a_weight_a1111_cannot_read_is_a_syntax_problem(text):
    with pytest.raises(SyntaxProblem, match="is not a number"):
        parse_attention(text)


def test_plain_text_and_escape():
    assert plain_text("a (red:1.3) car BREAK [blurry], \\(literal\\)") == "a red car blurry, (literal)"
    for text in ["a (red) car", "[x] \\ y", "((a:1.2))", "plain"]:
        assert parse_attention(escape(text)) == [[text, 1.0]]


def _tokenizer():
    words = {f"w{i}": 100 + i for i in range(200)}

    def tokenize(texts):
        return [[7 if w == "," else words.get(w, 99) for w in t.replace(",", " , ").split()] for t in texts]
    return tokenize


@pytest.mark.parametrize("count, chunk_count", [(75, 1), (76, 2), (150, 2), (151, 3)])
def test_a_chunk_holds_75_tokens(count, chunk_count):
    laid = chunks(" ".join(f"w{i % 200}" for i in range(count)), _tokenizer(), 1, 2, 0, 7)
    assert len(laid) == chunk_count
    assert all(len(c.tokens) == len(c.weights) == CHUNK + 2 and c.tokens[0] == 1 for c in laid)
    assert [t for c in laid for t in c.tokens if t >= 100] == [100 + i % 200 for i in range(count)]


def test_a_comma_more_than_20_tokens_back_does_not_move_the_rest():
    text = " ".join(f"w{i}" for i in range(54)) + " , " + " ".join(f"w{i}" for i in range(54, 80))
    laid = chunks(text, _tokenizer(), 1, 2, 0, 7)  # the comma is token 55: 21 back when the chunk is full
    assert laid[0].tokens[1:77] == tuple([100 + i for i in range(54)] + [7] + [100 + i for i in range(54, 74)]) + (2,)


def test_padding_follows_the_end_token_with_the_tokenizers_pad():
    # SD 2.x's tokenizer pads with "!" (id 0 there), not the end token: A1111 turns what follows the
    # first end token into it.
    (chunk,) = chunks("w1 (w2:0.5)", _tokenizer(), 1, 2, 0, 7)
    assert chunk.tokens == (1, 101, 102, 2) + (0,) * 73
    assert chunk.weights == (1.0, 1.0, 0.5) + (1.0,) * 74
    (empty,) = chunks("", _tokenizer(), 1, 2, 2, 7)  # A1111's empty chunk: start, then end tokens
    assert empty.tokens == (1,) + (2,) * 76 and set(empty.weights) == {1.0}


# --- encoding: A1111's chunks and emphasis, recomputed in NumPy from each chunk's plain encoding ----------

LONG = ", ".join(f"(word{i}:1.{i % 5}) thing" for i in range(30)) + ", [blurry] BREAK sky"


def _pipeline(path):
    from sdjax_runner.models.loaders import load_model

    cfg = compose_cfg(["model=local", f"model.pretrained_model_name_or_path={path}"])
    loaded = load_model(cfg.model, cfg.dtype)
    return loaded.pipeline, loaded.host_weights


def _a1111_emphasis(z: np.ndarray, weights: np.ndarray) -> np.ndarray:
    """A1111's EmphasisOriginal on one chunk (77, width), in NumPy."""
    original = z.mean()
    z = z * weights[:, None]
    return z * (original / z.mean())


def _layer_norm(x, params, eps):
    mean = x.mean(-1, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(-1, keepdims=True) + eps) * np.asarray(params["scale"]) \
        + np.asarray(params["bias"])


@pytest.fixture(scope="module")
def sd21_published(tmp_path_factory, tiny_model_dir) -> Path:
    """The tiny model laid out as stabilityai/stable-diffusion-2-1 ships (PyTorch safetensors, the hub's
    tokenizer files: it pads with "!", not the end token)."""
    from helpers.published import write_published

    return write_published(tiny_model_dir, tmp_path_factory.mktemp("published") / "stable-diffusion-2-1", "sd21")


@pytest.mark.parametrize("clip_skip", [1, 2])
@pytest.mark.parametrize("layout", ["built-in", "sd21 as published"])
@pytest.mark.slow
def test_sd_prompt_is_its_chunks_encoded_one_by_one_with_a1111s_emphasis(tiny_model_dir, sd21_published, layout,
                                                                         clip_skip):
    import jax.numpy as jnp

    from sdjax_runner.engine.encode import encode
    from sdjax_runner.engine.tokens import PromptTokens

    pipeline, params = _pipeline(tiny_model_dir if layout == "built-in" else sd21_published)
    tokens = PromptTokens(pipeline, "a1111")
    if layout == "sd21 as published":  # A1111's padding: the tokenizer's own pad after the first end token
        tokenizer = pipeline.tokenizer
        assert tokenizer.pad_token == "!" and tokenizer.pad_token_id != tokenizer.eos_token_id
        (short,), _ = tokens(["a car"], 1)
        end = list(short).index(tokenizer.eos_token_id)
        assert set(short[end + 1:]) == {tokenizer.pad_token_id}
    prompts = [LONG, "a (red:1.5) car"]
    count = tokens.chunk_count(prompts + ["ugly, (bad:0.8)"])
    assert count >= 3  # the long prompt's chunks (and BREAK's); the short ones are padded to them
    ids, weights = tokens(prompts, count)
    negative_ids, negative_weights = tokens(["ugly, (bad:0.8)"] * 2, count)
    assert ids.shape == weights.shape == (2, count * 77)
    got = np.asarray(encode(pipeline, params, jnp.asarray(ids), jnp.asarray(negative_ids), clip_skip, count,
                            jnp.asarray(weights), jnp.asarray(negative_weights)).context)

    encoder, norm = pipeline.text_encoder, params["text_encoder"]["text_model"]["final_layer_norm"]
    expected = []
    for rows, row_weights in ((negative_ids, negative_weights), (ids, weights)):
        for row, w in zip(rows, row_weights, strict=True):
            parts = []
            for chunk in range(count):
                piece = row[chunk * 77:(chunk + 1) * 77]
                out = encoder.apply({"params": params["text_encoder"]}, piece[None], output_hidden_states=True)
                z = np.asarray(out.last_hidden_state[0]) if clip_skip == 1 else \
                    _layer_norm(np.asarray(out.hidden_states[-clip_skip][0]), norm, encoder.config.layer_norm_eps)
                parts.append(_a1111_emphasis(z.astype(np.float64), w[chunk * 77:(chunk + 1) * 77]))
            expected.append(np.concatenate(parts))
    np.testing.assert_allclose(got, np.stack(expected), rtol=2e-5, atol=2e-5)
    # An empty chunk pads the short prompt: the encoding of A1111's empty chunk.
    (empty,), _ = tokens([""], 1)
    assert list(ids[1, 77:154]) == list(empty)


@pytest.mark.slow
def test_sdxl_prompt_reads_both_encoders_chunk_by_chunk_and_pools_the_first(tiny_xl_dir):
    import jax.numpy as jnp

    from sdjax_runner.engine.encode import encode
    from sdjax_runner.engine.tokens import PromptTokens

    pipeline, params = _pipeline(tiny_xl_dir)
    tokens = PromptTokens(pipeline, "a1111")
    count = tokens.chunk_count([LONG])
    ids, weights = tokens([LONG], count)
    assert ids.shape == weights.shape == (1, 2, count * 77)
    assert ids[0, 1, 76 + 77 * (count - 1)] != ids[0, 0, 76 + 77 * (count - 1)]  # "!" pads the second
    conditioning = encode(pipeline, params, jnp.asarray(ids), None, 1, count, jnp.asarray(weights), None)

    context, pooled = [], None
    for chunk in range(count):
        window = slice(chunk * 77, (chunk + 1) * 77)
        first = pipeline.text_encoder.apply({"params": params["text_encoder"]}, ids[:, 0, window],
                                            output_hidden_states=True)
        second = pipeline.text_encoder_2.apply({"params": params["text_encoder_2"]}, ids[:, 1, window],
                                               output_hidden_states=True)
        context.append(np.concatenate([
            _a1111_emphasis(np.asarray(first.hidden_states[-2][0], np.float64), weights[0, 0, window]),
            _a1111_emphasis(np.asarray(second.hidden_states[-2][0], np.float64), weights[0, 1, window])], axis=-1))
        pooled = np.asarray(second.text_embeds) if pooled is None else pooled
    got = np.asarray(conditioning.context)
    np.testing.assert_allclose(got[1], np.concatenate(context), rtol=2e-5, atol=2e-5)
    assert not got[0].any()  # no negative prompt: SDXL's zeros, as diffusers' pipeline
    np.testing.assert_allclose(np.asarray(conditioning.added["text_embeds"])[1:], pooled, rtol=2e-5, atol=2e-5)


# --- through the CLI: a sweep over syntax and prompts of different lengths -------------------------------

SHORT, WEIGHTED = "a red car", "a (red:1.5) car"


@pytest.fixture(scope="module")
def syntax_sweep(tmp_path_factory) -> dict[tuple[str, str], Path]:
    """plain and a1111 x a short prompt, the same with emphasis, and a prompt of several chunks; one
    process (one load, a compile per program: plain, a1111 of 1 chunk, a1111 of the long prompt's)."""
    work = tmp_path_factory.mktemp("syntax")
    texts = ",".join(f"[{hydra_quoted(t)}]" for t in (SHORT, WEIGHTED, LONG))
    result = run_cli("-m", "+experiment=smoke", "tracking=none", "prompts.syntax=plain,a1111", f"prompts.texts={texts}",
                     "prompts.negative=ugly", f"hydra.sweep.dir={work / 'sweep'}", cwd=work)
    assert result.returncode == 0, result.stderr
    jobs = {}
    for job in (work / "sweep").iterdir():
        if job.name.isdigit():
            records = json.loads((job / "images.json").read_text())
            jobs[records[0].get("prompt_syntax", "plain"), records[0]["prompt"]] = job
    assert len(jobs) == 6, result.stderr
    return jobs


@pytest.mark.slow
def test_a1111_syntax_reads_emphasis_and_a_plain_prompt_as_the_guide_does(syntax_sweep):
    images = {key: images_of(job) for key, job in syntax_sweep.items()}
    assert all(len(i) == 8 for i in images.values())
    # No syntax in the prompt: A1111's reading is the plain one (the weights are all 1: the same encoding).
    for mine, theirs in zip(images["a1111", SHORT], images["plain", SHORT], strict=True):
        difference = np.abs(mine.astype(int) - theirs.astype(int))
        assert difference.max() <= 1 and (difference == 0).mean() >= 0.99
    # Emphasis changes the image; read plainly, the brackets are text (another image again).
    for a, b, c in zip(images["a1111", WEIGHTED], images["a1111", SHORT], images["plain", WEIGHTED], strict=True):
        assert not np.array_equal(a, b) and not np.array_equal(a, c)
    assert all(np.isfinite(i).all() and i.std() > 1 for i in images["a1111", LONG])


@pytest.mark.slow
def test_a_sweep_compiles_once_per_chunk_count(syntax_sweep):
    # Each job's program: "reused" from an earlier job of the process, else traced (or a stored executable).
    path = {key: json.loads((job / "timings.json").read_text())["compile_path"] for key, job in syntax_sweep.items()}
    assert [path["a1111", SHORT], path["a1111", WEIGHTED]].count("reused") == 1  # one chunk each: one program
    assert path["a1111", LONG] != "reused"
    assert sum(p != "reused" for p in path.values()) == 3  # plain (77 tokens), a1111 in 1 chunk, in the long's
    chunks = re.search(r"prompts: A1111's syntax, (\d+) chunk", (syntax_sweep["a1111", LONG] / "run.log").read_text())
    assert chunks and int(chunks.group(1)) >= 3


@pytest.mark.slow
def test_the_png_infotext_is_the_prompt_as_a1111_reads_it(syntax_sweep):
    def parameters(key):
        with Image.open(sorted((syntax_sweep[key] / "images").glob("*.png"))[0]) as image:
            return image.text["parameters"].split("\n")

    assert parameters(("a1111", WEIGHTED))[0] == WEIGHTED  # A1111's syntax: as written
    plain = parameters(("plain", WEIGHTED))[0]
    assert plain == "a \\(red:1.5\\) car" and parse_attention(plain) == [[WEIGHTED, 1.0]]  # escaped: the same text
    assert parameters(("plain", WEIGHTED))[1] == "Negative prompt: ugly"


@pytest.mark.slow
def test_clip_score_reads_the_prompt_without_its_syntax(syntax_sweep):
    from sdjax_runner.metrics.clip_score import score_run

    job = syntax_sweep["a1111", WEIGHTED]
    records = json.loads((job / "images.json").read_text())
    images = [Image.open(job / r["file"]) for r in records]
    scores, _ = score_run(compose_cfg(["+experiment=smoke"]).metrics.clip_score, images, [SHORT] * len(images))
    assert [r["clip_score"] for r in records] == pytest.approx(list(scores), abs=1e-4)


@pytest.mark.slow
def test_sdxl_long_weighted_prompts_give_the_same_images_on_both_parallel_paths(tmp_path, tiny_xl_dir):
    result = run_cli("-m", "+experiment=smoke", "model=tiny-random-xl", "scheduler=euler", "tracking=none",
                     "parallelism=pmap,sharded", "prompts.syntax=a1111", f"prompts.texts=[{hydra_quoted(LONG)}]",
                     "prompts.negative='(ugly:1.3), BREAK blurry'", f"hydra.sweep.dir={tmp_path / 'sweep'}",
                     cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    pmap, sharded = (images_of(tmp_path / "sweep" / str(job)) for job in (0, 1))
    assert len(pmap) == 8 and all(np.isfinite(i).all() and i.std() > 1 for i in pmap)
    assert all(np.array_equal(a, b) for a, b in zip(pmap, sharded, strict=True))


def test_a_weight_a1111_fails_on_is_one_line_naming_the_prompt(tmp_path):
    result = run_cli("+experiment=smoke", "prompts.syntax=a1111", "prompts.texts=[a car,'a (red:1.2.3) car']",
                     cwd=tmp_path)
    assert_one_line_error(result, "error: prompts.texts[1]: the weight '1.2.3' in ':1.2.3)' is not a number "
                                  "(allowed: a number after the colon")
    (tmp_path / "prompts.txt").write_text("fine\n\n(ok:2) but [(bad:.)]\n")
    result = call_cli("+experiment=smoke", "prompts.syntax=a1111", f"prompts.file={tmp_path / 'prompts.txt'}",
                      cwd=tmp_path)
    assert_one_line_error(result, "error: prompts.file (prompt 2): the weight '.'")
    assert not any((tmp_path / "outputs").rglob("*.png")) and not any((tmp_path / "outputs").rglob("images.json"))


def test_readme_syntax_examples_are_valid_runs(monkeypatch):
    """The prompt syntax examples of the README and the documentation pages compose to runs the runner accepts,
    with the prompts as written."""
    from sdjax_runner.config.plan import admit, make_plan

    root = Path(__file__).resolve().parent.parent
    monkeypatch.chdir(root)
    pages = [root / "README.md", *sorted((root / "docs").rglob("*.md"))]
    lines = list(dict.fromkeys(line for page in pages for line in page.read_text().splitlines()
                               if line.startswith("python -m sdjax_runner") and "prompts.syntax=a1111" in line))
    assert len(lines) == 3
    for line in lines:
        words = [w for w in shlex.split(line)[3:] if w != "-m"]
        first_points = [w.split("],[")[0] + ("]" if "],[" in w else "") for w in words]
        plan = make_plan(admit(compose_cfg(first_points)), available_devices=8)
        assert plan.syntax == "a1111" and any("(" in p or "BREAK" in p for p in plan.prompts), line
