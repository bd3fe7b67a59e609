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
* :func:`a1111_sign` finds what, in a prompt read as plain text, is surely meant as A1111's syntax: a
  ``(text:1.3)`` weight, ``BREAK`` as a word, a ``[from:to:0.5]`` edit -- never a bare parenthesis.

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
# A1111's re_break, r"\s*\bBREAK\b\s*", which retries its leading \s* from every space of a run that does not
# end at BREAK (quadratic in the run's length); starting only where a run starts, it splits the same in a pass.
_BREAK = re.compile(r"(?:(?<!\s)\s+|)\bBREAK\b\s*")
_SPECIAL = re.compile(r"([\\()\[\]])")


_NUMBER = r"\s*[+-]?(?:\d+(?:\.\d*)?|\.\d+)\s*"
# Each alternative scans from a bracket to the next bracket or colon: linear in the prompt's length.
_A1111_SIGN = re.compile(r"(?<!\\)\([^()\[\]\\:]*:" + _NUMBER + r"\)"
                         r"|(?<!\\)\[[^()\[\]\\:]*:[^()\[\]\\:]*:" + _NUMBER + r"\]"
                         r"|\bBREAK\b")


class SyntaxProblem(ValueError):
    """A prompt A1111 would fail on (see the module docstring)."""


def parse_attention(text: str) -> list[list]:
    """[[text, weight], ...] of ``text`` as A1111 parses it (module docstring); BREAK is ["BREAK", -1.0].

    A1111 multiplies every piece after an opening bracket by the factor when the bracket closes, which is
    quadratic in the nesting (``"(a " * 30000``: minutes). Here each closing is recorded as a range of pieces
    and each piece's weight is the product of the ranges that hold it, in one pass (:func:`_products`):
    linear. A piece's factors are multiplied outermost first, A1111's in the order its brackets close, so
    with three or more different factors on one piece the weights can differ in the last bit of a float64
    (the encoder reads them as float32)."""
    texts: list[str] = []
    bases: list[float] = []  # 1.0, or BREAK's -1.0 (multiplied like any piece, as in A1111)
    rounds: list[tuple[int, int, float]] = []  # (first piece, end, factor) of each closed "(": A1111's multiply_range
    squares: list[tuple[int, int, float]] = []
    round_open: list[int] = []
    square_open: list[int] = []
    for match in _ATTENTION.finditer(text):
        part, weight = match.group(0), match.group(1)
        if part.startswith("\\"):
            texts.append(part[1:])
            bases.append(1.0)
        elif part == "(":
            round_open.append(len(texts))
        elif part == "[":
            square_open.append(len(texts))
        elif weight is not None and round_open:
            rounds.append((round_open.pop(), len(texts), _factor(weight, part)))
        elif part == ")" and round_open:
            rounds.append((round_open.pop(), len(texts), ROUND))
        elif part == "]" and square_open:
            squares.append((square_open.pop(), len(texts), SQUARE))
        else:
            for index, piece in enumerate(_BREAK.split(part)):
                if index > 0:
                    texts.append(BREAK[0])
                    bases.append(BREAK[1])
                texts.append(piece)
                bases.append(1.0)
    # Unclosed brackets close at the end, outermost first (A1111's order).
    rounds += [(start, len(texts), ROUND) for start in round_open]
    squares += [(start, len(texts), SQUARE) for start in square_open]
    if not texts:
        return [["", 1.0]]
    weights = [base * r * s for base, r, s in zip(bases, _products(rounds, len(texts)), _products(squares, len(texts)), strict=True)]
    return _merged(texts, weights)


ROUND, SQUARE = 1.1, 1 / 1.1  # A1111's round_bracket_multiplier, square_bracket_multiplier


def _factor(weight: str, part: str) -> float:
    try:
        return float(weight)
    except ValueError:
        raise SyntaxProblem(f"the weight {weight!r} in {part!r} is not a number") from None


def _products(ranges: list[tuple[int, int, float]], count: int) -> list[float]:
    """Each of ``count`` pieces' product of the factors of the ``ranges`` (first, end, factor) that hold it.
    Ranges of one bracket kind nest or are apart (a stack opened and closed them), so one sweep with a stack
    of the ranges open at each piece does it. ``ranges`` is in closing order: of the ranges that start at
    the same piece, a later one holds the earlier ones."""
    starting: dict[int, list[tuple[int, float]]] = {}
    for first, end, factor in ranges:
        if first < end:
            starting.setdefault(first, []).append((end, factor))
    products: list[float] = []
    open_ranges = [(count, 1.0)]  # (end, product of the factors of it and every range around it)
    for index in range(count):
        while open_ranges[-1][0] <= index:
            open_ranges.pop()
        for end, factor in reversed(starting.get(index, ())):  # the outermost first
            open_ranges.append((end, open_ranges[-1][1] * factor))
        products.append(open_ranges[-1][1])
    return products


def _merged(texts: list[str], weights: list[float]) -> list[list]:
    """Neighbouring pieces of equal weight as one (joined once: adding to a growing string is quadratic)."""
    runs: list[tuple[list[str], float]] = []
    for piece, weight in zip(texts, weights, strict=True):
        if runs and runs[-1][1] == weight:
            runs[-1][0].append(piece)
        else:
            runs.append(([piece], weight))
    return [["".join(pieces), weight] for pieces, weight in runs]


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

    for ids, (piece, weight) in zip(tokenize([p for p, _ in pieces]), pieces, strict=True):
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


def a1111_sign(text: str) -> str | None:
    """The first piece of ``text`` that only A1111's syntax gives a meaning (``(red:1.3)``, ``BREAK``,
    ``[cat:dog:0.5]``), or None."""
    found = _A1111_SIGN.search(text)
    return found.group(0) if found else None


def plain_text(text: str) -> str:
    """``text`` without its syntax: the pieces' text, BREAK as a space."""
    return "".join(" " if is_break(piece) else piece[0] for piece in parse_attention(text)).strip()


def escape(text: str) -> str:
    """``text`` with ``\\ ( ) [ ]`` escaped, so that A1111 reads it as exactly this text."""
    return _SPECIAL.sub(r"\\\1", text)
