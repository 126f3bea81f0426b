"""Keeper: a server that keeps what it is given, as servers people run do: in a SQLite database at
the path its command line names (``--db-path``, created if missing, as mcp-server-sqlite does),
and in files under its home (``~/.config``, ``~/Documents``).

Tools: ``put(key, value)`` and ``get(key)`` on the database; ``save(path, text)`` writes a file
(``~`` is the home it was given, and a relative path is in that home: where the server keeps its
own things; folders made as needed), ``load(path)`` reads one (an error when it cannot), and so does
``peek(path)``, which the server marks read-only (`readOnlyHint`).

Run as ``python tests/servers/keeper.py [--db-path PATH]``.
"""

from __future__ import annotations

import argparse
import os
import sqlite3
import warnings

import anyio
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver import MCPServer
from mcp.server.mcpserver.exceptions import ToolError
from mcp.server.stdio import stdio_server
from mcp_types import ToolAnnotations

server = MCPServer("keeper", version="0.1.0", instructions="Keeps values in a database and files under its home.")
_db: list[sqlite3.Connection] = []


def _connection() -> sqlite3.Connection:
    if not _db:
        raise ToolError("started without --db-path")
    return _db[0]


@server.tool()
def put(key: str, value: str) -> str:
    """Store `value` under `key` in the database."""
    with _connection() as db:
        db.execute("INSERT OR REPLACE INTO kept (key, value) VALUES (?, ?)", (key, value))
    return f"kept {key}"


@server.tool()
def get(key: str) -> str:
    """The value stored under `key`."""
    row = _connection().execute("SELECT value FROM kept WHERE key = ?", (key,)).fetchone()
    if row is None:
        raise ToolError(f"nothing kept under {key}")
    return str(row[0])


def _in_home(path: str) -> str:
    return os.path.expanduser(path if path.startswith(("/", "~")) else os.path.join("~", path))


@server.tool()
def save(path: str, text: str) -> str:
    """Write `text` to `path`, making its folders."""
    full = _in_home(path)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, "w", encoding="utf-8") as file:
        file.write(text)
    return f"saved {full}"


@server.tool()
def load(path: str) -> str:
    """The text of `path`."""
    try:
        with open(_in_home(path), encoding="utf-8") as file:
            return file.read()
    except OSError as exc:
        raise ToolError(f"cannot read {path}: {exc.strerror}") from exc


@server.tool(annotations=ToolAnnotations(read_only_hint=True))
def peek(path: str) -> str:
    """The text of `path`, read only."""
    return load(path)


async def serve() -> None:
    lowlevel = server._lowlevel_server
    options = lowlevel.create_initialization_options(NotificationOptions())
    async with stdio_server() as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, options)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--db-path")
    args = parser.parse_args()
    if args.db_path:
        db = sqlite3.connect(os.path.expanduser(args.db_path), check_same_thread=False)
        db.execute("CREATE TABLE IF NOT EXISTS kept (key TEXT PRIMARY KEY, value TEXT)")
        db.commit()
        _db.append(db)
    warnings.simplefilter("ignore")
    anyio.run(serve)


if __name__ == "__main__":
    main()
