"""MkDocs hook: the configuration reference (docs/reference/config.md) is written from the schema at build time."""

from __future__ import annotations

MARKER = "<!-- config reference: generated at build time from sdjax_runner/config/schema.py -->"


def on_page_markdown(markdown: str, page, config, files) -> str:
    if MARKER not in markdown:
        return markdown
    from sdjax_runner.config.schema_docs import reference_markdown

    return markdown.replace(MARKER, reference_markdown())
