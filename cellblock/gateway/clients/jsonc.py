"""JSON with comments, read for the exact span of each value and written in a file's own style.

`parse_jsonc` keeps every value's span, so the caller can replace exactly one of them; nothing is loaded
and dumped again. It reads JSONC (`//` and `/* */` comments, trailing commas), as VS Code writes
it; what `json_value` writes is plain JSON, so it stays valid for strict clients.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cellblock.gateway.clients.kinds import ClientConfigError

__all__ = [
    "Node",
    "indent_of_line",
    "indent_unit",
    "json_value",
    "line_col",
    "member",
    "parse_jsonc",
    "skip",
    "to_python",
]

_INLINE_ARRAY_WIDTH = 80  # arrays of scalars are written on one line up to this width


@dataclass(frozen=True, slots=True)
class Node:
    kind: str  # "object" | "array" | "scalar"
    start: int
    end: int
    members: tuple[tuple[str, int, Node], ...] = ()  # object: (key, where the key starts, value)
    items: tuple[Node, ...] = ()


class _ScanError(Exception):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true\b|false\b|null\b")
_SPACE = " \t\r\n\ufeff"


def skip(text: str, pos: int) -> int:
    """The position of the next token at or after `pos`, past whitespace and comments."""
    n = len(text)
    while pos < n:
        if text[pos] in _SPACE:
            pos += 1
        elif text.startswith("//", pos):
            end = text.find("\n", pos)
            pos = n if end < 0 else end
        elif text.startswith("/*", pos):
            end = text.find("*/", pos + 2)
            if end < 0:
                raise _ScanError("unterminated /* comment", pos)
            pos = end + 2
        else:
            break
    return pos


def _scan_value(text: str, pos: int) -> Node:
    pos = skip(text, pos)
    if pos >= len(text):
        raise _ScanError("expected a value, got the end of the file", pos)
    char = text[pos]
    if char in "{[":
        return _scan_container(text, pos)
    match = (_STRING if char == '"' else _SCALAR).match(text, pos)
    if match is None:
        raise _ScanError("unterminated string" if char == '"' else f"unexpected {char!r}", pos)
    return Node("scalar", pos, match.end())


def _scan_container(text: str, start: int) -> Node:
    is_object = text[start] == "{"
    close = "}" if is_object else "]"
    members: list[tuple[str, int, Node]] = []
    items: list[Node] = []
    pos = start + 1
    while True:
        pos = skip(text, pos)
        if text.startswith(close, pos):
            break
        if is_object:
            key_match = _STRING.match(text, pos)
            if key_match is None:
                raise _ScanError(f"expected a key in double quotes or {close!r}", pos)
            key = _decode(text, pos, key_match.end())
            pos = skip(text, key_match.end())
            if not text.startswith(":", pos):
                raise _ScanError("expected ':' after the key", pos)
            value = _scan_value(text, pos + 1)
            members.append((key, key_match.start(), value))
        else:
            value = _scan_value(text, pos)
            items.append(value)
        pos = skip(text, value.end)
        if text.startswith(",", pos):  # a trailing comma is allowed (JSONC): the loop then sees `close`
            pos += 1
        elif not text.startswith(close, pos):
            raise _ScanError(f"expected ',' or {close!r}", pos)
    kind = "object" if is_object else "array"
    return Node(kind, start, pos + 1, members=tuple(members), items=tuple(items))


def _decode(text: str, start: int, end: int) -> Any:
    try:
        return json.loads(text[start:end])
    except json.JSONDecodeError as exc:
        raise _ScanError(exc.msg, start + exc.pos) from exc


def to_python(text: str, node: Node) -> Any:
    if node.kind == "object":
        return {key: to_python(text, value) for key, _, value in node.members}
    if node.kind == "array":
        return [to_python(text, item) for item in node.items]
    return _decode(text, node.start, node.end)


def line_col(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    column = pos - text.rfind("\n", 0, pos)
    return f"line {line}, column {column}"


def parse_jsonc(text: str) -> Node:
    """The top-level object of a JSON(C) document.

    Raises:
        ClientConfigError: the text is not JSON(C), or its top level is not an object.
    """
    try:
        node = _scan_value(text, 0)
        rest = skip(text, node.end)
        if rest != len(text):
            raise _ScanError("unexpected text after the end of the document", rest)
        to_python(text, node)  # decodes every string and number once, so bad escapes fail here
    except _ScanError as exc:
        raise ClientConfigError(f"invalid JSON at {line_col(text, exc.pos)}: {exc.message}") from exc
    if node.kind != "object":
        raise ClientConfigError(f"the top level must be a JSON object (got {text[node.start]!r} at line 1)")
    return node


def member(text: str, node: Node, key: str) -> Node | None:
    found = [value for name, _, value in node.members if name == key]
    if len(found) > 1:
        where = " and ".join(line_col(text, value.start) for value in found)
        raise ClientConfigError(f"key {key!r} appears {len(found)} times ({where}); keep one")
    return found[0] if found else None


# --- writing ----------------------------------------------------------------------------------


def indent_of_line(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    line = text[start:pos]
    return line[: len(line) - len(line.lstrip(" \t"))]


def indent_unit(text: str) -> str:
    """The file's indentation step: that of its first indented key line, else two spaces."""
    for line in text.splitlines():
        stripped = line.lstrip(" \t")
        if stripped.startswith('"') and len(stripped) < len(line):
            return line[: len(line) - len(stripped)]
    return "  "


def _json_scalar(value: Any) -> str:
    if value is None or isinstance(value, str | bool | int | float):
        try:
            return json.dumps(value, ensure_ascii=False, allow_nan=False)
        except ValueError as exc:
            raise ClientConfigError(f"cannot write {value!r} as JSON") from exc
    raise ClientConfigError(f"cannot write a {type(value).__name__} as JSON")


def json_value(value: Any, indent: str, unit: str, nl: str) -> str:
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        inner = indent + unit
        members = [f"{inner}{_json_scalar(str(k))}: {json_value(v, inner, unit, nl)}" for k, v in value.items()]
        return "{" + nl + ("," + nl).join(members) + nl + indent + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        if not any(isinstance(item, Mapping | list | tuple) for item in value):
            flat = "[" + ", ".join(_json_scalar(item) for item in value) + "]"
            if len(flat) <= _INLINE_ARRAY_WIDTH:
                return flat
        inner = indent + unit
        return "[" + nl + ("," + nl).join(inner + json_value(v, inner, unit, nl) for v in value) + nl + indent + "]"
    return _json_scalar(value)
