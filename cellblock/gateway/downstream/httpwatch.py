"""What the HTTP layer saw during one remote connection, apart from the HTTP stack itself.

Every server's supervisor holds one, a local server's too, so it lives here rather than in
remote.py: a gateway with only local servers never imports httpx2, the OAuth client or discovery.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import httpx2

    from cellblock.gateway.downstream.discovery import DiscoveryRefused
    from cellblock.gateway.downstream.oauth import LoginNeeded

__all__ = ["HttpWatch"]


@dataclass
class HttpWatch:
    """What the HTTP layer saw during one connection; the SDK's own errors do not carry it."""

    unauthorized: bool = False
    login: LoginNeeded | None = None
    # an OAuth URL the server pointed us at that discovery refused (already audited)
    refused: DiscoveryRefused | None = None
    # a 404 to a request that carried a session id: the server restarted and forgot the session
    session_lost: bool = False

    async def on_response(self, response: httpx2.Response) -> None:
        if response.status_code == 401:
            self.unauthorized = True
        elif response.status_code == 404 and "mcp-session-id" in response.request.headers:
            self.session_lost = True
