"""A page in a real headless browser: Debian's Chromium (``apt-get install chromium``; the README's test
setup) driven by Playwright, which downloads no browser of its own."""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

BROWSERS = ("chromium", "chromium-browser", "google-chrome")
# As the machine's own Chromium probe starts it: no sandbox as root, and none of its background traffic.
FLAGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--disable-quic"]


def chromium() -> str:
    found = next((shutil.which(b) for b in BROWSERS if shutil.which(b)), None)
    assert found, "the browser tests need Chromium: apt-get install chromium (see the README's test setup)"
    return found


@dataclass
class Opened:
    page: Any
    console_errors: list[str] = field(default_factory=list)
    requests: list[str] = field(default_factory=list)  # every URL the page asked for


@contextlib.contextmanager
def open_page(url: str, width: int = 1400, height: int = 1000) -> Iterator[Opened]:
    """``url`` loaded (its load event fired) in headless Chromium; console errors, uncaught exceptions and
    requests recorded from the start."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium(), args=FLAGS, headless=True)
        try:
            page = browser.new_page(viewport={"width": width, "height": height})
            opened = Opened(page)
            page.on("console", lambda m: opened.console_errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: opened.console_errors.append(str(e)))
            page.on("request", lambda r: opened.requests.append(r.url))
            page.goto(url, wait_until="load")
            yield opened
        finally:
            browser.close()
