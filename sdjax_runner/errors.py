"""User-facing errors: one line naming the offending key and what is allowed."""

from __future__ import annotations

import errno
from collections.abc import Iterable
from typing import Optional


class Terminated(BaseException):
    """SIGTERM, raised in the main thread so a run ends KILLED like on Ctrl-C (SIGINT)."""


def _terminate(signum: int, frame: object) -> None:
    raise Terminated()


def stop_on_sigterm() -> None:
    """SIGTERM (a scheduler's kill) ends a job as Ctrl-C does: the tracker run ends KILLED, status.json
    says so and what was written stays. (Python sees a signal between bytecodes: a long XLA call
    finishes first.)"""
    import signal

    signal.signal(signal.SIGTERM, _terminate)


def stop_exit_status(exc: BaseException) -> int:
    """A shell's status for a process stopped by a signal: 130 for Ctrl-C (SIGINT), 143 for SIGTERM."""
    import signal

    return 128 + (signal.SIGINT if isinstance(exc, KeyboardInterrupt) else signal.SIGTERM)


class Refused(BaseException):
    """Bad input found by a Hydra callback (a run or sweep about to start). Hydra turns an Exception
    raised in a callback into a warning and goes on; this passes through it to cli.main, which
    prints one line."""

    def __init__(self, error: UserError | str):
        super().__init__(str(error))


class UserError(Exception):
    """Bad input the user can fix. Printed as one line, never with a traceback."""

    def __init__(self, key: str, problem: str, allowed: Optional[str | Iterable[str]] = None):
        self.key = key
        self.problem = problem
        if allowed is not None and not isinstance(allowed, str):
            allowed = ", ".join(str(a) for a in allowed)
        self.allowed = allowed
        text = f"{key}: {problem}" if key else problem
        if allowed:
            text += f" (allowed: {allowed})"
        super().__init__(text)


# Write failures that are the machine's state, not a bug: one line, and what to do about it.
DISK_ERRORS = {
    errno.ENOSPC: "free space there, or another paths.output_root",
    errno.EDQUOT: "free space in your quota, or another paths.output_root",
    errno.EROFS: "a writable paths.output_root",
    errno.EACCES: "a paths.output_root you may write to",
}
