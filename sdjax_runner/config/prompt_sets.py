"""Built-in prompt sets for evaluation (``prompts.set``): public benchmark prompts whose licences allow shipping
them, read from the package (sdjax_runner/conf/prompt_sets/), filtered by category and sampled.

* ``parti`` -- PartiPrompts (Yu et al. 2022, "Scaling Autoregressive Models for Content-Rich Text-to-Image
  Generation"): 1,632 English prompts in 12 categories (Animals, Artifacts, World Knowledge, People, ...) and 11
  challenge aspects. The file is google-research/parti's PartiPrompts.tsv at commit 5a657978134374ce28973948331b3
  19adef164bd (2022-06-28), byte for byte; Apache License 2.0 (the repository's LICENSE).

DrawBench (Saharia et al. 2022) is not shipped: its prompts are published in a spreadsheet without a licence that
allows redistributing them; give them as a ``prompts.file``.

A sample (``prompts.sample``) is drawn without replacement by NumPy's ``default_rng(prompts.sample_seed)`` from the
prompts the categories keep, and kept in the set's order: the same settings give the same prompts everywhere.
"""

from __future__ import annotations

import csv
import functools
from collections.abc import Sequence
from dataclasses import dataclass
from importlib import resources
from typing import Optional

from sdjax_runner.errors import UserError


@dataclass(frozen=True)
class PromptSet:
    file: str  # under sdjax_runner/conf/prompt_sets/
    text_column: str
    category_column: str
    source: str
    licence: str


SETS = {
    "parti": PromptSet("parti.tsv", "Prompt", "Category",
                       "google-research/parti PartiPrompts.tsv at 5a657978134374ce28973948331b319adef164bd",
                       "Apache-2.0"),
}


@functools.cache
def rows(name: str) -> tuple[tuple[str, str], ...]:
    """The set's (prompt, category) pairs, in the file's order (its tab-separated columns read verbatim: a quote
    is part of a prompt; each prompt's surrounding whitespace removed, as prompts.file's lines)."""
    found = SETS[name]
    text = resources.files("sdjax_runner.conf").joinpath("prompt_sets", found.file).read_text(encoding="utf-8")
    reader = csv.DictReader(text.splitlines(), delimiter="\t", quoting=csv.QUOTE_NONE)
    return tuple((row[found.text_column].strip(), row[found.category_column].strip()) for row in reader
                 if row[found.text_column].strip())


def categories(name: str) -> list[str]:
    """The set's categories, in order of first appearance."""
    return list(dict.fromkeys(category for _, category in rows(name)))


def read_set(name: str, wanted: Sequence[str] = (), sample: Optional[int] = None, seed: int = 0) -> list[str]:
    """The prompts of set ``name`` in the ``wanted`` categories (all: empty), ``sample`` of them (all: None);
    UserError naming the key and its allowed values otherwise."""
    if name not in SETS:
        raise UserError("prompts.set", str(name), ", ".join(SETS))
    known = categories(name)
    unknown = [c for c in wanted if c not in known]
    if unknown:
        raise UserError("prompts.categories", f"{unknown[0]} is not a category of {name}", ", ".join(known))
    kept = [prompt for prompt, category in rows(name) if not wanted or category in wanted]
    if sample is None:
        return kept
    if isinstance(sample, bool) or not isinstance(sample, int) or not 1 <= sample <= len(kept):
        raise UserError("prompts.sample", f"{sample}", f"a number of prompts from 1 to {len(kept)} (the prompts of "
                        f"{name}{' in ' + ', '.join(wanted) if wanted else ''}), or null for all")
    import numpy as np

    picked = np.random.default_rng(seed).choice(len(kept), size=sample, replace=False)
    return [kept[int(i)] for i in sorted(picked)]
