"""The catalog the client is shown, kept current: built again whenever a server's listing changes,
and announced to the client when what it lists has changed.

`CatalogKeeper` holds what each server offers as the lock shows it (`shown`), the merged
`Catalog` built from it (`serve/catalog.py`), and the gateway's start: a server whose catalog is
known (its lock, or the one seen last time) is listed from it before it answers, and the first
list waits (bounded) for the servers nobody has seen yet.
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.abc
from mcp.server.subscriptions import (
    InMemorySubscriptionBus,
    PromptsListChanged,
    ResourcesListChanged,
    ToolsListChanged,
)

from cellblock.gateway.config.model import Config
from cellblock.gateway.downstream.listing import Listing
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.supervisor import START_SECONDS
from cellblock.gateway.serve.catalog import Catalog, build_catalog
from cellblock.gateway.serve.listeners import Listeners
from cellblock.gateway.serve.locking import POLL_SECONDS, Locks
from cellblock.gateway.serve.search import Client
from cellblock.gateway.serve.status import review_tool, status_tool, tool_name
from cellblock.gateway.state import atomic_write_json, read_json
from cellblock.policy.rules import Policy

__all__ = ["KNOWN_START_SECONDS", "CatalogKeeper"]

logger = logging.getLogger(__name__)

# Eager servers whose catalog is known start after the client's first list, or after this long
# if it asks for none (see CatalogKeeper._start_after_first_list).
KNOWN_START_SECONDS = 2.0

# what tells the client to list again: the subscription event and the handshake-era notification
_LIST_CHANGES: dict[str, tuple[Any, str]] = {
    "tools/list": (ToolsListChanged(), "notifications/tools/list_changed"),
    "prompts/list": (PromptsListChanged(), "notifications/prompts/list_changed"),
    "resources/list": (ResourcesListChanged(), "notifications/resources/list_changed"),
    "resources/templates/list": (ResourcesListChanged(), "notifications/resources/list_changed"),
}


class CatalogKeeper:
    """The merged catalog of a gateway's servers, rebuilt and announced as their listings change."""

    def __init__(
        self,
        config: Config,
        catalog_dir: Path,  # where a server's last catalog is saved, for a lazy start
        downstreams: dict[str, Downstream],
        locks: Locks,
        policies: dict[str, Policy],
        item_policies: dict[str, dict[str, Policy]],
        offer: Callable[[Catalog], None],  # tool search's view of each new catalog
        bus: InMemorySubscriptionBus,
        listeners: Listeners,
        tasks: Callable[[], anyio.abc.TaskGroup],
    ) -> None:
        self.config = config
        self.catalog_dir = catalog_dir
        self.downstreams = downstreams
        self.locks = locks
        self.policies = policies
        self.item_policies = item_policies
        self.offer = offer
        self.bus = bus
        self.listeners = listeners
        self.tasks = tasks
        self.catalog = Catalog()
        # what each server offers, and what the lock lets the client see of it
        self.shown: dict[str, Listing] = {}
        self._settled = anyio.Event()
        self._listed = anyio.Event()  # the client has asked for a list
        # the catalog is the one this start settled on: no rebuild since (a flag, so the old
        # catalog is not kept alive after it changed)
        self._as_started = False

    def start(self, tg: anyio.abc.TaskGroup) -> None:
        """List each server from its known catalog, start the others, and keep the catalog current
        in `tg` from then on."""
        unknown: list[Downstream] = []
        known: list[Downstream] = []
        for ds in self.downstreams.values():
            # A server whose catalog is known (approved in its lock, or seen last time) is
            # listed from it until it answers itself; then the lock reviews what it offers.
            saved = self._saved_listing(ds.name)
            if saved is not None:
                ds.listing = self.shown[ds.name] = saved
                if self.config.start_of(ds.name) == "eager":
                    known.append(ds)
            else:
                # the handshake and the first list wait (bounded) for these; a lazy server
                # nobody has seen yet is started once to learn its catalog
                unknown.append(ds)
                ds.supervisor.start(tg)
        self._rebuild()
        tg.start_soon(self._settle, unknown)
        tg.start_soon(self._start_after_first_list, known)
        tg.start_soon(self._watch_locks)

    async def settled(self) -> None:
        """Wait (bounded) for the eager servers to settle."""
        with anyio.move_on_after(START_SECONDS):
            await self._settled.wait()

    def as_started(self) -> bool:
        """The catalog is still the one this start settled on."""
        return self._as_started

    async def _start_after_first_list(self, known: list[Downstream]) -> None:
        """Start the eager servers whose catalog is known once the client has its first list:
        starting many at once would hold up the answer, which does not need them. A call to one
        before then starts it at once."""
        with anyio.move_on_after(KNOWN_START_SECONDS):
            await self._listed.wait()
        for ds in known:
            ds.supervisor.start(self.tasks())

    def _saved_listing(self, server: str) -> Listing | None:
        """The catalog to show for a server before it answers: its lock, else the last one seen."""
        if self.locks.enabled(server):
            return self.locks.approved_listing(server)
        cached = read_json(self.catalog_dir / f"{server}.json")
        return Listing.load(cached) if isinstance(cached, dict) else None

    async def _watch_locks(self) -> None:
        """Pick up approvals made with `cellblock approve` while the gateway runs."""
        while True:
            await anyio.sleep(POLL_SECONDS)
            for server in self.locks.changed_on_disk():
                ds = self.downstreams[server]
                if ds.listing is not None:
                    await self.on_listing(ds)

    async def _settle(self, eager: list[Downstream]) -> None:
        async with anyio.create_task_group() as tg:
            for ds in eager:
                tg.start_soon(ds.supervisor.wait_settled, START_SECONDS)
        for ds in eager:
            # a server waiting for a credential or a login keeps its known tools on offer, so a
            # call to one gets the error that says which command to run
            saved = self._saved_listing(ds.name) if ds.supervisor.retryable and ds.listing is None else None
            if saved is not None:
                ds.listing = self.shown[ds.name] = saved
        self._rebuild()
        self._as_started = True
        self._settled.set()

    async def client_catalog(self) -> Catalog:
        """The catalog to answer a list with, once the eager servers have settled (bounded)."""
        # the first list waits (bounded) for the eager servers, so the client sees them all
        await self.settled()
        return self._listing_now()

    def settled_catalog(self) -> Catalog | None:
        """`client_catalog` without waiting: None while the eager servers are still settling."""
        return self._listing_now() if self._settled.is_set() else None

    def _listing_now(self) -> Catalog:
        self._listed.set()
        self._retry_failed()
        return self.catalog

    def _retry_failed(self) -> None:
        # a server that failed for want of a credential may have it now; it announces its tools
        for ds in self.downstreams.values():
            ds.supervisor.retry()

    def _rebuild(self) -> Catalog:
        offered = {name: ds.listing for name, ds in self.downstreams.items() if ds.listing is not None}
        catalog = build_catalog(
            self.shown,
            separator=self.config.names.separator,
            max_length=self.config.names.max_length,
            offered=offered,
            hidden=lambda server, tool: self.policies[server].hidden(tool),
            hidden_item=lambda kind, server, name: self.item_policies[kind][server].hidden(name),
            bare=self.config.unprefixed(),
        )
        held = [name for name, items in self.locks.held.items() if items]
        if held:  # the model can then tell the user what waits, and what to run, or ask them
            names = self.config.names
            own = (status_tool(names.separator, names.max_length), review_tool(names.separator, names.max_length, held))
            catalog = dataclasses.replace(catalog, tools=(*catalog.tools, *own))
        old, self.catalog = self.catalog, catalog
        self._as_started = False
        self.offer(catalog)
        return old

    def own_tool(self, tool: str) -> str:
        return tool_name(self.config.names.separator, self.config.names.max_length, tool)

    async def on_listing(self, ds: Downstream) -> None:
        if ds.listing is None:
            return
        self.shown[ds.name] = self.locks.review(ds.name, ds.listing)
        if not self.locks.enabled(ds.name):
            try:
                atomic_write_json(self.catalog_dir / f"{ds.name}.json", ds.listing.dump())
            except OSError as exc:
                logger.warning("could not save the catalog of '%s' for lazy start: %s", ds.name, exc)
        old = self._rebuild()
        if not self._settled.is_set():
            return
        new = self.catalog
        if old.tools != new.tools:
            await self.announce("tools/list")
        if old.prompts != new.prompts:
            await self.announce("prompts/list")
        if (old.resources, old.templates) != (new.resources, new.templates):
            await self.announce("resources/list")

    async def announce_to(self, client: Client) -> None:
        """Tell one client that its tool list changed: on stdio, on its wire or its listen stream;
        over HTTP, its handshake-era session (a 2026-07-28 one is never told: it has no key)."""
        if client.key == "" and self.listeners.wire is not None and self.listeners.wire.modern:
            await self.bus.publish(ToolsListChanged())
        elif client.key is not None:
            self.listeners.notify(self.tasks(), "notifications/tools/list_changed", None, only=frozenset({client.key}))

    async def announce(self, method: str) -> None:
        """Tell the client that what `method` lists has changed."""
        event, notification = _LIST_CHANGES[method]
        await self.bus.publish(event)  # 2026-07-28 clients listening on subscriptions/listen
        self.listeners.notify(self.tasks(), notification, None)  # only a handshake-era client has a channel
