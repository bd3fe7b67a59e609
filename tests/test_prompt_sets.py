"""#61 item 4: built-in prompt sets for evaluation (config/prompt_sets.py). PartiPrompts as google-research/parti
publishes it (read here with the csv module from the packaged file, the repository's PartiPrompts.tsv byte for
byte), its categories kept and sampled as said, bad values one line, and a run of a sample."""

from __future__ import annotations

import csv
import hashlib
import json
from importlib import resources

import pytest

from helpers.cli import assert_one_line_error, run_cli
from sdjax_runner.config.prompt_sets import categories, read_set

# sha256 of google-research/parti's PartiPrompts.tsv at commit 5a657978134374ce28973948331b319adef164bd.
PARTI_SHA256 = "fab29e41bb512a169b56acab4cf2a41dcb675e285df2efcde6640c7dd3c440eb"


def _published() -> list[dict]:
    text = resources.files("sdjax_runner.conf").joinpath("prompt_sets", "parti.tsv").read_text(encoding="utf-8")
    return list(csv.DictReader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE))


def test_parti_is_the_published_file_and_its_categories_filter_it():
    data = resources.files("sdjax_runner.conf").joinpath("prompt_sets", "parti.tsv").read_bytes()
    assert hashlib.sha256(data).hexdigest() == PARTI_SHA256
    rows = _published()
    # each prompt without its surrounding whitespace, as prompts.file's lines (a few end in a space)
    assert len(rows) == 1632 and read_set("parti") == [r["Prompt"].strip() for r in rows]
    assert any(p.startswith('"G I G G L E" painted') for p in read_set("parti"))  # its quotes are part of it
    assert len(categories("parti")) == 12 and "World Knowledge" in categories("parti")
    vehicles = read_set("parti", ["Vehicles", "Food & Beverage"])
    assert vehicles == [r["Prompt"].strip() for r in rows if r["Category"] in ("Vehicles", "Food & Beverage")]
    assert len(vehicles) == 104 + 74


def test_a_sample_is_drawn_by_its_seed_in_the_sets_order():
    everything = read_set("parti")
    sample = read_set("parti", sample=32, seed=3)
    assert sample == read_set("parti", sample=32, seed=3) != read_set("parti", sample=32, seed=4)
    assert len(set(sample)) == 32 and sample == sorted(sample, key=everything.index)
    animals = read_set("parti", ["Animals"], sample=314)
    assert animals == read_set("parti", ["Animals"])  # all of a category, in order


@pytest.mark.parametrize(("overrides", "expected"), [
    (["prompts=parti", "prompts.sample=5000"],
     "error: prompts.sample: 5000 (allowed: a number of prompts from 1 to 1632 (the prompts of parti), or null"),
    (["prompts=parti", "prompts.categories=[Vehicles]", "prompts.sample=105"],
     "error: prompts.sample: 105 (allowed: a number of prompts from 1 to 104 (the prompts of parti in Vehicles)"),
    (["prompts=parti", "prompts.sample=0"], "error: prompts.sample: 0 (allowed: a number of prompts from 1 to 1632"),
    (["prompts.set=drawbench"], "error: prompts.set: drawbench (allowed: parti)"),
    (["prompts=parti", "prompts.categories=[Animal]"],
     "error: prompts.categories: Animal is not a category of parti (allowed: Abstract, Vehicles, Illustrations,"),
])
def test_bad_prompt_set_values_are_one_line(tmp_path, overrides, expected):
    assert_one_line_error(run_cli("+experiment=smoke", *overrides, cwd=tmp_path), expected)


@pytest.mark.slow
def test_a_run_of_a_sample_of_a_category(tmp_path, tiny_model_dir):
    """prompts.set on the command line: the run's prompts are the set's sample alone (not the experiment's prompt
    too), one image each, recorded with the set's name."""
    wanted = {r["Prompt"].strip() for r in _published() if r["Category"] == "Vehicles"}
    run_dir = tmp_path / "run"
    result = run_cli("+experiment=smoke", "prompts.set=parti", "prompts.categories=[Vehicles]", "prompts.sample=8",
                     "tracking=none", "metrics.clip_score.enabled=false", f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    prompts = [r["prompt"] for r in json.loads((run_dir / "images.json").read_text())]
    assert len(prompts) == len(set(prompts)) == 8 and set(prompts) <= wanted
    assert prompts == read_set("parti", ["Vehicles"], sample=8, seed=0)
    assert json.loads((run_dir / "inputs.json").read_text())["prompt_set"] == "parti"
