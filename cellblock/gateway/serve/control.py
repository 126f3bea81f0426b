"""The control socket: how `cellblock pending|approve|deny|ps` reach a running gateway.

Each gateway (`cellblock serve`, one per MCP client) listens on `control-<pid>.sock` in the 0700
runtime dir, and writes a random token, new at each start, to `control-<pid>.token` beside it
(0600, written atomically before the socket is bound, removed at exit). The runtime dir is hidden
from every jail, so only the user's own processes outside the jails can read it.

Reaching the socket is never enough. A connection is refused unless the peer's credentials (Linux
`SO_PEERCRED`; macOS and the BSDs `getpeereid`) name the gateway's own uid, and unless the peer is
no process of a server, this gateway's or another's (`serve/peer.py`: a server's marked cgroup,
and its process tree, where the OS gives the peer's pid: Linux). A request is refused unless it
carries the token, compared in constant time. Each refusal is answered with why, logged and
audited (`control_refused`), never with the token's value, which nothing logs.

The protocol is one JSON object per line, one exchange per connection; every request carries
`"token": "<the token file's line, without its newline>"` besides what is shown:

    -> {"op": "pending"}                      <- {"ok": true, "pending": [...]}   (arguments cut)
    -> {"op": "pending", "full": ID}          <- the same, only ID, its arguments uncut
    -> {"op": "approve", "id": ..., "scope": "once"|"session"|"always"}
    -> {"op": "deny", "id": ...}              <- {"ok": true} | {"ok": false, "error": "..."}
                                                 (both take "via": "cli" (the default) | "dashboard")
    -> {"op": "revoke", "server": ..., "tool": ...|null, "kind": "tool"|"prompt"|"resource"}
                                              <- {"ok": true, "revoked": [{"kind", "tool", "scope"}, ...]}
    -> {"op": "ps"}                           <- {"ok": true, "pid": ..., "config": ..., "servers": [{"name",
                                                  "state", ..., "stderr", "jail_detail", "package", "lock"}]}
    -> {"op": "held"}                         <- {"ok": true, "held": [{"server", "first", "hash", "diff",
                                                  "tools": [{"name", "unasked"}]}, ...]}
    -> {"op": "approve_catalog", "server": ..., "hash": SHA256}
                                              <- {"ok": true, "items": N}  (refused if the held catalog's
                                                 hash is no longer SHA256: it changed after it was shown)
    -> {"op": "reconnect", "server": ...}     <- {"ok": true, "restarted": bool, "state": ...}
    -> {"op": "allow_host", "server": ..., "entry": "host:port", "config": PATH}
                                              <- {"ok": true, "applied": bool}  (only for its own config)
    -> {"op": "share", "server": ..., "path": PATH, "write": bool, "config": PATH}
                                              <- {"ok": true, "applied": bool}  (the server restarted with it)

A reply refusing an unknown id should carry `"code": NOT_FOUND`, so the CLI can tell "not this
gateway" from a real refusal when several gateways run. The server side checks the frame (one
line, a JSON object with a string `op`), the peer and the token, and leaves every op (without the
token) to the gateway's handler; the client side is blocking stdlib code for the CLI, which reads
the token beside the socket it talks to.

    CellblockError
    └── ControlError      no gateway at a socket, or its answer is not a control reply
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
import socket
import stat
import time
from collections.abc import Awaitable, Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import anyio
import anyio.abc

from cellblock.gateway.serve.peer import peer
from cellblock.policy.errors import CellblockError
from cellblock.policy.files import atomic_write_bytes
from cellblock.sandbox.unix import accept, bind_private, reachable

__all__ = [
    "MAX_CONNECTIONS",
    "MAX_REQUEST",
    "NOT_FOUND",
    "REPLY_TIMEOUT",
    "REQUEST_TIMEOUT",
    "ControlError",
    "ControlServer",
    "Handler",
    "Refused",
    "gateways",
    "request",
    "socket_path",
    "token_path",
]

logger = logging.getLogger(__name__)

Handler = Callable[[dict[str, Any]], Awaitable[dict[str, Any]]]
# Told of each refused request: its op, the peer's pid and uid (None where unknown), and why.
Refused = Callable[[str, int | None, int | None, str], None]

# The requests are a few hundred bytes (an op and an id); 64 KiB is far above any honest one and
# small enough that a confused or hostile local peer cannot make the gateway buffer much.
MAX_REQUEST = 64 * 1024
# The CLI writes its request as soon as it connects; a peer silent for 5 s is stuck or hostile,
# and holds one of the few connection slots until it is cut off.
REQUEST_TIMEOUT = 5.0
# A reader that stops reading must not hold a slot (and the handler's answer) forever.
REPLY_TIMEOUT = 5.0
# A peer refused mid-request may still be sending; closing on unread data resets the connection
# and loses the refusal, so its rest is read and dropped for at most this long first.
DRAIN_TIMEOUT = 1.0
# A human types these commands; 16 at once is ample, and the cap bounds what stuck peers can hold.
MAX_CONNECTIONS = 16
# A pending list carries each call's arguments; the cap only stops a confused peer from making
# the CLI read without end.
MAX_REPLY = 16 * 1024 * 1024
# Probing a socket only needs the kernel to accept or refuse; a live but busy gateway still
# accepts into its backlog at once, so a short wait is enough.
PROBE_TIMEOUT = 1.0

NOT_FOUND = "not_found"
# 32 random bytes: nobody guesses it, and it fits in any request with room to spare.
TOKEN_BYTES = 32
# The token file holds one token and a newline; a bigger one is not the gateway's.
MAX_TOKEN_FILE = 1024
_INTERNAL = {"ok": False, "error": "internal error"}


class ControlError(CellblockError):
    """No gateway answers at a control socket, or its answer is not a control reply."""


class _BadRequest(Exception):
    """The request frame is malformed; the message is sent back as the error."""


def socket_path(runtime: Path, pid: int | None = None) -> Path:
    """The control socket of the gateway with `pid` (default: this process) in `runtime`."""
    return runtime / f"control-{pid or os.getpid()}.sock"


def token_path(socket_file: Path) -> Path:
    """The token file beside the control socket `socket_file`."""
    return socket_file.with_name(socket_file.name.removesuffix(".sock") + ".token")


# -- server ----------------------------------------------------------------------------------------


class ControlServer:
    """Serves the control socket at `path`, answering each request with `handler`.

    `handler` gets the request object (with a string `op`) and returns the reply object, which
    should carry `"ok": true|false`. If it raises, the peer gets `internal error` and the
    exception is logged.
    """

    def __init__(
        self,
        path: Path,
        handler: Handler,
        servers: Callable[[], set[int]] = set,
        refused: Refused | None = None,
    ) -> None:
        self.path = path
        self._handler = handler
        self._servers = servers  # the pids of the servers the gateway runs: they and theirs are refused
        self._refused = refused  # told of each refusal (the audit), besides the log
        self._token = b""

    async def serve(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Write a new token file (0600), bind the socket (0600), report started, and serve until
        cancelled.

        A stale socket file at `path` is replaced; the socket and token files are removed on the
        way out.

        Raises:
            OSError: the token cannot be written or the socket bound (its directory is missing,
                the path is too long, or a non-socket file is in the way).
        """
        token = secrets.token_urlsafe(TOKEN_BYTES)
        token_file = token_path(self.path)
        # before the socket: a client that finds the socket finds the token beside it
        atomic_write_bytes(token_file, (token + "\n").encode("ascii"), 0o600)
        self._token = token.encode("ascii")
        try:
            await self._serve_bound(task_status)
        finally:
            _remove_token(token_file, self._token)

    async def _serve_bound(self, task_status: anyio.abc.TaskStatus[None]) -> None:
        listener = bind_private(self.path, MAX_CONNECTIONS)
        bound = os.lstat(self.path).st_ino
        slots = anyio.Semaphore(MAX_CONNECTIONS)
        try:
            async with anyio.create_task_group() as tg:
                task_status.started()
                while True:
                    # take a slot before accepting: past the cap, peers wait in the kernel backlog
                    await slots.acquire()
                    try:
                        conn = await accept(listener, "control socket")
                    except BaseException:
                        slots.release()
                        raise
                    tg.start_soon(self._connection, conn, slots)
        finally:
            listener.close()
            _remove_own(self.path, bound)

    async def _connection(self, conn: socket.socket, slots: anyio.Semaphore) -> None:
        try:
            with conn:
                drain = False
                pid, uid, refusal = peer(conn, self._servers())
                try:
                    message = await _read_request(conn)
                except _BadRequest as exc:
                    reply, drain = _encode({"ok": False, "error": str(exc)}), True
                except TimeoutError:
                    reply = _encode({"ok": False, "error": f"no complete request within {REQUEST_TIMEOUT:g} s"})
                else:
                    if message is None:
                        return  # connected and left without a word: a liveness probe
                    refusal = refusal or self._refused_token(message.pop("token", None))
                    if refusal is not None:
                        self._refuse(str(message["op"]), pid, uid, refusal)
                        reply = _encode({"ok": False, "error": refusal})
                    else:
                        reply = await self._answer(message)
                with anyio.move_on_after(REPLY_TIMEOUT):
                    await _send_all(conn, reply)
                if drain:
                    conn.shutdown(socket.SHUT_WR)
                    with anyio.move_on_after(DRAIN_TIMEOUT):
                        await _discard(conn)
        except OSError as exc:
            logger.debug("control socket: peer went away: %s", exc)
        finally:
            slots.release()

    def _refused_token(self, sent: Any) -> str | None:
        """Why the request's token is refused, if it is; never the token's value."""
        if sent is None:
            return f"refused a request without the control token (the CLI reads it from {token_path(self.path).name})"
        given = sent.encode("utf-8", "replace") if isinstance(sent, str) else b""
        if not self._token or not hmac.compare_digest(given, self._token):
            return "refused a request with a wrong control token"
        return None

    def _refuse(self, op: str, pid: int | None, uid: int | None, why: str) -> None:
        logger.warning("control socket: %s (op %r, peer pid %s, uid %s)", why, op[:40], pid, uid)
        if self._refused is not None:
            try:
                self._refused(op[:40], pid, uid, why)
            except Exception:
                logger.exception("control socket: could not record a refusal")

    async def _answer(self, message: dict[str, Any]) -> bytes:
        try:
            reply = await self._handler(message)
            if not isinstance(reply, dict):
                raise TypeError(f"handler returned {type(reply).__name__}, expected dict")
            return _encode(reply)
        except Exception:
            # top-level supervisor of one request: the peer learns nothing of the failure's detail
            logger.exception("control socket: handler failed for op %r", message.get("op"))
            return _encode(_INTERNAL)


def _remove_own(path: Path, inode: int) -> None:
    """Remove `path` if it is still the file we made: a later gateway may have replaced one we left."""
    with suppress(FileNotFoundError):
        if os.lstat(path).st_ino == inode:
            os.unlink(path)


def _remove_token(path: Path, token: bytes) -> None:
    """Remove the token file at `path` if it still holds `token`: a later gateway may have replaced
    a file we left behind, and an inode number is reused at once, so the content tells."""
    with suppress(OSError), open(path, "rb") as handle:
        if hmac.compare_digest(handle.read(MAX_TOKEN_FILE).strip(), token):
            os.unlink(path)


async def _read_request(conn: socket.socket) -> dict[str, Any] | None:
    """The request line as an object; None when the peer closed without sending anything.

    Raises:
        _BadRequest: too long, not one line, not a JSON object, or no string `op`.
        TimeoutError: the line did not arrive within REQUEST_TIMEOUT.
    """
    buffer = bytearray()
    with anyio.fail_after(REQUEST_TIMEOUT):
        while b"\n" not in buffer:
            if len(buffer) > MAX_REQUEST:
                raise _BadRequest(f"request too large (limit {MAX_REQUEST} bytes)")
            await anyio.wait_readable(conn)
            try:
                chunk = conn.recv(65536)
            except (BlockingIOError, InterruptedError):
                continue
            if not chunk:
                if not buffer:
                    return None
                raise _BadRequest("request ended without a newline; send one JSON object per line")
            buffer += chunk
    line = bytes(buffer[: buffer.index(b"\n")])
    if len(line) > MAX_REQUEST:
        raise _BadRequest(f"request too large (limit {MAX_REQUEST} bytes)")
    try:
        message = json.loads(line)
    except ValueError as exc:  # JSONDecodeError and UnicodeDecodeError alike
        raise _BadRequest(f"request is not JSON: {exc}") from None
    except RecursionError:
        raise _BadRequest("request is not JSON: nested too deeply") from None
    if not isinstance(message, dict):
        raise _BadRequest(f"request must be a JSON object, got {type(message).__name__}")
    if not isinstance(message.get("op"), str):
        raise _BadRequest("request has no 'op' string")
    return message


async def _send_all(conn: socket.socket, data: bytes) -> None:
    view = memoryview(data)
    while view:
        await anyio.wait_writable(conn)
        try:
            sent = conn.send(view)
        except (BlockingIOError, InterruptedError):
            continue
        view = view[sent:]


async def _discard(conn: socket.socket) -> None:
    while True:
        await anyio.wait_readable(conn)
        try:
            if not conn.recv(65536):
                return
        except (BlockingIOError, InterruptedError):
            continue


def _encode(reply: dict[str, Any]) -> bytes:
    """One reply line; non-ASCII escaped so no byte of it can be read as a control character."""
    return (json.dumps(reply, separators=(",", ":"), allow_nan=False) + "\n").encode("ascii")


# -- client ----------------------------------------------------------------------------------------


def request(path: Path, message: dict[str, Any], timeout: float = 5.0) -> dict[str, Any]:
    """Send `message` to the gateway at `path` and return its reply (blocking, `timeout` in all).

    Raises:
        ControlError: nobody listens at `path`, it did not answer in time, or the answer is not
            one JSON object with a boolean `ok`.
    """
    deadline = time.monotonic() + timeout
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(timeout)
        try:
            with reachable(path) as address:
                sock.connect(address)
        except (FileNotFoundError, ConnectionRefusedError) as exc:
            raise ControlError(f"no gateway is listening at {path}; is 'cellblock serve' running?") from exc
        except TimeoutError as exc:
            raise ControlError(f"the gateway at {path} did not accept a connection within {timeout:g} s") from exc
        except OSError as exc:
            raise ControlError(f"cannot connect to the gateway at {path}: {exc.strerror or exc}") from exc
        token = _read_token(path)
        # without a token the gateway refuses the request, and its answer says why
        sent = message if token is None else {**message, "token": token}
        data = (json.dumps(sent, separators=(",", ":")) + "\n").encode("utf-8")
        try:
            sock.settimeout(_remaining(deadline, path, timeout))
            sock.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass  # it may have answered and closed before reading it all (too large); the reply says why
        except TimeoutError as exc:
            raise ControlError(f"the gateway at {path} did not take the request within {timeout:g} s") from exc
        raw = _read_reply(sock, deadline, path, timeout)
    try:
        reply = json.loads(raw)
    except (ValueError, RecursionError):
        reply = None
    if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
        raise ControlError(f"the gateway at {path} answered something that is not a control reply: {raw[:80]!r}")
    return reply


def _read_token(path: Path) -> str | None:
    """The token the gateway at `path` wrote beside its socket; None if it cannot be read."""
    try:
        with open(token_path(path), "rb") as handle:
            token = handle.read(MAX_TOKEN_FILE).strip().decode("ascii")
    except (OSError, UnicodeDecodeError):
        return None
    return token or None


def _remaining(deadline: float, path: Path, timeout: float) -> float:
    left = deadline - time.monotonic()
    if left <= 0:
        raise ControlError(f"the gateway at {path} did not answer within {timeout:g} s")
    return left


def _read_reply(sock: socket.socket, deadline: float, path: Path, timeout: float) -> bytes:
    buffer = bytearray()
    while b"\n" not in buffer:
        if len(buffer) > MAX_REPLY:
            raise ControlError(f"the gateway at {path} sent a reply over {MAX_REPLY} bytes")
        sock.settimeout(_remaining(deadline, path, timeout))
        try:
            chunk = sock.recv(65536)
        except TimeoutError as exc:
            raise ControlError(f"the gateway at {path} did not answer within {timeout:g} s") from exc
        except ConnectionResetError:
            chunk = b""
        if not chunk:
            if not buffer:
                raise ControlError(f"the gateway at {path} closed the connection without answering")
            break
        buffer += chunk
    return bytes(buffer.split(b"\n", 1)[0])


def gateways(runtime: Path) -> list[Path]:
    """The control sockets of the running gateways in `runtime`; stale socket files (and the token
    files beside them) are removed.

    A socket whose connect is refused is stale (its gateway died without cleaning up) unless the
    pid in its name is still alive, which covers a gateway between bind() and listen().
    """
    found = []
    for path in sorted(runtime.glob("control-*.sock")):
        try:
            if not stat.S_ISSOCK(path.lstat().st_mode):
                continue
        except FileNotFoundError:
            continue
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
            probe.settimeout(PROBE_TIMEOUT)
            try:
                with reachable(path) as address:
                    probe.connect(address)
            except ConnectionRefusedError:
                if not _alive(path):
                    path.unlink(missing_ok=True)
                    token_path(path).unlink(missing_ok=True)
                continue
            except TimeoutError:
                pass  # listening, with a full backlog: alive and busy
            except OSError:
                continue
        found.append(path)
    return found


def _alive(path: Path) -> bool:
    pid = path.name.removeprefix("control-").removesuffix(".sock")
    if not pid.isdigit() or int(pid) <= 0:
        return False
    try:
        os.kill(int(pid), 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, owned by someone else
    return True
