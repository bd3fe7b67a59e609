"""The console: a run's lines go to standard output and to run.log. A reader that stops reading
standard output (``| head``, a pager closed early) ends the console's copy, never the run: the run
goes on, its lines still reach run.log, and no logging-error traceback is printed for each line."""

from __future__ import annotations

import logging
import os
import sys


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
