"""Issue #42: what a prompt may cost, and documented input that crashed.

A prompt is bounded in characters (every syntax) and, with prompts.syntax=a1111, in 75-token chunks; each bound
is one line naming it, refused fast -- before Hydra writes the prompt into .hydra/ where it can, else before
the model loads, else (the exact chunk count needs the tokenizer) before anything compiles, the run FAILED. A1111's
parser is linear here and reads as the published one does. Scheduler settings that would break the scheduler and
a run folder that cannot be made are one line too."""

from __future__ import annotations

import json
import random
import time
from pathlib import Path

import pytest
from PIL import Image
from PIL.PngImagePlugin import PngInfo

from helpers.a1111_reference import parse_prompt_attention as published_parse
from helpers.cli import assert_one_line_error, call_cli, run_cli
from sdjax_runner.config.prompt_syntax import SyntaxProblem, parse_attention, plain_text

PARSE_BOUND_S = 20  # 200 KB of hostile prompt through the parser: A1111's quadratic one takes minutes
FAST_S = 30  # a refusal's wall time, the interpreter's start included (a bad value is refused in ~3 s)
LENGTH_BOUND = "(allowed: at most 10,000 characters per prompt)"
CHUNK_BOUND = ("(allowed: at most 20 chunks of 75 tokens (1,500 tokens) per prompt with prompts.syntax=a1111, "
               "each BREAK ending one)")


def timed_cli(*args, cwd, command=None, cli=run_cli):
    started = time.perf_counter()
    result = cli(*args, cwd=cwd, command=command)
    return result, time.perf_counter() - started


def status(run_dir: Path) -> dict:
    return json.loads((run_dir / "status.json").read_text())


# --- the parser: linear, and A1111's reading ----------------------------------------------------------------

# About 200 KB each: A1111's parser took 174 s on 90 KB of "(a ", and its BREAK split is quadratic in a run of spaces.
HOSTILE = {"nested, unclosed": "(a " * 66_667, "unclosed squares": "[" * 200_000 + "a", "closed, merged": "(a)" * 66_667,
           "spaces": "x" + " " * 200_000 + "y", "BREAKs": "a BREAK " * 25_000, "colons": "(a:" * 66_667,
           "weights in nesting": "((a:1.3) " * 22_223, "weight digits": "(x:" + "1" * 200_000 + " y"}


def per_character(pieces: list[list]) -> tuple[str, list[float]]:
    """What the pieces read as, character by character (however neighbours of equal weight were merged)."""
    return "".join(p for p, _ in pieces), [w for p, w in pieces for _ in p]


@pytest.mark.parametrize("text", HOSTILE.values(), ids=HOSTILE.keys())
def test_the_parser_is_linear_and_reads_as_a1111(text):
    started = time.perf_counter()
    pieces = parse_attention(text)
    # Not a timing claim (those live in benchmarks/): a bound no linear parser comes near on a loaded machine
    # (about 0.1 s alone, 1.2 s beside a CI run here) and a quadratic one cannot meet (A1111's: minutes).
    assert time.perf_counter() - started < PARSE_BOUND_S
    small = text[:2000]  # the same shape, small enough for the published (quadratic) parser
    ours, theirs = per_character(parse_attention(small)), per_character(published_parse(small))
    assert ours[0] == theirs[0] and ours[1] == pytest.approx(theirs[1], rel=1e-12)
    assert per_character(pieces)[0].startswith(ours[0][:1000])
    assert plain_text(text).startswith(plain_text(small)[:1000])


def test_the_parser_reads_every_mix_of_brackets_as_a1111s_published_one():
    rng = random.Random(42)
    parts = ["(", ")", "[", "]", ":1.3)", ":0.5)", ": -1 )", ":0)", ":1.2.3)", "\\(", "\\]", "\\", "a", "b ", " ", "BREAK",
             " BREAK ", ",", ":"]
    for _ in range(5000):
        text = "".join(rng.choice(parts) for _ in range(rng.randint(0, 24)))
        try:
            theirs = published_parse(text)
        except ValueError:  # a weight A1111 cannot read fails its generation
            with pytest.raises(SyntaxProblem):
                parse_attention(text)
            continue
        ours = parse_attention(text)
        # The same text with the same weights (to the last bits of a float64: the factors are multiplied in another
        # order, so neighbours may merge differently), and the same BREAKs.
        assert per_character(ours)[0] == per_character(theirs)[0], text
        assert per_character(ours)[1] == pytest.approx(per_character(theirs)[1], rel=1e-12, nan_ok=True), text
        assert [p == ["BREAK", -1.0] for p in ours].count(True) == [p == ["BREAK", -1] for p in theirs].count(True)


def test_the_clip_score_reads_each_distinct_prompt_once(monkeypatch, tmp_path):
    from sdjax_runner.config import prompt_syntax
    from sdjax_runner.metrics import clip_score
    from sdjax_runner.metrics.evaluate import evaluate
    from sdjax_runner.records import ImageRecord, Quality

    read, scored = [], []
    monkeypatch.setattr(prompt_syntax, "plain_text", lambda text: read.append(text) or text.strip("()"))
    monkeypatch.setattr(clip_score, "score_run", lambda clip, images, prompts, executables: scored.extend(prompts)
                        or (None, Quality()))
    from sdjax_runner.config.schema import ClipScoreConfig, MetricsConfig

    metrics = MetricsConfig(clip_score=ClipScoreConfig(enabled=True, model="m"))  # the other metrics off, as default
    records = [ImageRecord(prompt="(a red car)" if i % 2 else "(a cat)") for i in range(1000)]
    evaluate(metrics, tmp_path, [None] * 1000, records, None, lambda path: [], syntax="a1111")
    assert sorted(read) == ["(a cat)", "(a red car)"]
    assert scored == ["a red car" if i % 2 else "a cat" for i in range(1000)]


# --- the bounds, through the CLI --------------------------------------------------------------------------

LONG = "x" * 10_001


@pytest.mark.parametrize("source", ["prompts.texts", "prompts.negative", "a sweep's prompts.texts", "prompts.file"])
def test_a_prompt_over_the_length_bound_is_one_line_before_hydra_writes_it(tmp_path, source):
    args = {"prompts.texts": [f"prompts.texts=['{LONG}']"], "prompts.negative": [f"prompts.negative='{LONG}'"],
            "a sweep's prompts.texts": ["-m", "seed=0,1", f"prompts.texts=['{LONG}']"]}.get(source)
    if args is None:
        (tmp_path / "prompts.txt").write_text(f"a cat\n{LONG}\n")
        args = [f"prompts.file={tmp_path / 'prompts.txt'}"]
    result, seconds = timed_cli(*args, "+experiment=smoke", "tracking=none", cwd=tmp_path)
    key = {"prompts.negative": "prompts.negative", "prompts.file": "prompts.file (prompt 2)"}.get(source, "prompts.texts[0]")
    assert_one_line_error(result, f"error: {key}: has 10,001 characters {LENGTH_BOUND}")
    assert seconds < FAST_S and "load:" not in result.stdout
    if source == "prompts.file":  # read at the door, after Hydra's record: no run left RUNNING, nothing made
        assert all(json.loads(f.read_text())["status"] == "FAILED" for f in tmp_path.rglob("status.json"))
        assert not list(tmp_path.rglob("*.png"))
    else:  # given inline: refused before Hydra made a folder or wrote .hydra/
        assert not (tmp_path / "outputs" / "runs").exists() and not (tmp_path / "outputs" / "multiruns").exists()
        assert not list(tmp_path.rglob(".hydra"))


def test_a_50mb_ish_prompt_in_a_png_never_reaches_hydras_record(tmp_path):
    """A PNG's infotext can carry a prompt no command line can (Linux caps one argument at 128 KB)."""
    info = PngInfo()
    info.add_text("parameters", "a cat " * 350_000 + "\nSteps: 4, Sampler: Euler, CFG scale: 7, Seed: 1, Size: 64x64")
    Image.new("RGB", (8, 8)).save(tmp_path / "hostile.png", pnginfo=info)
    result, seconds = timed_cli(str(tmp_path / "hostile.png"), "+experiment=smoke", "tracking=none", cwd=tmp_path,
                                command="from_png")
    assert result.returncode == 2 and "Traceback" not in result.stderr
    assert [line for line in result.stderr.splitlines() if line.startswith("error")] == \
        [f"error: Prompt: has 2,099,999 characters {LENGTH_BOUND}"]  # refused in from_png, before Hydra parses it
    assert seconds < FAST_S
    assert not (tmp_path / "outputs" / "runs").exists()  # no run folder, no .hydra/ (three copies of the prompt)
    assert not list(tmp_path.rglob(".hydra"))


def test_more_breaks_than_chunks_is_one_line_before_anything_loads(tmp_path):
    result, seconds = timed_cli("+experiment=smoke", "tracking=none", "prompts.syntax=a1111",
                                f"prompts.texts=[a cat,'{'a BREAK ' * 800}']", cwd=tmp_path)
    assert_one_line_error(result, f"error: prompts.texts[1]: has 800 BREAKs: at least 800 chunks {CHUNK_BOUND}")
    assert seconds < FAST_S and "load:" not in result.stdout


@pytest.mark.slow
def test_more_chunks_than_the_bound_is_one_line_before_compiling_and_the_run_fails(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    result, seconds = timed_cli("+experiment=smoke", "tracking=none", "prompts.syntax=a1111",
                                f"prompts.negative='{'a ' * 1600}'", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert_one_line_error(result, f"error: prompts.negative: takes 22 chunks {CHUNK_BOUND}")  # 1600 tokens
    assert seconds < FAST_S
    assert status(run_dir)["status"] == "FAILED" and "prompts.negative" in status(run_dir)["error"]
    assert not (run_dir / "images").exists() and not (run_dir / "timings.json").exists()


def test_prompts_at_the_bounds_are_planned(tmp_path):
    from helpers.configs import compose_cfg
    from sdjax_runner.config.plan import admit, make_plan
    from sdjax_runner.config.prompts import check_chunks

    at_bounds = "x" * 10_000, ("a BREAK " * 20).strip()
    cfg = compose_cfg(["+experiment=smoke", "prompts.syntax=a1111", f"prompts.texts=['{at_bounds[0]}','{at_bounds[1]}']"])
    assert make_plan(admit(cfg), 8).prompts == at_bounds
    check_chunks({"a prompt": "prompts.texts[0]"}, lambda text: 20)


# --- documented input that crashed: scheduler settings, a run folder that cannot be made --------------------

@pytest.mark.parametrize("args,expected", [
    (["+scheduler.config_overrides.num_train_timesteps=0"], "error: scheduler.config_overrides.num_train_timesteps: "
     "0 is not a count pndm can use (allowed: a whole number 1..10000)"),
    (["+scheduler.config_overrides.num_train_timesteps=1000000000"], "error: scheduler.config_overrides."
     "num_train_timesteps: 1000000000 is not a count pndm can use"),
    (["scheduler=dpm_solver_pp", "scheduler.config_overrides.solver_order=0"], "error: scheduler.config_overrides."
     "solver_order: 0 is not a count dpm_solver_pp can use (allowed: a whole number 1..3)"),
    (["+scheduler.config_overrides.beta_schedule=cosine"], "error: scheduler.config_overrides.beta_schedule: 'cosine' "
     "is not a beta_schedule pndm takes (allowed: linear, scaled_linear, squaredcos_cap_v2)"),
    (["scheduler=euler", "+scheduler.config_overrides.prediction_type=sample"], "error: scheduler.config_overrides."
     "prediction_type: 'sample' is not a prediction_type euler takes (allowed: epsilon, v_prediction)"),
    (["+scheduler.config_overrides.beta_end=1"], "error: scheduler.config_overrides.beta_end: 1 is not a beta "
     "(allowed: a number from 0 up to (not including) 1)"),
])
def test_scheduler_settings_that_break_the_scheduler_are_one_line_before_it_loads(tmp_path, args, expected):
    result, seconds = timed_cli("+experiment=smoke", "tracking=none", *args, cwd=tmp_path, cli=call_cli)
    assert_one_line_error(result, expected)
    assert seconds < FAST_S and "load:" not in result.stdout


@pytest.mark.slow
def test_a_beta_start_above_the_models_beta_end_is_one_line_once_its_config_is_read(tmp_path, tiny_model_dir):
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", "tracking=none", "+scheduler.config_overrides.beta_start=0.5",
                     f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert_one_line_error(result, "error: scheduler.config_overrides.beta_start: 0.5 is above the model's beta_end "
                                  "0.012 (allowed: a beta_start from 0 to 0.012)")  # (else: NaN images)
    assert status(run_dir)["status"] == "FAILED" and not (run_dir / "images").exists()


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc")
@pytest.mark.parametrize("key", ["hydra.run.dir", "paths.output_root", "paths.cache_dir", "compilation_cache.dir",
                                 "hydra.sweep.dir"])
def test_a_folder_that_cannot_be_made_is_one_line(tmp_path, key):
    """mkdir under /proc is ENOENT (as a folder without write permission is EACCES): before, a traceback."""
    sweep = ["-m", "seed=0,1"] if key == "hydra.sweep.dir" else []
    result, seconds = timed_cli(*sweep, "+experiment=smoke", "tracking=none", f"{key}=/proc/self/x", cwd=tmp_path)
    assert_one_line_error(result, f"error: {key}: /proc/self/x")
    assert "cannot be made: /proc/self takes no new folder (" in result.stderr
    assert result.stderr.rstrip().endswith("(allowed: a folder you can create and write in)")
    assert seconds < FAST_S and "load:" not in result.stdout


def test_asking_a_folder_leaves_nothing_behind(tmp_path):
    from sdjax_runner.config.checks import folder

    area = tmp_path / "area"
    area.mkdir()
    folder("hydra.run.dir", area / "new" / "run")
    folder("hydra.run.dir", area)
    assert list(area.iterdir()) == []
