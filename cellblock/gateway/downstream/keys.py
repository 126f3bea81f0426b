"""A server's credentials: the keyring it reads them from, and the secret values the gateway
hands it, told to the audit log so that they are redacted wherever they turn up."""

from __future__ import annotations

import contextlib
import logging
import re
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.model import LocalServer, RemoteServer, entries_of
from cellblock.gateway.credentials import CredentialError, Keyring
from cellblock.gateway.scrub import Held

if TYPE_CHECKING:
    from cellblock.gateway.downstream.discovery import DiscoveryRefused

__all__ = ["ServerKeys", "reader_of"]

logger = logging.getLogger(__name__)


@dataclass(eq=False)
class ServerKeys:
    name: str
    config: LocalServer | RemoteServer
    audit: Audit | None
    # `credentials.allow_insecure`: accept a keyring backend that keeps secrets in plain files
    allow_insecure: bool = False
    _store: Keyring | None = None
    _known: bool = False  # register ran

    def pattern(self) -> re.Pattern[str] | None:
        return self.audit.secret_pattern() if self.audit is not None else None

    def carried(self, value: Any) -> list[Held]:
        """The secrets held for another server (or the gateway's own) that `value`, on its way to
        this server, carries.

        Raises:
            Scrubbed: `value` is nested too deeply to be checked.
        """
        return self.audit.held.carried(self.name, value) if self.audit is not None else []

    def refused(self, refused: DiscoveryRefused) -> None:
        # the server pointed OAuth somewhere it may not go: recorded with the origin only, never a path or token
        logger.warning("%s", refused)
        if self.audit is not None:
            refused.record(self.audit)

    def add(self, value: str, name: str | None = None) -> None:
        """A credential the gateway handed out, called `name` (None: the name it was registered
        under, if any): redacted wherever it turns up, and refused in a call to another server."""
        if self.audit is not None:
            self.audit.add_secret(value, self.name, name)

    async def environment(self) -> dict[str, str]:
        """A local server's `secrets:`, read from the keyring for one start: variable -> value
        (its environment, and the arguments that name one as `${secrets.NAME}`).

        Raises:
            CredentialError: one is not set, or the keyring is refused.
        """
        values = {}
        for variable, entry in self.config.secrets.items():
            value = await self.keyring().aget(entry)
            if value is None:
                raise CredentialError(
                    f"server '{self.name}' needs the secret {variable} from keyring entry '{entry}', "
                    f"which is not set: run `cellblock auth set {entry}`"
                )
            values[variable] = value
            self.add(value, _named(f"secret {variable}", entry))
        return values

    async def register(self) -> None:
        """Tell the audit log this server's credentials, each with its name, before a call to it
        is recorded (so a value echoed in a call's arguments is redacted even before the server
        has started) and before a call to another server is judged (once: a reading cancelled
        part way is done again by the next)."""
        if self._known or self.audit is None:
            return
        oauth = isinstance(self.config, RemoteServer) and self.config.auth.type == "oauth"
        # an OAuth server's tokens are in their own entries (read below), not under its name
        entries = [(e, what) for e, what in entries_of(self.name, self.config) if not (oauth and e == self.name)]
        if not entries and not oauth:
            self._known = True
            return
        with contextlib.suppress(CredentialError):  # missing or refused: starting the server says so
            for entry, what in entries:
                value = await self.keyring().aget(entry)
                if value:
                    self.add(value, _named(what, entry))
            if oauth:  # reading the stored tokens tells each one to `_secret`
                from cellblock.gateway.downstream.oauth import KeyringTokenStorage  # remote servers only

                storage = KeyringTokenStorage(self.keyring(), self.name)
                storage.on_secret = lambda value: self.add(value, _named("OAuth token", storage.tokens_entry))
                await storage.get_tokens()
        self._known = True  # only now: a call must not find this server's secrets taken as read

    def keyring(self) -> Keyring:
        if self._store is None:
            self._store = Keyring(self.allow_insecure)
        return self._store


def _named(what: str, entry: str) -> str:
    """A secret's name as a refusal or the audit says it: what it is and where it is kept."""
    return f"{what} (keyring entry '{entry}')"


def reader_of(keys: Iterable[ServerKeys]) -> Callable[[], Awaitable[None]]:
    """What reads every one of these servers' credentials (`ServerKeys.register`), in turn."""
    every = list(keys)

    async def read() -> None:
        for each in every:
            await each.register()

    return read
