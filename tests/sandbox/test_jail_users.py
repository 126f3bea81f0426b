"""The real bubblewrap jail, attacked from inside, as root and as an unprivileged user.

The attacks are `cellblock/sandbox/escape/`, run by the system Python inside the exact argv
`bwrap_plan` builds. As root the jail must hold even though root could otherwise remount or read
anything; as a normal user it must hold the same way. The kernel keyring has no namespace, so
there the seccomp filter is what holds, shown against the same jail without it.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
from dataclasses import replace
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox.bwrap import bwrap_plan
from cellblock.sandbox.spawn import run_plan
from cellblock.sandbox.types import JailSpec
from tests.kernel_keys import keyrings_usable, planted_key
from tests.sandbox.conftest import escape_copy

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap"),
    pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs the system python3"),
]

ABSTRACT = "cellblock-test-users-bus"
# (the physical pages, /proc/kpage*, are masked too, but read in 8-byte units only)
KERNEL_INTERNALS = ("/proc/slabinfo", "/proc/vmallocinfo", "/proc/pagetypeinfo")


def run_jailed(
    prefix: list[str], spec: JailSpec, attempts: list[dict[str, Any]], seccomp: bool = True
) -> list[dict[str, Any]]:
    spec = replace(spec, argv=(*spec.argv, "--json", json.dumps(attempts)))
    done = run_plan(bwrap_plan(spec, [], seccomp=seccomp), 60, prefix)
    assert done.returncode in (0, 1), done.stderr
    results: list[dict[str, Any]] = json.loads(done.stdout)
    return results


def test_nothing_gets_out_as_root_or_as_a_user(who: tuple[str, list[str], str, int], area: Path) -> None:
    name, prefix, home, uid = who
    planted = Path(home) / ".ssh" / "cellblock_test_key"
    planted.parent.mkdir(mode=0o700, exist_ok=True)
    planted.write_text("FAKE KEY\n")
    os.chown(planted.parent, uid, -1)
    os.chown(planted, uid, -1)
    ro = area / "ro"
    ro.mkdir()
    (ro / "data").write_text("x")
    outside = area / "outside"
    outside.mkdir(mode=0o777)
    outside.chmod(0o777)
    tcp = socket.create_server(("127.0.0.1", 0))
    bus = socket.socket(socket.AF_UNIX)
    bus.bind(str(area / "bus"))
    (area / "bus").chmod(0o777)
    bus.listen()
    abstract = socket.socket(socket.AF_UNIX)
    abstract.bind("\0" + ABSTRACT)
    abstract.listen()
    attempts: list[dict[str, Any]] = [
        {"kind": "read", "target": str(planted)},
        {"kind": "read", "target": "/etc/shadow"},
        {"kind": "list", "target": home, "expect": [".ssh"]},
        {"kind": "write", "target": str(outside / "planted")},
        {"kind": "write", "target": str(ro / "planted")},
        {"kind": "connect", "target": f"127.0.0.1:{tcp.getsockname()[1]}"},
        {"kind": "resolve", "target": "example.com"},
        {"kind": "dbus", "target": f"unix:path={area / 'bus'}", "abstract": [ABSTRACT]},
        {"kind": "processes", "pid": os.getpid()},
        # uid 0 writes sysctls without a capability (kernel.core_pattern runs a program as host root)
        {"kind": "sysctl", "target": "/proc/sys/vm/stat_interval"},
        {"kind": "capabilities", "target": ""},
        {"kind": "userns", "target": ""},
        {"kind": "remount", "target": str(ro)},
        # kernel internals only uid 0 may read: the kernel's heap and its allocations
        *({"kind": "read", "target": f} for f in KERNEL_INTERNALS if os.path.exists(f)),
    ]
    escape = escape_copy(area)
    spec = JailSpec(
        name="attacker",
        argv=("/usr/bin/python3", str(escape)),
        env={"PATH": "/usr/bin:/bin", "HOME": home},
        read_only=(str(escape.parent), str(ro)),
        home=home,
    )
    try:
        # the honest control: the same attacks, same user, no jail, do get through
        direct = subprocess.run(
            [*prefix, *spec.argv, "--json", json.dumps(attempts[:1] + attempts[5:6] + attempts[7:9])],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert [r["got_through"] for r in json.loads(direct.stdout)] == [True, True, True, True], direct.stdout
        if uid == 0:  # and root reads the kernel's internals
            internals = [a for a in attempts if a.get("target") in KERNEL_INTERNALS]
            read = subprocess.run(
                [*prefix, *spec.argv, "--json", json.dumps(internals)], capture_output=True, text=True, timeout=60
            )
            assert internals and all(r["got_through"] for r in json.loads(read.stdout)), read.stdout
        results = run_jailed(prefix, spec, attempts)
    finally:
        for sock in (tcp, bus, abstract):
            sock.close()
        planted.unlink()
    assert len(results) == len(attempts)
    escaped = [f"{r['name']} {r['target']}: {r['detail']}" for r in results if r["got_through"]]
    assert escaped == [], f"as {name}"
    assert sorted(os.listdir(outside)) == [] and sorted(os.listdir(ro)) == ["data"]


def test_the_jail_runs_its_command_as_that_user_with_what_it_was_given(
    who: tuple[str, list[str], str, int], area: Path
) -> None:
    name, prefix, home, _ = who
    data = area / "ro"
    data.mkdir()
    (data / "data").write_text("granted\n")
    escape = escape_copy(area)
    spec = JailSpec(
        name="honest",
        argv=("/usr/bin/python3", str(escape)),
        env={"PATH": "/usr/bin:/bin", "HOME": home},
        read_only=(str(escape.parent), str(data)),
        home=home,
    )
    results = run_jailed(prefix, spec, [{"kind": "read", "target": str(data / "data")}])
    assert results[0]["got_through"], f"as {name}: {results[0]['detail']}"


@pytest.mark.skipif(not keyrings_usable(), reason="this kernel has no keyrings")
def test_the_users_kernel_keyring_cannot_be_read_from_a_jail_as_root_or_as_a_user(
    who: tuple[str, list[str], str, int], area: Path
) -> None:
    name, prefix, home, _ = who
    escape = escape_copy(area)
    spec = JailSpec(
        name="attacker",
        argv=("/usr/bin/python3", str(escape)),
        env={"PATH": "/usr/bin:/bin", "HOME": home},
        read_only=(str(escape.parent),),
        home=home,
    )
    with planted_key(prefix) as key:
        # the user keyring's serial as if learnt otherwise: the jail masks /proc/keys, which lists it
        attempt = [{"kind": "keyring", "target": key.description, "rings": [key.ring]}]
        # the honest controls: the same attempt as the same user reads the key unjailed, and in the
        # same jail without its seccomp filter (bwrap alone has no keyring namespace)
        direct = subprocess.run(
            [*prefix, *spec.argv, "--json", json.dumps(attempt)],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        unfiltered = run_jailed(prefix, spec, attempt, seccomp=False)
        jailed = run_jailed(prefix, spec, attempt)
    outputs = direct.stdout + json.dumps([unfiltered, jailed])
    assert key.payload.decode() not in outputs, "an attempt reported the bytes it read"
    assert json.loads(direct.stdout)[0]["got_through"], f"as {name}: {direct.stdout}"
    assert unfiltered[0]["got_through"], f"as {name}: {unfiltered[0]['detail']}"
    assert not jailed[0]["got_through"], f"as {name}: {jailed[0]['detail']}"
    assert "keyctl(JOIN_SESSION_KEYRING): EPERM" in jailed[0]["detail"]


@pytest.mark.skipif(not keyrings_usable(), reason="this kernel has no keyrings")
def test_proc_keys_names_none_of_the_users_keys_in_a_jail(area: Path) -> None:
    """The filter keeps the keys out of reach; /proc/keys, which would still list their
    descriptions, is masked with /dev/null."""
    escape = escape_copy(area)
    spec = JailSpec(
        "attacker", ("/usr/bin/python3", str(escape)), {"PATH": "/usr/bin:/bin"}, read_only=(str(escape.parent),)
    )
    with planted_key() as key:
        attempt = [{"kind": "keyring", "target": key.description}]
        direct = subprocess.run(
            [*spec.argv, "--json", json.dumps(attempt)], capture_output=True, text=True, timeout=60, check=False
        )
        (jailed,) = run_jailed([], spec, attempt)
    assert "the target among them" in json.loads(direct.stdout)[0]["detail"]  # unjailed, it is listed
    assert not jailed["got_through"]
    assert jailed["detail"].startswith("/proc/keys shows 0 keys, the target not among them"), jailed["detail"]
