"""MCP client config files: find the servers block in each format, and edit only that block.

`cellblock wrap` replaces the servers a client starts with one `cellblock serve` entry, and
`cellblock unwrap` puts them back. Both must leave the rest of the file byte-for-byte as it was:
these files hold comments, key order, other tools' settings and, in `~/.claude.json`, a lot of
unrelated state. So nothing here loads and re-dumps a document. Instead a small scanner finds the
exact character span of the servers value, `render_block` writes a replacement for that span
only, and `replace_span` splices it in. Putting the old span text back restores the file.

Formats (checked against each client's documentation; see `KINDS`):

- JSON with a servers object: `mcpServers` for Claude Desktop, Claude Code, Cursor, Windsurf and
  Gemini CLI; `servers` for VS Code. `~/.claude.json` holds one user block at the top and one
  block per project under `projects.<dir>.mcpServers`.
- The scanner reads JSONC for every JSON kind (`//` and `/* */` comments, trailing commas), as
  VS Code writes it. What it renders is plain JSON, so the block stays valid for strict clients.
- Codex: TOML tables `[mcp_servers.NAME]`, with sub-tables such as `[mcp_servers.NAME.env]`.

Limitations:

- A rendered block is new text: comments inside the replaced block are not carried over. The
  caller keeps the old block text (`text[block.start:block.end]`) to restore it.
- Codex: the `[mcp_servers.*]` tables must sit together in the file. Another table between them
  (say `[profiles.x]`) is refused with `ClientConfigError`, because no single span could then be
  replaced. Servers written as dotted keys or inline tables (not as their own tables) are refused
  too. An entry's `raw_text` is the exact text of its tables when they are adjacent; otherwise
  it is their texts joined by a blank line.

Stdlib only (`json`, `tomllib`), so it is tested without the MCP SDK.
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from cellblock.policy.errors import CellblockError

__all__ = [
    "KINDS",
    "ClientConfigError",
    "ClientEntry",
    "ServersBlock",
    "detect",
    "entry_dict",
    "insert_block",
    "known_locations",
    "name_budget",
    "read_blocks",
    "render_block",
    "replace_span",
]

KINDS: Mapping[str, str] = MappingProxyType(
    {
        "claude-desktop": "Claude Desktop, claude_desktop_config.json (mcpServers)",
        "claude-code": "Claude Code, .mcp.json or ~/.claude.json (mcpServers, projects.<dir>.mcpServers)",
        "cursor": "Cursor, .cursor/mcp.json (mcpServers)",
        "vscode": "VS Code, .vscode/mcp.json or the user mcp.json (servers, JSONC)",
        "windsurf": "Windsurf, ~/.codeium/windsurf/mcp_config.json (mcpServers, remote via serverUrl)",
        "gemini": "Gemini CLI, .gemini/settings.json (mcpServers, remote via httpUrl or url)",
        "codex": "Codex, ~/.codex/config.toml ([mcp_servers.NAME] tables)",
    }
)

_SERVERS_KEY = {"vscode": "servers", "codex": "mcp_servers"}  # every other kind: "mcpServers"

# Per kind: (key in the file, field of ClientEntry), in priority order. A key whose field is
# already taken (Windsurf `url` beside `serverUrl`) stays in `extra`. Sources: each client's MCP
# docs (Claude Code, Cursor, VS Code "MCP configuration reference", docs.windsurf.com, Gemini CLI
# docs/tools/mcp-server.md) and, for Codex, `RawMcpServerConfig` in codex-rs/config/src/mcp_types.rs.
_REMOTE = (("type", "transport"), ("url", "url"), ("headers", "headers"))
_STDIO = (("command", "command"), ("args", "args"), ("env", "env"))
_FIELDS: dict[str, tuple[tuple[str, str], ...]] = {
    "claude-desktop": (*_STDIO, *_REMOTE),
    "claude-code": (*_STDIO, *_REMOTE),
    "cursor": (*_STDIO, *_REMOTE),
    "vscode": (*_STDIO, ("cwd", "cwd"), *_REMOTE),
    "windsurf": (*_STDIO, ("serverUrl", "url"), *_REMOTE),
    "gemini": (*_STDIO, ("cwd", "cwd"), ("type", "transport"), ("httpUrl", "url"), *_REMOTE[1:]),
    "codex": (*_STDIO, ("cwd", "cwd"), ("url", "url"), ("http_headers", "headers")),
}
# The transport a key implies when the entry writes no `type`.
_IMPLIED_TRANSPORT = {("gemini", "httpUrl"): "http", ("gemini", "url"): "sse", ("codex", "url"): "http"}

_MIN_NAME_LENGTH = 16  # Cellblock's `names.max_length` floor (gateway.config)
_INLINE_ARRAY_WIDTH = 80  # arrays of scalars are written on one line up to this width


class ClientConfigError(CellblockError, ValueError):
    """A client config file cannot be read or edited; the message names the place and the fix."""


@dataclass(frozen=True)
class ClientEntry:
    """One server entry of a client config, as the client would read it.

    `transport` is the `type` the entry writes; with none, the one its key implies (Gemini
    `httpUrl` → "http", Gemini `url` → "sse", Codex `url` → "http"); else None. `extra` holds the
    keys Cellblock does not interpret (`disabled`, `trust`, `envFile`, ...), so the caller can
    report them. `raw_text` is the exact source text of the entry's value (Codex: of its tables,
    see the module docstring).
    """

    name: str
    command: str | None
    args: tuple[str, ...]
    env: Mapping[str, str]
    cwd: str | None
    url: str | None
    headers: Mapping[str, str]
    transport: str | None
    extra: Mapping[str, Any]
    raw_text: str


@dataclass(frozen=True)
class ServersBlock:
    """A servers mapping and the span `text[start:end]` that holds it.

    JSON: the object, `{` to `}`. Codex: from the first `[mcp_servers...]` header to the end of
    the last line with content in the last such table (comments and blank lines after it stay out).
    """

    where: tuple[str, ...]
    start: int
    end: int
    entries: tuple[ClientEntry, ...]


# --- JSONC scanner ------------------------------------------------------------------------------


@dataclass(frozen=True, slots=True)
class _Node:
    kind: str  # "object" | "array" | "scalar"
    start: int
    end: int
    members: tuple[tuple[str, int, _Node], ...] = ()  # object: (key, where the key starts, value)
    items: tuple[_Node, ...] = ()


class _ScanError(Exception):
    def __init__(self, message: str, pos: int) -> None:
        super().__init__(message)
        self.message = message
        self.pos = pos


_STRING = re.compile(r'"(?:[^"\\\n]|\\.)*"')
_SCALAR = re.compile(r"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?|true\b|false\b|null\b")
_SPACE = " \t\r\n\ufeff"


def _skip(text: str, pos: int) -> int:
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


def _scan_value(text: str, pos: int) -> _Node:
    pos = _skip(text, pos)
    if pos >= len(text):
        raise _ScanError("expected a value, got the end of the file", pos)
    char = text[pos]
    if char in "{[":
        return _scan_container(text, pos)
    match = (_STRING if char == '"' else _SCALAR).match(text, pos)
    if match is None:
        raise _ScanError("unterminated string" if char == '"' else f"unexpected {char!r}", pos)
    return _Node("scalar", pos, match.end())


def _scan_container(text: str, start: int) -> _Node:
    is_object = text[start] == "{"
    close = "}" if is_object else "]"
    members: list[tuple[str, int, _Node]] = []
    items: list[_Node] = []
    pos = start + 1
    while True:
        pos = _skip(text, pos)
        if text.startswith(close, pos):
            break
        if is_object:
            key_match = _STRING.match(text, pos)
            if key_match is None:
                raise _ScanError(f"expected a key in double quotes or {close!r}", pos)
            key = _decode(text, pos, key_match.end())
            pos = _skip(text, key_match.end())
            if not text.startswith(":", pos):
                raise _ScanError("expected ':' after the key", pos)
            value = _scan_value(text, pos + 1)
            members.append((key, key_match.start(), value))
        else:
            value = _scan_value(text, pos)
            items.append(value)
        pos = _skip(text, value.end)
        if text.startswith(",", pos):  # a trailing comma is allowed (JSONC): the loop then sees `close`
            pos += 1
        elif not text.startswith(close, pos):
            raise _ScanError(f"expected ',' or {close!r}", pos)
    kind = "object" if is_object else "array"
    return _Node(kind, start, pos + 1, members=tuple(members), items=tuple(items))


def _decode(text: str, start: int, end: int) -> Any:
    try:
        return json.loads(text[start:end])
    except json.JSONDecodeError as exc:
        raise _ScanError(exc.msg, start + exc.pos) from exc


def _to_python(text: str, node: _Node) -> Any:
    if node.kind == "object":
        return {key: _to_python(text, value) for key, _, value in node.members}
    if node.kind == "array":
        return [_to_python(text, item) for item in node.items]
    return _decode(text, node.start, node.end)


def _line_col(text: str, pos: int) -> str:
    line = text.count("\n", 0, pos) + 1
    column = pos - text.rfind("\n", 0, pos)
    return f"line {line}, column {column}"


def _parse_jsonc(text: str) -> _Node:
    """The top-level object of a JSON(C) document.

    Raises:
        ClientConfigError: the text is not JSON(C), or its top level is not an object.
    """
    try:
        node = _scan_value(text, 0)
        rest = _skip(text, node.end)
        if rest != len(text):
            raise _ScanError("unexpected text after the end of the document", rest)
        _to_python(text, node)  # decodes every string and number once, so bad escapes fail here
    except _ScanError as exc:
        raise ClientConfigError(f"invalid JSON at {_line_col(text, exc.pos)}: {exc.message}") from exc
    if node.kind != "object":
        raise ClientConfigError(f"the top level must be a JSON object (got {text[node.start]!r} at line 1)")
    return node


def _member(text: str, node: _Node, key: str) -> _Node | None:
    found = [value for name, _, value in node.members if name == key]
    if len(found) > 1:
        where = " and ".join(_line_col(text, value.start) for value in found)
        raise ClientConfigError(f"key {key!r} appears {len(found)} times ({where}); keep one")
    return found[0] if found else None


# --- reading ------------------------------------------------------------------------------------


def _check_kind(kind: str) -> None:
    if kind not in KINDS:
        raise ClientConfigError(f"unknown client kind {kind!r}; expected one of {', '.join(KINDS)}")


def _type_name(value: Any) -> str:
    names = {dict: "object", list: "array", str: "string", bool: "boolean", int: "number", float: "number"}
    return "null" if value is None else names.get(type(value), type(value).__name__)


def _string(server: str, field: str, value: Any, *, numbers: bool = False) -> str:
    if isinstance(value, str):
        return value
    if numbers and isinstance(value, int | float) and not isinstance(value, bool):
        return json.dumps(value)  # VS Code allows numbers as env values
    raise ClientConfigError(f"server {server!r}: {field!r} must be a string (got {_type_name(value)})")


def _string_list(server: str, field: str, value: Any) -> tuple[str, ...]:
    if not isinstance(value, list):
        raise ClientConfigError(f"server {server!r}: {field!r} must be an array of strings (got {_type_name(value)})")
    return tuple(_string(server, f"{field}[{i}]", item) for i, item in enumerate(value))


def _string_map(server: str, field: str, value: Any) -> Mapping[str, str]:
    if not isinstance(value, dict):
        raise ClientConfigError(f"server {server!r}: {field!r} must be an object of strings (got {_type_name(value)})")
    return MappingProxyType({k: _string(server, f"{field}.{k}", v, numbers=True) for k, v in value.items()})


def _entry(kind: str, name: str, value: Any, raw_text: str) -> ClientEntry:
    if not isinstance(value, dict):
        raise ClientConfigError(f"server {name!r} must be an object (got {_type_name(value)})")
    fields: dict[str, Any] = {}
    used: set[str] = set()
    for key, field in _FIELDS[kind]:
        if key not in value or field in fields:
            continue
        item = value[key]
        used.add(key)
        if field == "args":
            fields[field] = _string_list(name, key, item)
        elif field in ("env", "headers"):
            fields[field] = _string_map(name, key, item)
        else:
            fields[field] = _string(name, key, item)
        if field == "url" and (kind, key) in _IMPLIED_TRANSPORT:
            fields.setdefault("implied", _IMPLIED_TRANSPORT[kind, key])
    return ClientEntry(
        name=name,
        command=fields.get("command"),
        args=fields.get("args", ()),
        env=fields.get("env", MappingProxyType({})),
        cwd=fields.get("cwd"),
        url=fields.get("url"),
        headers=fields.get("headers", MappingProxyType({})),
        transport=fields.get("transport", fields.get("implied")),
        extra=MappingProxyType({key: item for key, item in value.items() if key not in used}),
        raw_text=raw_text,
    )


def _json_block(kind: str, text: str, where: tuple[str, ...], node: _Node) -> ServersBlock:
    if node.kind != "object":
        raise ClientConfigError(f"{'.'.join(where)!r} at {_line_col(text, node.start)} must be an object")
    entries: list[ClientEntry] = []
    for name, _, value in node.members:
        _member(text, node, name)  # refuses a server name written twice
        raw = text[value.start : value.end]
        entries.append(_entry(kind, name, _to_python(text, value), raw))
    return ServersBlock(where=where, start=node.start, end=node.end, entries=tuple(entries))


def read_blocks(kind: str, text: str) -> list[ServersBlock]:
    """Every servers block of a client config, in file order; none when the key is absent.

    Only `~/.claude.json` (kind "claude-code") has several: the user block at the top, then one
    per project under `projects.<dir>.mcpServers`, including empty ones.

    Raises:
        ClientConfigError: unknown kind, a parse error (with line and column), or a servers
            value or entry of the wrong shape.
    """
    _check_kind(kind)
    if not text.strip():
        return []
    if kind == "codex":
        return _codex_blocks(text)
    top = _parse_jsonc(text)
    key = _SERVERS_KEY.get(kind, "mcpServers")
    blocks: list[ServersBlock] = []
    servers = _member(text, top, key)
    if servers is not None:
        blocks.append(_json_block(kind, text, (key,), servers))
    projects = _member(text, top, "projects") if kind == "claude-code" else None
    if projects is not None and projects.kind == "object":
        for directory, _, project in projects.members:
            found = _member(text, project, key) if project.kind == "object" else None
            if found is not None:
                blocks.append(_json_block(kind, text, ("projects", directory, key), found))
    return blocks


# --- Codex TOML ---------------------------------------------------------------------------------

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
class _Table:
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


def _toml_tables(text: str) -> list[_Table]:
    """Every table header of a valid TOML document and the extent of its table's content."""
    tables: list[_Table] = []
    depth = 0
    line_start, line_blank, in_header = 0, True, False
    current: _Table | None = None
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
            current = _Table(keys, line_start, end, has_keys=False)
            in_header = True
        elif not in_header:
            if lexeme in ("[", "{"):  # an array or inline table: a `[` inside it opens no header
                depth += 1
            elif lexeme in ("]", "}"):
                depth -= 1
            if current is not None:
                current = _Table(current.keys, current.start, _line_end(text, token.end()), has_keys=True)
        line_blank = False
    if current is not None:
        tables.append(current)
    return tables


def _codex_blocks(text: str) -> list[ServersBlock]:
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClientConfigError(f"invalid TOML: {exc}") from exc
    servers = document.get("mcp_servers")
    if servers is None:
        return []
    if not isinstance(servers, dict):
        raise ClientConfigError(f"'mcp_servers' must be a table (got {_type_name(servers)})")
    tables = _toml_tables(text)
    mine = [i for i, table in enumerate(tables) if table.keys[:1] == ("mcp_servers",)]
    unsupported = ClientConfigError(
        "'mcp_servers' is written as dotted keys or an inline table; write each server as its own "
        "[mcp_servers.NAME] table so it can be edited in place"
    )
    if not mine:
        raise unsupported
    between = [tables[i] for i in range(mine[0], mine[-1] + 1) if i not in mine]
    if between:
        raise ClientConfigError(
            f"the [mcp_servers.*] tables must sit together, but [{'.'.join(between[0].keys)}] at "
            f"{_line_col(text, between[0].start)} is between them; move it above or below them"
        )
    start, end = tables[mine[0]].start, tables[mine[-1]].end
    if any(len(tables[i].keys) == 1 and tables[i].has_keys for i in mine):
        raise unsupported
    if tomllib.loads(text[start:end]).get("mcp_servers") != servers:
        raise unsupported
    entries = []
    for name, value in servers.items():
        own = [i for i in mine if tables[i].keys[1:2] == (name,)]
        if not own:
            raise unsupported
        if own == list(range(own[0], own[-1] + 1)):
            raw = text[tables[own[0]].start : tables[own[-1]].end]
        else:
            raw = "\n\n".join(text[tables[i].start : tables[i].end] for i in own)
        entries.append(_entry("codex", name, value, raw))
    return [ServersBlock(where=("mcp_servers",), start=start, end=end, entries=tuple(entries))]


# --- rendering ----------------------------------------------------------------------------------


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def _indent_of_line(text: str, pos: int) -> str:
    start = text.rfind("\n", 0, pos) + 1
    line = text[start:pos]
    return line[: len(line) - len(line.lstrip(" \t"))]


def _indent_unit(text: str) -> str:
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


def _json_value(value: Any, indent: str, unit: str, nl: str) -> str:
    if isinstance(value, Mapping):
        if not value:
            return "{}"
        inner = indent + unit
        members = [f"{inner}{_json_scalar(str(k))}: {_json_value(v, inner, unit, nl)}" for k, v in value.items()]
        return "{" + nl + ("," + nl).join(members) + nl + indent + "}"
    if isinstance(value, list | tuple):
        if not value:
            return "[]"
        if not any(isinstance(item, Mapping | list | tuple) for item in value):
            flat = "[" + ", ".join(_json_scalar(item) for item in value) + "]"
            if len(flat) <= _INLINE_ARRAY_WIDTH:
                return flat
        inner = indent + unit
        return "[" + nl + ("," + nl).join(inner + _json_value(v, inner, unit, nl) for v in value) + nl + indent + "]"
    return _json_scalar(value)


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


def _toml_table(path: tuple[str, ...], table: Mapping[str, Any], nl: str) -> str:
    lines = ["[" + ".".join(_toml_key(key) for key in path) + "]"]
    subtables = []
    for key, value in table.items():
        if isinstance(value, Mapping):
            subtables.append(_toml_table((*path, key), value, nl))
        else:
            lines.append(f"{_toml_key(key)} = {_toml_value(value)}")
    return (nl + nl).join([nl.join(lines), *subtables])


def _check_entries(entries: Mapping[str, Mapping[str, Any]]) -> None:
    for name, entry in entries.items():
        if not isinstance(entry, Mapping):
            raise ClientConfigError(f"server {name!r}: an entry must be a mapping (got {type(entry).__name__})")


def _render(kind: str, entries: Mapping[str, Mapping[str, Any]], indent: str, unit: str, nl: str) -> str:
    _check_entries(entries)
    if kind == "codex":
        return (nl + nl).join(_toml_table(("mcp_servers", name), entry, nl) for name, entry in entries.items())
    return _json_value(entries, indent, unit, nl)


def render_block(kind: str, block: ServersBlock, text: str, entries: Mapping[str, Mapping[str, Any]]) -> str:
    """The text to put in place of `text[block.start:block.end]` so that it holds exactly `entries`.

    `entries` maps a server name to its entry in this client's shape (see `entry_dict`). JSON is
    indented like the block it replaces (its column and the file's step, tabs or spaces) and uses
    the file's line breaks; Codex gets one `[mcp_servers.NAME]` table per entry, mappings inside
    an entry as sub-tables.

    Raises:
        ClientConfigError: unknown kind, or an entry value JSON or TOML cannot hold.
    """
    _check_kind(kind)
    nl = _newline(text)
    indent = _indent_of_line(text, block.start)
    unit = _indent_unit(text)
    if kind != "codex" and block.entries:
        first = _skip(text, block.start + 1)
        own = _indent_of_line(text, first)
        starts_line = len(own) == first - (text.rfind("\n", 0, first) + 1)
        if starts_line and len(own) > len(indent) and own.startswith(indent):
            unit = own[len(indent) :]  # the step the block's own members use
    return _render(kind, entries, indent, unit, nl)


def entry_dict(kind: str, command: str, args: Sequence[str]) -> dict[str, Any]:
    """A stdio entry in this client's shape: `command` and `args`, plus `type` where it is written.

    VS Code requires `"type": "stdio"`; Claude Code writes it too (`claude mcp add`).

    Raises:
        ClientConfigError: unknown kind.
    """
    _check_kind(kind)
    entry: dict[str, Any] = {"type": "stdio"} if kind in ("vscode", "claude-code") else {}
    entry["command"] = command
    entry["args"] = list(args)
    return entry


def replace_span(text: str, start: int, end: int, new: str) -> str:
    """`text` with `text[start:end]` replaced by `new`.

    Raises:
        ClientConfigError: the span is not inside the text.
    """
    if not 0 <= start <= end <= len(text):
        raise ClientConfigError(f"span {start}..{end} is not inside a text of {len(text)} characters")
    return text[:start] + new + text[end:]


def insert_block(kind: str, text: str, entries: Mapping[str, Mapping[str, Any]]) -> str:
    """`text` with a servers key holding `entries` added, for a file that has none.

    JSON: a new last member of the top-level object (after any trailing comment on the last
    member's line); an empty text becomes a new document. Codex: tables appended at the end.

    Raises:
        ClientConfigError: unknown kind, a parse error, or the servers key is already there
            (use `render_block` for that).
    """
    _check_kind(kind)
    nl = _newline(text)
    if kind == "codex":
        if read_blocks(kind, text):
            raise ClientConfigError("the file already has [mcp_servers] tables; replace them with render_block")
        body = _render(kind, entries, "", "", nl)
        if not text.strip():
            return body + nl
        return text + ("" if text.endswith("\n") else nl) + nl + body + nl
    key = _SERVERS_KEY.get(kind, "mcpServers")
    unit = _indent_unit(text)
    if not text.strip():
        return "{" + nl + unit + _json_scalar(key) + ": " + _render(kind, entries, unit, unit, nl) + nl + "}" + nl
    top = _parse_jsonc(text)
    if _member(text, top, key) is not None:
        raise ClientConfigError(f"the file already has {key!r}; replace it with render_block")
    if not top.members:
        member = unit + _json_scalar(key) + ": " + _render(kind, entries, unit, unit, nl)
        inside = text[top.start + 1 : top.end - 1]
        if not inside.strip():
            return text[: top.start + 1] + nl + member + nl + text[top.end - 1 :]
        return text[: top.start + 1] + nl + member + text[top.start + 1 :]
    _, key_start, last = top.members[-1]
    indent = _indent_of_line(text, key_start) or unit
    member = indent + _json_scalar(key) + ": " + _render(kind, entries, indent, unit, nl)
    after = _skip(text, last.end)
    comma, anchor = ("", after + 1) if text.startswith(",", after) else (",", last.end)
    rest = text[anchor : _line_end(text, anchor)]
    # After a trailing `// comment` on the last member's line, so the comment stays with it.
    at = _line_end(text, anchor) if not rest.strip() or rest.lstrip().startswith("//") else anchor
    return text[: last.end] + comma + text[last.end : at] + nl + member + text[at:]


# --- where the files are, and what names they accept --------------------------------------------


def known_locations(home: Path, cwd: Path, platform: str = sys.platform) -> list[tuple[str, Path]]:
    """(kind, path) of every config file a client reads on `platform`, for the user and for `cwd`.

    Paths only: whether a file exists is the caller's question. Windows paths assume the default
    `%APPDATA%` (`~/AppData/Roaming`).
    """
    if platform == "darwin":
        app_data = home / "Library" / "Application Support"
    elif platform == "win32":
        app_data = home / "AppData" / "Roaming"
    else:
        app_data = home / ".config"
    found = [
        ("claude-desktop", app_data / "Claude" / "claude_desktop_config.json"),
        ("claude-code", home / ".claude.json"),
        ("claude-code", cwd / ".mcp.json"),
        ("cursor", home / ".cursor" / "mcp.json"),
        ("cursor", cwd / ".cursor" / "mcp.json"),
        ("vscode", app_data / "Code" / "User" / "mcp.json"),
        ("vscode", cwd / ".vscode" / "mcp.json"),
        ("windsurf", home / ".codeium" / "windsurf" / "mcp_config.json"),
        ("gemini", home / ".gemini" / "settings.json"),
        ("gemini", cwd / ".gemini" / "settings.json"),
        ("codex", home / ".codex" / "config.toml"),
        ("codex", cwd / ".codex" / "config.toml"),  # read only in a project Codex trusts
    ]
    unique: list[tuple[str, Path]] = []
    for kind, path in found:  # with cwd == home, the project files are the user files
        if all(path != seen for _, seen in unique):
            unique.append((kind, path))
    return unique


def name_budget(kind: str, key: str) -> int:
    """The `names.max_length` under which `kind` accepts every tool name when Cellblock is `key`.

    Raises:
        ClientConfigError: unknown kind.
    """
    _check_kind(kind)
    if kind in ("claude-code", "codex"):
        # Both show `mcp__<key>__<tool>` and cap the whole at 64: Claude Code's tool search breaks
        # past it (anthropics/claude-code#19882); Codex hashes longer names (MAX_TOOL_NAME_LENGTH).
        budget = 64 - len(f"mcp__{key}__")
    elif kind == "gemini":
        # Gemini CLI calls the tool `mcp_<key>_<tool>` and middle-truncates past 63 characters,
        # which can merge two names (google-gemini/gemini-cli#20987, #28971).
        budget = 63 - len(f"mcp_{key}_")
    elif kind == "cursor":
        # Cursor filters out a tool when "Combined server and tool name length (60) exceeds 60
        # characters" (its warning, quoted in ComposioHQ/composio#2788): 60 itself is refused.
        budget = 59 - len(key)
    else:
        budget = 64
    return max(_MIN_NAME_LENGTH, budget)


# --- which format a file is ---------------------------------------------------------------------


def _by_name(path: Path) -> str | None:
    name, parent = path.name, path.parent.name
    if name == "claude_desktop_config.json":
        return "claude-desktop"
    if name in (".claude.json", ".mcp.json"):
        return "claude-code"
    if name == "mcp_config.json":
        return "windsurf"
    if name == "mcp.json" and parent == ".cursor":
        return "cursor"
    if name == "mcp.json" and (parent == ".vscode" or (parent == "User" and "Code" in path.parent.parent.name)):
        return "vscode"
    if name == "settings.json" and parent == ".gemini":
        return "gemini"
    if name == "config.toml" and parent == ".codex":
        return "codex"
    return None


def _by_content(path: Path, text: str) -> str | None:
    if path.suffix == ".toml":
        try:
            return "codex" if "mcp_servers" in tomllib.loads(text) else None
        except tomllib.TOMLDecodeError as exc:
            raise ClientConfigError(f"{path}: invalid TOML: {exc}") from exc
    try:
        top = _parse_jsonc(text)
    except ClientConfigError as exc:
        raise ClientConfigError(f"{path}: {exc}") from exc
    keys = {key for key, _, _ in top.members}
    if "servers" in keys:
        return "vscode"
    return "claude-desktop" if "mcpServers" in keys else None


def detect(path: Path, text: str) -> str:
    """The kind of client config `text` is, from the file's name and folder, else its content.

    By content: a `servers` key means VS Code, `mcp_servers` in TOML means Codex, and
    `mcpServers` reads as the Claude Desktop format (which the other JSON clients share).

    Raises:
        ClientConfigError: the file cannot be parsed (JSON errors give line and column), or its
            kind cannot be told; the message names the file.
    """
    kind = _by_name(path)
    if kind is None and path.suffix in (".json", ".jsonc", ".toml"):
        kind = _by_content(path, text)
    if kind is None:
        raise ClientConfigError(
            f"cannot tell which MCP client {str(path)!r} belongs to: it has no mcpServers, servers or "
            f"mcp_servers key; known formats: {', '.join(KINDS)}"
        )
    try:
        read_blocks(kind, text)
    except ClientConfigError as exc:
        raise ClientConfigError(f"{path}: {exc}") from exc
    return kind
