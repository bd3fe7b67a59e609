"""console.one_line and console.error_line: a library's error text as one line of a message or a log line."""

from __future__ import annotations

from sdjax_runner.console import DETAIL_LIMIT, error_line, one_line


def test_runs_of_whitespace_become_one_space_and_none_is_left_at_the_ends():
    assert one_line("  a   b  ") == "a b"
    assert one_line("a\nb\r\nc\rd") == "a b c d"
    assert one_line("while parsing\n  in '<unicode>', line 1\n\tcolumn 3\n\n") == \
        "while parsing in '<unicode>', line 1 column 3"
    assert one_line("a\x0b\x0cb\u2028c\xa0d") == "a b c d"  # vertical tab, form feed, line separator, NBSP


def test_the_line_is_cut_at_the_limit_after_the_whitespace_is_collapsed():
    assert one_line("a" * 500) == "a" * DETAIL_LIMIT
    assert one_line("a" * 500, 120) == "a" * 120
    assert one_line("a \n\n\n b " * 10, 6) == "a b a "
    assert one_line("short", 800) == "short"
    assert one_line("a" * 5000, None) == "a" * 5000  # None: nothing is cut
    assert one_line("x", 0) == ""


def test_anything_is_read_as_its_str():
    assert one_line(ValueError("bad\n  value")) == "bad value"
    assert one_line(KeyError("k")) == "'k'"
    assert one_line(12345, 3) == "123"
    assert one_line(None) == "None"


def test_empty_text_is_an_empty_line():
    assert one_line("") == ""
    assert one_line(" \n\t ") == ""
    assert one_line(ValueError()) == ""


def test_control_characters_other_than_whitespace_are_left_to_console_shown():
    assert one_line("a\x1b[2Jb\x07") == "a\x1b[2Jb\x07"


def test_error_line_names_the_type_of_an_exception_without_text():
    assert error_line(ValueError("cannot\nidentify image file")) == "cannot identify image file"
    assert error_line(OSError("x" * 300), 120) == "x" * 120
    assert error_line(ValueError()) == "ValueError"
    assert error_line(KeyError("")) == "''"
    assert error_line(RuntimeError(" \n "), 120) == "RuntimeError"
