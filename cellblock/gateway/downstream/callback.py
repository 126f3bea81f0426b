"""The loopback end of an interactive OAuth login: a listener on 127.0.0.1 that catches the
authorization server's redirect to `/callback` and hands its code to the SDK's flow
(gateway/downstream/oauth.py), answering the browser with a short page.
"""

from __future__ import annotations

import contextlib
from urllib.parse import parse_qs, urlsplit

import anyio
import anyio.abc
from anyio.abc import SocketAttribute
from mcp.shared.auth import AuthorizationCodeResult
from pydantic import ValidationError

from cellblock.gateway.credentials import CredentialError

__all__ = ["CALLBACK_PATH", "LOGIN_PORT", "LOGIN_SECONDS", "LoopbackCatcher"]


# The loopback port a login listens on first; a registered client's redirect URI names it, so
# the same port is reused at each login. When it is taken, a free port and a new registration.
LOGIN_PORT = 33418
CALLBACK_PATH = "/callback"
# How long a login waits for the browser to come back with the authorization code.
LOGIN_SECONDS = 300.0
# A connection to the loopback listener that sends no request in this time is dropped (browsers
# open spare connections); the callback waits behind it at most this long.
IDLE_SECONDS = 10.0


class LoopbackCatcher:
    """A listener on 127.0.0.1 that waits for the authorization server's redirect to `/callback`."""

    def __init__(self, server: str, port: int) -> None:
        self.server, self.port = server, port
        self._listener: anyio.abc.SocketListener | None = None
        # every callback caught, in order: each authorization of a login takes its own
        self._caught, self._callbacks = anyio.create_memory_object_stream[AuthorizationCodeResult | CredentialError](16)

    @property
    def redirect_uri(self) -> str:
        return f"http://127.0.0.1:{self.port}{CALLBACK_PATH}"

    async def __aenter__(self) -> LoopbackCatcher:
        try:
            multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=self.port)
        except OSError:
            # the wanted port is taken: any free one (a client registered for the old one registers anew)
            multi = await anyio.create_tcp_listener(local_host="127.0.0.1", local_port=0)
        listener = multi.listeners[0]
        if not isinstance(listener, anyio.abc.SocketListener):  # what create_tcp_listener makes
            raise OSError("the login listener is not a TCP socket")
        self._listener = listener
        self.port = listener.extra(SocketAttribute.local_port)
        return self

    async def __aexit__(self, *exc: object) -> None:
        if self._listener is not None:
            await self._listener.aclose()

    async def run(self) -> None:
        """Catch callbacks until cancelled: from the start, since a browser may come back before
        the URL's `show` returns (a URL elicitation answers when the person is done)."""
        while True:
            try:
                outcome: AuthorizationCodeResult | CredentialError = await self.wait()
            except CredentialError as exc:
                outcome = exc
            await self._caught.send(outcome)

    async def next(self) -> AuthorizationCodeResult:
        """The next callback `run` caught (one per authorization: a second authorization in one
        login, after a scope step-up, waits for its own).

        Raises:
            CredentialError: the authorization server redirected with an error.
            TimeoutError: none came within LOGIN_SECONDS.
        """
        with anyio.fail_after(LOGIN_SECONDS):
            outcome = await self._callbacks.receive()
        if isinstance(outcome, CredentialError):
            raise outcome
        return outcome

    async def wait(self) -> AuthorizationCodeResult:
        """The code and state of the first request to `/callback`; other paths get a 404.

        Raises:
            CredentialError: the authorization server redirected with an error.
        """
        if self._listener is None:  # opened by __aenter__
            raise RuntimeError("use LoopbackCatcher as an async context manager")
        while True:
            stream = await self._listener.accept()
            async with stream:
                with anyio.move_on_after(IDLE_SECONDS):
                    outcome = await self._one_request(stream)
                    if outcome is not None:
                        return outcome

    async def _one_request(self, stream: anyio.abc.SocketStream) -> AuthorizationCodeResult | None:
        head = b""
        while b"\r\n\r\n" not in head and len(head) < 16384:
            try:
                head += await stream.receive()
            except (anyio.EndOfStream, anyio.BrokenResourceError):
                return None
        parts = head.split(b"\r\n", 1)[0].decode("latin-1").split(" ")
        target = urlsplit(parts[1]) if len(parts) == 3 and parts[0] == "GET" else None
        if target is None or target.path != CALLBACK_PATH:
            await _respond(stream, "404 Not Found", "Not the Cellblock login callback.")
            return None
        query = {k: v[0] for k, v in parse_qs(target.query).items()}
        if "error" in query:
            reason = query.get("error_description") or query["error"]
            await _respond(stream, "400 Bad Request", f"Login to {self.server} failed: {reason}")
            raise CredentialError(f"the authorization server for '{self.server}' refused the login: {reason}")
        try:
            result = AuthorizationCodeResult(code=query["code"], state=query.get("state"), iss=query.get("iss"))
        except (KeyError, ValidationError):
            await _respond(stream, "400 Bad Request", "The redirect carried no authorization code.")
            return None
        await _respond(stream, "200 OK", f"Cellblock is logged in to {self.server}. You can close this tab.")
        return result


async def _respond(stream: anyio.abc.SocketStream, status: str, text: str) -> None:
    body = f"<!doctype html><meta charset=utf-8><title>Cellblock</title><p>{_escape(text)}</p>".encode()
    head = f"HTTP/1.1 {status}\r\nContent-Type: text/html; charset=utf-8\r\nContent-Length: {len(body)}\r\n"
    with contextlib.suppress(anyio.BrokenResourceError, anyio.ClosedResourceError):
        await stream.send(head.encode() + b"Connection: close\r\n\r\n" + body)


def _escape(text: str) -> str:
    return text.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")
