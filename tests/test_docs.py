"""The documentation: the site builds with ``mkdocs build --strict`` (no broken link or anchor), its start page
renders in headless Chromium with the navigation's sections, the configuration reference has every key of the
schema with its words, and every command line the README and the pages show is one the runner accepts (a run's
overrides compose and pass the schema; a command is one the dispatcher has)."""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]
SECTIONS = ["Home", "Getting started", "Guides", "Reference", "Performance", "Reliability", "Architecture"]
# Words standing for what the reader fills in: a line with one composes only once they are filled.
PLACEHOLDERS = re.compile(r"\$\w|\b(PATH|RUN_DIR|RUN_A|RUN_B|RUN|SWEEP_DIR|SWEEP|IMAGE|NAME|KEY|VALUE|DIR|URI|ID|N)\b|\.\.\.")


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    import os

    built = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-d", str(out)], cwd=ROOT,
                           capture_output=True, text=True, timeout=300,
                           env={**os.environ, "NO_MKDOCS_2_WARNING": "1"})  # Material's banner about its future
    assert built.returncode == 0, built.stdout + built.stderr
    assert not re.search(r"^(WARNING|ERROR)\b", built.stdout + built.stderr, re.M), built.stdout + built.stderr
    return out


@contextlib.contextmanager
def served(folder: Path) -> Iterator[str]:
    """``folder`` served over HTTP on 127.0.0.1 (as mkdocs serve would; the search needs HTTP), its base URL."""
    import functools
    import http.server
    import threading

    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args) -> None:  # no line per request in the test's output
            pass

    handler = functools.partial(Quiet, directory=str(folder))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@pytest.mark.browser
@pytest.mark.server
def test_the_site_builds_strict_and_its_start_page_renders_with_the_sections(site, tmp_path):
    """The start page in headless Chromium: a title, the navigation's sections, no console error, nothing asked
    of another host; its screenshot a rendered page (SDJAX_DOCS_SCREENSHOT=PATH keeps it: docs/site_start_page.png
    was taken so)."""
    import os

    import numpy as np
    from PIL import Image

    from helpers.browser import open_page

    with served(site) as url, open_page(f"{url}/index.html") as opened:
        page = opened.page
        nav = page.locator("nav.md-nav--primary").first.inner_text()
        for section in SECTIONS:
            assert section in nav, nav
        assert page.locator("h1").first.inner_text().strip()
        shot = Path(os.environ.get("SDJAX_DOCS_SCREENSHOT", tmp_path / "start_page.png"))
        page.screenshot(path=str(shot), full_page=False)
        assert not opened.console_errors, opened.console_errors
        assert all(asked.startswith((url, "data:", "blob:")) for asked in opened.requests), opened.requests
    pixels = np.asarray(Image.open(shot).convert("L"), dtype=float)
    assert pixels.shape == (1000, 1400) and pixels.std() > 10  # a rendered page, not a blank one


def test_the_configuration_reference_has_every_key_with_its_words(site):
    from sdjax_runner.config.schema_docs import group_options, keys

    page = (site / "reference" / "config.html").read_text()
    documented = list(keys())
    assert len(documented) > 80
    for doc in documented:
        assert doc.text, f"{doc.key} has no documentation in sdjax_runner/config/schema.py (or conf/config.yaml)"
        assert f"<code>{doc.key}</code>" in page, doc.key
    for group, options in group_options().items():
        for option, first in options:
            assert first, f"conf/{group}/{option}.yaml opens with no comment saying what it is"
            assert f"<code>{option}</code>" in page


def command_lines() -> list[tuple[str, str, str]]:
    """(page, line, the error it shows) for every ``python -m sdjax_runner ...`` line in a fenced block of the
    README and the pages (continuation lines joined; a transcript's ``$ `` dropped); the error is the
    ``error: ...`` line a transcript shows right after the command, or ""."""
    found: list[tuple[str, str, str]] = []
    for path in PAGES:
        in_block, pending, last_was_command = False, "", False
        for raw in path.read_text(encoding="utf-8").splitlines():
            if raw.lstrip().startswith("```"):
                in_block, pending, last_was_command = not in_block, "", False
                continue
            if not in_block:
                continue
            if raw.startswith("error: ") and found and found[-1][0] == str(path.relative_to(ROOT)) \
                    and not found[-1][2] and last_was_command:
                found[-1] = (found[-1][0], found[-1][1], raw.strip())
            line = pending + raw.strip()
            if line.endswith("\\"):
                pending = line[:-1] + " "
                continue
            pending = ""
            line = line.removeprefix("$ ")
            last_was_command = line.startswith("python -m sdjax_runner")
            if last_was_command:
                found.append((str(path.relative_to(ROOT)), line.split(" #")[0].split(" && ")[0].strip(), ""))
    return found


def first_points(words: list[str]) -> list[str]:
    """A sweep's overrides as its first point (``seed=0,1`` -> ``seed=0``), as Hydra's grammar renders them."""
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parsed = OverridesParser.create().parse_overrides(words)
    return [f"{o.input_line.split('=', 1)[0]}={next(iter(o.sweep_string_iterator()))}" if o.is_sweep_override()
            else o.input_line for o in parsed]


def without_flags(words: list[str]) -> list[str]:
    """The overrides of a run's command line: Hydra's flags (``--cfg job``, ``--config-dir DIR``) left out."""
    kept, skip = [], False
    for word in words:
        if skip:
            skip = False
        elif word in ("--cfg", "-c", "--config-dir", "-cd", "--config-name", "-cn", "--package", "-p", "--info"):
            skip = word != "--info"
        elif not word.startswith("--"):
            kept.append(word)
    return kept


@pytest.mark.slow
def test_every_command_line_in_the_readme_and_the_pages_is_one_the_runner_accepts(monkeypatch, tmp_path):
    """A run's overrides compose and pass the schema (a sweep's first point); a transcript's command gives the
    error the page shows (up to its list of allowed values), run as the reader would."""
    from helpers.cli import run_cli
    from helpers.configs import compose_cfg
    from sdjax_runner.commands import COMMANDS
    from sdjax_runner.config.plan import admit

    monkeypatch.chdir(ROOT)  # as a reader runs them: from the checkout (examples/, conf/)
    lines = command_lines()
    assert len(lines) > 40 and {page for page, _, _ in lines} >= {"README.md", "docs/getting-started.md"}
    composed = shown_errors = 0
    for page, line, error in lines:
        words = [w for w in shlex.split(line)[3:] if w not in ("-m", "--multirun")]
        if error:
            result = run_cli(*shlex.split(line)[3:], cwd=tmp_path)
            printed = [text for text in result.stderr.splitlines() if text.startswith("error: ")]
            assert result.returncode == 2 and printed, (page, line, result.stderr)
            assert printed[0].startswith(error.split(" (allowed")[0]), (page, line, printed[0])
            shown_errors += 1
            continue
        if (words and words[0] in COMMANDS) or words[:1] == ["--help"]:
            continue  # a command of the dispatcher: its --help is tested in tests/test_user_conf.py
        assert not words or "=" in words[0] or words[0].startswith(("+", "~", "-")), (page, line)
        words = without_flags(words)
        if PLACEHOLDERS.search(" ".join(words)):
            continue
        try:
            admit(compose_cfg(first_points(words)))
        except Exception as exc:  # any failure: it names the page and line
            pytest.fail(f"{page}: {line}\n  {type(exc).__name__}: {exc}")
        composed += 1
    assert composed > 30 and shown_errors >= 3


def test_the_readmes_links_into_the_docs_lead_to_pages_and_headings_that_exist(site):
    """mkdocs checks the pages' links; the README is outside the site, so its links are checked here."""
    links = re.findall(r"\]\((docs/[^)#\s]+)(?:#([^)\s]+))?\)", (ROOT / "README.md").read_text(encoding="utf-8"))
    assert len(links) > 15
    for target, anchor in links:
        assert (ROOT / target).is_file(), target
        if anchor and target.endswith(".md"):
            page = site / Path(target).relative_to("docs").with_suffix(".html")
            assert f'id="{anchor}"' in page.read_text(encoding="utf-8"), f"{target}#{anchor}"
