"""A1111's prompt syntax (``prompts.syntax=a1111``), on the host: emphasis, BREAK and 75-token chunks.

* :func:`parse_attention` is A1111's ``parse_prompt_attention`` (modules/prompt_parser.py): ``(text)``
  multiplies the weight of its tokens by 1.1, ``[text]`` divides it by 1.1, ``(text:1.3)`` sets the
  factor, brackets nest and multiply, ``\\(`` ``\\)`` ``\\[`` ``\\]`` ``\\\\`` are literal characters, an
  unbalanced bracket is closed at the end of the prompt (A1111 is lenient: nothing is an error), and
  ``BREAK`` (the word, in capitals) ends a chunk. Neighbouring pieces of equal weight are merged.
* :func:`chunks` is A1111's ``tokenize_line`` (modules/sd_hijack_clip.py): the pieces' tokens (no start or
  end token) fill chunks of 75; a chunk that would overflow with a comma among its last 20 tokens is cut
  after that comma and the rest moves to the next chunk (``comma_padding_backtrack``); each chunk is
  start token + 75 + end token, padded, every token carrying its piece's weight (1.0 at the ends).
* :func:`plain_text` is what a prompt says without its syntax (CLIP score reads that), :func:`escape` a
  plain prompt written so that A1111 reads it as the same plain text (our PNGs' infotext).

A weight that matches A1111's pattern but is no number (``(red:1.2.3)``, ``(red:.)``) fails A1111's
generation; here it is a :class:`SyntaxProblem` (one line naming the prompt). A weight that is no number at
all (``(red:abc)``) is text, as in A1111.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

CHUNK = 75  # tokens of text per chunk; with the start and end tokens, the encoder's 77
COMMA_BACKTRACK = 20  # A1111's default comma_padding_backtrack
BREAK = ("BREAK", -1.0)

_ATTENTION = re.compile(r"""
\\\(|\\\)|\\\[|\\]|\\\\|\\|\(|\[|:\s*([+-]?[.\d]+)\s*\)|\)|]|[^\\()\[\]:]+|:
""", re.X)
_BREAK = re.compile(r"\s*\bBREAK\b\s*", re.S)
_SPECIAL = re.compile(r"([\\()\[\]])")


class SyntaxProblem(ValueError):
    """A prompt A1111 would fail on (see the module docstring)."""


def parse_attention(text: str) -> list[list]:
    """[[text, weight], ...] of ``text`` as A1111 parses it (module docstring); BREAK is ["BREAK", -1.0]."""
    pieces: list[list] = []
    round_open: list[int] = []
    square_open: list[int] = []

    def multiply(start: int, factor: float) -> None:
        for piece in pieces[start:]:
            piece[1] *= factor

    for match in _ATTENTION.finditer(text):
        part, weight = match.group(0), match.group(1)
        if part.startswith("\\"):
            pieces.append([part[1:], 1.0])
        elif part == "(":
            round_open.append(len(pieces))
        elif part == "[":
            square_open.append(len(pieces))
        elif weight is not None and round_open:
            try:
                factor = float(weight)
            except ValueError:
                raise SyntaxProblem(f"the weight {weight!r} in {part!r} is not a number") from None
            multiply(round_open.pop(), factor)
        elif part == ")" and round_open:
            multiply(round_open.pop(), 1.1)
        elif part == "]" and square_open:
            multiply(square_open.pop(), 1 / 1.1)
        else:
            for index, piece in enumerate(_BREAK.split(part)):
                if index > 0:
                    pieces.append(list(BREAK))
                pieces.append([piece, 1.0])
    for start in round_open:
        multiply(start, 1.1)
    for start in square_open:
        multiply(start, 1 / 1.1)
    if not pieces:
        pieces = [["", 1.0]]
    merged = [pieces[0]]
    for piece in pieces[1:]:
        if piece[1] == merged[-1][1]:
            merged[-1][0] += piece[0]
        else:
            merged.append(piece)
    return merged


@dataclass(frozen=True)
class Chunk:
    tokens: tuple[int, ...]  # 77: start, 75 of text or padding, end
    weights: tuple[float, ...]  # 77, 1.0 at the start, the end and the padding


def chunks(text: str, tokenize, start: int, end: int, pad: int, comma: int) -> list[Chunk]:
    """``text``'s chunks, A1111's way (module docstring). ``tokenize(list of str) -> list of token id
    lists`` without start/end tokens; ``start``, ``end``, ``pad``, ``comma``: the tokenizer's ids."""
    pieces = parse_attention(text)
    out: list[Chunk] = []
    tokens: list[int] = []
    weights: list[float] = []
    last_comma = -1

    def close() -> None:
        nonlocal tokens, weights, last_comma
        fill = CHUNK - len(tokens)
        # A1111 pads with the end token and, where the tokenizer pads with another (SD 2.x's "!"), turns
        # everything after the first end token into that (its process_tokens).
        out.append(Chunk(tuple([start] + tokens + [end] + [pad] * fill), tuple([1.0] + weights + [1.0] * (fill + 1))))
        tokens, weights, last_comma = [], [], -1

    for ids, (piece, weight) in zip(tokenize([p for p, _ in pieces]), pieces):
        if is_break([piece, weight]):
            close()
            continue
        for token in ids:
            if token == comma:
                last_comma = len(tokens)
            elif len(tokens) == CHUNK and last_comma != -1 and len(tokens) - last_comma <= COMMA_BACKTRACK:
                moved_tokens, moved_weights = tokens[last_comma + 1:], weights[last_comma + 1:]
                tokens, weights = tokens[:last_comma + 1], weights[:last_comma + 1]
                close()
                tokens, weights = moved_tokens, moved_weights
            if len(tokens) == CHUNK:
                close()
            tokens.append(token)
            weights.append(weight)
    if tokens or not out:
        close()
    return out


def is_break(piece: list) -> bool:
    return piece[0] == BREAK[0] and piece[1] == BREAK[1]


def plain_text(text: str) -> str:
    """``text`` without its syntax: the pieces' text, BREAK as a space."""
    return "".join(" " if is_break(piece) else piece[0] for piece in parse_attention(text)).strip()


def escape(text: str) -> str:
    """``text`` with ``\\ ( ) [ ]`` escaped, so that A1111 reads it as exactly this text."""
    return _SPECIAL.sub(r"\\\1", text)
