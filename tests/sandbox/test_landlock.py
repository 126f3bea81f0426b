"""The Landlock jail (sandbox/landlock.py), attacked from inside by real processes.

Each hostile test runs an attempt (the gateway's Python, with a script of its own) in a Landlock
plan and judges it by its effect on the host: the file not read or written, the connection not
accepted, the process still alive. Each has a control: the same attempt unjailed, or in the same
jail with the one defence removed, visibly succeeding.
"""

from __future__ import annotations

import json
import os
import select
import signal
import socket
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox.closure import exec_closure
from cellblock.sandbox.landlock import landlock_abi, landlock_plan
from cellblock.sandbox.limits import limit_plan
from cellblock.sandbox.spawn import run_plan, spawn_args
from cellblock.sandbox.types import JailSpec, LaunchPlan, Limits, Mount, MountMode, Network

ABI = landlock_abi()
pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(ABI < 4, reason="the Landlock jail's network: none needs Landlock ABI 4 (Linux 6.7)"),
]

PYTHON = os.path.realpath(sys.executable)
# the attempts' interpreter, shown as a launcher's installation is
INTERPRETER = Mount(os.path.realpath(sys.base_prefix), MountMode.READ_ONLY, "python")
SECONDS = 30


def jail(tmp_path: Path, code: str, *, launchers: Sequence[Mount] = (), **extra: Any) -> LaunchPlan:
    """A Landlock plan that runs `code` (with `-I -S`: no site, no home)."""
    spec = JailSpec(
        name="hostile",
        argv=(PYTHON, "-I", "-S", "-c", code),
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "user")},
        **extra,
    )
    return landlock_plan(spec, [INTERPRETER, *launchers], str(tmp_path / "private"))


def run(plan: LaunchPlan) -> dict[str, Any]:
    """Run `plan`; what its attempt printed last, as JSON."""
    done = run_plan(plan, SECONDS)
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def unjailed(code: str, prefix: Sequence[str] = (), python: str = PYTHON) -> dict[str, Any]:
    """Run `code` with no jail (after `prefix`: as another user, where user namespaces are refused)."""
    argv = [*prefix, python, "-I", "-S", "-c", code]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=SECONDS, check=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


# Each attempt reports every step as "ok" or the error's name, in one JSON line.
TRY = """
import json, os, socket, sys
said = {}
def attempt(name, act):
    try:
        act()
        said[name] = "ok"
    except OSError as exc:
        said[name] = type(exc).__name__
"""


def script(body: str, **values: object) -> str:
    """`body` after `TRY`, with `values` as variables, ending in the JSON of what it did."""
    assigned = "".join(f"{key} = {value!r}\n" for key, value in values.items())
    return f"{TRY}{assigned}{body}\nprint(json.dumps(said))\n"


READ_KEY = """
attempt("read", lambda: said.setdefault("key", open(key).read()))
attempt("list", lambda: os.listdir(home))
"""


def test_a_decoy_key_in_the_real_home_is_unreadable(tmp_path: Path, user_home: Path) -> None:
    code = script(READ_KEY, key=str(user_home / ".ssh" / "id_ed25519"), home=str(user_home))
    assert unjailed(code)["key"] == "DECOY-KEY\n"  # the control: the key is there to read
    said = run(jail(tmp_path, code))
    assert "key" not in said
    assert said["read"] == said["list"] == "PermissionError"


WRITE_OUTSIDE = """
attempt("outside", lambda: open(outside, "w").write("x"))
"""
WRITE = (
    WRITE_OUTSIDE
    + """
attempt("granted", lambda: open(granted, "w").write("x"))
attempt("home", lambda: open(os.path.join(os.environ["HOME"], "x"), "w").write("x"))
attempt("tmp", lambda: open(os.path.join(os.environ["TMPDIR"], "x"), "w").write("x"))
"""
)


def test_a_write_outside_the_grants_is_refused_and_a_granted_write_lands(tmp_path: Path) -> None:
    outside, granted = tmp_path / "outside", tmp_path / "granted"
    outside.mkdir()
    granted.mkdir()
    code = script(WRITE, outside=str(outside / "x"), granted=str(granted / "x"))
    said = run(jail(tmp_path, code, read_write=(str(granted),)))
    assert said["outside"] == "PermissionError"
    assert not (outside / "x").exists()
    assert (granted / "x").read_text() == "x"  # the positive control: a granted write lands
    assert said["home"] == said["tmp"] == "ok"  # its own home and tmp, in the gateway's private directory
    assert not list((tmp_path / "user").glob("*"))
    assert unjailed(script(WRITE_OUTSIDE, outside=str(outside / "x"))) == {"outside": "ok"}  # the control
    assert (outside / "x").exists()


@pytest.fixture
def listeners() -> Iterator[tuple[socket.socket, socket.socket]]:
    """A TCP and a UDP socket of the host, on loopback."""
    tcp = socket.socket()
    tcp.bind(("127.0.0.1", 0))
    tcp.listen(8)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind(("127.0.0.1", 0))
    yield tcp, udp
    tcp.close()
    udp.close()


NETWORK = """
attempt("tcp", lambda: socket.create_connection(("127.0.0.1", tcp), timeout=5))
attempt("udp", lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM).sendto(b"x", ("127.0.0.1", udp)))
attempt("fastopen", lambda: socket.socket().sendto(b"x", socket.MSG_FASTOPEN, ("127.0.0.1", tcp)))
def listen():
    server = socket.socket()
    server.listen()
    said["port"] = server.getsockname()[1]
attempt("listen", listen)
"""


def arrived(listener: socket.socket) -> int:
    """How many connections (or datagrams) wait on `listener` now. The attempt has ended: what it
    sent over loopback is there already, or never will be."""
    count = 0
    while select.select([listener], [], [], 0)[0]:
        if listener.type == socket.SOCK_STREAM:
            listener.accept()[0].close()
        else:
            listener.recv(64)
        count += 1
    return count


def test_under_network_none_the_hosts_loopback_is_out_of_reach_by_tcp_udp_fast_open_or_a_listener(
    tmp_path: Path, listeners: tuple[socket.socket, socket.socket]
) -> None:
    tcp, udp = listeners
    code = script(NETWORK, tcp=tcp.getsockname()[1], udp=udp.getsockname()[1])
    said = run(jail(tmp_path, code, network=Network.NONE))
    assert (said["tcp"], said["udp"], said["fastopen"], said["listen"]) == ("PermissionError",) * 4
    assert arrived(tcp) == arrived(udp) == 0
    # the control: the same jail on the host's network reaches both, and listens
    said = run(jail(tmp_path, code, network=Network.OPEN))
    assert said["tcp"] == said["udp"] == said["listen"] == "ok"
    assert arrived(tcp) >= 1
    assert arrived(udp) == 1


UNIX = """
def connect(address):
    client = socket.socket(socket.AF_UNIX)
    client.connect(address)
attempt("path", lambda: connect(path))
attempt("abstract", lambda: connect("\\0" + abstract))
"""


def test_a_unix_socket_the_test_listens_on_at_a_path_or_in_the_abstract_namespace_is_unreachable(
    tmp_path: Path,
) -> None:
    granted = tmp_path / "granted"
    granted.mkdir()
    by_path, abstract = socket.socket(socket.AF_UNIX), socket.socket(socket.AF_UNIX)
    name = f"cellblock-test-{os.getpid()}-{tmp_path.name}"
    with by_path, abstract:
        by_path.bind(str(granted / "agent.sock"))  # inside a grant: the file rules alone would not stop it
        abstract.bind("\0" + name)
        by_path.listen(8)
        abstract.listen(8)
        code = script(UNIX, path=str(granted / "agent.sock"), abstract=name)
        for network in (Network.NONE, Network.OPEN):
            said = run(jail(tmp_path, code, network=network, read_write=(str(granted),)))
            assert said["path"] != "ok"
            assert said["abstract"] != "ok"
            assert arrived(by_path) == arrived(abstract) == 0
        assert unjailed(code) == {"path": "ok", "abstract": "ok"}  # the control
        assert arrived(by_path) == arrived(abstract) == 1


PROCESSES = """
attempt("environ", lambda: said.setdefault("read", open(f"/proc/{pid}/environ", "rb").read().decode()))
attempt("mem", lambda: open(f"/proc/{pid}/mem", "rb").read(1))
attempt("cmdline", lambda: open(f"/proc/{pid}/cmdline", "rb").read())
attempt("signal", lambda: os.kill(pid, 15))
"""


@pytest.mark.skipif(ABI < 6, reason="Landlock scopes signals from ABI 6 (Linux 6.12)")
def test_another_process_is_neither_signalled_nor_read(tmp_path: Path, bystander: subprocess.Popen[bytes]) -> None:
    code = script(PROCESSES, pid=bystander.pid)
    said = run(jail(tmp_path, code))
    assert "read" not in said
    assert said["environ"] == said["mem"] == said["signal"] == "PermissionError"
    assert bystander.poll() is None
    assert said["cmdline"] == "ok"  # what stays visible on this backend (landlock_gaps says so)
    said = unjailed(code)  # the control
    assert "DECOY-ENVIRON" in said["read"]
    assert said["signal"] == "ok"
    assert bystander.wait(SECONDS) == -signal.SIGTERM


EXEC = """
import subprocess
attempt("unlisted", lambda: subprocess.run(["/bin/ls", "/usr"], check=True, capture_output=True))
attempt("allowed", lambda: subprocess.run([sys.executable, "-I", "-S", "-c", ""], check=True))
"""


def test_an_unlisted_program_under_exec_allow_is_refused(tmp_path: Path) -> None:
    code = script(EXEC)
    closure = exec_closure([PYTHON], "/usr/bin:/bin")
    said = run(jail(tmp_path, code, exec_allow=(PYTHON,), exec_closure=closure))
    assert said == {"unlisted": "PermissionError", "allowed": "ok"}
    assert run(jail(tmp_path, code)) == {"unlisted": "ok", "allowed": "ok"}  # the control: no exec.allow


INSTALLED = """
attempt("write", lambda: open(os.path.join(tree, "server.py"), "w").write("taken over"))
attempt("add", lambda: open(os.path.join(tree, "new.py"), "w").write("x"))
"""


def test_a_write_into_an_installed_tree_is_refused(tmp_path: Path) -> None:
    tree = tmp_path / "installed"
    tree.mkdir()
    (tree / "server.py").write_text("original")
    code = script(INSTALLED, tree=str(tree))
    installed = Mount(str(tree), MountMode.READ_ONLY, "installed package")
    assert run(jail(tmp_path, code, launchers=[installed])) == {"write": "PermissionError", "add": "PermissionError"}
    assert (tree / "server.py").read_text() == "original"
    assert not (tree / "new.py").exists()
    # the control: the same tree granted writable is written
    assert run(jail(tmp_path, code, read_write=(str(tree),))) == {"write": "ok", "add": "ok"}
    assert (tree / "server.py").read_text() == "taken over"


def test_a_launchers_installation_inside_a_writable_grant_is_writable_as_its_gap_says(tmp_path: Path) -> None:
    """The gap is real: Landlock cannot take back part of a grant, and the plan says so."""
    project = tmp_path / "project"
    tree = project / ".venv"
    tree.mkdir(parents=True)
    (tree / "server.py").write_text("original")
    installed = Mount(str(tree), MountMode.READ_ONLY, "virtualenv")
    plan = jail(tmp_path, script(INSTALLED, tree=str(tree)), launchers=[installed], read_write=(str(project),))
    assert any(str(tree) in gap and "may change it" in gap for gap in plan.gaps)
    assert run(plan) == {"write": "ok", "add": "ok"}
    assert (tree / "server.py").read_text() == "taken over"


THREADS = """
import threading
ready = threading.Barrier(5)
def escape(n):
    ready.wait()
    attempt(f"read{n}", lambda: open(key).read())
    attempt(f"write{n}", lambda: open(f"{outside}/{n}", "w").write("x"))
threads = [threading.Thread(target=escape, args=(n,)) for n in range(4)]
for thread in threads:
    thread.start()
ready.wait()
for thread in threads:
    thread.join()
"""


def test_a_server_that_starts_threads_before_it_escapes_is_still_bound(tmp_path: Path, user_home: Path) -> None:
    outside = tmp_path / "outside"
    outside.mkdir()
    code = script(THREADS, key=str(user_home / ".ssh" / "id_ed25519"), outside=str(outside))
    said = run(jail(tmp_path, code))
    assert set(said.values()) == {"PermissionError"} and len(said) == 8
    assert not list(outside.iterdir())
    assert set(unjailed(code).values()) == {"ok"}  # the control
    assert len(list(outside.iterdir())) == 4


OWNER = """
attempt("setid", lambda: os.chmod(victim, 0o4700))
attempt("mode", lambda: os.chmod(victim, 0o666))
attempt("own", lambda: os.fchmod(os.open(own, os.O_RDONLY), 0o4755))  # a file of its own, in its grant
"""


def test_a_file_outside_the_grants_gets_no_set_id_bit_and_as_root_keeps_its_mode(tmp_path: Path) -> None:
    victim = tmp_path / "victim"
    victim.write_text("x")
    victim.chmod(0o600)
    granted = tmp_path / "granted"
    granted.mkdir()
    (granted / "tool").write_text("x")
    code = script(OWNER, victim=str(victim), own=str(granted / "tool"))
    said = run(jail(tmp_path, code, read_write=(str(granted),)))
    assert said["setid"] == said["own"] == "PermissionError"
    assert not (granted / "tool").stat().st_mode & 0o6000
    if os.geteuid() == 0:  # root owns the system's files: no change of mode by path at all
        assert said["mode"] == "PermissionError"
        assert victim.stat().st_mode & 0o7777 == 0o600
    else:  # a gap landlock_gaps names: Landlock governs no mode
        assert victim.stat().st_mode & 0o7777 == 0o666
    victim.chmod(0o600)
    assert unjailed(code) == {"setid": "ok", "mode": "ok", "own": "ok"}  # the control: Landlock governs no mode


def test_secrets_reach_the_server_by_its_environment_and_the_spawners_variables_do_not(tmp_path: Path) -> None:
    code = script("said.update(os.environ)")
    spec = JailSpec(name="env", argv=(PYTHON, "-I", "-S", "-c", code), env={"PATH": "/usr/bin:/bin", "HOME": "/x"})
    plan = landlock_plan(spec, [INTERPRETER], str(tmp_path / "private"), secrets={"API_KEY": "DECOY-SECRET"})
    assert not any("DECOY-SECRET" in arg for arg in plan.argv)
    environ = run_with_env(plan, {"SPAWNER_ADDED": "1"})
    assert environ["API_KEY"] == "DECOY-SECRET"
    assert environ["HOME"].startswith(str(tmp_path / "private"))
    assert "SPAWNER_ADDED" not in environ


def run_with_env(plan: LaunchPlan, added: dict[str, str]) -> dict[str, Any]:
    """Run `plan` with its environment and `added` (what a spawner adds, as the SDK's does)."""
    with spawn_args(plan) as spawn:
        done = subprocess.run(
            spawn.argv,
            env={**plan.env, **added},
            capture_output=True,
            text=True,
            timeout=SECONDS,
            check=False,
            pass_fds=spawn.pass_fds,
        )
    assert done.returncode == 0, done.stderr
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def test_a_jail_under_limits_is_held_until_they_are_in_place_then_runs(tmp_path: Path) -> None:
    code = script('attempt("pid", lambda: said.setdefault("me", os.getpid()))')
    held = limit_plan(jail(tmp_path, code), "hostile", Limits(processes=64, memory=512 << 20))
    said = run(held)
    assert said["pid"] == "ok"


ESCAPE = Path(__file__).resolve().parents[2] / "cellblock" / "sandbox" / "escape"


def probe(tmp_path: Path, attempts: list[dict[str, Any]], **extra: Any) -> dict[str, bool]:
    """`cellblock probe`'s escape attempts run in a Landlock plan: each attempt's name -> got through."""
    spec = JailSpec(
        name="probe",
        argv=(PYTHON, "-I", "-S", str(ESCAPE), "--json", json.dumps(attempts)),
        env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path / "user")},
        read_only=(str(ESCAPE),),
        **extra,
    )
    done = run_plan(landlock_plan(spec, [INTERPRETER], str(tmp_path / "private")), SECONDS)
    assert done.returncode in (0, 1), done.stderr
    return {f"{r['name']} {r['target']}": r["got_through"] for r in json.loads(done.stdout)}


def test_the_probes_escape_attempts_are_blocked_and_what_gets_through_is_a_gap_the_plan_names(
    tmp_path: Path, user_home: Path, listeners: tuple[socket.socket, socket.socket]
) -> None:
    tcp, _ = listeners
    attempts: list[dict[str, Any]] = [
        {"kind": "read", "target": str(user_home / ".ssh" / "id_ed25519")},
        {"kind": "list", "target": str(user_home), "expect": [".ssh"]},
        {"kind": "write", "target": str(tmp_path / "canary"), "keep": True},
        {"kind": "connect", "target": f"127.0.0.1:{tcp.getsockname()[1]}"},
        {"kind": "dbus", "target": ""},
        {"kind": "capabilities", "target": ""},
        {"kind": "userns", "target": ""},
        {"kind": "sysctl", "target": "/proc/sys/vm/stat_interval"},
        {"kind": "remount", "target": "/usr"},
        {"kind": "processes", "pid": os.getpid()},
    ]
    said = probe(tmp_path, attempts)
    assert said.pop(f"processes {os.getpid()}") is True  # a gap: there is no pid namespace
    assert said and not any(said.values()), said
    assert not (tmp_path / "canary").exists()
    plan = jail(tmp_path, "")
    assert any("other processes are visible" in gap for gap in plan.gaps)


LOAD = """
import subprocess
def load():
    fd = os.open(copy, os.O_WRONLY | os.O_CREAT, 0o755)
    os.write(fd, open("/bin/true", "rb").read())
    os.close(fd)
    subprocess.run([loader, copy], check=True)
attempt("load", load)
"""


def test_under_exec_allow_the_probe_finds_only_the_loader_gap_the_plan_names(tmp_path: Path) -> None:
    writable = tmp_path / "granted"
    writable.mkdir()
    attempts: list[dict[str, Any]] = [
        {"kind": "exec", "argv": ["/bin/sh", "-c", "true"]},
        {"kind": "memfd_exec", "target": "/bin/true"},
    ]
    closure = exec_closure([PYTHON], "/usr/bin:/bin")
    locked: dict[str, Any] = {"read_write": (str(writable),), "exec_allow": (PYTHON,), "exec_closure": closure}
    assert probe(tmp_path, attempts, **locked) == {"exec /bin/sh": False, "memfd_exec /bin/true": False}
    # what bwrap's noexec mounts stop and Landlock cannot: the allowed loader maps a file the server wrote
    loader = next(p for p in closure.executables if "ld-linux" in p)
    plan = jail(tmp_path, script(LOAD, copy=str(writable / "copy"), loader=loader), **locked)
    assert run(plan) == {"load": "ok"}
    assert any("loaded as code by an allowed program" in gap for gap in plan.gaps)


def test_its_throw_away_home_and_tmp_go_once_it_has_ended_and_a_kept_home_stays(tmp_path: Path) -> None:
    code = "import json, os; open(os.environ['TMPDIR'] + '/left', 'w').write('x'); print(json.dumps({}))"
    plan = jail(tmp_path, code)
    home, tmp = plan.env["HOME"], plan.env["TMPDIR"]
    assert set(plan.made) == {home, tmp} and os.path.isdir(home) and os.path.isdir(tmp)  # made for this run
    run(plan)
    assert not os.path.exists(home) and not os.path.exists(tmp)
    kept = tmp_path / "kept"
    kept.mkdir()
    plan = jail(tmp_path, code, home_source=str(kept))
    assert plan.env["HOME"] == str(kept) and plan.made == (plan.env["TMPDIR"],)
    run(plan)
    assert kept.is_dir() and not os.path.exists(plan.env["TMPDIR"])
