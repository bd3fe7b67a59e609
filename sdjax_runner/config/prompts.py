"""The prompt list a run asks for (inline texts plus an optional prompt file), and what CLIP will read of it."""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Optional

from sdjax_runner import process
from sdjax_runner.config.prompt_syntax import CHUNK, SyntaxProblem, a1111_sign, is_break, parse_attention
from sdjax_runner.console import shown
from sdjax_runner.errors import UserError
from sdjax_runner.files import not_a_file

log = logging.getLogger("sdjax_runner")
# A run makes at most 1,000,000 images (config/checks.py): that many prompts of 256 bytes each.
MAX_FILE_BYTES = 256 * 2**20
# One prompt's bounds: far above what anyone writes (A1111's users rarely pass 3 chunks, 225 tokens), low enough
# that a pasted file or a hostile PNG's infotext costs milliseconds. A prompt is written into .hydra/, parsed and
# tokenized; with prompts.syntax=a1111 each chunk is one more text-encoder pass per image and 77 more tokens for
# every cross-attention of the UNet (800 BREAKs: 800 chunks, gigabytes).
MAX_PROMPT_CHARS = 10_000
MAX_PROMPT_CHUNKS = 20
CHUNKS_ALLOWED = (f"at most {MAX_PROMPT_CHUNKS} chunks of {CHUNK} tokens ({MAX_PROMPT_CHUNKS * CHUNK:,} tokens) per "
                  "prompt with prompts.syntax=a1111, each BREAK ending one")


def read_prompt_file(path: str) -> list[str]:
    """One prompt per line of a UTF-8 file. Lines end at ``\n`` or ``\r\n`` only (not at the other
    characters Python's ``splitlines`` treats as line breaks, such as U+2028 or form feed, which stay
    inside a prompt); each line's surrounding whitespace (``str.strip``) is removed and blank lines
    are skipped."""
    file = Path(path).expanduser()
    missing = not_a_file(file)
    if missing:
        raise UserError("prompts.file", f"{missing}: {file}", "a UTF-8 text file with one prompt per line")
    size = file.stat().st_size
    if size > MAX_FILE_BYTES:  # read whole: a sparse file of terabytes costs no disk, but all the memory
        raise UserError("prompts.file", f"{file} has {size / 1e9:.1f} GB",
                        f"a prompt file of at most {MAX_FILE_BYTES // 2**20} MB")
    try:
        text = file.read_bytes().decode("utf-8")  # not read_text: its universal newlines end a line at a lone \r
    except UnicodeDecodeError as exc:
        raise UserError("prompts.file", f"{file} is not valid UTF-8 (byte {exc.start})") from None
    if "\x00" in text:
        line = text[: text.index("\x00")].count("\n") + 1
        raise UserError("prompts.file", f"{file} has a NUL byte on line {line}: not a text file",
                        "a UTF-8 text file with one prompt per line")
    prompts = [line.strip() for line in text.split("\n") if line.strip()]
    if not prompts:
        raise UserError("prompts.file", f"{file} has no prompts", "a UTF-8 text file with one prompt per line")
    for number, prompt in enumerate(prompts, start=1):
        check_length(file_key(number), prompt)
    return prompts


def file_key(number: int) -> str:
    """How a one-line error names prompt ``number`` (from 1) of prompts.file."""
    return f"prompts.file (prompt {number})"


def check_length(key: str, text: str) -> None:
    if len(text) > MAX_PROMPT_CHARS:
        raise UserError(key, f"has {len(text):,} characters", f"at most {MAX_PROMPT_CHARS:,} characters per prompt")


def file_replaces_texts(args: list[str]) -> list[str]:
    """Command-line overrides with ``prompts.texts=[]`` added where ``prompts.file`` (or ``prompts.set``) is given
    and ``prompts.texts`` is not: a prompt file then means exactly its prompts, not the prompts option's
    texts followed by them. Texts given on the command line too are kept, before the file's. Added
    before Hydra composes, so the run's recorded config and overrides say what ran."""
    keys = {arg.split("=", 1)[0].lstrip("+~") for arg in args if "=" in arg and not arg.startswith("-")}
    files = [arg.split("=", 1)[1] for arg in args if arg.split("=", 1)[0].lstrip("+") in ("prompts.file", "prompts.set")
             and "=" in arg]
    if "prompts.texts" in keys or not files or all(v.strip() in ("", "null") for v in files):
        return args
    return [*args, "prompts.texts=[]"]


def check_text(key: str, text: str) -> None:
    """A prompt from the command line or a config: valid UTF-8 (a shell can pass any bytes; Python
    keeps undecodable ones as lone surrogates, which fail only when written) and no NUL byte."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise UserError(key, f"is not valid UTF-8 (character {exc.start})", "UTF-8 text") from None
    if "\x00" in text:
        raise UserError(key, "contains a NUL byte", "printable text")
    check_length(key, text)


def load_prompts(texts: list[str], file: str | None, from_set: Sequence[str] = ()) -> list[str]:
    """prompts.texts, then prompts.file's prompts, then ``from_set`` (the prompt set's: :func:`set_prompts`)."""
    prompts = [str(t) for t in texts]
    for number, text in enumerate(prompts):
        check_text(f"prompts.texts[{number}]", text)
    if file:
        prompts += read_prompt_file(file)
    prompts += list(from_set)
    if not prompts:
        raise UserError("prompts.texts", "no prompts given",
                        "a non-empty prompts.texts list, a prompts.file or a prompts.set")
    return prompts


def set_prompts(config: Any) -> list[str]:
    """The prompts of ``config``'s (a prompts config's) prompts.set: config/prompt_sets.py; none without one."""
    if not getattr(config, "set", None):
        return []
    from sdjax_runner.config.prompt_sets import read_set

    return read_set(str(config.set), [str(c) for c in config.categories or []], config.sample, int(config.sample_seed))


def prompt_names(texts: int, file: int, from_set: int, set_name: Optional[str]) -> tuple[str, ...]:
    """The key a one-line error names each prompt by, in load_prompts' order: ``prompts.texts[i]``, then
    ``prompts.file (prompt n)``, then ``prompts.set (parti prompt n)``."""
    return (*(f"prompts.texts[{i}]" for i in range(texts)), *(file_key(n) for n in range(1, file + 1)),
            *(f"prompts.set ({set_name} prompt {n})" for n in range(1, from_set + 1)))


def named_prompts(prompts: list[str] | tuple[str, ...], names: Sequence[str],
                  negative: Optional[str]) -> dict[str, str]:
    """Each distinct prompt (``names``: :func:`prompt_names`) and the negative prompt -> the key a one-line error
    names it by (its first place)."""
    named: dict[str, str] = {}
    for text, name in zip(prompts, names, strict=True):
        named.setdefault(text, name)
    if negative:
        named.setdefault(negative, "prompts.negative")
    return named


def check_syntax(prompts: list[str], names: Sequence[str], negative: str | None) -> None:
    """``prompts.syntax=a1111``: a prompt that A1111 fails on (a weight such as ``(word:1.2.3)``,
    config/prompt_syntax.py) is one line naming it; everything A1111 reads leniently passes. So is one with
    more BREAKs than :data:`MAX_PROMPT_CHUNKS` (each ends a chunk: known before any tokenizer loads)."""
    for text, key in named_prompts(prompts, names, negative).items():
        try:
            pieces = parse_attention(text)
        except SyntaxProblem as problem:
            raise UserError(key, str(problem), "a number after the colon, as in (word:1.3), or \\( for a "
                            "literal bracket") from None
        breaks = sum(map(is_break, pieces))
        if breaks > MAX_PROMPT_CHUNKS:
            raise UserError(key, f"has {breaks} BREAKs: at least {breaks} chunks", CHUNKS_ALLOWED)


def check_chunks(named: dict[str, str], count_chunks: Callable[[str], int]) -> None:
    """``prompts.syntax=a1111``, once the tokenizer is loaded and before the program is made (its shape grows
    with the chunks): each prompt (``named``: :func:`named_prompts`) within :data:`MAX_PROMPT_CHUNKS`;
    ``count_chunks(text)``: the chunks it takes."""
    for text, key in named.items():
        count = count_chunks(text)
        if count > MAX_PROMPT_CHUNKS:
            raise UserError(key, f"takes {count} chunks", CHUNKS_ALLOWED)




def hint_a1111_syntax(named: dict[str, str]) -> None:
    """``prompts.syntax=plain``: one line, once, when a prompt (``named``: :func:`named_prompts`) holds what
    only A1111's syntax gives a meaning (config/prompt_syntax.a1111_sign) -- read here as plain text. The
    jobs of a sweep in one process with the same prompts hear it once."""
    signs = [(key, sign) for key, sign in ((key, a1111_sign(text)) for text, key in named.items()) if sign]
    hinted = process.current().hinted_prompts  # a sweep's jobs: said once
    if not signs or tuple(signs) in hinted:
        return
    hinted.add(tuple(signs))
    (key, sign), more = signs[0], len(signs) - 1
    log.warning("prompts: %s%s looks like A1111's prompt syntax (%r) but is read as plain text, brackets and "
                "numbers included (prompts.syntax=plain); prompts.syntax=a1111 reads weights, BREAK and [from:to:when] "
                "as A1111 does", key, f" (and {more} more prompt(s))" if more else "", shown(sign[:60]))


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
