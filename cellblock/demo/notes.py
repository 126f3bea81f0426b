"""Demo downstream server "notes": an in-memory notebook over stdio.

Run with ``python -m cellblock.demo.notes``. Serves both protocol eras (handshake ``initialize``
clients and stateless 2026-07-28 clients) from one SDK server.

- tools: ``add_note(title, text)``, ``list_notes()`` (structured output), ``read_note(title)``
- resources: ``note://<title>`` for every note, plus the template ``note://{title}``
- prompt: ``summarize_notes``
"""

from collections.abc import Callable
from urllib.parse import quote

import anyio
from mcp.server.lowlevel.server import NotificationOptions
from mcp.server.mcpserver import Context, MCPServer
from mcp.server.mcpserver.exceptions import ResourceError, ToolError
from mcp.server.mcpserver.resources import FunctionResource
from mcp.server.stdio import stdio_server
from mcp_types import ToolAnnotations
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel

__all__ = ["main", "server"]

server = MCPServer(
    "notes",
    version="0.1.0",
    instructions="A tiny in-memory notebook: add notes, list them, read them back.",
)

_notes: dict[str, str] = {}


class NoteSummary(BaseModel):
    title: str
    uri: str
    length: int


class NoteList(BaseModel):
    notes: list[NoteSummary]


def note_uri(title: str) -> str:
    return f"note://{quote(title, safe='')}"


def _reader(title: str) -> Callable[[], str]:
    def read() -> str:
        return _notes[title]

    return read


@server.tool(title="Add note")
async def add_note(title: str, text: str, ctx: Context) -> str:
    """Add (or replace) a note."""
    if not title:
        raise ToolError("title must not be empty")
    is_new = title not in _notes
    _notes[title] = text
    if is_new:
        server.add_resource(
            FunctionResource.from_function(
                _reader(title), uri=note_uri(title), name=title, description=f"Note {title!r}", mime_type="text/plain"
            )
        )
        # Announce the new resource: 2026-07-28 via the subscription bus (subscriptions/listen
        # streams), handshake era via a notification on the session.
        if ctx.protocol_version in MODERN_PROTOCOL_VERSIONS:
            await ctx.notify_resources_changed()
        else:
            await ctx.session.send_resource_list_changed()
    return f"{'Added' if is_new else 'Updated'} note {title!r}"


@server.tool(title="List notes", annotations=ToolAnnotations(read_only_hint=True))
def list_notes() -> NoteList:
    """List all notes (titles, URIs and lengths)."""
    return NoteList(
        notes=[NoteSummary(title=t, uri=note_uri(t), length=len(text)) for t, text in sorted(_notes.items())]
    )


@server.tool(title="Read note", annotations=ToolAnnotations(read_only_hint=True))
def read_note(title: str) -> str:
    """Return the text of a note."""
    try:
        return _notes[title]
    except KeyError:
        raise ToolError(f"No note titled {title!r}") from None


@server.tool(title="Save note to a file")
def save_note(title: str, path: str) -> str:
    """Write a note's text to a file."""
    try:
        text = _notes[title]
    except KeyError:
        raise ToolError(f"No note titled {title!r}") from None
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(text)
    except OSError as exc:
        raise ToolError(f"cannot write {path}: {exc.strerror}") from None
    return f"Saved {title!r} to {path}"


@server.tool(title="Delete every note")
def delete_notes() -> str:
    """Delete all notes."""
    count = len(_notes)
    _notes.clear()
    return f"Deleted {count} notes"


@server.resource("note://{title}", name="note", description="A note by title", mime_type="text/plain")
def note_by_title(title: str) -> str:
    try:
        return _notes[title]
    except KeyError:
        raise ResourceError(f"No note titled {title!r}") from None


@server.prompt(name="summarize_notes", description="Ask the model to summarize every note")
def summarize_notes() -> str:
    if not _notes:
        return "There are no notes yet. Say so briefly."
    body = "\n\n".join(f"## {t}\n{text}" for t, text in sorted(_notes.items()))
    return f"Summarize the following notes in a few bullet points:\n\n{body}"


async def serve() -> None:
    lowlevel = server._lowlevel_server  # MCPServer.run() cannot advertise listChanged for the handshake era
    options = lowlevel.create_initialization_options(NotificationOptions(resources_changed=True))
    async with stdio_server() as (read_stream, write_stream):
        await lowlevel.run(read_stream, write_stream, options)


def main() -> None:
    anyio.run(serve)


if __name__ == "__main__":
    main()
