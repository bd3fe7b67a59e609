"""The configuration reference, read from the schema's own documentation: the comments on each field of
:mod:`sdjax_runner.config.schema` (the lines above a field and the one beside it), its type, its default, and,
for a config group, its options with the first comment line of each option's YAML file.

docs/reference/config.md is this text (docs/hooks/reference.py writes it in when the site is built), so the
reference says what the runner accepts today; tests/test_docs.py checks that every key has its words."""

from __future__ import annotations

import ast
import dataclasses
import enum
import functools
import io
import tokenize
import typing
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from omegaconf import MISSING

from sdjax_runner.config import schema

PACKAGE_CONF = Path(schema.__file__).resolve().parent.parent / "conf"
# The top-level keys whose values come from a config group (group=option), not from the schema's default.
GROUPS = ("model", "dtype", "scheduler", "prompts", "sampling", "parallelism", "tracking", "experiment")


@dataclass(frozen=True)
class KeyDoc:
    key: str  # dotted, a list's items as key[]: lora[].scale
    kind: str  # what it takes, in words
    default: str  # the schema's default as a command line writes it, or "" when a group's option sets it
    text: str  # the schema's comments on the field, joined


@functools.cache
def _schema_source() -> tuple[str, ast.Module]:
    """schema.py's text and syntax tree, read once."""
    source = Path(schema.__file__).read_text(encoding="utf-8")
    return source, ast.parse(source)


@functools.cache
def _field_comments() -> dict[tuple[str, str], str]:
    """(class name, field name) -> its comments in schema.py: the comment lines just above it, then the one
    beside it."""
    source, tree = _schema_source()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string.lstrip("#").strip()
    lines = source.splitlines()
    found: dict[tuple[str, str], str] = {}
    for node in tree.body:
        if not isinstance(node, ast.ClassDef):
            continue
        for item in node.body:
            if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name):
                above: list[str] = []
                line = item.lineno - 1
                while line >= 1 and lines[line - 1].strip().startswith("#"):
                    above.insert(0, comments.get(line, ""))
                    line -= 1
                beside = comments.get(item.lineno) if item.lineno in comments and \
                    not lines[item.lineno - 1].strip().startswith("#") else None
                found[(node.name, item.target.id)] = " ".join([*above, *([beside] if beside else [])]).strip()
    return found


@functools.cache
def _enum_comments(kind: type) -> dict[str, str]:
    """An enum's members -> the comment beside each in schema.py (what the value means)."""
    source, tree = _schema_source()
    lines = source.splitlines()
    out: dict[str, str] = {}
    for node in tree.body:
        if isinstance(node, ast.ClassDef) and node.name == kind.__name__:
            for item in node.body:
                if isinstance(item, ast.Assign) and isinstance(item.targets[0], ast.Name):
                    text = lines[item.lineno - 1]
                    out[item.targets[0].id] = text.split("#", 1)[1].strip() if "#" in text else ""
    return out


@functools.cache
def _yaml_comments(path: Path = PACKAGE_CONF / "config.yaml") -> dict[str, str]:
    """Dotted key -> the comment lines just above it in a config YAML file (conf/config.yaml documents the
    keys it sets there, beside the schema)."""
    found: dict[str, str] = {}
    stack: list[tuple[int, str]] = []
    above: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            above.append(stripped.lstrip("#").strip())
            continue
        if not stripped or stripped.startswith("-") or ":" not in stripped:
            above = []
            continue
        indent = len(line) - len(line.lstrip())
        while stack and stack[-1][0] >= indent:
            stack.pop()
        name = stripped.split(":", 1)[0].strip()
        stack.append((indent, name))
        if above:
            found[".".join(n for _, n in stack)] = " ".join(above)
        above = []
    return found


def kind_in_words(kind: Any) -> str:
    """A schema type as a reader says it: ``an integer or null``, ``one of: pmap, sharded``."""
    inner, nullable = schema.without_null(kind)
    origin = typing.get_origin(inner)
    if isinstance(inner, type) and issubclass(inner, enum.Enum):
        words = "one of: " + ", ".join(member.name for member in inner)
    elif origin is list:
        (item,) = typing.get_args(inner) or (Any,)
        words = "a list of " + ("items with the keys below" if dataclasses.is_dataclass(item) else
                                kind_in_words(item).removeprefix("a ").removeprefix("an ") + "s")
    elif origin is dict:
        words = "a mapping of keys to values"
    else:
        words = schema.SCALAR_WORDS.get(inner, "a value (a path, or a list of paths)")
    return f"{words}, or null" if nullable else words


def _default(field: dataclasses.Field) -> str:
    if field.default is not dataclasses.MISSING:
        value = field.default
    elif field.default_factory is not dataclasses.MISSING:
        value = field.default_factory()
        if dataclasses.is_dataclass(value):
            return ""
    else:
        return ""
    if value is MISSING or value == MISSING:
        return ""
    if isinstance(value, enum.Enum):
        return value.name
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return "[]" if value == [] else "{}" if value == {} else str(value)


def keys(node: type = schema.RunConfig, prefix: str = "") -> Iterator[KeyDoc]:
    """Every key of the schema below ``node``, depth first, in declaration order."""
    comments = _field_comments()
    types = schema.field_types(node)
    for field in dataclasses.fields(node):
        key = f"{prefix}{field.name}"
        kind = types[field.name]
        inner, _ = schema.without_null(kind)
        text = comments.get((node.__name__, field.name)) or _yaml_comments().get(key, "")
        if isinstance(inner, type) and dataclasses.is_dataclass(inner):
            yield from keys(inner, f"{key}.")
            continue
        yield KeyDoc(key, kind_in_words(kind), _default(field), _with_values(text, inner))
        item = typing.get_args(inner)[0] if typing.get_origin(inner) is list else None
        if isinstance(item, type) and dataclasses.is_dataclass(item):
            yield from keys(item, f"{key}[].")


def _with_values(text: str, kind: Any) -> str:
    """The field's words, and for an enum what each value means."""
    if isinstance(kind, type) and issubclass(kind, enum.Enum):
        meanings = [f"`{name}`: {words}" for name, words in _enum_comments(kind).items() if words]
        if meanings:
            return " ".join([text, "Values: " + "; ".join(meanings) + "."]).strip()
    return text


def group_options() -> dict[str, list[tuple[str, str]]]:
    """Each config group of the package -> its options with the first comment line of each option's file."""
    out: dict[str, list[tuple[str, str]]] = {}
    for folder in sorted(p for p in PACKAGE_CONF.iterdir() if p.is_dir() and not p.name.startswith("_")):
        if folder.name == "hydra":
            continue
        options = []
        for path in sorted(folder.glob("*.yaml")):
            options.append((path.stem, _first_sentence(path)))
        out[folder.name] = options
    return out


def _first_sentence(path: Path) -> str:
    """The first sentence of the comment a YAML file opens with (after its ``# @package`` line)."""
    words: list[str] = []
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("# @package"):
            continue
        if not line.startswith("#"):
            break
        words.append(line.lstrip("#").strip())
    text = " ".join(words)
    end = text.find(". ")
    return text if end < 0 else text[:end + 1]


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def reference_markdown() -> str:
    """The reference as Markdown: the config groups and their options, then one table per top-level section."""
    parts = ["## Config groups", "",
             "Pick an option with `GROUP=OPTION` (`model=sd-v1-5`); `+experiment=NAME` adds an experiment. A "
             "`conf/GROUP/NAME.yaml` of your own in the working directory is an option too "
             "([Getting started](../getting-started.md)).", ""]
    for group, options in group_options().items():
        parts += [f"### {group}=OPTION", "", "| option | what it is |", "| --- | --- |"]
        parts += [f"| `{name}` | {_cell(first)} |" for name, first in options]
        parts.append("")
    parts += ["## Keys", "",
              "The default is the schema's; an option of a group (and an experiment) may set another. "
              "`python -m sdjax_runner +experiment=smoke --cfg job` prints every value a run would use.", ""]
    sections: dict[str, list[KeyDoc]] = {"top level": []}
    for doc in keys():
        nested = "." in doc.key or "[" in doc.key
        sections.setdefault(doc.key.split(".")[0].split("[")[0] if nested else "top level", []).append(doc)
    for section, docs in sections.items():
        parts += [f"### {section if section == 'top level' else section + '.*'}", "", "| key | takes | default | meaning |", "| --- | --- | --- | --- |"]
        for doc in docs:
            default = f"`{_cell(doc.default)}`" if doc.default else \
                ("set by its group" if doc.key.split(".")[0] in GROUPS else "--")
            parts.append(f"| `{doc.key}` | {_cell(doc.kind)} | {default} | {_cell(doc.text)} |")
        parts.append("")
    return "\n".join(parts) + "\n"
