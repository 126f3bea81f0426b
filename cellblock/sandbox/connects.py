"""A Landlock jail's connections, made by the gateway: each connect() of the server judged here.

A `network: allowlist` or `ask` jail on Landlock shares the host's network, and Landlock's TCP
rules are by port alone: a rule for the egress proxy's port would reach that port on any host. So
the jail's launcher (`sandbox/landlocked.py`) installs a seccomp filter under which every connect()
waits for an answer (`seccomp.LANDLOCK_PROXIED_RULES`), and hands the filter's listener to the
gateway before it becomes the server. A `ConnectGate` holds it, and for each connect:

- reads the address the call names from the caller's memory, and checks the call still waits
  (its thread may have ended, its pid been reused);
- refuses (EACCES, what Landlock answers) every address but the gate's own listener on
  127.0.0.1;
- for that one, takes a duplicate of the caller's socket (`pidfd_getfd`) and connects it itself, to
  the address it checked, held in the gateway's memory: another thread of the jail may change the
  caller's memory after it was read, but what is connected is what was judged. The call returns
  that connect's result; the kernel never goes on with the call as the jail made it (the filter's
  CONTINUE flag is not used). Each such connect runs in a thread of its own: one that never
  completes (its SYN dropped, by a TCP MD5 key the jail set on the socket) holds up no other, and
  `close` ends those still waiting.

The listener accepts only the connections the gate made (by their source address, noted before
each connect, used once; a socket whose connect is still under way is held until it ends, so its
source stays bound by it) and carries each to the egress proxy's Unix socket
(`relay.serve_connection`), where the proxy's checks, questions and audit apply as for a bwrap jail.
Another process of the host that finds the port is closed on. A jail whose gate is gone fails each
connect (ENOSYS).
"""

from __future__ import annotations

import contextlib
import ctypes
import errno
import fcntl
import functools
import logging
import os
import select
import socket
import struct
import sys
import threading
import time

from cellblock.sandbox.modes import MODE_CALLS, change_mode
from cellblock.sandbox.pin import SYS_SECCOMP
from cellblock.sandbox.relay import ACCEPT_BACKOFF, MAX_CONNECTIONS, serve_connection
from cellblock.sandbox.seccomp import syscall_name
from cellblock.sandbox.sidecars import FILE_CALLS, Opened, Sidecars
from cellblock.sandbox.types import GatePlan
from cellblock.sandbox.unix import reachable

__all__ = ["LOOPBACK", "ConnectGate", "gate_missing"]

logger = logging.getLogger(__name__)

LOOPBACK = "127.0.0.1"
_LIBC = ctypes.CDLL(None, use_errno=True)
SYS_PIDFD_GETFD = 438  # the same on x86-64 and aarch64 (the generic syscall table)
_PIDFD_THREAD = os.O_EXCL  # pidfd_open: a pidfd of the thread itself (Linux 6.9)
# struct seccomp_notif (id, pid, flags, then seccomp_data: nr, arch, instruction pointer, args)
# and struct seccomp_notif_resp (id, val, error, flags), and the ioctls that read and answer them
_NOTIF = struct.Struct("=QIIiIQ6Q")
_RESP = struct.Struct("=QqiI")
NOTIF_RECV = 0xC0000000 | (_NOTIF.size << 16) | (ord("!") << 8) | 0
NOTIF_SEND = 0xC0000000 | (_RESP.size << 16) | (ord("!") << 8) | 1
NOTIF_ID_VALID = 0x40000000 | (8 << 16) | (ord("!") << 8) | 2
# struct seccomp_notif_addfd (id, flags, srcfd, newfd, newfd_flags): a descriptor put into the caller
_ADDFD = struct.Struct("=QIIII")
NOTIF_ADDFD = 0x40000000 | (_ADDFD.size << 16) | (ord("!") << 8) | 3
_ADDFD_SEND = 1 << 1  # ... and the call answered with its number, at once (Linux 5.14)
_FLAG_CONTINUE = 1  # the call goes on as the caller made it, judged by the kernel (Landlock)
SECCOMP_GET_ACTION_AVAIL, SECCOMP_RET_USER_NOTIF = 2, 0x7FC00000
# The longest address read: a sockaddr_in6 (for the refusal's message); a sockaddr_in is 16 bytes.
_ADDRESS_BYTES = 28
# Destinations whose refusal is logged: the first ones; a runaway of attempts is not a flood of lines.
_TOLD = 64
# Connects under way at once, each in a thread of its own (one may wait minutes): the next waits.
_CONNECTING = 64
_IP_BIND_ADDRESS_NO_PORT = 24  # a bound socket's port chosen at its connect, not at its bind
_TCP_CLOSE = 7  # a TCP socket's state (tcp_info's first byte) when its connect failed
# Seconds `close` waits for the gate's threads (they wake at once; this only bounds a stuck one).
_JOIN_SECONDS = 2.0


@functools.cache
def gate_missing() -> str | None:
    """Why this machine cannot run a gate (None: it can): seccomp user notification or
    `pidfd_getfd` is missing or refused (an old kernel, a container's seccomp profile)."""
    number = SYS_SECCOMP.get(os.uname().machine)
    action = ctypes.c_uint32(SECCOMP_RET_USER_NOTIF)
    if number is None or _LIBC.syscall(number, SECCOMP_GET_ACTION_AVAIL, 0, ctypes.byref(action)) != 0:
        return f"seccomp user notification is not available here ({os.strerror(ctypes.get_errno())})"
    try:
        own = os.pidfd_open(os.getpid())
    except OSError as exc:
        return f"pidfd_open is refused here ({exc.strerror})"
    try:
        dup = _LIBC.syscall(SYS_PIDFD_GETFD, own, own, 0)
        if dup < 0:
            return f"pidfd_getfd is refused here ({os.strerror(ctypes.get_errno())})"
        os.close(dup)
    finally:
        os.close(own)
    return None


class ConnectGate:
    """The gate of one run of a server's jail, as its `plan` asks: carrying the connections it
    allows to the egress proxy, a root installer's mode changes, the files beside lone granted files
    (`sandbox/sidecars.py`). Give the launcher `child` (``--gate``) and, where the jail's network
    goes through the proxy, `port` (``--proxy-port``); call `spawned` once it is started, and `close`
    once it has ended.

    Raises:
        OSError: what it holds cannot be opened (nothing is left open).
    """

    def __init__(self, plan: GatePlan) -> None:
        self.name = name = plan.server
        # a root installer's: its mode changes are made beneath this directory (sandbox/modes.py)
        self._modes = plan.modes_beneath
        self._beneath = -1
        self._sidecars: Sidecars | None = None
        self._listener: socket.socket | None = None
        self._egress = ""
        self.port = 0
        # everything it opens, closed by `close` (or here, when a later one cannot be opened)
        self._held = contextlib.ExitStack()
        try:
            self._ours, self._theirs = (self._held.enter_context(end) for end in socket.socketpair())
            self._stop, self._stopping = os.pipe()
            self._held.callback(os.close, self._stop)
            self._held.callback(os.close, self._stopping)
            if plan.modes_beneath is not None:
                self._beneath = os.open(plan.modes_beneath, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
                self._held.callback(os.close, self._beneath)
            if plan.beside:
                self._sidecars = Sidecars(plan.beside)
                self._held.callback(self._sidecars.close)
            if plan.egress_socket is not None:
                # the proxy's socket by a path short enough to connect to, however long its own
                self._egress = self._held.enter_context(reachable(plan.egress_socket))
                self._listener = self._held.enter_context(socket.create_server((LOOPBACK, 0), backlog=128))
                self.port = self._listener.getsockname()[1]
        except BaseException:
            self._held.close()
            raise
        self.child = self._theirs.fileno()
        self._expected: set[tuple[str, int]] = set()  # the source addresses of the connections it made
        self._told: set[tuple[str, int]] = set()
        self._slots = threading.BoundedSemaphore(MAX_CONNECTIONS)
        # the connects under way, each in a thread of its own, and the sockets they are connecting
        self._connecting = threading.BoundedSemaphore(_CONNECTING)
        self._workers: set[threading.Thread] = set()
        self._sockets: set[socket.socket] = set()
        self._closed = False
        self._threads = [threading.Thread(target=self._notices, name=f"gate-{name}", daemon=True)]
        if self._listener is not None:
            accepts = threading.Thread(
                target=self._accepts, args=(self._listener,), name=f"gate-{name}-accept", daemon=True
            )
            self._threads.append(accepts)
        for thread in self._threads:
            thread.start()

    def spawned(self) -> None:
        """The launcher has its end: the gateway's copy goes, so a launcher that dies before it hands
        the listener over is seen (EOF), not waited for."""
        self._theirs.close()

    def close(self) -> None:
        """Stop answering: a connect still waiting, or made later by what is left of the jail, fails."""
        if self._closed:
            return
        self._closed = True
        os.write(self._stopping, b"x")
        if self._listener is not None:
            with contextlib.suppress(OSError):
                self._listener.shutdown(socket.SHUT_RDWR)  # wakes the accept
        deadline = time.monotonic() + _JOIN_SECONDS
        self._abort()  # frees the slots the notices' thread may be waiting for
        for thread in self._threads:
            thread.join(max(0.0, deadline - time.monotonic()))
        self._abort()  # a connect started meanwhile: it sees the gate closed, or is shut down here
        for thread in list(self._workers):
            thread.join(max(0.0, deadline - time.monotonic()))
        self._held.close()

    def _abort(self) -> None:
        for sock in list(self._sockets):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)  # a connect that waits (its SYN dropped) ends now

    # -- the connects ---------------------------------------------------------------------------

    def _notices(self) -> None:
        listener = self._receive()
        if listener is None:
            return
        try:
            poller = select.poll()
            poller.register(listener, select.POLLIN)
            poller.register(self._stop, select.POLLIN)
            while True:
                for fd, events in poller.poll():
                    if fd == self._stop:
                        return
                    if events & select.POLLIN:
                        self._answer(listener)
                    elif events & (select.POLLHUP | select.POLLERR | select.POLLNVAL):
                        return  # every process of the jail has ended
        finally:
            os.close(listener)

    def _receive(self) -> int | None:
        """The filter's listener, as the launcher sends it (None: it ended first, or the gate closed)."""
        poller = select.poll()
        poller.register(self._ours, select.POLLIN)
        poller.register(self._stop, select.POLLIN)
        if any(fd == self._stop for fd, _ in poller.poll()):
            return None
        try:
            _, fds, _, _ = socket.recv_fds(self._ours, 1, 1)
        except OSError:
            return None
        return fds[0] if fds else None

    def _answer(self, listener: int) -> None:
        notice = bytearray(_NOTIF.size)  # zeroed: the kernel refuses to fill one that is not
        try:
            fcntl.ioctl(listener, NOTIF_RECV, notice)
        except OSError:
            return  # the caller went away before it was read
        ident, pid, _, number, arch, _, *args = _NOTIF.unpack(notice)
        call = syscall_name(arch, number)
        if call in FILE_CALLS and self._sidecars is not None:
            _hand(listener, ident, self._sidecars.answer(pid, call, args, lambda: _waiting(listener, ident)))
            return
        if call != "connect":
            _reply(listener, ident, self._mode(listener, ident, pid, call, args))
            return
        fd, address, length = args[:3]
        error = self._judge(listener, ident, pid, address, length)
        if error == 0:
            error = self._start(listener, ident, pid, fd)
        if error != 0:
            _reply(listener, ident, error)

    def _mode(self, listener: int, ident: int, pid: int, call: str | None, args: list[int]) -> int:
        """A root installer's change of mode, made beneath its install (any other call: EPERM)."""
        if call not in MODE_CALLS or self._modes is None:
            return errno.EPERM
        return change_mode(pid, call, args, self._beneath, self._modes, lambda: _waiting(listener, ident))

    def _judge(self, listener: int, ident: int, pid: int, address: int, length: int) -> int:
        """The connect's error number, 0 when it names the gate's own listener."""
        try:
            with open(f"/proc/{pid}/mem", "rb", buffering=0) as memory:
                data = os.pread(memory.fileno(), min(length, _ADDRESS_BYTES), address)
        except (OSError, OverflowError, ValueError):
            return errno.EFAULT
        if not _waiting(listener, ident):
            return errno.EINTR  # not read by anyone: the call is gone
        family = int.from_bytes(data[:2], sys.byteorder) if len(data) >= 2 else -1
        if family == socket.AF_INET and length >= 16 and len(data) >= 8:
            target = (socket.inet_ntoa(data[4:8]), int.from_bytes(data[2:4], "big"))
        elif family == socket.AF_INET6 and length >= 24 and len(data) >= 24:
            target = (socket.inet_ntop(socket.AF_INET6, data[8:24]), int.from_bytes(data[2:4], "big"))
        else:
            return errno.EACCES
        if target != (LOOPBACK, self.port):
            self._tell(*target)
            return errno.EACCES
        return 0

    def _start(self, listener: int, ident: int, pid: int, fd: int) -> int:
        """Connect the caller's socket in a thread of its own, which answers the call (0: started, else
        the error the call gets). A connect may wait minutes (its SYN dropped): the others do not wait
        for it, unless `_CONNECTING` of the jail's own wait already. The thread answers through a
        listener of its own, which stays open as long as it does."""
        self._connecting.acquire()
        try:
            own = os.dup(listener)
        except OSError as exc:  # out of descriptors: this connect fails, not the gate
            self._connecting.release()
            return exc.errno or errno.EMFILE
        worker = threading.Thread(
            target=self._connect_and_reply, args=(own, ident, pid, fd), name=f"gate-{self.name}-connect", daemon=True
        )
        self._workers.add(worker)
        try:
            worker.start()
        except RuntimeError:  # no thread to be had: this connect fails, not the gate
            self._workers.discard(worker)
            os.close(own)
            self._connecting.release()
            return errno.EAGAIN
        return 0

    def _connect_and_reply(self, listener: int, ident: int, pid: int, fd: int) -> None:
        try:
            sock = self._socket_of(listener, ident, pid, fd)
            if isinstance(sock, int):
                _reply(listener, ident, sock)
                return
            self._sockets.add(sock)
            try:
                with sock:
                    error, source = self._connect(sock)
                    _reply(listener, ident, error)
                    if error == errno.EINPROGRESS:
                        self._settle(sock, source)
            finally:
                self._sockets.discard(sock)
        finally:
            os.close(listener)
            self._workers.discard(threading.current_thread())
            self._connecting.release()

    def _socket_of(self, listener: int, ident: int, pid: int, fd: int) -> socket.socket | int:
        """The caller's socket `fd`, duplicated here (an int: the error the call gets instead)."""
        try:
            handle = _pidfd(pid)
        except OSError as exc:
            return exc.errno or errno.ESRCH
        try:
            if not _waiting(listener, ident):  # the pid is still the caller's, now that it is held
                return errno.EINTR
            dup = _LIBC.syscall(SYS_PIDFD_GETFD, handle, fd, 0)
            if dup < 0:
                return ctypes.get_errno()
        finally:
            os.close(handle)
        try:
            return socket.socket(fileno=dup)
        except OSError as exc:
            os.close(dup)
            return exc.errno or errno.ENOTSOCK

    def _connect(self, sock: socket.socket) -> tuple[int, tuple[str, int] | None]:
        """Connect `sock` to the gate's listener, from here: the error number, and the source noted."""
        if self._closed:  # after `close` shut the connects under way down
            return errno.ECONNABORTED, None
        if sock.family != socket.AF_INET or sock.type != socket.SOCK_STREAM:
            return errno.EACCES, None
        try:
            if sock.getsockname()[1] == 0:
                # its source is known before it connects: a port chosen now, not put off to the connect
                sock.setsockopt(socket.IPPROTO_IP, _IP_BIND_ADDRESS_NO_PORT, 0)
                sock.bind((LOOPBACK, 0))
            host, port = sock.getsockname()
        except OSError as exc:
            return exc.errno or errno.EACCES, None
        if port == 0:  # put off again meanwhile, by another thread of the jail
            return errno.EADDRNOTAVAIL, None
        if socket.inet_aton(host)[0] != 127:
            # bound by the server beyond loopback (possible below Landlock ABI 4): an IP source route
            # on the socket would send its SYN to the route's first hop; from loopback none leaves the host
            return errno.EACCES, None
        source = (host, port)
        noted = source not in self._expected  # else a connect of this socket under way noted it
        self._expected.add(source)
        to = struct.pack("=H", socket.AF_INET) + struct.pack(">H", self.port) + socket.inet_aton(LOOPBACK)
        to += bytes(8)
        failed = _LIBC.connect(sock.fileno(), to, len(to)) != 0
        error = ctypes.get_errno() if failed else 0
        if error not in (0, errno.EINPROGRESS) and noted:
            self._expected.discard(source)
        return error, source

    def _settle(self, sock: socket.socket, source: tuple[str, int] | None) -> None:
        """Hold `sock`, whose connect is under way, until it ends: its source stays bound by it (the
        jail may close its own descriptor meanwhile), and is forgotten if the connect fails. It ends
        when the kernel gives up its SYNs, or when `close` shuts it down."""
        poller = select.poll()
        poller.register(sock, select.POLLOUT)
        poller.poll()
        # its state, not SO_ERROR: reading that clears it, and the jail reads it to learn how its connect went
        if source is not None and sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_INFO, 1)[0] == _TCP_CLOSE:
            self._expected.discard(source)

    def _tell(self, host: str, port: int) -> None:
        if (host, port) in self._told or len(self._told) >= _TOLD:
            return
        self._told.add((host, port))
        shown = f"[{host}]" if ":" in host else host
        logger.warning(
            "server '%s': its connection to %s:%d was refused: in its Landlock jail it reaches the network "
            "only through the egress proxy (the proxy variables)",
            self.name,
            shown,
            port,
        )

    # -- the listener ---------------------------------------------------------------------------

    def _accepts(self, listener: socket.socket) -> None:
        while True:
            try:
                client, peer = listener.accept()
            except OSError:
                if self._closed:
                    return
                time.sleep(ACCEPT_BACKOFF)  # out of descriptors: not a spin
                continue
            source = (peer[0], peer[1])
            if source not in self._expected:
                client.close()  # not a connection the gate made: another process of the host
                continue
            # used once, carried or not: a source left behind would let a host process that binds it pass
            self._expected.discard(source)
            if not self._slots.acquire(blocking=False):
                client.close()
                continue
            work = (client, self._egress, self._slots, None, True)
            try:
                threading.Thread(target=serve_connection, args=work, daemon=True).start()
            except RuntimeError:  # no thread to be had (the user's process limit): this one, not the listener
                client.close()
                self._slots.release()


def _reply(listener: int, ident: int, error: int, flags: int = 0) -> None:
    with contextlib.suppress(OSError):  # the caller may have gone away meanwhile
        fcntl.ioctl(listener, NOTIF_SEND, _RESP.pack(ident, 0, -error, flags))


def _hand(listener: int, ident: int, answer: int | Opened | None) -> None:
    """Answer a file call: let it go on (None), fail it or say it is done (an error number, 0), or
    hand it the descriptor opened for it, as its result, in one step (the kernel's ADDFD_FLAG_SEND)."""
    if answer is None:
        _reply(listener, ident, 0, _FLAG_CONTINUE)
    elif isinstance(answer, int):
        _reply(listener, ident, answer)
    else:
        try:
            fcntl.ioctl(listener, NOTIF_ADDFD, _ADDFD.pack(ident, _ADDFD_SEND, answer.fd, 0, _cloexec(answer)))
        except OSError as exc:  # the caller went away, or it is out of descriptors (EMFILE: its answer)
            _reply(listener, ident, exc.errno or errno.EMFILE)
        finally:
            os.close(answer.fd)


def _cloexec(opened: Opened) -> int:
    return os.O_CLOEXEC if opened.cloexec else 0


def _waiting(listener: int, ident: int) -> bool:
    """Whether the notification `ident` still waits for its answer (its caller has not gone away)."""
    try:
        fcntl.ioctl(listener, NOTIF_ID_VALID, struct.pack("=Q", ident))
    except OSError:
        return False
    return True


def _pidfd(tid: int) -> int:
    """A pidfd of thread `tid`, whose descriptor table `pidfd_getfd` reads (a thread may have its own,
    and outlive its process's first thread); before Linux 6.9, which has no thread pidfds, its process's.

    Raises:
        OSError: the thread is gone.
    """
    try:
        return os.pidfd_open(tid, _PIDFD_THREAD)
    except OSError as exc:
        if exc.errno != errno.EINVAL:
            raise
    return os.pidfd_open(_thread_group(tid))


def _thread_group(tid: int) -> int:
    """The process of thread `tid` (a notification names the calling thread; a pidfd needs a process).

    Raises:
        OSError: the thread is gone.
    """
    with open(f"/proc/{tid}/status") as status:
        for line in status:
            if line.startswith("Tgid:"):
                return int(line.split()[1])
    raise OSError(errno.ESRCH, f"thread {tid} has no process")
