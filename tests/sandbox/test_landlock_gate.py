"""`network: allowlist` on Landlock: the gateway makes each connection (sandbox/connects.py), attacked.

A Landlock jail shares the host's network, and Landlock's TCP rules are by port alone: the attacks
aim at what a port rule would let through (the proxy's port on another address, loopback or not),
at the host's loopback services, at the gate's reading of the address (a thread rewriting it),
at the gate's listener from outside the jail (through a source the gate noted and left behind), at
the gate itself (calls meant to trip it up, a connect that never completes, a socket bound beyond
loopback), and at other ways out (the 32-bit calls, Fast Open, netlink). What arrives is counted where it would arrive:
at the listeners the test holds, and at a stand-in for the egress proxy's Unix socket (the proxy
itself is not what these tests are about: tests/integration/test_egress.py runs the real one on
both backends). Each refusal has its control: the same attempt unjailed gets through.
"""

from __future__ import annotations

import contextlib
import errno
import json
import os
import select
import shutil
import socket
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox import connects, relay
from cellblock.sandbox.connects import ConnectGate, gate_missing
from cellblock.sandbox.landlock import landlock_abi, landlock_plan
from cellblock.sandbox.spawn import spawn_args
from cellblock.sandbox.trace import Kind, parse_trace, traced
from cellblock.sandbox.types import JailSpec, LaunchPlan, Mount, MountMode, Network
from cellblock.sandbox.unix import SUN_PATH, reachable

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(landlock_abi() < 1 or gate_missing() is not None, reason=f"no gate here: {gate_missing()}"),
]

PYTHON = os.path.realpath(sys.executable)
INTERPRETER = Mount(os.path.realpath(sys.base_prefix), MountMode.READ_ONLY, "python")
ROOT = Path(__file__).resolve().parents[2]
SECONDS = 30


class Proxy:
    """A stand-in for the egress proxy's socket: what each connection carried to it, in order."""

    def __init__(self, path: Path) -> None:
        self.path = str(path)
        self.carried: list[bytes] = []
        self._server = socket.socket(socket.AF_UNIX)
        with reachable(self.path) as short:  # as the proxy binds it, however deep its directory
            self._server.bind(short)
        self._server.listen()
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self._server.accept()
            except OSError:
                return
            with client:
                data = client.recv(64)
                self.carried.append(data)
                client.sendall(b"proxy got " + data)

    def close(self) -> None:
        self._server.shutdown(socket.SHUT_RDWR)
        self._server.close()


@pytest.fixture
def proxy(tmp_path: Path) -> Iterator[Proxy]:
    stand_in = Proxy(tmp_path / "egress.sock")
    yield stand_in
    stand_in.close()


def plan_for(tmp_path: Path, code: str, proxy: Proxy, abi: int | None = None) -> LaunchPlan:
    """A Landlock plan under `network: allowlist` running `code`: for the kernel's ABI, or for `abi`."""
    spec = JailSpec(
        name="hostile",
        argv=(PYTHON, "-I", "-S", "-c", code),
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "user")},
        network=Network.ALLOWLIST,
        egress_socket=proxy.path,
    )
    return landlock_plan(spec, [INTERPRETER], str(tmp_path / "private"), abi=abi)


def gate_port(argv: tuple[str, ...]) -> int:
    return int(argv[argv.index("--proxy-port") + 1])


def run(plan: LaunchPlan, before_start: Any = None) -> dict[str, Any]:
    """Run `plan` (calling `before_start(port)` with its gate's port first); what it printed last, as JSON."""
    with spawn_args(plan) as spawn:
        assert spawn.gate is not None
        try:
            if before_start is not None:
                before_start(spawn.gate.port)
            done = subprocess.run(
                spawn.argv, capture_output=True, text=True, timeout=SECONDS, pass_fds=spawn.pass_fds, check=False
            )
        finally:
            spawn.gate.close()
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def unjailed(code: str, port: int) -> dict[str, Any]:
    done = subprocess.run(
        [PYTHON, "-I", "-S", "-c", code],
        capture_output=True,
        text=True,
        timeout=SECONDS,
        check=True,
        env={"http_proxy": f"http://127.0.0.1:{port}"},
    )
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def elsewhere(held: list[socket.socket], backlog: int) -> Callable[[int], None]:
    """What listens, before the jail starts, on the gate's port at 127.0.0.2 (what a port rule would
    let through), keeping the listener in `held`."""
    return lambda port: held.append(socket.create_server(("127.0.0.2", port), backlog=backlog))


def arrived(listener: socket.socket) -> int:
    """Connections waiting on `listener` now (the attempt has ended: what it sent is there, or never will be)."""
    count = 0
    while select.select([listener], [], [], 0)[0]:
        listener.accept()[0].close()
        count += 1
    return count


TRY = """
import json, os, socket, threading
said = {}
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
def attempt(name, act):
    try:
        result = act()
        said[name] = result if isinstance(result, str) else "ok"
    except OSError as exc:
        said[name] = type(exc).__name__
def through(address, family=socket.AF_INET, answer=False):
    with socket.socket(family) as sock:
        sock.settimeout(5)
        sock.connect(address)
        sock.sendall(b"hello")
        return sock.recv(64).decode() if answer else "connected"
"""

ATTACKS = (
    TRY
    + """
attempt("proxy", lambda: through(("127.0.0.1", port), answer=True))
def from_a_thread():
    attempt("thread", lambda: through(("127.0.0.1", port), answer=True))
worker = threading.Thread(target=from_a_thread)
worker.start()
worker.join()
attempt("other_address", lambda: through(("127.0.0.2", port)))
attempt("ipv6", lambda: through(("::1", port), socket.AF_INET6))
attempt("loopback_service", lambda: through(("127.0.0.1", service)))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", service)))
attempt("fastopen", lambda: socket.socket().sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", service)))
def listen():
    server = socket.socket()
    server.listen()
attempt("listen", listen)
print(json.dumps(said))
"""
)


def test_under_allowlist_only_the_proxy_is_reached_not_its_port_elsewhere_nor_the_hosts_services(
    tmp_path: Path, proxy: Proxy
) -> None:
    service = socket.create_server(("127.0.0.1", 0))
    elsewhere: list[socket.socket] = []

    def listen_elsewhere(port: int) -> None:
        # the proxy's port on another loopback address, and on IPv6's: what a port rule allows
        elsewhere.append(socket.create_server(("127.0.0.2", port)))
        elsewhere.append(socket.create_server(("::1", port), family=socket.AF_INET6))

    code = f"service = {service.getsockname()[1]}\n{ATTACKS}"
    with service:
        said = run(plan_for(tmp_path, code, proxy), listen_elsewhere)
        try:
            # what it may: the proxy, from any thread (the positive control)
            assert said["proxy"] == said["thread"] == "proxy got hello"
            assert proxy.carried == [b"hello", b"hello"]
            for attack in ("other_address", "ipv6", "loopback_service", "udp", "fastopen", "listen"):
                assert said[attack] == "PermissionError", (attack, said)
            assert [arrived(s) for s in (service, *elsewhere)] == [0, 0, 0]
            # the control: unjailed, the same attempts reach every one of them
            port = elsewhere[0].getsockname()[1]
            control = unjailed(code, port)
            assert control["other_address"] == control["ipv6"] == control["loopback_service"] == "connected", control
            assert control["udp"] == control["fastopen"] == control["listen"] == "ok", control
            assert arrived(service) == 2 and [arrived(s) for s in elsewhere] == [1, 1]  # a connect, a fast open
        finally:
            for each in elsewhere:
                each.close()


# Connects again and again to an address another thread keeps rewriting between the gate's port on
# 127.0.0.1 and on 127.0.0.2 (where the test listens): the gate reads the address once, and must
# connect to what it read, not to what the memory holds a moment later.
RACE = """
import ctypes, json, os, socket, struct, threading
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
libc = ctypes.CDLL(None, use_errno=True)
def address(host):
    return struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(host) + bytes(8)
allowed, other = address("127.0.0.1"), address("127.0.0.2")
buffer = ctypes.create_string_buffer(allowed, 16)
done = False
def flip():
    while not done:
        ctypes.memmove(buffer, other, 16)
        ctypes.memmove(buffer, allowed, 16)
flipper = threading.Thread(target=flip)
flipper.start()
results = {}
for _ in range(rounds):  # until the race has gone both ways (or reached the other address)
    with socket.socket() as sock:
        code = libc.connect(sock.fileno(), buffer, 16)
        key = "connected" if code == 0 else os.strerror(ctypes.get_errno())
        key = "reached" if code == 0 and sock.getpeername()[0] == "127.0.0.2" else key
        results[key] = results.get(key, 0) + 1
    if "reached" in results or len(results) > 1:
        break
done = True
flipper.join()
print(json.dumps(results))
"""


def test_a_thread_that_rewrites_the_address_while_the_gate_judges_it_never_reaches_another(
    tmp_path: Path, proxy: Proxy
) -> None:
    other: list[socket.socket] = []
    code = f"rounds = 3000\n{RACE}"
    listen = lambda port: other.append(socket.create_server(("127.0.0.2", port)))  # noqa: E731
    said = run(plan_for(tmp_path, code, proxy), listen)
    with other[0]:
        assert arrived(other[0]) == 0, said
        # the race went both ways: the gate read the allowed address, and the other one
        assert said.get("connected", 0) > 0 and said.get("Permission denied", 0) > 0, said
        # the control: unjailed, the same race reaches the other address
        control = unjailed(code, other[0].getsockname()[1])
        assert control.get("reached") == 1 and arrived(other[0]) == 1, control


WAIT = """
import json, os, sys
print(json.dumps({"port": int(os.environ["http_proxy"].rsplit(":", 1)[1])}), flush=True)
sys.stdin.read()
"""


@contextlib.contextmanager
def waiting(plan: LaunchPlan) -> Iterator[tuple[ConnectGate, dict[str, Any]]]:
    """Start `plan`, whose server prints a JSON line then waits on its stdin: its gate and that line."""
    with spawn_args(plan) as spawn:
        assert spawn.gate is not None
        process = subprocess.Popen(
            spawn.argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, pass_fds=spawn.pass_fds
        )
        try:
            assert process.stdout is not None
            yield spawn.gate, json.loads(process.stdout.readline())
        finally:
            process.communicate("", timeout=SECONDS)
            spawn.gate.close()


def test_the_gates_listener_closes_on_a_connection_it_did_not_make(tmp_path: Path, proxy: Proxy) -> None:
    """Another process of the host that finds the port is not carried to the proxy."""
    with (
        waiting(plan_for(tmp_path, WAIT, proxy)) as (gate, _),
        socket.create_connection(("127.0.0.1", gate.port), timeout=5) as outsider,
    ):
        outsider.sendall(b"from outside")
        try:
            answer = outsider.recv(64)
        except ConnectionResetError:  # closed with what it sent unread
            answer = b""
        assert answer == b""
    assert proxy.carried == []


NETNS_SCRIPT = """
import json, socket, subprocess, sys
from pathlib import Path
sys.path.insert(0, {root!r})
from tests.sandbox.test_landlock_gate import Proxy, plan_for, run, unjailed, arrived
tmp = Path({tmp!r})
proxy = Proxy(tmp / "egress.sock")
held = []
code = 'attempt("far", lambda: through(("10.200.0.1", port)))\\nprint(json.dumps(said))'
code = {attempt!r} + code
said = run(plan_for(tmp, code, proxy), lambda port: held.append(socket.create_server(("10.200.0.1", port))))
jailed = arrived(held[0])
control = unjailed(code, held[0].getsockname()[1])
print(json.dumps({{"said": said, "arrived": jailed, "control": control, "control_arrived": arrived(held[0])}}))
"""


@pytest.mark.skipif(subprocess.run(["which", "ip"], capture_output=True).returncode != 0, reason="needs ip (iproute2)")
def test_the_proxys_port_on_a_host_beyond_loopback_is_not_reached(tmp_path: Path) -> None:
    """In a network namespace the test makes, with a second address beyond loopback: a listener there
    on the gate's own port stays unreached from the jail, and is reached unjailed."""
    script = NETNS_SCRIPT.format(root=str(ROOT), tmp=str(tmp_path), attempt=TRY)
    setup = 'ip link set lo up && ip addr add 10.200.0.1/32 dev lo && exec "$0" -c "$1"'
    done = subprocess.run(
        ["unshare", "--net", "--map-root-user", "sh", "-c", setup, sys.executable, script],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    if done.returncode != 0 and "unshare failed" in done.stderr:
        pytest.skip(f"no network namespace can be made here: {done.stderr.strip()}")
    assert done.returncode == 0, done.stderr
    outcome = json.loads(done.stdout.strip().splitlines()[-1])
    assert outcome["said"]["far"] == "PermissionError" and outcome["arrived"] == 0, outcome
    assert outcome["control_arrived"] == 1, outcome  # the control: unjailed, it is reached


# Two connections to the gate when it carries one at a time: the second is closed on, no slot free.
# Its source address must not stay registered: once the slot is free again, a process of the host
# that connects from that address would be carried to the proxy as if the gate had made it.
CROWD = """
import json, os, socket, sys
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
first = socket.create_connection(("127.0.0.1", port), timeout=10)  # takes the one slot: sends nothing yet
second = socket.create_connection(("127.0.0.1", port), timeout=10)
source = second.getsockname()
try:
    closed = second.recv(64) == b""
except ConnectionResetError:
    closed = True
second.close()
first.sendall(b"first")
answer = first.recv(64).decode()
first.close()
print(json.dumps({"source": source, "closed": closed, "answer": answer}), flush=True)
sys.stdin.read()
"""


def test_a_connection_closed_for_want_of_a_slot_leaves_no_source_an_outsider_could_use(
    tmp_path: Path, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(connects, "MAX_CONNECTIONS", 1)
    with waiting(plan_for(tmp_path, CROWD, proxy)) as (gate, said):
        # the jail's own connection was carried, the second closed on (the control: the slot is real)
        assert said["answer"] == "proxy got first" and said["closed"], said
        assert gate._slots.acquire(timeout=SECONDS)  # the first's slot is free again
        gate._slots.release()
        with socket.socket() as outsider:
            outsider.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            outsider.bind(tuple(said["source"]))
            outsider.settimeout(5)
            outsider.connect(("127.0.0.1", gate.port))
            outsider.sendall(b"outsider")
            with contextlib.suppress(ConnectionResetError):  # closed on, unread
                outsider.recv(64)
    assert proxy.carried == [b"first"]


# NETLINK_USERSOCK (2) carries messages between processes, by port id, for any user: with no network
# namespace of its own, a jail reaches every host process (another jail, a server run unjailed) that
# has such a socket. Also asked with garbage above the 32 bits of the protocol, which the kernel drops.
USERSOCK = """
import ctypes, json, socket, struct
libc = ctypes.CDLL(None, use_errno=True)
said = {}
message = struct.pack("=IHHII", 16 + 6, 0x10, 0, 1, 0) + b"secret"
for name, protocol in (("usersock", 2), ("usersock_high", (1 << 32) | 2)):
    fd = libc.syscall(41, 16, 3, ctypes.c_long(protocol))  # socket(AF_NETLINK, SOCK_RAW, protocol)
    if fd < 0:
        said[name] = "refused"
        continue
    with socket.socket(fileno=fd) as sock:
        sock.sendto(message, (target, 0))
        said[name] = "sent"
print(json.dumps(said))
"""


def test_a_landlock_jail_sends_nothing_to_a_host_process_over_netlink(tmp_path: Path, proxy: Proxy) -> None:
    with socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, 2) as outside:
        outside.bind((0, 0))
        code = f"target = {outside.getsockname()[0]}\n{USERSOCK}"
        said = run(plan_for(tmp_path, code, proxy))
        received = []
        while select.select([outside], [], [], 0)[0]:
            received.append(outside.recv(64))
        assert said == {"usersock": "refused", "usersock_high": "refused"} and received == [], (said, received)
        # the control: unjailed, both reach it
        assert unjailed(code, 0) == {"usersock": "sent", "usersock_high": "sent"}
        assert select.select([outside], [], [], 0)[0] and outside.recv(64).endswith(b"secret")


# Other ways to a connection, aimed at the proxy's port on 127.0.0.2: the 32-bit ABI (`int 0x80`:
# connect, socketcall, a Fast Open sendto), the Fast Open sends with MSG_FASTOPEN (and with garbage
# above the flags' 32 bits), TCP_FASTOPEN_CONNECT, an IPv6 socket (to ::ffff:127.0.0.1, or given an
# IPv4 address), a disconnect (AF_UNSPEC) of a proxied socket, a seccomp listener of its own (which
# would get its own connects before the gate); and calls meant to trip the gate up: a
# socketpair, a pipe, a bad or kernel address, a huge or negative length, an fd with garbage above
# its 32 bits, a flood of refused connects. Then a connect to the proxy must still work.
OTHER_WAYS = """
import ctypes, errno, json, os, socket, struct
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
said = {}
libc = ctypes.CDLL(None, use_errno=True)
libc.mmap.restype = ctypes.c_void_p
libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
def address(host):
    return struct.pack("=H", socket.AF_INET) + struct.pack(">H", port) + socket.inet_aton(host) + bytes(8)
other = address("127.0.0.2")
def raw(result):
    return "ok" if result >= 0 else errno.errorcode[ctypes.get_errno()]
def attempt(name, act, family=socket.AF_INET):
    try:
        with socket.socket(family) as sock:
            sock.setblocking(False)
            result = act(sock)
        said[name] = result if isinstance(result, str) else "ok"
    except OSError as exc:
        said[name] = errno.errorcode[exc.errno]
def int80(sock, number, *args):
    # in a child: where the kernel runs no 32-bit calls, int 0x80 is a fault, not an error
    low = libc.mmap(None, 8192, 7, 0x22 | 0x40, -1, 0)  # MAP_32BIT: what a 32-bit call can point at
    ctypes.memmove(low, other, 16)
    ctypes.memmove(low + 64, struct.pack("<III", sock.fileno(), low, 16), 12)
    values = [{"other": low, "args": low + 64, "fd": sock.fileno()}.get(a, a) for a in args]
    code = b"\\x53\\x55\\xb8" + struct.pack("<I", number)
    for op, value in zip((b"\\xbb", b"\\xb9", b"\\xba", b"\\xbe", b"\\xbf", b"\\xbd"), values + [0] * 6):
        code += op + struct.pack("<I", value & 0xFFFFFFFF)
    ctypes.memmove(low + 4096, code + b"\\xcd\\x80\\x5d\\x5b\\xc3", len(code) + 5)
    read, write = os.pipe()
    if os.fork() == 0:
        result = ctypes.CFUNCTYPE(ctypes.c_int)(low + 4096)()
        os.write(write, ("ok" if result >= 0 else errno.errorcode[-result]).encode())
        os._exit(0)
    os.close(write)
    os.wait()
    return os.read(read, 64).decode() or "no 32-bit calls"
if os.uname().machine == "x86_64":
    attempt("int80_connect", lambda s: int80(s, 362, "fd", "other", 16))
    attempt("int80_socketcall", lambda s: int80(s, 102, 3, "args"))
    attempt("int80_sendto_fastopen", lambda s: int80(s, 369, "fd", "other", 1, 0x20000000, "other", 16))
attempt("sendmsg_fastopen", lambda s: s.sendmsg([b"x"], [], socket.MSG_FASTOPEN, ("127.0.0.2", port)))
flags = ctypes.c_long(0x20000000 | (1 << 40))
attempt("sendto_fastopen_high", lambda s: raw(libc.sendto(s.fileno(), b"x", 1, flags, other, 16)))
def sendmmsg(sock):
    data, to = ctypes.create_string_buffer(b"x"), ctypes.create_string_buffer(other)
    iovec = ctypes.create_string_buffer(struct.pack("=QQ", ctypes.addressof(data), 1))
    header = struct.pack("=QI4xQQQQi4x", ctypes.addressof(to), 16, ctypes.addressof(iovec), 1, 0, 0, 0) + bytes(8)
    return raw(libc.sendmmsg(sock.fileno(), ctypes.create_string_buffer(header), 1, 0x20000000))
attempt("sendmmsg_fastopen", sendmmsg)
def fast_open_connect(sock, host):
    sock.setsockopt(socket.IPPROTO_TCP, 30, 1)  # TCP_FASTOPEN_CONNECT
    sock.settimeout(5)
    sock.connect((host, port))
    return raw(libc.sendto(sock.fileno(), b"x", 1, 0, other, 16)) if host == "127.0.0.1" else "ok"
attempt("fastopen_connect", lambda s: fast_open_connect(s, "127.0.0.2"))
attempt("fastopen_connect_then_sendto", lambda s: fast_open_connect(s, "127.0.0.1"))
attempt("mapped_ipv6", lambda s: s.connect(("::ffff:127.0.0.1", port)), socket.AF_INET6)
attempt("ipv6_socket_ipv4_address", lambda s: raw(libc.connect(s.fileno(), address("127.0.0.1"), 16)), socket.AF_INET6)
def unspec(sock):
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    return raw(libc.connect(sock.fileno(), bytes(16), 16))
attempt("disconnect", unspec)
def pair(sock):
    a, b = socket.socketpair()
    with a, b:
        return raw(libc.connect(a.fileno(), address("127.0.0.1"), 16))
attempt("socketpair", pair)
def pipe(sock):
    r, w = os.pipe()
    result = raw(libc.connect(r, address("127.0.0.1"), 16))
    os.close(r), os.close(w)
    return result
attempt("pipe", pipe)
attempt("bad_address", lambda s: raw(libc.connect(s.fileno(), ctypes.c_void_p(16), 16)))
attempt("kernel_address", lambda s: raw(libc.connect(s.fileno(), ctypes.c_void_p(0xFFFFFFFFFF600000), 16)))
attempt("huge_length", lambda s: raw(libc.connect(s.fileno(), address("127.0.0.1"), ctypes.c_long(1 << 40))))
attempt("negative_length", lambda s: raw(libc.connect(s.fileno(), address("127.0.0.1"), -1)))
high = lambda s: ctypes.c_long(s.fileno() | (1 << 32))  # noqa: E731
attempt("high_fd", lambda s: raw(libc.syscall(42, high(s), address("127.0.0.1"), 16)))
def flood(sock):
    refused = 0
    for _ in range(200):
        with socket.socket() as each:
            refused += libc.connect(each.fileno(), other, 16) != 0
    return str(refused)
attempt("flood", flood)
def own_listener(sock):
    # a filter of its own with a listener would get its own connects first, and could let them go on:
    # the kernel allows one listener in a process's filters. In a child, which the filter binds alone.
    def op(code, k, jt=0, jf=0):
        return struct.pack("=HBBI", code, jt, jf, k)
    program = op(0x20, 0) + op(0x15, 42, 0, 1) + op(0x06, 0x7FC00000) + op(0x06, 0x7FFF0000)
    code = ctypes.create_string_buffer(program)
    fprog = ctypes.create_string_buffer(struct.pack("=H6xQ", 4, ctypes.addressof(code)))
    read, write = os.pipe()
    if os.fork() == 0:
        libc.prctl(38, 1, 0, 0, 0)  # no_new_privs, which an unprivileged filter needs (the control)
        os.write(write, raw(libc.syscall(317, 1, 8, fprog)).encode())  # seccomp(SET_MODE_FILTER, NEW_LISTENER)
        os._exit(0)
    os.close(write)
    os.wait()
    return os.read(read, 64).decode()
attempt("own_listener", own_listener)
def proxy(sock):
    sock.settimeout(5)
    sock.connect(("127.0.0.1", port))
    sock.sendall(b"hello")
    return sock.recv(64).decode()
attempt("proxy", proxy)
print(json.dumps(said))
"""


def test_other_ways_to_a_connection_are_refused_and_calls_meant_to_trip_the_gate_leave_it_answering(
    tmp_path: Path, proxy: Proxy
) -> None:
    held: list[socket.socket] = []
    said = run(plan_for(tmp_path, OTHER_WAYS, proxy), elsewhere(held, backlog=512))
    with held[0]:
        assert arrived(held[0]) == 0, said
        assert said["proxy"] == "proxy got hello", said  # still answering, after all the rest
        if "int80_connect" in said and said["int80_connect"] != "no 32-bit calls":
            assert said["int80_connect"] == "EACCES" and said["int80_socketcall"] == "EPERM", said
            assert said["int80_sendto_fastopen"] == "EPERM", said
        for refused in ("sendmsg_fastopen", "sendto_fastopen_high", "sendmmsg_fastopen"):
            assert said[refused] == "EPERM", (refused, said)
        for refused in ("fastopen_connect", "mapped_ipv6", "ipv6_socket_ipv4_address", "disconnect", "socketpair"):
            assert said[refused] == "EACCES", (refused, said)
        assert said["fastopen_connect_then_sendto"] == "ok", said  # connected: the address is not looked at
        assert said["pipe"] == "ENOTSOCK" and said["bad_address"] == said["kernel_address"] == "EFAULT", said
        # the gate connects its own address: a length or fd the kernel would read otherwise changes nothing
        assert said["huge_length"] == said["negative_length"] == said["high_fd"] == "EINPROGRESS", said
        assert said["flood"] == "200" and said["own_listener"] == "EBUSY", said
        # the control: unjailed, every attempt at the other address reaches it
        control = unjailed(OTHER_WAYS, held[0].getsockname()[1])
        assert control["own_listener"] == "ok", control
        ways = 7 if control.get("int80_connect") == "EINPROGRESS" else 4
        assert arrived(held[0]) == ways + 200, control


# A connect the gate makes that never completes: a TCP MD5 key on the socket makes the gate's own
# listener drop its SYN, and the kernel retries for minutes. Another thread's connect, made while the
# first waits, must not wait behind it; and once the jail has ended, the gate is left with nothing.
STALL = """
import json, os, socket, struct, threading
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
said = {}
def stuck():
    sock = socket.socket()
    key = struct.pack("=H", socket.AF_INET) + bytes(2) + socket.inet_aton("127.0.0.1")
    key += bytes(128 - len(key)) + struct.pack("=BBHi", 0, 0, 4, 0) + b"key!" + bytes(76)
    sock.setsockopt(socket.IPPROTO_TCP, 14, key)  # TCP_MD5SIG, for 127.0.0.1
    said["stuck"] = "waiting"
    sock.connect(("127.0.0.1", port))
    said["stuck"] = "connected"
first = threading.Thread(target=stuck, daemon=True)
first.start()
while "stuck" not in said or open(f"/proc/self/task/{first.native_id}/syscall").read().split()[0] != "42":
    pass  # until it is in its connect (42): its notice is before the next one
def proxy():
    with socket.create_connection(("127.0.0.1", port)) as sock:
        sock.sendall(b"hello")
        said["proxy"] = sock.recv(64).decode()
second = threading.Thread(target=proxy, daemon=True)
second.start()
second.join(10)
print(json.dumps(said), flush=True)
os._exit(0)
"""


def test_a_connect_that_never_completes_holds_up_neither_the_jails_other_connects_nor_the_gate(
    tmp_path: Path, proxy: Proxy
) -> None:
    said = run(plan_for(tmp_path, STALL, proxy))
    assert said == {"stuck": "waiting", "proxy": "proxy got hello"}, said
    assert not [t for t in threading.enumerate() if t.name.startswith("gate-hostile")]  # closed: none left


TWICE = """
import json, os, socket
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
said = []
for _ in range(2):
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as sock:
            sock.sendall(b"hello")
            said.append(sock.recv(64).decode() or "closed")
    except ConnectionResetError:  # closed on, with what it sent unread
        said.append("closed")
    except OSError as exc:
        said.append(type(exc).__name__)
print(json.dumps({"said": said}))
"""


def test_a_connection_the_gate_finds_no_thread_for_is_closed_on_and_the_next_is_carried(
    tmp_path: Path, proxy: Proxy, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The user's process limit reached (by this jail or another), the gate's listener goes on once
    threads can be had again."""
    failed: list[threading.Thread] = []
    start = threading.Thread.start

    def start_unless_the_first_carry(thread: threading.Thread) -> None:
        if getattr(thread, "_target", None) is relay.serve_connection and not failed:
            failed.append(thread)
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", start_unless_the_first_carry)
    said = run(plan_for(tmp_path, TWICE, proxy))
    assert failed and said == {"said": ["closed", "proxy got hello"]}, said
    assert proxy.carried == [b"hello"]


# A connect that is under way when the jail lets its socket go: a TCP MD5 key makes the gate's
# listener drop the SYN, the socket does not wait (EINPROGRESS), and the jail closes it. Its source
# address must not stay registered for whoever binds it next.
ABANDONED = """
import json, os, socket, struct, sys
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
sock = socket.socket()
key = struct.pack("=H", socket.AF_INET) + bytes(2) + socket.inet_aton("127.0.0.1")
key += bytes(128 - len(key)) + struct.pack("=BBHi", 0, 0, 4, 0) + b"key!" + bytes(76)
sock.setsockopt(socket.IPPROTO_TCP, 14, key)  # TCP_MD5SIG, for 127.0.0.1
sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # its source may be bound again by another
sock.setblocking(False)
code = sock.connect_ex(("127.0.0.1", port))
source = sock.getsockname()
sock.close()
print(json.dumps({"code": code, "source": source}), flush=True)
sys.stdin.read()
"""


def test_a_connect_left_under_way_leaves_no_source_an_outsider_could_use(tmp_path: Path, proxy: Proxy) -> None:
    with waiting(plan_for(tmp_path, ABANDONED, proxy)) as (gate, said):
        assert said["code"] == errno.EINPROGRESS, said
        with socket.socket() as outsider, contextlib.suppress(OSError):  # its source may still be taken
            outsider.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            outsider.bind(tuple(said["source"]))
            outsider.settimeout(5)
            outsider.connect(("127.0.0.1", gate.port))
            outsider.sendall(b"outsider")
            outsider.recv(64)
    assert proxy.carried == []


# Below Landlock ABI 4 (Linux 6.7) there are no TCP rules: a server may bind its socket before it
# connects. Bound beyond loopback, a connect "to 127.0.0.1" routed by an IP source-route option
# (which kernels before the 2026 restriction let any user set) sends its SYN to the first hop, off
# the host. The gate connects only sockets whose source is loopback, where no route leaves the host.
# A connection to the proxy, from `source` if given: what the proxy answered, or the error.
HELLO = """
import json, os, socket
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
said = {}
def hello(name, source=None):
    try:
        with socket.socket() as sock:
            if source is not None:
                sock.bind((source, 0))
            sock.settimeout(5)
            sock.connect(("127.0.0.1", port))
            sock.sendall(b"hello")
            said[name] = sock.recv(64).decode()
    except OSError as exc:
        said[name] = type(exc).__name__
"""
BOUND = (
    HELLO
    + """
for name, host in sources.items():
    hello(name, host)
print(json.dumps(said))
"""
)


def outward_address() -> str | None:
    """This host's address toward the world (no packet is sent), if it has a route there."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        try:
            probe.connect(("192.0.2.1", 9))
        except OSError:
            return None
        address: str = probe.getsockname()[0]
        return None if address.startswith("127.") else address


def test_below_landlock_tcp_rules_a_socket_bound_beyond_loopback_is_not_connected(tmp_path: Path, proxy: Proxy) -> None:
    sources = {"loopback": "127.0.0.1", "any": "0.0.0.0"}
    outward = outward_address()
    sources |= {"outward": outward} if outward else {}
    said = run(plan_for(tmp_path, f"sources = {sources!r}\n{BOUND}", proxy, abi=min(3, landlock_abi())))
    assert said.pop("loopback") == "proxy got hello", said  # the control: bound on loopback, carried
    assert set(said.values()) == {"PermissionError"}, said
    assert proxy.carried == [b"hello"]


# Processes of the jail at once, each with a socket its parent made and passed on (inherited, and
# over a socketpair), connecting to the proxy and to the proxy's port on 127.0.0.2 together.
CROWDS = """
import json, os, socket
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
def through(sock, host):
    try:
        with sock:
            sock.settimeout(10)
            sock.connect((host, port))
            sock.sendall(b"hello")
            return sock.recv(64).decode() if host == "127.0.0.1" else "connected"
    except OSError as exc:
        return type(exc).__name__
children = []
for _ in range(6):
    inherited, passer, taker = socket.socket(), *socket.socketpair()
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        passed = socket.socket(fileno=socket.recv_fds(taker, 1, 1)[1][0])
        said = [through(inherited, "127.0.0.1"), through(passed, "127.0.0.1")]
        said += [through(socket.socket(), "127.0.0.2") for _ in range(2)]
        os.write(write, json.dumps(said).encode())
        os._exit(0)
    socket.send_fds(passer, [b"s"], [socket.socket().detach()])
    children.append(read)
    os.close(write)
said = []
for read in children:
    said += json.loads(os.read(read, 4096))
    os.wait()
print(json.dumps({name: said.count(name) for name in set(said)}))
"""


def test_processes_of_the_jail_at_once_reach_the_proxy_with_passed_sockets_and_nothing_else(
    tmp_path: Path, proxy: Proxy
) -> None:
    held: list[socket.socket] = []
    said = run(plan_for(tmp_path, CROWDS, proxy), elsewhere(held, backlog=64))
    with held[0]:
        assert said == {"proxy got hello": 12, "PermissionError": 12}, said
        assert arrived(held[0]) == 0 and proxy.carried == [b"hello"] * 12
        # the control: unjailed, the connects to 127.0.0.2 arrive (and nothing listens on 127.0.0.1's port)
        control = unjailed(CROWDS, held[0].getsockname()[1])
        assert control["connected"] == 12 and arrived(held[0]) == 12, control


# The jail learns how a connect under way went by SO_ERROR, which reading clears: the gate, holding
# the socket till then, looks at its state instead and leaves the error to the jail (which of the two
# looks first is left to the scheduler, so this shows what the jail sees, not that the gate never
# reads it). TCP_SYNCNT 1: the SYN is given up in 3 s.
GIVEN_UP = """
import errno, json, os, select, socket, struct
port = int(os.environ["http_proxy"].rsplit(":", 1)[1])
with socket.socket() as sock:
    key = struct.pack("=H", socket.AF_INET) + bytes(2) + socket.inet_aton("127.0.0.1")
    key += bytes(128 - len(key)) + struct.pack("=BBHi", 0, 0, 4, 0) + b"key!" + bytes(76)
    sock.setsockopt(socket.IPPROTO_TCP, 14, key)  # TCP_MD5SIG: the listener drops the SYN
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_SYNCNT, 1)
    sock.setblocking(False)
    code = sock.connect_ex(("127.0.0.1", port))
    select.select([], [sock], [], 30)
    error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
    print(json.dumps({"code": errno.errorcode[code], "error": errno.errorcode.get(error, "0")}))
"""


def test_a_connect_under_way_that_fails_tells_the_jail_why(tmp_path: Path, proxy: Proxy) -> None:
    said = run(plan_for(tmp_path, GIVEN_UP, proxy))
    assert said == {"code": "EINPROGRESS", "error": "ETIMEDOUT"}, said
    with socket.create_server(("127.0.0.1", 0)) as listener:  # the control: unjailed, the same
        assert unjailed(GIVEN_UP, listener.getsockname()[1]) == said


# A thread with a descriptor table of its own (unshare(CLONE_FILES)), whose socket has the number
# of a pipe in its process's table; and a thread still running after its process's first thread
# has ended. The gate must connect the socket of the thread that called.
OWN_TABLES = (
    HELLO
    + """
import ctypes, threading
libc = ctypes.CDLL(None, use_errno=True)
read, write = os.pipe()
def own_table():
    if libc.unshare(0x400) != 0:  # CLONE_FILES
        said["own_table"] = "no unshare"
        return
    os.close(read)  # in its own table only: its socket takes the number the pipe has in the process's
    hello("own_table")
worker = threading.Thread(target=own_table)
worker.start()
worker.join()
out = os.dup(1)
def after_the_first():
    worker_done.wait()
    hello("after_the_first")
    os.write(out, (json.dumps(said) + "\\n").encode())
    os._exit(0)
worker_done = threading.Event()
threading.Thread(target=after_the_first).start()
worker_done.set()
libc.syscall(60, 0)  # exit(0): the first thread ends, the process goes on
"""
)


def test_a_thread_with_its_own_descriptor_table_or_outliving_the_first_connects_its_own_socket(
    tmp_path: Path, proxy: Proxy
) -> None:
    said = run(plan_for(tmp_path, OWN_TABLES, proxy))
    assert said == {"own_table": "proxy got hello", "after_the_first": "proxy got hello"}, said
    assert unjailed(OWN_TABLES, 0) == {
        "own_table": "ConnectionRefusedError",
        "after_the_first": "ConnectionRefusedError",
    }


# IP_BIND_ADDRESS_NO_PORT (24) puts off choosing a bound socket's port to its connect: the gate's
# bind of the socket then leaves no source to note, and the connection it makes would be closed on.
NO_PORT = (
    HELLO
    + """
_socket = socket.socket
class socket_no_port(_socket):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.setsockopt(socket.IPPROTO_IP, 24, 1)
socket.socket = socket_no_port
hello("no_port")
print(json.dumps(said))
"""
)


def test_a_socket_that_puts_off_choosing_its_port_is_carried(tmp_path: Path, proxy: Proxy) -> None:
    assert run(plan_for(tmp_path, NO_PORT, proxy)) == {"no_port": "proxy got hello"}


def test_the_proxys_socket_is_reached_however_long_its_path(tmp_path: Path) -> None:
    """A runtime directory deep enough that the socket's path is longer than a Unix socket's address
    holds: the proxy binds it through its directory, and the gate connects to it the same way."""
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    proxy = Proxy(deep / "egress-1234-server.sock")
    try:
        assert len(proxy.path) >= SUN_PATH
        said = run(plan_for(tmp_path, HELLO + 'hello("far")\nprint(json.dumps(said))', proxy))
    finally:
        proxy.close()
    assert said == {"far": "proxy got hello"} and proxy.carried == [b"hello"]


@pytest.mark.skipif(shutil.which("strace") is None, reason="learn and scan trace with strace (apt-get install strace)")
def test_a_traced_jail_reaches_the_proxy_through_the_gate_and_the_trace_shows_the_connect(
    tmp_path: Path, proxy: Proxy
) -> None:
    """`learn` and `scan` run a jail under strace: the gate still makes its connections."""
    output = tmp_path / "trace"
    with spawn_args(plan_for(tmp_path, HELLO + 'hello("traced")\nprint(json.dumps(said))', proxy)) as spawn:
        assert spawn.gate is not None
        try:
            argv = traced(spawn.argv, str(output), shutil.which("strace") or "strace")
            done = subprocess.run(argv, capture_output=True, text=True, pass_fds=spawn.pass_fds, timeout=SECONDS)
        finally:
            spawn.gate.close()
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == {"traced": "proxy got hello"}
    assert proxy.carried == [b"hello"]
    trace = parse_trace(output.read_text())
    assert trace.command == PYTHON  # the server, not the launcher before it
    assert [e.target for e in trace.events if e.kind is Kind.CONNECT] == [f"127.0.0.1:{spawn.gate.port}"]
