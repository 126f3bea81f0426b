"""The dashboard's web app: one static page, its script and style, and a small JSON API, behind the
checks a privileged page on loopback needs (docs/dashboard.md says what each stops).

- Every response carries a strict Content-Security-Policy (no inline script, no framing) and the
  headers beside it (`HEADERS`), refusals included.
- The Host header must be exactly `127.0.0.1:PORT`: a DNS-rebinding page reaches us under its
  own name, and is refused before anything runs.
- The secret of the run reaches the page in the URL's fragment (never sent to a server); the page
  POSTs it once to /session and gets an HttpOnly, SameSite=Strict session cookie and a CSRF token.
  A page opened later from an approval link (no secret) POSTs /session with that cookie alone and
  gets the same session's token: only this origin's page can both send the cookie and read it.
- Every /api request needs the cookie and the X-CSRF-Token header: cookies are not kept apart by
  port, so another local web server could be sent ours; the token lives only in the page.
- A state-changing request is a POST whose Origin is exactly `http://127.0.0.1:PORT`; nothing
  changes on GET.
"""

from __future__ import annotations

import hmac
import json
import re
import secrets
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio.to_thread
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from cellblock.gateway.dashboard.scans import ScanReports
from cellblock.gateway.dashboard.timeline import FILTERS, Timeline
from cellblock.gateway.dashboard.view import Source, answer_text, catalog_answer_text

__all__ = ["COOKIE", "CSRF_HEADER", "HEADERS", "MAX_SESSIONS", "create_app"]

STATIC = Path(__file__).parent / "static"
COOKIE = "cellblock_dashboard"
CSRF_HEADER = "x-csrf-token"
HEADERS = {
    "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; "
    "img-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
    "x-frame-options": "DENY",
    "x-content-type-options": "nosniff",
    "referrer-policy": "no-referrer",
    "cache-control": "no-store",
}
# a user opens the page in a tab or two; the oldest session goes past this, so reopening the
# address forever cannot grow what the process keeps
MAX_SESSIONS = 8
# an answer is an id and a scope, or a server and a hash: anything larger is not the page's
MAX_BODY = 4096
_SHA256 = re.compile(r"[0-9a-f]{64}")
# a filter's value is a server's, a tool's, a decision's or an event's name
MAX_FILTER = 500
_FILES = {
    "/": ("index.html", "text/html; charset=utf-8"),
    "/dom.js": ("dom.js", "text/javascript; charset=utf-8"),
    "/dashboard.js": ("dashboard.js", "text/javascript; charset=utf-8"),
    "/dashboard.css": ("dashboard.css", "text/css; charset=utf-8"),
    "/scans.js": ("scans.js", "text/javascript; charset=utf-8"),
    "/scans.css": ("scans.css", "text/css; charset=utf-8"),
    "/charts.js": ("charts.js", "text/javascript; charset=utf-8"),
    # uPlot, vendored (static/vendor/README.md): served from here, nothing fetched at run time
    "/vendor/uPlot.iife.min.js": ("vendor/uPlot.iife.min.js", "text/javascript; charset=utf-8"),
    "/vendor/uPlot.min.css": ("vendor/uPlot.min.css", "text/css; charset=utf-8"),
}


class _Refused(Exception):
    """A request the checks refuse: answered 403 with `why`, and nothing else happens."""

    def __init__(self, why: str, status: int = 403) -> None:
        super().__init__(why)
        self.why, self.status = why, status


def create_app(
    port: int, secret: str, source: Source, timeline: Timeline | None = None, scans: ScanReports | None = None
) -> ASGIApp:
    """The dashboard served at `http://127.0.0.1:PORT`, opened with `secret`, showing `source` (and
    the audit log's `timeline`, the kept `scans` reports)."""
    return _Guard(_Dashboard(port, secret, source, timeline, scans).app(), f"127.0.0.1:{port}")


class _Dashboard:
    def __init__(
        self, port: int, secret: str, source: Source, timeline: Timeline | None, scans: ScanReports | None
    ) -> None:
        self.origin = f"http://127.0.0.1:{port}"
        self._secret = secret.encode()
        self._source = source
        self._timeline = timeline
        self._scans = scans
        self._sessions: OrderedDict[str, str] = OrderedDict()  # cookie value -> its CSRF token

    def app(self) -> Starlette:
        routes = [Route(path, self._file, methods=["GET"]) for path in _FILES]
        routes += [
            Route("/session", self._guarded(self._session, session=False), methods=["POST"]),
            Route("/api/state", self._guarded(self._state), methods=["GET"]),
            Route("/api/approve", self._guarded(self._answer), methods=["POST"]),
            Route("/api/deny", self._guarded(self._answer), methods=["POST"]),
            Route("/api/approve-catalog", self._guarded(self._approve_catalog), methods=["POST"]),
            Route("/api/audit", self._guarded(self._audit), methods=["GET"]),
            Route("/api/scans", self._guarded(self._scan_reports), methods=["GET"]),
        ]
        return Starlette(routes=routes)

    def _guarded(
        self, handler: Callable[[Request], Awaitable[Response]], session: bool = True
    ) -> Callable[[Request], Awaitable[Response]]:
        """`handler` behind the checks its route needs (`session`: the cookie and the CSRF token;
        a POST: the Origin); a refusal says why, and nothing else happens."""

        async def endpoint(request: Request) -> Response:
            try:
                if request.method == "POST":
                    self._check_origin(request)
                if session:
                    self._check_session(request)
                return await handler(request)
            except _Refused as exc:
                return JSONResponse({"error": exc.why}, status_code=exc.status)

        return endpoint

    def _check_origin(self, request: Request) -> None:
        # a cross-site page's POST carries its own Origin; a request with none is not the page's
        if request.headers.getlist("origin") != [self.origin]:
            raise _Refused("refused: the request's Origin is not this dashboard's")

    def _check_session(self, request: Request) -> None:
        sent = request.headers.get(CSRF_HEADER, "")
        token = self._token_of(request.cookies.get(COOKIE, ""))
        if token is None:
            raise _Refused("refused: no dashboard session; open the address `cellblock dashboard` gave")
        if not hmac.compare_digest(token.encode(), sent.encode()):
            raise _Refused("refused: the request lacks this session's CSRF token")

    def _token_of(self, cookie: str) -> str | None:
        """The CSRF token of the session `cookie` holds, or None."""
        return next((t for c, t in self._sessions.items() if hmac.compare_digest(c.encode(), cookie.encode())), None)

    async def _file(self, request: Request) -> Response:
        name, media = _FILES[request.url.path]
        return Response((STATIC / name).read_bytes(), media_type=media)

    async def _session(self, request: Request) -> Response:
        """The secret opens a new session; without it, a page this browser opened from a gateway's
        approval link (no secret in it) is given the token of the session its cookie holds."""
        body = await _json_body(request)
        given = body.get("secret")
        if given is None:
            token = self._token_of(request.cookies.get(COOKIE, ""))
            if token is None:
                raise _Refused("refused: no dashboard session; open the address `cellblock dashboard` gave")
            return JSONResponse({"csrf": token})
        if not isinstance(given, str) or not hmac.compare_digest(given.encode(), self._secret):
            raise _Refused("refused: not this dashboard's secret")
        cookie, csrf = secrets.token_urlsafe(32), secrets.token_urlsafe(32)
        self._sessions[cookie] = csrf
        while len(self._sessions) > MAX_SESSIONS:
            self._sessions.popitem(last=False)
        response = JSONResponse({"csrf": csrf})
        response.set_cookie(COOKIE, cookie, path="/", httponly=True, samesite="strict")
        return response

    async def _state(self, request: Request) -> Response:
        # the control sockets are blocking stdlib code (the CLI's): in a worker thread
        return JSONResponse(await anyio.to_thread.run_sync(self._source.state))

    async def _answer(self, request: Request) -> Response:
        body = await _json_body(request)
        ident, scope = body.get("id"), body.get("scope", "once")
        op = request.url.path.removeprefix("/api/")
        if not isinstance(ident, str) or not ident or (op == "approve" and scope not in ("once", "session", "always")):
            raise _Refused("an answer is {'id': ID} and, to approve, a 'scope' of once, session or always", 400)
        message = {"op": op, "id": ident, "via": "dashboard", **({"scope": scope} if op == "approve" else {})}
        answered = await anyio.to_thread.run_sync(self._source.answer, message)
        return JSONResponse({"ok": answered.done, "message": answer_text(message, answered)})

    async def _approve_catalog(self, request: Request) -> Response:
        """Approve a held catalog bound to the hash the page showed: the gateway refuses it if the
        catalog it holds now has another (`cellblock approve SERVER --hash`)."""
        body = await _json_body(request)
        server, shown_hash = body.get("server"), body.get("hash")
        if (
            not isinstance(server, str)
            or not server
            or not isinstance(shown_hash, str)
            or not _SHA256.fullmatch(shown_hash)
        ):
            raise _Refused("an approval of a catalog is {'server': NAME, 'hash': the sha256 shown}", 400)
        message = {"op": "approve_catalog", "server": server, "hash": shown_hash}
        answered = await anyio.to_thread.run_sync(self._source.answer, message)
        return JSONResponse({"ok": answered.done, "message": catalog_answer_text(server, shown_hash, answered)})

    async def _audit(self, request: Request) -> Response:
        """The audit log's newest events matching the query's filters, and its chain's verdict."""
        if self._timeline is None:
            return JSONResponse({"error": "this dashboard reads no audit log"}, status_code=404)
        filters: dict[str, str] = {}
        for name, value in request.query_params.multi_items():
            if name not in FILTERS or name in filters or len(value) > MAX_FILTER:
                raise _Refused(f"the audit's filters are {', '.join(FILTERS)}, each once", 400)
            if value:
                filters[name] = value
        # the whole log is read through (blocking file I/O): in a worker thread
        return JSONResponse(await anyio.to_thread.run_sync(self._timeline.read, filters))

    async def _scan_reports(self, request: Request) -> Response:
        """The latest scan report of each server, as `cellblock scan` kept it."""
        if self._scans is None:
            return JSONResponse({"error": "this dashboard reads no scan reports"}, status_code=404)
        # file I/O, bounded but blocking: in a worker thread
        return JSONResponse(await anyio.to_thread.run_sync(self._scans.read))


async def _json_body(request: Request) -> dict[str, Any]:
    """The request's JSON object; a form post, or anything but a small JSON object, is refused."""
    if request.headers.get("content-type", "").split(";")[0].strip().lower() != "application/json":
        raise _Refused("refused: the body must be application/json", 415)
    # read no further than the limit: any local process may send here, with any Origin it likes
    raw = b""
    async for chunk in request.stream():
        raw += chunk
        if len(raw) > MAX_BODY:
            raise _Refused(f"refused: the body is over {MAX_BODY} bytes", 413)
    try:
        body = json.loads(raw)
    except (ValueError, RecursionError):
        body = None
    if not isinstance(body, dict):
        raise _Refused("refused: the body must be one JSON object", 400)
    return body


class _Guard:
    """Checks the Host of every request and puts `HEADERS` on every response, refusals and errors
    included."""

    def __init__(self, app: ASGIApp, host: str) -> None:
        self._app, self._host = app, host.encode()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            if scope["type"] == "lifespan":
                await self._app(scope, receive, send)
            return  # no websockets: nothing is served on them

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                kept = [(k, v) for k, v in message.get("headers", []) if k.decode("latin-1").lower() not in HEADERS]
                message["headers"] = kept + [(k.encode(), v.encode()) for k, v in HEADERS.items()]
            await send(message)

        hosts = [value for key, value in scope["headers"] if key.lower() == b"host"]
        if hosts != [self._host]:  # DNS rebinding: the attacker's name, pointed at 127.0.0.1
            refusal = JSONResponse({"error": "refused: wrong Host; open the address `cellblock dashboard` gave"}, 403)
            await refusal(scope, receive, send_with_headers)
            return
        await self._app(scope, receive, send_with_headers)
