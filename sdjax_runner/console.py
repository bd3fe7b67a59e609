"""The console: a run's lines go to standard output and to run.log. A reader that stops reading
standard output (``| head``, a pager closed early) ends the console's copy, never the run: the run
goes on, its lines still reach run.log, and no logging-error traceback is printed for each line."""

from __future__ import annotations

import logging
import os
import sys
from typing import Optional

# How much of an error's text one line of the console or a message keeps: the limit most messages use.
DETAIL_LIMIT = 160


class ConsoleHandler(logging.StreamHandler):
    """``logging.StreamHandler`` that, once its reader is gone, sends what follows to /dev/null."""

    def handleError(self, record: logging.LogRecord) -> None:
        if isinstance(sys.exc_info()[1], BrokenPipeError):
            devnull = os.open(os.devnull, os.O_WRONLY)
            try:  # the stream's descriptor now leads nowhere: later lines and the flush at exit succeed
                os.dup2(devnull, self.stream.fileno())
            finally:
                os.close(devnull)
            return
        super().handleError(record)

    def format(self, record: logging.LogRecord) -> str:
        """The line, with control and bidi characters shown escaped (a run name, a prompt, a record's text
        cannot move the cursor, clear the screen, retitle the terminal or reorder what follows it)."""
        return shown(super().format(record), keep="\n\t")


def shown(text: object, keep: str = "") -> str:
    """``text`` as a terminal shows it safely: every character that is not printable -- ESC, BEL, CR and
    the other controls, bidi overrides (U+202E), zero-width and separator characters -- written as its
    Python escape (``\\x1b``, ``\\u202e``); the characters in ``keep`` (``"\\n"``) stay as they are."""
    text = str(text)
    if text.isprintable():
        return text
    return "".join(c if c.isprintable() or c in keep else c.encode("unicode_escape").decode("ascii") for c in text)


def one_line(text: object, limit: Optional[int] = DETAIL_LIMIT) -> str:
    """``text`` (``str()`` of it: an exception, a path, ...) as one line of at most ``limit`` characters:
    each run of whitespace -- line breaks, tabs, repeated spaces -- becomes one space, none is left at either
    end, and what is past ``limit`` is cut (``None``: nothing is). For a library's error text inside a log line
    or a message, which may span lines (a traceback-like YAML or Hydra error). Control characters other than
    whitespace stay as they are: :func:`shown` escapes those, where the line reaches a terminal."""
    line = " ".join(str(text).split())
    return line if limit is None else line[:limit]


def error_line(exc: BaseException, limit: Optional[int] = DETAIL_LIMIT) -> str:
    """An exception's text as :func:`one_line`, or its type's name where that is empty (``KeyError()``)."""
    return one_line(exc, limit) or type(exc).__name__


# The longest error line: a message quoting a value given (a 700 kB prompt list, say) keeps its start -- the key and
# what was wrong -- and its end -- what is allowed --, and says how much of the middle it left out.
ERROR_LIMIT = 4000


def bounded(text: str, limit: int = ERROR_LIMIT) -> str:
    if len(text) <= limit:
        return text
    head, tail = limit * 5 // 8, limit * 3 // 8
    return f"{text[:head]} ... [{len(text) - head - tail} characters left out] ... {text[-tail:]}"


def error(message: object) -> None:
    """``error: MESSAGE`` on standard error, as one bounded line whatever the message holds."""
    print(f"error: {bounded(shown(message))}", file=sys.stderr)


def say(text: object) -> None:
    """A command's output on standard output, its lines kept, every other control character escaped."""
    print(shown(text, keep="\n"))
