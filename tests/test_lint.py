"""Lint and types (docs/architecture.md, "Lint and types"): ruff on the code, the tests, the benchmarks, the
tools and the docs site's hooks (what ``ruff check .`` checks), and mypy on the package, each with its
pyproject.toml settings. Both run here so the README's test command (what CI runs) runs them."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LINTED = ["sdjax_runner", "hydra_plugins", "tests", "benchmarks", "examples", "tools", "docs"]


def run_tool(*args: str) -> subprocess.CompletedProcess:
    """``python -m TOOL ...`` from this interpreter (the test extra installs both) at the checkout's root,
    where pyproject.toml configures them."""
    return subprocess.run([sys.executable, "-m", *args], cwd=ROOT, capture_output=True, text=True, timeout=600)


def test_ruff_is_clean():
    result = run_tool("ruff", "check", "--no-cache", "--output-format=concise", *LINTED)
    assert result.returncode == 0, f"ruff check {' '.join(LINTED)}:\n{result.stdout}{result.stderr}"


def test_mypy_is_clean():
    # files, strictness and the per-library settings: [tool.mypy] in pyproject.toml.
    result = run_tool("mypy")
    assert result.returncode == 0, f"mypy:\n{result.stdout}{result.stderr}"
