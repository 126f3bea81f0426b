"""A server's credentials: the keyring it reads them from, and the secret values the gateway
hands it, told to the audit log so that they are redacted wherever they turn up."""

from __future__ import annotations

import contextlib
import logging
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.model import LocalServer, RemoteServer
from cellblock.gateway.credentials import (
    CredentialError,
    Keyring,
    client_key_entry,
    client_secret_entry,
    id_token_entry,
)

if TYPE_CHECKING:
    from cellblock.gateway.downstream.discovery import DiscoveryRefused

__all__ = ["ServerKeys"]

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

    def refused(self, refused: DiscoveryRefused) -> None:
        # the server pointed OAuth somewhere it may not go: recorded with the origin only, never a path or token
        logger.warning("%s", refused)
        if self.audit is not None:
            refused.record(self.audit)

    def add(self, value: str) -> None:
        # a credential the gateway handed out: redacted wherever it turns up in the audit log
        if self.audit is not None:
            self.audit.add_secret(value)

    async def environment(self) -> dict[str, str]:
        """A local server's `secrets:`, read from the keyring for one start: variable -> value.

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
            self.add(value)
        return values

    async def register(self) -> None:
        """Tell the audit log this server's credentials before a call to it is recorded, so a value
        echoed in a call's arguments is redacted even before the server has started (once)."""
        if self._known or self.audit is None:
            return
        self._known = True
        entries = list(self.config.secrets.values())
        oauth = isinstance(self.config, RemoteServer) and self.config.auth.type == "oauth"
        if isinstance(self.config, RemoteServer) and self.config.auth.type == "bearer":
            entries.append(self.name)
        if isinstance(self.config, RemoteServer) and self.config.auth.client_id is not None:  # a pre-registered client
            signs = self.config.auth.client_auth == "private_key_jwt"
            entries.append(client_key_entry(self.name) if signs else client_secret_entry(self.name))
        if isinstance(self.config, RemoteServer) and self.config.auth.grant == "identity_assertion":
            entries.append(id_token_entry(self.name))
        if not entries and not oauth:
            return
        with contextlib.suppress(CredentialError):  # missing or refused: starting the server says so
            for entry in entries:
                value = await self.keyring().aget(entry)
                if value:
                    self.add(value)
            if oauth:  # reading the stored tokens tells each one to `_secret`
                from cellblock.gateway.downstream.oauth import KeyringTokenStorage  # remote servers only

                await KeyringTokenStorage(self.keyring(), self.name, self.add).get_tokens()

    def keyring(self) -> Keyring:
        if self._store is None:
            self._store = Keyring(self.allow_insecure)
        return self._store
