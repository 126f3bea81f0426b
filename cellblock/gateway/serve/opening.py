"""This start's record of the client's opening answers, for the next start (`wire/early.py`).

The wire hands each answer to an opening request here (`record`); it is kept while the catalog
is still the one the gateway started with (and no search has added to a client's list), and
written a little later, in one go, off the event loop. An answer the client already had early
from the last start's record, and that the gateway would not give now (`differed`), corrects the
record, and a list's client is told to list again.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

import anyio
import anyio.abc

from cellblock.gateway.serve.catalog import LIST_KINDS
from cellblock.gateway.wire.early import SAVE_AFTER_SECONDS, Early

__all__ = ["Recording"]

logger = logging.getLogger(__name__)


class Recording:
    def __init__(
        self,
        early: Early,
        tasks: Callable[[], anyio.abc.TaskGroup],
        current: Callable[[], bool],  # the answers are still those of the start
        announce: Callable[[str], Coroutine[Any, Any, None]],  # tells the client that what a list method lists changed
    ) -> None:
        self.early = early
        self.tasks = tasks
        self.current = current
        self.announce = announce
        self._saving = False

    def record(self, key: str, result: Callable[[], str | None]) -> None:
        """An opening answer, kept for the next start while the catalog is still the one it starts with."""
        if not self.current():
            return
        text = result()
        if text is not None and self.early.record(key, text):
            self._save_soon()

    def differed(self, key: str, early: str, result: str) -> None:
        """The client was answered early with something the gateway would not say now."""
        if self.early.record(key, result):
            self._save_soon()
        method = json.loads(key)[0]
        if method in LIST_KINDS:
            logger.warning("the early answer to %s was out of date; the client is told to list again", method)
            self.tasks().start_soon(self.announce, method)
        else:  # the handshake: nothing in the protocol revises it
            logger.warning(
                "the early answer to %s was out of date; the client keeps it until it reconnects "
                "(the record is corrected for the next start)",
                method,
            )

    def _save_soon(self) -> None:
        if not self._saving:  # see SAVE_AFTER_SECONDS
            self._saving = True
            self.tasks().start_soon(self._save)

    async def _save(self) -> None:
        await anyio.sleep(SAVE_AFTER_SECONDS)
        self._saving = False
        record = self.early.snapshot()
        if record is not None:
            await anyio.to_thread.run_sync(self.early.write, record)
