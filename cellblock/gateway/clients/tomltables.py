"""The tables of a TOML document, with the span of each, and TOML written for a servers block.

Codex keeps its servers as `[mcp_servers.NAME]` tables. `tomllib` reads the values but not where
they are, so `find_tables` finds each table's header and the end of its content; `toml_table` writes
one table, mappings inside it as sub-tables.
"""

from __future__ import annotations

import re
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from cellblock.gateway.clients.kinds import ClientConfigError

__all__ = ["Table", "find_tables", "toml_table"]

_TOML_TOKEN = re.compile(
    r'"""(?:\\[\s\S]|[^\\])*?"""(?!")'  # multi-line basic string; `""""` closes after one quote
    r"|'''[\s\S]*?'''(?!')"
    r'|"(?:[^"\\\n]|\\.)*"'
    r"|'[^'\n]*'"
    r"|#[^\n]*"
    r"|\n"
    r"|[\[\]{}]"
    r"|[^\"'#\n\[\]{}]+"
)


@dataclass(frozen=True, slots=True)
class Table:
    keys: tuple[str, ...]  # the header's key path
    start: int  # start of the header line
    end: int  # end of its last line with content (header or key), before the line break
    has_keys: bool


def _header_keys(line: str) -> tuple[str, ...]:
    node: Any = tomllib.loads(line)
    keys: list[str] = []
    while isinstance(node, dict) and len(node) == 1:
        key = next(iter(node))
        keys.append(key)
        node = node[key]
        if isinstance(node, list):  # [[array.of.tables]]
            node = node[-1]
    return tuple(keys)


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    end = len(text) if end < 0 else end
    return end - 1 if end > 0 and text[end - 1] == "\r" else end


def find_tables(text: str) -> list[Table]:
    """Every table header of a valid TOML document and the extent of its table's content."""
    tables: list[Table] = []
    depth = 0
    line_start, line_blank, in_header = 0, True, False
    current: Table | None = None
    for token in _TOML_TOKEN.finditer(text):
        lexeme = token.group()
        if lexeme == "\n":
            line_start, line_blank, in_header = token.end(), True, False
            continue
        if lexeme.startswith("#") or not lexeme.strip():
            continue
        if lexeme == "[" and depth == 0 and line_blank and not in_header:
            if current is not None:
                tables.append(current)
            end = _line_end(text, token.start())
            keys = _header_keys(text[line_start:end])
            current = Table(keys, line_start, end, has_keys=False)
            in_header = True
        elif not in_header:
            if lexeme in ("[", "{"):  # an array or inline table: a `[` inside it opens no header
                depth += 1
            elif lexeme in ("]", "}"):
                depth -= 1
            if current is not None:
                current = Table(current.keys, current.start, _line_end(text, token.end()), has_keys=True)
        line_blank = False
    if current is not None:
        tables.append(current)
    return tables


# --- writing ----------------------------------------------------------------------------------


def _toml_string(value: str) -> str:
    escapes = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}
    out = []
    for char in value:
        if char in escapes:
            out.append(escapes[char])
        elif ord(char) < 0x20 or ord(char) == 0x7F:
            out.append(f"\\u{ord(char):04x}")
        else:
            out.append(char)
    return '"' + "".join(out) + '"'


def _toml_key(key: str) -> str:
    return key if re.fullmatch(r"[A-Za-z0-9_-]+", key) else _toml_string(key)


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int | float):
        return repr(value)  # TOML spells the special floats as Python does: inf, -inf, nan
    if isinstance(value, str):
        return _toml_string(value)
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml_value(item) for item in value) + "]"
    if isinstance(value, Mapping):
        return "{ " + ", ".join(f"{_toml_key(str(k))} = {_toml_value(v)}" for k, v in value.items()) + " }"
    raise ClientConfigError(f"cannot write {'null' if value is None else type(value).__name__} as TOML")


def toml_table(path: tuple[str, ...], table: Mapping[str, Any], nl: str) -> str:
    lines = ["[" + ".".join(_toml_key(key) for key in path) + "]"]
    subtables = []
    for key, value in table.items():
        if isinstance(value, Mapping):
            subtables.append(toml_table((*path, key), value, nl))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    return (nl + nl).join([nl.join(lines), *subtables])
