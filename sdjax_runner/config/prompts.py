"""The prompt list a run asks for (inline texts plus an optional prompt file), and what CLIP will read of it."""

from __future__ import annotations

import logging
from pathlib import Path

from sdjax_runner.errors import UserError

log = logging.getLogger("sdjax_runner")


def read_prompt_file(path: str) -> list[str]:
    """One prompt per line of a UTF-8 file; blank lines are skipped."""
    file = Path(path).expanduser()
    if not file.is_file():
        raise UserError("prompts.file", f"no such file: {file}", "a UTF-8 text file with one prompt per line")
    try:
        text = file.read_text(encoding="utf-8")
    except UnicodeDecodeError as exc:
        raise UserError("prompts.file", f"{file} is not valid UTF-8 (byte {exc.start})") from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise UserError("prompts.file", f"{file} has a NUL byte on line {line}: not a text file",
                        "a UTF-8 text file with one prompt per line")
    prompts = [line.strip() for line in text.splitlines() if line.strip()]
    if not prompts:
        raise UserError("prompts.file", f"{file} has no prompts", "a UTF-8 text file with one prompt per line")
    return prompts


def load_prompts(texts: list[str], file: str | None) -> list[str]:
    prompts = [str(t) for t in texts]
    for number, text in enumerate(prompts):
        if "\x00" in text:
            raise UserError(f"prompts.texts[{number}]", "contains a NUL byte", "printable text")
    if file:
        prompts += read_prompt_file(file)
    if not prompts:
        raise UserError("prompts.texts", "no prompts given", "a non-empty prompts.texts list or a prompts.file")
    return prompts


def warn_truncated(tokenizer, prompts: tuple[str, ...]) -> None:
    """CLIP reads model_max_length tokens (77 with start and end); say what a longer prompt loses."""
    limit = tokenizer.model_max_length
    unique = list(dict.fromkeys(prompts))
    for number, prompt in enumerate(unique, start=1):
        count = len(tokenizer(prompt, truncation=False).input_ids)
        if count > limit:
            kept = tokenizer.decode(tokenizer(prompt, truncation=True, max_length=limit).input_ids,
                                    skip_special_tokens=True)
            log.warning("prompt %d of %d has %d tokens; the text encoder reads %d, so the last %d are dropped "
                        "(it reads up to: ...%s)", number, len(unique), count, limit, count - limit, kept[-40:])
