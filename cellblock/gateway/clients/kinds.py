"""The MCP clients whose config files Cellblock reads and edits: one record per client kind.

A client is one `ClientKind` in `KINDS`: where its files live, their format and servers key,
which keys of an entry mean what, how it writes a stdio entry, and how long a tool name it
accepts may be. `blocks` reads and edits the files from these records alone.

Sources: each client's MCP docs (Claude Code, Cursor, VS Code "MCP configuration reference",
docs.windsurf.com, Gemini CLI docs/tools/mcp-server.md) and, for Codex, `RawMcpServerConfig` in
codex-rs/config/src/mcp_types.rs.
"""

from __future__ import annotations

import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType
from typing import Any, Literal

from cellblock.policy.errors import CellblockError

__all__ = [
    "BY_CONTENT",
    "KINDS",
    "ClientConfigError",
    "ClientKind",
    "entry_dict",
    "kind_of",
    "known_locations",
    "name_budget",
]

_MIN_NAME_LENGTH = 16  # Cellblock's `names.max_length` floor (gateway.config)


class ClientConfigError(CellblockError, ValueError):
    """A client config file cannot be read or edited; the message names the place and the fix."""


@dataclass(frozen=True)
class ClientKind:
    """One MCP client's config format, and where its files are."""

    name: str
    format: Literal["json", "toml"]
    servers_key: str
    # (root, path below it) of each file it reads; root "app_data" is the OS's (see known_locations)
    files: tuple[tuple[Literal["home", "cwd", "app_data"], str], ...]
    # the ends of a path that mark a file of this kind (`PurePath.match` patterns)
    names: tuple[str, ...]
    # (key in the file, field of ClientEntry), in priority order: a key whose field is already
    # taken (Windsurf `url` beside `serverUrl`) stays in `extra`
    fields: tuple[tuple[str, str], ...]
    # (key, transport) the key implies when the entry writes no `type`
    implied: tuple[tuple[str, str], ...] = ()
    entry_type: str | None = None  # the `type` its stdio entries carry
    projects: bool = False  # it also reads `projects.<dir>.<servers_key>` (~/.claude.json)
    # a tool name it shows is `name_prefix` ({key}: Cellblock's entry key) and the name, at most
    # `name_limit` characters
    name_limit: int = 64
    name_prefix: str = ""


_REMOTE = (("type", "transport"), ("url", "url"), ("headers", "headers"))
_STDIO = (("command", "command"), ("args", "args"), ("env", "env"))

CLAUDE_DESKTOP = ClientKind(
    "claude-desktop",
    "json",
    "mcpServers",
    files=(("app_data", "Claude/claude_desktop_config.json"),),
    names=("claude_desktop_config.json",),
    fields=(*_STDIO, *_REMOTE),
)
CLAUDE_CODE = ClientKind(
    "claude-code",
    "json",
    "mcpServers",
    files=(("home", ".claude.json"), ("cwd", ".mcp.json")),
    names=(".claude.json", ".mcp.json"),
    fields=(*_STDIO, *_REMOTE),
    entry_type="stdio",  # as `claude mcp add` writes it
    projects=True,
    # its tool search breaks past 64 characters of `mcp__<key>__<tool>` (anthropics/claude-code#19882)
    name_prefix="mcp__{key}__",
)
CURSOR = ClientKind(
    "cursor",
    "json",
    "mcpServers",
    files=(("home", ".cursor/mcp.json"), ("cwd", ".cursor/mcp.json")),
    names=(".cursor/mcp.json",),
    fields=(*_STDIO, *_REMOTE),
    # it filters out a tool when "Combined server and tool name length (60) exceeds 60 characters"
    # (its warning, quoted in ComposioHQ/composio#2788): 60 itself is refused
    name_limit=59,
    name_prefix="{key}",
)
VSCODE = ClientKind(
    "vscode",
    "json",  # JSONC, as VS Code writes it
    "servers",
    files=(("app_data", "Code/User/mcp.json"), ("cwd", ".vscode/mcp.json")),
    names=(".vscode/mcp.json", "*Code*/User/mcp.json"),
    fields=(*_STDIO, ("cwd", "cwd"), *_REMOTE),
    entry_type="stdio",  # required
)
WINDSURF = ClientKind(
    "windsurf",
    "json",
    "mcpServers",
    files=(("home", ".codeium/windsurf/mcp_config.json"),),
    names=("mcp_config.json",),
    fields=(*_STDIO, ("serverUrl", "url"), *_REMOTE),
)
GEMINI = ClientKind(
    "gemini",
    "json",
    "mcpServers",
    files=(("home", ".gemini/settings.json"), ("cwd", ".gemini/settings.json")),
    names=(".gemini/settings.json",),
    fields=(*_STDIO, ("cwd", "cwd"), ("type", "transport"), ("httpUrl", "url"), *_REMOTE[1:]),
    implied=(("httpUrl", "http"), ("url", "sse")),
    # it calls the tool `mcp_<key>_<tool>` and middle-truncates past 63 characters, which can
    # merge two names (google-gemini/gemini-cli#20987, #28971)
    name_limit=63,
    name_prefix="mcp_{key}_",
)
CODEX = ClientKind(
    "codex",
    "toml",  # [mcp_servers.NAME] tables, with sub-tables such as [mcp_servers.NAME.env]
    "mcp_servers",
    # the project's file is read only in a project Codex trusts
    files=(("home", ".codex/config.toml"), ("cwd", ".codex/config.toml")),
    names=(".codex/config.toml",),
    fields=(*_STDIO, ("cwd", "cwd"), ("url", "url"), ("http_headers", "headers")),
    implied=(("url", "http"),),
    # it hashes a name longer than 64 characters of `mcp__<key>__<tool>` (MAX_TOOL_NAME_LENGTH)
    name_prefix="mcp__{key}__",
)

KINDS: Mapping[str, ClientKind] = MappingProxyType(
    {kind.name: kind for kind in (CLAUDE_DESKTOP, CLAUDE_CODE, CURSOR, VSCODE, WINDSURF, GEMINI, CODEX)}
)
# What a file's content says when its name says nothing, the most specific key first: VS Code's
# `servers`, then the `mcpServers` every other JSON client shares (read as Claude Desktop's).
BY_CONTENT = (VSCODE, CLAUDE_DESKTOP, CODEX)


def kind_of(name: str) -> ClientKind:
    """The record of client kind `name`.

    Raises:
        ClientConfigError: unknown kind.
    """
    kind = KINDS.get(name)
    if kind is None:
        raise ClientConfigError(f"unknown client kind {name!r}; expected one of {', '.join(KINDS)}")
    return kind


def entry_dict(kind: str, command: str, args: Sequence[str]) -> dict[str, Any]:
    """A stdio entry in this client's shape: `command` and `args`, plus `type` where it is written.

    Raises:
        ClientConfigError: unknown kind.
    """
    entry_type = kind_of(kind).entry_type
    entry: dict[str, Any] = {"type": entry_type} if entry_type else {}
    entry["command"] = command
    entry["args"] = list(args)
    return entry


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
    roots = {"home": home, "cwd": cwd, "app_data": app_data}
    unique: list[tuple[str, Path]] = []
    for kind in KINDS.values():
        for root, below in kind.files:
            path = roots[root].joinpath(*below.split("/"))
            if all(path != seen for _, seen in unique):  # with cwd == home, the project files are the user files
                unique.append((kind.name, path))
    return unique


def name_budget(kind: str, key: str) -> int:
    """The `names.max_length` under which `kind` accepts every tool name when Cellblock is `key`.

    Raises:
        ClientConfigError: unknown kind.
    """
    record = kind_of(kind)
    return max(_MIN_NAME_LENGTH, record.name_limit - len(record.name_prefix.replace("{key}", key)))
