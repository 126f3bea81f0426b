"""An allowlist jail's names: the DNS and ports its relay answers, and the namespace that allows it.

Programs that ignore proxy variables (Node 20's fetch, Go, raw sockets) resolve names and connect
themselves. In an allowlist jail the relay (`sandbox/relay.py`) answers DNS for the names
`allow_hosts` lists, each with a loopback address of its own, and carries a connection to that
address to the egress proxy as `CONNECT name:port`, where the proxy's checks and audit apply as to
any other request. The jail's /etc/resolv.conf points at the relay; nothing else answers DNS.

DNS is port 53 and HTTPS 443: the jail's network namespace is made one step out, by
`sandbox/netns.py` in front of bwrap, with `net.ipv4.ip_unprivileged_port_start` 0, so the relay
binds them without any capability; and with every IPv4 address local to it, so a connection to a
raw address on one of those ports reaches the relay too, which carries it as `CONNECT ip:port`.
"""

from __future__ import annotations

import ipaddress
import os
import shutil
import subprocess
import sys
from collections.abc import Sequence
from dataclasses import replace

from cellblock.policy.hosts import HostKind, parse_rule
from cellblock.sandbox.types import JailError, LaunchPlan, Mount, MountMode

__all__ = ["HOSTS", "NETNS", "RESOLV_CONF", "check_netns", "in_netns", "relay_names", "resolv_mounts"]

NETNS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "netns.py")
# The jail's /etc/resolv.conf: the relay's DNS on loopback, and nothing else; and its /etc/hosts:
# localhost only, so no name the host's file maps (to an address the jail cannot reach) hides the
# relay's answer.
RESOLV_CONF = os.path.join(os.path.dirname(os.path.abspath(__file__)), "resolv.conf")
HOSTS = os.path.join(os.path.dirname(os.path.abspath(__file__)), "hosts")
_LOOPBACK = ipaddress.IPv4Network("127.0.0.0/8")
# The namespace step runs in well under this; a hung one means something is badly wrong.
_CHECK_SECONDS = 10


def relay_names(allow_hosts: Sequence[str]) -> tuple[list[str], list[int]]:
    """The name patterns (`name`, `*.suffix`) the relay answers DNS for, and the ports it carries
    connections on: every port a name entry allows (80 and 443 where none is written), and every
    port an IPv4 entry beyond loopback allows (a raw address is carried as it is). A loopback
    entry is not: inside the jail, 127.0.0.1 is the jail's own, reached through the proxy alone."""
    names: list[str] = []
    ports: set[int] = set()
    for entry in allow_hosts:
        rule = parse_rule(entry)
        if rule.kind is HostKind.NAME:
            names.append(rule.host)
        elif rule.kind is HostKind.SUFFIX:
            names.append(f"*.{rule.host}")
        elif rule.network is None or rule.network.version != 4 or rule.network.overlaps(_LOOPBACK):
            continue
        ports.update(rule.ports)
    return list(dict.fromkeys(names)), sorted(ports)


def resolv_mounts() -> list[Mount]:
    """The jail's name resolution: the relay's DNS, and localhost alone in /etc/hosts."""
    return [
        Mount("/etc/resolv.conf", MountMode.READ_ONLY, "DNS: the egress relay's, for the allowed names", RESOLV_CONF),
        Mount("/etc/hosts", MountMode.READ_ONLY, "localhost only: the allowed names come from the relay", HOSTS),
    ]


def in_netns(plan: LaunchPlan, bwrap: str, python: str | None = None) -> LaunchPlan:
    """`plan` with its bwrap (the program `bwrap`, after any scope or cgroup launcher in front of
    it) started in a network namespace made by `netns.py`, where the relay may bind ports below
    1024, instead of one of bwrap's own.

    Raises:
        JailError: the plan does not run `bwrap` making a network namespace of its own.
    """
    argv = list(plan.argv)
    start = argv.index(bwrap) if bwrap in argv else -1
    # bwrap's namespace options come first, before the first "--" of any value or the server's argv
    options = argv[start : argv.index("--", start) if "--" in argv[start:] else len(argv)] if start >= 0 else []
    at = start + options.index("--unshare-net") if "--unshare-net" in options else -1
    if at < 0:
        raise JailError("the launch plan has no network namespace of its own to move; nothing was started")
    del argv[at]
    prefix = [python or os.path.realpath(sys.executable), "-I", "-S", NETNS, "--"]
    argv[start:start] = prefix
    tmpfs = tuple((i + (len(prefix) if i > start else 0) - (1 if i > at else 0), point) for i, point in plan.tmpfs)
    return replace(plan, argv=tuple(argv), tmpfs=tmpfs)


def check_netns(python: str | None = None) -> str | None:
    """Why an allowlist jail with names cannot start here (the namespace step fails), or None."""
    argv = [python or os.path.realpath(sys.executable), "-I", "-S", NETNS, "--", shutil.which("true") or "/bin/true"]
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=_CHECK_SECONDS, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"the namespace step did not run: {exc}"
    lines = done.stderr.strip().splitlines()  # a step it went on without is said there too
    if done.returncode == 0 and not lines:
        return None
    return "; ".join(lines) if lines else f"the namespace step exited with status {done.returncode}"
