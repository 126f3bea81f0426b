"""A Unix socket inside a grant, and the host's abstract sockets under `network: open`.

A grant that held the session bus (`dbus-launch` puts it in /tmp) or an ssh-agent's socket let a
server read every secret of the keyring, the HTTP token among them, and list the agent's keys. Each
jail now shows every socket of the session and the machine that a grant holds as /dev/null
(`sandbox/sockets.py`, `downstream/private.py: hidden_paths`), and a `network: open` jail starts in a Landlock domain
scoped against the host's abstract sockets (`sandbox/scope.py`). The attacks run through a real
`cellblock serve` against a real private bus with gnome-keyring and a real ssh-agent holding a key;
the controls are the same reads from an unjailed server and from the same jail without the mask.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import uuid
from collections.abc import Iterator, Mapping
from dataclasses import replace
from pathlib import Path
from typing import Any

import keyring
import pytest

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.credentials import SERVICE
from cellblock.gateway.downstream import jailreport, jailspec
from cellblock.gateway.downstream.jailspec import jail_spec
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.sandbox.bwrap import bwrap_plan, check_bwrap
from cellblock.sandbox.landlock import landlock_abi
from cellblock.sandbox.sockets import ABSTRACT_SCOPE_ABI
from cellblock.sandbox.spawn import run_plan, spawn_args
from tests.integration.conftest import cli, gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.jail]

SERVERS = Path(__file__).resolve().parents[1] / "servers"
HOSTILE = SERVERS / "hostile.py"
SANDBOX = Path(__file__).resolve().parents[2] / "cellblock" / "sandbox"
CODE = [str(SERVERS), str(SANDBOX)]
PLANTED_KEY = "cellblock-planted-key"
# what a stand-in listener gives whoever connects
GIFT = b"planted-by-the-test"
# a jail's one run of the reader below; it starts in well under a second
RUN_SECONDS = 60
# Run in a jail by the tests' Python: the hostile server's own reads, printed as JSON.
READER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import hostile
reads = [hostile.secret_service(sys.argv[2], sys.argv[3]), hostile.ssh_agent(sys.argv[4])]
print(json.dumps([r.structured_content for r in reads]))
"""


def _outcome(result: Any) -> dict[str, Any]:
    assert not result.is_error and result.structured_content is not None, result
    outcome: dict[str, Any] = result.structured_content
    return outcome


def bus_socket(address: str) -> Path:
    """The socket file of a `unix:path=` D-Bus address."""
    fields = dict(f.partition("=")[::2] for f in address.removeprefix("unix:").split(","))
    return Path(fields["path"])


@pytest.fixture
def planted(keyring_env: Mapping[str, str]) -> Iterator[str]:
    """A secret Cellblock holds in the (private) keyring, as `cellblock auth set` keeps one."""
    entry, value = f"planted-{uuid.uuid4().hex[:8]}", f"secret-{uuid.uuid4().hex}"
    keyring.set_password(SERVICE, entry, value)
    try:
        yield value
    finally:
        keyring.delete_password(SERVICE, entry)


@contextlib.contextmanager
def running_agent(sock: Path) -> Iterator[Path]:
    """A real ssh-agent holding one key, listening at `sock` (its key made and kept elsewhere)."""
    if shutil.which("ssh-agent") is None or shutil.which("ssh-add") is None:
        pytest.skip("no ssh-agent here: install openssh-client")
    with tempfile.TemporaryDirectory(prefix="cb-key-") as keys:
        key = Path(keys) / "key"
        keygen = ["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", PLANTED_KEY, "-f", str(key)]
        subprocess.run(keygen, check=True, timeout=30)
        process = subprocess.Popen(
            ["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
        )
        try:
            assert process.stdout is not None
            process.stdout.readline()  # it tells its address once it listens (or ends, and says nothing)
            assert sock.is_socket(), "ssh-agent did not start"
            env = {**os.environ, "SSH_AUTH_SOCK": str(sock)}
            subprocess.run(["ssh-add", "-q", str(key)], env=env, check=True, timeout=30, capture_output=True)
            yield sock
        finally:
            process.terminate()
            process.wait(timeout=10)


@pytest.fixture
def agent() -> Iterator[Path]:
    """A real ssh-agent holding one key, listening in a directory of its own in /tmp, as ssh-agent does."""
    with (
        tempfile.TemporaryDirectory(prefix="ssh-", dir="/tmp") as directory,
        running_agent(Path(directory) / "agent.1") as sock,
    ):
        yield sock


class Listener:
    """A Unix socket that gives `GIFT` to whoever connects: a stand-in for a service on the host."""

    def __init__(self, address: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(address)
        self.sock.listen(8)
        self.sock.settimeout(0.2)
        self.accepted = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                continue
            self.accepted += 1
            with conn:
                conn.sendall(GIFT)

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


@pytest.fixture
def short() -> Iterator[Path]:
    """A directory standing for /tmp, with a path short enough for a socket."""
    with tempfile.TemporaryDirectory(prefix="cb-grant-", dir="/tmp") as directory:
        yield Path(directory)


@pytest.mark.parametrize("named", [True, False], ids=["named-by-the-environment", "as-a-desktop-client-starts-it"])
async def test_a_server_whose_grant_holds_the_session_bus_and_an_agent_reads_no_secret_and_lists_no_key(
    tmp_path: Path, keyring_env: Mapping[str, str], planted: str, agent: Path, named: bool
) -> None:
    """The grant holds the directory of a bus (where the tests' private Secret Service listens, as
    dbus-launch's does in /tmp) and the agent's. Named by the gateway's environment or not (a
    desktop client starts it with little more than HOME and PATH), both are masked."""
    address = keyring_env["DBUS_SESSION_BUS_ADDRESS"]
    bus = bus_socket(address)
    control = bus.parent / "run" / "keyring" / "control"  # gnome-keyring's own, beside the bus
    assert control.is_socket()
    env = {"HOME": str(Path.home())} | ({**keyring_env, "SSH_AUTH_SOCK": str(agent)} if named else {})
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    servers = {
        "jailed": hostile | {"jail": {"read_only": [*CODE, str(bus.parent), str(agent.parent)]}},
        "loose": hostile | {"jail": False},
    }
    log = tmp_path / "gateway.log"
    reads = {"address": address, "looking_for": planted}
    async with gateway(write_config(tmp_path, servers), tmp_path / "state", env=env, stderr=log) as client:
        # the honest control: without a jail the same reads get the secret and the key
        stolen = _outcome(await client.call_tool("loose__secret_service", reads))
        assert stolen["got_through"] and stolen["amount"] >= 1, stolen
        listed = _outcome(await client.call_tool("loose__ssh_agent", {"target": str(agent)}))
        assert listed["got_through"] and listed["amount"] == 1, listed
        given = _outcome(await client.call_tool("loose__unix_socket", {"target": str(control)}))
        assert given["got_through"], given
        # the jailed server sees the sockets in its grant, as /dev/null: nothing answers
        stolen = _outcome(await client.call_tool("jailed__secret_service", reads))
        assert not stolen["got_through"] and "ECONNREFUSED" in stolen["detail"] and stolen["amount"] is None, stolen
        listed = _outcome(await client.call_tool("jailed__ssh_agent", {"target": str(agent)}))
        assert not listed["got_through"] and "ECONNREFUSED" in listed["detail"], listed
        given = _outcome(await client.call_tool("jailed__unix_socket", {"target": str(control)}))
        assert not given["got_through"] and "ECONNREFUSED" in given["detail"], given
    told = log.read_text()
    assert "server 'jailed': its jail keeps from it what its grants hold" in told
    assert f"{agent} (an ssh-agent's socket" in told and f"{bus} (a D-Bus bus" in told
    assert ("(SSH_AUTH_SOCK)" in told) is named
    assert planted not in told


async def test_a_socket_made_or_made_again_inside_a_grant_after_the_jail_started_is_reached(
    tmp_path: Path, short: Path
) -> None:
    """GAP: the mask is made when the jail starts. A socket made inside a grant after that, or made
    again at the same path (an ssh-agent or a bus restarted: removing the old file takes the mask
    with it), is reachable until the server's next start. No mount made at start can cover a file
    that does not exist yet, and Landlock (up to ABI 7) has no rule on connecting to a path socket."""
    before = Listener(str(short / "before.sock"))
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    servers = {"jailed": hostile | {"jail": {"read_only": [*CODE, str(short)]}}}
    try:
        async with gateway(write_config(tmp_path, servers), tmp_path / "state") as client:
            masked = _outcome(await client.call_tool("jailed__unix_socket", {"target": str(short / "before.sock")}))
            assert not masked["got_through"], masked
            late = Listener(str(short / "late.sock"))
            before.close()
            (short / "before.sock").unlink()
            again = Listener(str(short / "before.sock"))
            try:
                for name in ("late.sock", "before.sock"):
                    reached = _outcome(await client.call_tool("jailed__unix_socket", {"target": str(short / name)}))
                    assert reached["got_through"] and reached["amount"] == len(GIFT), (name, reached)
            finally:
                late.close()
                again.close()
    finally:
        before.close()


async def test_an_open_network_server_reaches_none_of_the_hosts_abstract_sockets(tmp_path: Path) -> None:
    """An abstract socket (X11's @/tmp/.X11-unix/X0, a bus at unix:abstract=) is no file a mount can
    hide; `network: open` shares the namespace it lives in. The jail's Landlock scope refuses it."""
    if landlock_abi() < ABSTRACT_SCOPE_ABI:
        pytest.skip(f"this kernel has Landlock ABI {landlock_abi()}: see the GAP test below")
    name = f"@cellblock-test-{uuid.uuid4().hex[:12]}"
    listener = Listener("\0" + name[1:])
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    servers = {
        "opened": hostile | {"jail": {"read_only": CODE, "network": "open"}},
        "loose": hostile | {"jail": False},
    }
    try:
        async with gateway(write_config(tmp_path, servers), tmp_path / "state") as client:
            given = _outcome(await client.call_tool("loose__unix_socket", {"target": name}))
            assert given["got_through"] and given["amount"] == len(GIFT), given  # the honest control
            refused = _outcome(await client.call_tool("opened__unix_socket", {"target": name}))
            assert not refused["got_through"] and "EPERM" in refused["detail"], refused
    finally:
        listener.close()
    assert listener.accepted == 1  # the control's connection, and no other


def _reader(grants: list[str]) -> LocalServer:
    return LocalServer.model_validate(
        {"command": sys.executable, "args": ["-c", READER], "jail": {"read_only": grants}}
    )


def _run_hiding(spec: Any, launchers: Any, hidden: Mapping[str, str], args: tuple[str, ...] = ()) -> Any:
    """What the reader of `spec`'s jail says it got, run with `hidden` (and `args` after its argv)
    hidden in place of what `jail_spec` chose: the controls run the same jail hiding less."""
    jailed = replace(spec, argv=(*spec.argv, *args), hidden=hidden)
    done = run_plan(bwrap_plan(jailed, launchers, check_bwrap()), RUN_SECONDS)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def test_the_same_jail_without_the_mask_reads_the_keyring_and_lists_the_agents_keys(
    keyring_env: Mapping[str, str], planted: str, agent: Path
) -> None:
    """The honest control of the mask: the jail `launch_plan` builds for a grant that holds the bus
    and the agent, run as it is and with nothing hidden. Only the mask stands between them."""
    address = keyring_env["DBUS_SESSION_BUS_ADDRESS"]
    server = _reader([*CODE, str(bus_socket(address).parent), str(agent.parent)])
    assert server.jail is not False
    spec, launchers = jail_spec("reader", server, server.jail)
    assert {str(bus_socket(address)), str(agent)} <= set(spec.hidden)
    args = (str(SERVERS), address, planted, str(agent))

    secrets, keys = _run_hiding(spec, launchers, {}, args)
    assert secrets["got_through"] and keys["got_through"] and keys["amount"] == 1, (secrets, keys)
    secrets, keys = _run_hiding(spec, launchers, spec.hidden, args)
    assert not secrets["got_through"] and "ECONNREFUSED" in secrets["detail"], secrets
    assert not keys["got_through"] and "ECONNREFUSED" in keys["detail"], keys


def test_without_landlock_6_an_open_network_jail_reaches_the_hosts_abstract_sockets(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    """GAP: on a kernel whose Landlock is older than ABI 6 (Linux before 6.12), or has none, a
    `network: open` jail reaches every abstract socket the host listens on (X11's, a bus at
    unix:abstract=); the server still starts, and `show`, `doctor` and the start log say so. Here:
    the same jail planned as on such a kernel reaches it, and as this kernel allows it, does not."""
    name = f"cellblock-test-{uuid.uuid4().hex[:12]}"
    listener = Listener("\0" + name)
    code = f"import socket\ns = socket.socket(socket.AF_UNIX)\ns.connect({chr(0) + name!r})\nprint(s.recv(64).decode())"
    server = LocalServer.model_validate({"command": sys.executable, "args": ["-c", code], "jail": {"network": "open"}})
    try:
        if landlock_abi() >= ABSTRACT_SCOPE_ABI:
            closed = run_plan(launch_plan("s", server), RUN_SECONDS)
            assert closed.returncode != 0 and "PermissionError" in closed.stderr, closed
        monkeypatch.setattr(jailspec, "landlock_abi", lambda: ABSTRACT_SCOPE_ABI - 1)
        monkeypatch.setattr(jailreport, "landlock_abi", lambda: ABSTRACT_SCOPE_ABI - 1)
        plan = launch_plan("s", server)
        reached = run_plan(plan, RUN_SECONDS)
        assert reached.returncode == 0 and reached.stdout.strip() == GIFT.decode(), reached
        with caplog.at_level("WARNING"):
            jailreport.tell_jail("s", plan)
        assert "server 's' has network: open" in caplog.text and "Landlock ABI 6" in caplog.text
    finally:
        listener.close()


def test_with_exec_allow_an_open_network_jail_is_scoped_and_still_runs_only_what_it_may() -> None:
    """The scope launcher runs before the pin launcher: both hold."""
    if landlock_abi() < ABSTRACT_SCOPE_ABI:
        pytest.skip(f"this kernel has Landlock ABI {landlock_abi()}")
    name = f"cellblock-test-{uuid.uuid4().hex[:12]}"
    listener = Listener("\0" + name)
    code = (
        "import socket, subprocess\n"
        "try:\n    subprocess.run(['/bin/sh', '-c', 'true'])\nexcept OSError as e:\n    print('sh:', e.errno)\n"
        f"s = socket.socket(socket.AF_UNIX)\ns.connect({chr(0) + name!r})"
    )
    jail = {"network": "open", "exec": {"allow": [sys.executable]}}
    server = LocalServer.model_validate({"command": sys.executable, "args": ["-c", code], "jail": jail})
    try:
        done = run_plan(launch_plan("s", server), RUN_SECONDS)
    finally:
        listener.close()
    assert done.stdout.startswith("sh: ") and "PermissionError" in done.stderr, done
    assert listener.accepted == 0


def test_show_names_each_masked_socket_and_a_grant_of_one_is_refused(agent: Path, tmp_path: Path) -> None:
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    servers = {
        "jailed": hostile | {"jail": {"read_only": [*CODE, str(agent.parent)]}},
        "direct": hostile | {"jail": {"read_only": [*CODE, str(agent)]}},
    }
    config = write_config(tmp_path, servers)
    env = {"SSH_AUTH_SOCK": str(agent), "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}
    done = cli(env, "show", "--config", str(config), "--json")
    assert done.returncode == 0, done.stderr
    shown = {s["name"]: s for s in json.loads(done.stdout)}
    masked = [m for m in shown["jailed"]["mounts"] if m["path"] == str(agent)]
    assert masked == [
        {
            "path": str(agent),
            "mode": "hidden",
            "why": "an ssh-agent's socket, which signs with your SSH keys (SSH_AUTH_SOCK): /dev/null in its place",
        }
    ]
    assert shown["direct"]["jail"] == "cannot be built"
    assert shown["direct"]["error"] == (
        f"server 'direct': jail.read_only path {agent} is {agent}: an ssh-agent's socket, which signs with your "
        "SSH keys (SSH_AUTH_SOCK), which Cellblock keeps from every server; remove it from jail.read_only"
    )


# Run in a jail: an ssh-agent's keys asked for at argv[2], printed as JSON.
AGENT_READER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import hostile
print(json.dumps(hostile.ssh_agent(sys.argv[2]).structured_content))
"""


async def test_a_server_that_renames_the_directory_of_a_hidden_agent_finds_it_hidden_again_at_its_next_start(
    tmp_path: Path, short: Path
) -> None:
    """The mask is a mount at a path; the agent is a file. A server with a writable grant cannot move
    the masked socket (a mount point), but it can rename the directory it is in, and the kernel
    still lists the agent at the path it was bound to, where nothing is now. At the server's next
    start the agent is found in the grant by its inode and hidden where it went."""
    (short / "ssh-Ab12").mkdir(mode=0o700)
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    servers = {
        "jailed": hostile | {"jail": {"read_only": CODE, "read_write": [str(short)]}},
        "loose": hostile | {"jail": False},
    }
    config, state, log = write_config(tmp_path, servers), tmp_path / "state", tmp_path / "gateway.log"
    moved = short / "moved" / "agent.1"
    with running_agent(short / "ssh-Ab12" / "agent.1") as agent:
        async with gateway(config, state) as client:
            hidden = _outcome(await client.call_tool("jailed__ssh_agent", {"target": str(agent)}))
            assert not hidden["got_through"] and "ECONNREFUSED" in hidden["detail"], hidden
            mv = {"argv": ["mv", str(agent.parent), str(moved.parent)]}
            renamed = _outcome(await client.call_tool("jailed__exec_binary", mv))
            assert renamed["got_through"] and moved.is_socket(), renamed
        # the server's next start: a restart, or the next session
        async with gateway(config, state, stderr=log) as client:
            # the honest control: the agent is there, and answers whoever reaches it
            listed = _outcome(await client.call_tool("loose__ssh_agent", {"target": str(moved)}))
            assert listed["got_through"] and listed["amount"] == 1, listed
            refused = _outcome(await client.call_tool("jailed__ssh_agent", {"target": str(moved)}))
            assert not refused["got_through"] and "ECONNREFUSED" in refused["detail"], refused
    told = log.read_text()
    assert f"{moved} (a Unix socket a program on this machine listens on, found by its inode" in told


def test_the_same_jail_hiding_only_the_sockets_where_they_were_bound_lists_a_moved_agents_keys(short: Path) -> None:
    """The honest control of the inode search: the jail `jail_spec` plans after the rename, run as
    it is and with the moved agent left as the listed path alone would leave it."""
    (short / "ssh-Ab12").mkdir(mode=0o700)
    moved = short / "moved" / "agent.1"
    with running_agent(short / "ssh-Ab12" / "agent.1") as agent:
        agent.parent.rename(moved.parent)
        reader = {"command": sys.executable, "args": ["-c", AGENT_READER, str(SERVERS), str(moved)]}
        server = LocalServer.model_validate(reader | {"jail": {"read_only": CODE, "read_write": [str(short)]}})
        assert server.jail is not False
        spec, launchers = jail_spec("reader", server, server.jail)
        assert "found by its inode" in spec.hidden[str(moved)]

        listed = _run_hiding(spec, launchers, {path: why for path, why in spec.hidden.items() if path != str(moved)})
        assert listed["got_through"] and listed["amount"] == 1, listed
        refused = _run_hiding(spec, launchers, spec.hidden)
        assert not refused["got_through"] and "ECONNREFUSED" in refused["detail"], refused


async def test_a_socket_made_on_the_hosts_network_and_handed_to_another_jail_reaches_no_abstract_socket(
    tmp_path: Path, short: Path
) -> None:
    """An abstract name is looked up on the network namespace the socket was made in, and Landlock's
    scope judges the process that connects. A `network: open` server lends a socket it made (on the
    host's network) through a socket in a grant it shares with a `network: none` one, which connects
    it to the host's abstract listener: every jail is in the scope, so that fails as well."""
    if landlock_abi() < ABSTRACT_SCOPE_ABI:
        pytest.skip(f"this kernel has Landlock ABI {landlock_abi()}: see the GAP test above")
    name = f"@cellblock-test-{uuid.uuid4().hex[:12]}"
    listener = Listener("\0" + name[1:])
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    shared = {"read_only": CODE, "read_write": [str(short)]}
    servers = {
        "opened": hostile | {"jail": shared | {"network": "open"}},
        "closed": hostile | {"jail": shared},
        "loose": hostile | {"jail": False},
    }
    borrowed: dict[str, dict[str, Any]] = {}
    try:
        async with gateway(write_config(tmp_path, servers), tmp_path / "state") as client:
            for borrower in ("loose", "closed"):
                lent = str(short / f"{borrower}.sock")
                lending = _outcome(await client.call_tool("opened__lend_socket", {"path": lent}))
                assert lending["got_through"], lending
                asked = {"path": lent, "target": name}
                borrowed[borrower] = _outcome(await client.call_tool(f"{borrower}__borrowed_socket", asked))
    finally:
        listener.close()
    # the honest control: the lent socket reaches the listener from a process outside any domain
    assert borrowed["loose"]["got_through"] and borrowed["loose"]["amount"] == len(GIFT), borrowed
    closed = borrowed["closed"]
    assert not closed["got_through"] and closed["detail"] == "connect: PermissionError EPERM", closed
    assert listener.accepted == 1


# Run in a jail: lend a socket made on this jail's network at argv[2], say so, then wait until taken.
LENDER = """
import sys
sys.path.insert(0, sys.argv[1])
import hostile
lending = hostile.lend(sys.argv[2])
print("listening", flush=True)
lending.join()
"""
# Run in a jail: borrow the socket lent at argv[2] and connect it to the abstract argv[3], as JSON.
BORROWER = """
import json, sys
sys.path.insert(0, sys.argv[1])
import hostile
print(json.dumps(hostile.borrowed_socket(sys.argv[2], sys.argv[3]).structured_content))
"""


def test_a_jail_planned_without_the_scope_reaches_the_hosts_abstract_socket_through_a_lent_socket(
    monkeypatch: pytest.MonkeyPatch, short: Path
) -> None:
    """The honest control of the scope for a jail of its own network: the same borrower planned as
    on a kernel without Landlock ABI 6 (no scope launcher) reaches the host's listener; as this
    kernel allows it, it does not."""
    if landlock_abi() < ABSTRACT_SCOPE_ABI:
        pytest.skip(f"this kernel has Landlock ABI {landlock_abi()}")
    name = f"@cellblock-test-{uuid.uuid4().hex[:12]}"
    listener = Listener("\0" + name[1:])
    shared = {"read_only": CODE, "read_write": [str(short)]}

    def plan(code: str, *args: str, **jail: str) -> Any:
        argv = ["-c", code, str(SERVERS), *args]
        return launch_plan(
            "s", LocalServer.model_validate({"command": sys.executable, "args": argv, "jail": shared | jail})
        )

    def borrow(lender: Any, borrower: Any) -> dict[str, Any]:
        with spawn_args(lender) as spawn:
            lending = subprocess.Popen(spawn.argv, stdout=subprocess.PIPE, text=True, pass_fds=spawn.pass_fds)
        with lending:
            assert lending.stdout is not None and lending.stdout.readline() == "listening\n"
            done = run_plan(borrower, RUN_SECONDS)
            lending.wait(timeout=RUN_SECONDS)
        assert done.returncode == 0, done.stderr
        read: dict[str, Any] = json.loads(done.stdout)
        return read

    paths = [str(short / "a.sock"), str(short / "b.sock")]
    lenders = [plan(LENDER, path, network="open") for path in paths]
    try:
        scoped = borrow(lenders[0], plan(BORROWER, paths[0], name))
        monkeypatch.setattr(jailspec, "landlock_abi", lambda: ABSTRACT_SCOPE_ABI - 1)
        unscoped = borrow(lenders[1], plan(BORROWER, paths[1], name))
    finally:
        listener.close()
    assert unscoped["got_through"] and unscoped["amount"] == len(GIFT), unscoped
    assert not scoped["got_through"] and scoped["detail"] == "connect: PermissionError EPERM", scoped
    assert listener.accepted == 1


@contextlib.contextmanager
def bind_mounted(source: Path, target: Path) -> Iterator[Path]:
    """`source` mounted again at `target` on the host (as /etc/fstab or a container tool makes one)."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("a bind mount on the host needs root and mount")
    target.mkdir()
    done = subprocess.run(["mount", "--bind", str(source), str(target)], capture_output=True, text=True, timeout=30)
    if done.returncode != 0:
        pytest.skip(f"no bind mount here: {done.stderr.strip()[-200:]}")
    try:
        yield target
    finally:
        subprocess.run(["umount", "-l", str(target)], check=True, timeout=30)


async def test_a_grant_that_is_a_bind_mount_of_an_agents_directory_lists_no_key(tmp_path: Path, short: Path) -> None:
    """A mount shows a directory under a second name, and a mask is a mount at a path: a grant of a
    bind mount of the agent's directory showed the agent there, beside its mask at the path it was
    bound to. Every place a share, or a mount inside it, is a directory on a hidden path's way now
    hides it too."""
    (short / "ssh-Ab12").mkdir(mode=0o700)
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    alias = short / "alias"
    with running_agent(short / "ssh-Ab12" / "agent.1") as agent, bind_mounted(agent.parent, alias):
        servers = {
            "jailed": hostile | {"jail": {"read_only": [*CODE, str(alias)]}},
            "loose": hostile | {"jail": False},
        }
        config, log = write_config(tmp_path, servers), tmp_path / "gateway.log"
        async with gateway(config, tmp_path / "state", stderr=log) as client:
            # the honest control: through the mount the agent answers whoever reaches it
            listed = _outcome(await client.call_tool("loose__ssh_agent", {"target": str(alias / "agent.1")}))
            assert listed["got_through"] and listed["amount"] == 1, listed
            refused = _outcome(await client.call_tool("jailed__ssh_agent", {"target": str(alias / "agent.1")}))
            assert not refused["got_through"] and "ECONNREFUSED" in refused["detail"], refused
    assert f"{alias}/agent.1 (an ssh-agent's socket" in log.read_text()
    assert f"shown here by a mount as {agent}" in log.read_text()


def test_the_same_jail_hiding_only_by_name_lists_the_agents_keys_through_a_bind_mount(short: Path) -> None:
    """The honest control of the search through mounts: the jail `jail_spec` plans for a grant of a
    bind mount of the agent's directory, run as it is and with only the places named by the path."""
    (short / "ssh-Ab12").mkdir(mode=0o700)
    alias = short / "alias"
    with running_agent(short / "ssh-Ab12" / "agent.1") as agent, bind_mounted(agent.parent, alias):
        reader = {"command": sys.executable, "args": ["-c", AGENT_READER, str(SERVERS), str(alias / "agent.1")]}
        server = LocalServer.model_validate(reader | {"jail": {"read_only": [*CODE, str(alias)]}})
        assert server.jail is not False
        spec, launchers = jail_spec("reader", server, server.jail)
        assert "shown here by a mount" in spec.hidden[str(alias / "agent.1")]

        by_name = {path: why for path, why in spec.hidden.items() if "shown here by a mount" not in why}
        listed = _run_hiding(spec, launchers, by_name)
        assert listed["got_through"] and listed["amount"] == 1, listed
        refused = _run_hiding(spec, launchers, spec.hidden)
        assert not refused["got_through"] and "ECONNREFUSED" in refused["detail"], refused


async def test_a_grant_that_is_a_bind_mount_of_cellblocks_state_is_refused_naming_both(
    tmp_path: Path, short: Path
) -> None:
    """A bind mount shows the state directory (approvals, the audit log, the locks) under a second
    name: a grant of it is refused as a grant of the state directory by its own name is, naming
    both, rather than shown empty. The controls: through the mount an unjailed server reads what is
    there, and a grant of a bind mount of an ordinary directory starts and reads it."""
    state, work = tmp_path / "state", short / "work"
    state.mkdir(mode=0o700)
    work.mkdir()
    planted = f"planted-{uuid.uuid4().hex}"
    (state / "planted").write_text(planted)
    (work / "notes").write_text("notes")
    hostile = {"command": sys.executable, "args": [str(HOSTILE)]}
    with bind_mounted(state, short / "alias") as alias, bind_mounted(work, short / "desk") as desk:
        servers = {
            "jailed": hostile | {"jail": {"read_only": [*CODE, str(alias)]}},
            "desk": hostile | {"jail": {"read_only": [*CODE, str(desk)]}},
            "loose": hostile | {"jail": False},
        }
        log = tmp_path / "gateway.log"
        async with gateway(write_config(tmp_path, servers), state, stderr=log) as client:
            read = _outcome(await client.call_tool("loose__read_file", {"path": str(alias / "planted")}))
            assert read["got_through"], read  # the honest control: the mount shows the state
            read = _outcome(await client.call_tool("desk__read_file", {"path": str(desk / "notes")}))
            assert read["got_through"], read  # and a bind mount of an ordinary directory is granted
            refused = await client.call_tool("jailed__read_file", {"path": str(alias / "planted")})
    assert refused.is_error and refused.structured_content is None, refused
    told = " ".join(getattr(c, "text", "") for c in refused.content)
    expected = f"server 'jailed': jail.read_only path {alias} is {state} under another name: Cellblock's own"
    assert expected in told and "grant another directory" in told, told
    assert planted not in told and expected in log.read_text()
