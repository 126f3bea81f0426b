"""What a server offers: its tools, prompts, resources, templates and instructions, as listed.

Each kind is listed on its own. A server whose list of one kind fails (an older SDK that declares
`resources` and answers `resources/templates/list` with "Method not found", or an error of its
own, such as a database that is down) offers none of that kind, keeps the others, and is neither
refused nor restarted for it: the log says once which server, which kind and the error. A re-read
after a change notice keeps the kind's last good list when that kind fails (docs/protocol.md).
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import re
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import anyio
import mcp.types as types
from mcp import Client
from mcp.shared.exceptions import MCPError

from cellblock.gateway.errors import first_line
from cellblock.gateway.namespacing import is_app
from cellblock.gateway.scrub import scrub as scrub_secrets
from cellblock.policy.jsontext import scrub
from cellblock.policy.lock import without_protocol_meta

__all__ = ["APP_READ_SECONDS", "KIND_WORDS", "Listing", "app_digest", "app_entry", "fetch_listing", "kind_failure"]

# How long the read of one listed app may take with the catalog: well inside the server's start
# deadline, so a page that is never served is locked as unreadable instead of failing the server.
APP_READ_SECONDS = 5.0

logger = logging.getLogger(__name__)

# how the log names each kind of list
NOT_FOUND = "Method not found"  # how a failure that will not pass is told
KIND_WORDS = {"tools": "tools", "prompts": "prompts", "resources": "resources", "templates": "resource templates"}


@dataclass(frozen=True)
class Listing:
    """Everything a server offers, as it listed it."""

    tools: tuple[types.Tool, ...] = ()
    prompts: tuple[types.Prompt, ...] = ()
    resources: tuple[types.Resource, ...] = ()
    templates: tuple[types.ResourceTemplate, ...] = ()
    instructions: str | None = None
    # (ui:// URI, `app_digest` of its content, its page as `cellblock diff` shows it) of each listed app
    apps: tuple[tuple[str, str, str], ...] = ()
    # (kind, the error) of each kind (tools, prompts, resources, templates) whose list failed: a
    # fact of this connection, never locked or saved
    failed: tuple[tuple[str, str], ...] = ()

    @property
    def retryable(self) -> bool:
        """A kind failed with an error that may pass (not "Method not found"): worth listing again."""
        return any(not why.startswith(NOT_FOUND) for _, why in self.failed)

    def dump(self) -> dict[str, Any]:
        def each(items: tuple[Any, ...]) -> list[Any]:
            return [i.model_dump(mode="json", by_alias=True, exclude_none=True) for i in items]

        return {
            "tools": each(self.tools),
            "prompts": each(self.prompts),
            "resources": each(self.resources),
            "templates": each(self.templates),
            "instructions": self.instructions,
            "apps": [{"uri": uri, "sha256": digest, "text": page} for uri, digest, page in self.apps],
        }

    @functools.cached_property
    def task_only(self) -> frozenset[str]:
        """The tools the server runs only as tasks (2025-11-25 `execution.taskSupport: required`)."""
        return frozenset(
            t.name for t in self.tools if t.execution is not None and t.execution.task_support == "required"
        )

    def app(self, uri: str) -> str | None:
        """The digest of the app at `uri` as listed, or None when it is not one of its apps."""
        return next((digest for listed, digest, _ in self.apps if listed == uri), None)

    @classmethod
    def load(cls, data: dict[str, Any]) -> Listing:
        """A listing saved earlier (a lock's snapshot, the last catalog seen); text that cannot be
        encoded, which an older version may have saved, is replaced (see `policy.jsontext`)."""
        data = scrub(data)
        return cls(
            tools=tuple(types.Tool.model_validate(t) for t in data.get("tools", [])),
            prompts=tuple(types.Prompt.model_validate(p) for p in data.get("prompts", [])),
            resources=tuple(types.Resource.model_validate(r) for r in data.get("resources", [])),
            templates=tuple(types.ResourceTemplate.model_validate(t) for t in data.get("templates", [])),
            instructions=data.get("instructions"),
            apps=tuple((str(a["uri"]), str(a["sha256"]), str(a.get("text", ""))) for a in data.get("apps", [])),
        ).unstamped()

    def scrubbed(self, secrets: re.Pattern[str] | None) -> Listing:
        """This listing with every secret `secrets` finds replaced: what a server lists goes to the
        model and into the catalogs kept on disk, and it may hold a value the gateway gave it."""
        clean, count = scrub_secrets(self.dump(), secrets)
        return replace(Listing.load(clean), failed=self.failed) if count else self

    def unstamped(self) -> Listing:
        """This listing without the protocol stamps in its items' `_meta`: the lock does not hash
        them (`policy.lock.without_protocol_meta`), so the client must not see them either."""

        def each(items: tuple[Any, ...]) -> tuple[Any, ...]:
            return tuple(_unstamped(item) for item in items)

        return replace(
            self,
            tools=each(self.tools),
            prompts=each(self.prompts),
            resources=each(self.resources),
            templates=each(self.templates),
        )


async def fetch_listing(
    client: Client, secrets: re.Pattern[str] | None, server: str = "server", previous: Listing | None = None
) -> Listing:
    """What `server` offers, each kind listed on its own (see the module docstring); `previous`:
    the listing of this connection a re-read replaces, whose kind is kept when its list fails.

    Raises:
        MCPError: the connection closed while listing.
    """
    caps = client.server_capabilities
    failed: list[tuple[str, str]] = []

    async def pages(fetch: Callable[[str | None], Awaitable[Any]], attr: str) -> tuple[Any, ...]:
        items: list[Any] = []
        cursor: str | None = None
        for _ in range(1000):  # a server that pages forever is cut off, not followed
            page = await fetch(cursor)
            items.extend(getattr(page, attr))
            cursor = page.next_cursor
            if not cursor:
                break
        return tuple(items)

    async def kind(name: str, declared: object, fetch: Callable[[str | None], Awaitable[Any]], attr: str) -> Any:
        if not declared:
            return ()
        try:
            return await pages(fetch, attr)
        except MCPError as exc:
            if exc.code == types.CONNECTION_CLOSED:
                raise  # the server is gone: the supervisor restarts it
            why = kind_failure(exc, secrets)
            kept = getattr(previous, name) if previous is not None else ()
            failed.append((name, why))
            told = previous is not None and (name, why) in previous.failed  # once, not at each retry
            (logger.debug if told else logger.warning)(
                "server '%s' did not list its %s (%s); %s",
                server,
                KIND_WORDS[name],
                why,
                "its last list of them is kept" if kept else f"it offers no {KIND_WORDS[name]} until it lists them",
            )
            return kept

    tools = await kind("tools", caps.tools, lambda c: client.list_tools(cursor=c), "tools")
    prompts = await kind("prompts", caps.prompts, lambda c: client.list_prompts(cursor=c), "prompts")
    resources: tuple[types.Resource, ...] = await kind(
        "resources", caps.resources, lambda c: client.list_resources(cursor=c), "resources"
    )
    templates: tuple[types.ResourceTemplate, ...] = await kind(
        "templates", caps.resources, lambda c: client.list_resource_templates(cursor=c), "resource_templates"
    )
    apps: list[tuple[str, str, str]] = []
    if previous is not None and any(name == "resources" for name, _ in failed):
        apps = list(previous.apps)  # kept with the resources they belong to
    else:
        for uri in sorted({str(r.uri) for r in resources if is_app(str(r.uri))}):
            # the lock hashes what an app is, not only how it is listed
            try:
                with anyio.fail_after(APP_READ_SECONDS):  # one page never served does not stop the server
                    apps.append(app_entry(uri, (await client.read_resource(uri)).contents))
            except MCPError as exc:
                apps.append(app_entry(uri, unreadable=str(exc)))
            except TimeoutError:
                logger.warning("app %s: no answer to its read within %gs; locked as unreadable", uri, APP_READ_SECONDS)
                apps.append(app_entry(uri, unreadable=f"no answer within {APP_READ_SECONDS:g}s"))
    for name, _ in previous.failed if previous is not None else ():
        if name not in {kind for kind, _ in failed}:
            logger.info("server '%s' lists its %s again", server, KIND_WORDS[name])
    listing = Listing(tools, prompts, resources, templates, client.instructions, tuple(apps), tuple(failed))
    return listing.unstamped().scrubbed(secrets)


def kind_failure(exc: MCPError, secrets: re.Pattern[str] | None) -> str:
    """How a list's error is told: its code and first line, with the gateway's secrets redacted
    (the text is the server's, and may hold a value the gateway gave it)."""
    if exc.code == types.METHOD_NOT_FOUND:
        return f"{NOT_FOUND} ({exc.code}): it declared the capability but does not answer its list"
    text = scrub_secrets(first_line(exc), secrets)[0]
    return f"error {exc.code}: {text}"


def app_entry(uri: str, contents: Sequence[Any] = (), unreadable: str | None = None) -> tuple[str, str, str]:
    """An app as the lock keeps it: its URI, `app_digest`, and its page as text, so that
    `cellblock diff` shows what an approval would let the client render."""
    shown = [getattr(c, "text", None) or f"({c.mime_type or 'binary'} content, not shown)" for c in contents]
    page = f"(not readable: {unreadable})" if unreadable is not None else "\n".join(shown)
    return uri, app_digest(contents, unreadable), page


def app_digest(contents: Sequence[Any], unreadable: str | None = None) -> str:
    """The SHA-256 of an app's content as read (every part, its type and metadata), or of the
    error it could not be read with."""
    parts = [c.model_dump(mode="json", by_alias=True, exclude_none=True) for c in contents]
    text = json.dumps({"contents": parts, "unreadable": unreadable}, sort_keys=True, ensure_ascii=False)
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()


def _unstamped(item: Any) -> Any:
    meta = item.meta
    if not meta:
        return item
    kept = without_protocol_meta(meta)
    return item if len(kept) == len(meta) else item.model_copy(update={"meta": kept or None})
