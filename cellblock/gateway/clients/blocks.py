"""MCP client config files: find the servers block in each format, and edit only that block.

`cellblock wrap` replaces the servers a client starts with one `cellblock serve` entry, and
`cellblock unwrap` puts them back. Both must leave the rest of the file byte-for-byte as it was:
these files hold comments, key order, other tools' settings and, in `~/.claude.json`, a lot of
unrelated state. So nothing here loads and re-dumps a document. Instead a small scanner finds the
exact character span of the servers value, `render_block` writes a replacement for that span
only, and `replace_span` splices it in. Putting the old span text back restores the file.

What each client's file looks like is its record in `kinds.KINDS`: JSON with a servers object
(`mcpServers`, or `servers` for VS Code; `~/.claude.json` also has one block per project under
`projects.<dir>.mcpServers`), read as JSONC (`jsonc`), or Codex's TOML tables
`[mcp_servers.NAME]`, with sub-tables such as `[mcp_servers.NAME.env]` (`tomltables`).

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
import tomllib
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any

from cellblock.gateway.clients.jsonc import (
    Node,
    indent_of_line,
    indent_unit,
    json_value,
    line_col,
    member,
    parse_jsonc,
    skip,
    to_python,
)
from cellblock.gateway.clients.kinds import BY_CONTENT, KINDS, ClientConfigError, ClientKind, kind_of
from cellblock.gateway.clients.tomltables import find_tables, toml_table

__all__ = ["ClientEntry", "ServersBlock", "detect", "read_blocks", "render_block", "replace_span"]


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


# --- reading ------------------------------------------------------------------------------------


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


def _entry(kind: ClientKind, name: str, value: Any, raw_text: str) -> ClientEntry:
    if not isinstance(value, dict):
        raise ClientConfigError(f"server {name!r} must be an object (got {_type_name(value)})")
    implied = dict(kind.implied)
    fields: dict[str, Any] = {}
    used: set[str] = set()
    for key, field in kind.fields:
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
        if field == "url" and key in implied:
            fields.setdefault("implied", implied[key])
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


def _json_block(kind: ClientKind, text: str, where: tuple[str, ...], node: Node) -> ServersBlock:
    if node.kind != "object":
        raise ClientConfigError(f"{'.'.join(where)!r} at {line_col(text, node.start)} must be an object")
    entries: list[ClientEntry] = []
    for name, _, value in node.members:
        member(text, node, name)  # refuses a server name written twice
        raw = text[value.start : value.end]
        entries.append(_entry(kind, name, to_python(text, value), raw))
    return ServersBlock(where=where, start=node.start, end=node.end, entries=tuple(entries))


def read_blocks(kind: str, text: str) -> list[ServersBlock]:
    """Every servers block of a client config, in file order; none when the key is absent.

    Only `~/.claude.json` (kind "claude-code") has several: the user block at the top, then one
    per project under `projects.<dir>.mcpServers`, including empty ones.

    Raises:
        ClientConfigError: unknown kind, a parse error (with line and column), or a servers
            value or entry of the wrong shape.
    """
    record = kind_of(kind)
    if not text.strip():
        return []
    if record.format == "toml":
        return _toml_blocks(record, text)
    top = parse_jsonc(text)
    key = record.servers_key
    blocks: list[ServersBlock] = []
    servers = member(text, top, key)
    if servers is not None:
        blocks.append(_json_block(record, text, (key,), servers))
    projects = member(text, top, "projects") if record.projects else None
    if projects is not None and projects.kind == "object":
        for directory, _, project in projects.members:
            found = member(text, project, key) if project.kind == "object" else None
            if found is not None:
                blocks.append(_json_block(record, text, ("projects", directory, key), found))
    return blocks


def _toml_blocks(kind: ClientKind, text: str) -> list[ServersBlock]:
    key = kind.servers_key
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ClientConfigError(f"invalid TOML: {exc}") from exc
    servers = document.get(key)
    if servers is None:
        return []
    if not isinstance(servers, dict):
        raise ClientConfigError(f"'{key}' must be a table (got {_type_name(servers)})")
    tables = find_tables(text)
    mine = [i for i, table in enumerate(tables) if table.keys[:1] == (key,)]
    unsupported = ClientConfigError(
        f"'{key}' is written as dotted keys or an inline table; write each server as its own "
        f"[{key}.NAME] table so it can be edited in place"
    )
    if not mine:
        raise unsupported
    between = [tables[i] for i in range(mine[0], mine[-1] + 1) if i not in mine]
    if between:
        raise ClientConfigError(
            f"the [{key}.*] tables must sit together, but [{'.'.join(between[0].keys)}] at "
            f"{line_col(text, between[0].start)} is between them; move it above or below them"
        )
    start, end = tables[mine[0]].start, tables[mine[-1]].end
    if any(len(tables[i].keys) == 1 and tables[i].has_keys for i in mine):
        raise unsupported
    if tomllib.loads(text[start:end]).get(key) != servers:
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
        entries.append(_entry(kind, name, value, raw))
    return [ServersBlock(where=(key,), start=start, end=end, entries=tuple(entries))]


# --- rendering ----------------------------------------------------------------------------------


def _newline(text: str) -> str:
    return "\r\n" if "\r\n" in text else "\n"


def render_block(kind: str, block: ServersBlock, text: str, entries: Mapping[str, Mapping[str, Any]]) -> str:
    """The text to put in place of `text[block.start:block.end]` so that it holds exactly `entries`.

    `entries` maps a server name to its entry in this client's shape (see `kinds.entry_dict`). JSON
    is indented like the block it replaces (its column and the file's step, tabs or spaces) and
    uses the file's line breaks; Codex gets one `[mcp_servers.NAME]` table per entry, mappings
    inside an entry as sub-tables.

    Raises:
        ClientConfigError: unknown kind, or an entry value JSON or TOML cannot hold.
    """
    record = kind_of(kind)
    for name, entry in entries.items():
        if not isinstance(entry, Mapping):
            raise ClientConfigError(f"server {name!r}: an entry must be a mapping (got {type(entry).__name__})")
    nl = _newline(text)
    if record.format == "toml":
        return (nl + nl).join(toml_table((record.servers_key, name), entry, nl) for name, entry in entries.items())
    indent = indent_of_line(text, block.start)
    unit = indent_unit(text)
    if block.entries:
        first = skip(text, block.start + 1)
        own = indent_of_line(text, first)
        starts_line = len(own) == first - (text.rfind("\n", 0, first) + 1)
        if starts_line and len(own) > len(indent) and own.startswith(indent):
            unit = own[len(indent) :]  # the step the block's own members use
    return json_value(entries, indent, unit, nl)


def replace_span(text: str, start: int, end: int, new: str) -> str:
    """`text` with `text[start:end]` replaced by `new`.

    Raises:
        ClientConfigError: the span is not inside the text.
    """
    if not 0 <= start <= end <= len(text):
        raise ClientConfigError(f"span {start}..{end} is not inside a text of {len(text)} characters")
    return text[:start] + new + text[end:]


# --- which format a file is ---------------------------------------------------------------------


def _by_content(path: Path, text: str) -> str | None:
    if path.suffix == ".toml":
        try:
            keys = set(tomllib.loads(text))
        except tomllib.TOMLDecodeError as exc:
            raise ClientConfigError(f"{path}: invalid TOML: {exc}") from exc
    else:
        try:
            keys = {key for key, _, _ in parse_jsonc(text).members}
        except ClientConfigError as exc:
            raise ClientConfigError(f"{path}: {exc}") from exc
    form = "toml" if path.suffix == ".toml" else "json"
    return next((kind.name for kind in BY_CONTENT if kind.format == form and kind.servers_key in keys), None)


def detect(path: Path, text: str) -> str:
    """The kind of client config `text` is, from the file's name and folder, else its content.

    By content: a `servers` key means VS Code, `mcp_servers` in TOML means Codex, and
    `mcpServers` reads as the Claude Desktop format (which the other JSON clients share).

    Raises:
        ClientConfigError: the file cannot be parsed (JSON errors give line and column), or its
            kind cannot be told; the message names the file.
    """
    kind = next((k.name for k in KINDS.values() if any(path.match(name) for name in k.names)), None)
    if kind is None and path.suffix in (".json", ".jsonc", ".toml"):
        kind = _by_content(path, text)
    if kind is None:
        keys = list(dict.fromkeys(k.servers_key for k in KINDS.values()))
        raise ClientConfigError(
            f"cannot tell which MCP client {str(path)!r} belongs to: it has no {', '.join(keys[:-1])} or "
            f"{keys[-1]} key; known formats: {', '.join(KINDS)}"
        )
    try:
        read_blocks(kind, text)
    except ClientConfigError as exc:
        raise ClientConfigError(f"{path}: {exc}") from exc
    return kind
