"""The pure pieces of an allowlist jail's names: which names and ports, the DNS answers, the
namespace step in front of bwrap."""

from __future__ import annotations

import json
import socket
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.sandbox.egress import RELAY
from cellblock.sandbox.jailnet import HOSTS, NETNS, RESOLV_CONF, check_netns, in_netns, relay_names
from cellblock.sandbox.relay import MAX_NAMES, MAX_REPORTED, Names, dns_answer
from cellblock.sandbox.types import JailError, LaunchPlan, Network

A, AAAA, MX = 1, 28, 15


def query(name: str, qtype: int = A, ident: int = 0x1234, flags: int = 0x0100) -> bytes:
    labels = b"".join(bytes([len(p)]) + p.encode() for p in name.split(".")) + b"\0"
    return struct.pack("!6H", ident, flags, 1, 0, 0, 0) + labels + struct.pack("!HH", qtype, 1)


def rcode(response: bytes) -> int:
    return struct.unpack("!H", response[2:4])[0] & 0xF


def answers(response: bytes) -> int:
    return int(struct.unpack("!H", response[6:8])[0])


def test_the_relay_answers_for_the_name_entries_on_the_ports_they_allow() -> None:
    names, ports = relay_names(["api.example.com", "*.svc.test", "h.test:8443", "10.0.0.0/8", "127.0.0.1:9000"])
    assert names == ["api.example.com", "*.svc.test", "h.test"]
    assert ports == [80, 443, 8443]


def test_address_entries_give_the_relay_their_ports_but_loopback_ones_nothing() -> None:
    assert relay_names(["10.0.0.0/8", "192.0.2.1:5432", "[2001:db8::1]:9000"]) == ([], [80, 443, 5432])
    # the jail's 127.0.0.1 is its own: a loopback entry is reached through the proxy alone
    assert relay_names(["127.0.0.1:9000", "127.0.0.0/8", "[::1]:80"]) == ([], [])


def test_a_listed_name_gets_a_loopback_address_of_its_own_and_keeps_it() -> None:
    names = Names(["api.example.com", "*.svc.test"])
    response, refused = dns_answer(query("API.Example.com"), names)
    assert response is not None and refused is None
    assert rcode(response) == 0 and answers(response) == 1
    assert response[:2] == b"\x12\x34" and response[2] & 0x80  # the query's id, marked a response
    address = socket.inet_ntoa(response[-4:])
    assert address.startswith("127.100.")
    assert names.name_at(address) == "api.example.com"
    other, _ = dns_answer(query("a.svc.test"), names)
    assert other is not None and socket.inet_ntoa(other[-4:]) not in (address, "127.0.0.1")
    again, _ = dns_answer(query("api.example.com"), names)
    assert again is not None and socket.inet_ntoa(again[-4:]) == address


def test_a_name_not_listed_is_nxdomain_and_reported_once() -> None:
    names = Names(["*.svc.test"])
    for name in ("example.com", "svc.test", "svc.test.evil.com"):
        response, refused = dns_answer(query(name), names)
        assert response is not None and rcode(response) == 3 and answers(response) == 0
        assert refused == name
        first, reported = names.refusal(name)
        again, same = names.refusal(name)
        assert first and not again and reported is same is not None
    assert names.name_at("127.0.0.1") is None


def test_a_name_that_is_not_a_host_names_letters_is_nxdomain_and_never_reported() -> None:
    names = Names(["*.svc.test"])
    for label in (b"a\r\nX: y", b"a b", b"caf\xc3\xa9", b"a:443"):
        packet = query("x.svc.test")
        packet = packet[:12] + bytes([len(label)]) + label + packet[14:]  # the first label replaced
        response, refused = dns_answer(packet, names)
        assert response is not None and rcode(response) == 3 and refused is None


def test_other_record_types_of_a_listed_name_get_no_answer_and_no_report() -> None:
    names = Names(["api.example.com"])
    for qtype in (AAAA, MX):
        response, refused = dns_answer(query("api.example.com", qtype), names)
        assert response is not None and rcode(response) == 0 and answers(response) == 0 and refused is None
    _, refused = dns_answer(query("example.com", MX), names)
    assert refused is None  # only address lookups are reported


@pytest.mark.parametrize(
    "packet",
    [
        b"",
        b"\x00" * 11,
        query("api.example.com", flags=0x8100),  # a response, not a query
    ],
)
def test_what_is_not_a_query_gets_no_answer(packet: bytes) -> None:
    assert dns_answer(packet, Names(["api.example.com"])) == (None, None)


@pytest.mark.parametrize(
    "packet",
    [
        query("api.example.com")[:-3],  # cut short
        query("api.example.com")[:12] + b"\xc0\x0c" + struct.pack("!HH", A, 1),  # a pointer in a question
        struct.pack("!6H", 1, 0x0100, 2, 0, 0, 0) + query("a.b")[12:] * 2,  # two questions
    ],
)
def test_a_malformed_query_is_formerr(packet: bytes) -> None:
    response, refused = dns_answer(packet, Names(["api.example.com"]))
    assert response is not None and rcode(response) == 1 and refused is None


def test_refusals_reported_are_bounded() -> None:
    names = Names([])
    assert all(names.refusal(f"n{i}.test")[0] for i in range(MAX_REPORTED))
    assert names.refusal("one-more.test") == (False, None)


def test_the_names_given_addresses_are_bounded() -> None:
    names = Names(["*.flood.test"])
    given = {names.address_for(f"n{i}.flood.test") for i in range(MAX_NAMES)}
    assert None not in given and len(given) == MAX_NAMES
    assert names.address_for("one-more.flood.test") is None


def test_the_jail_resolves_through_the_relay_and_knows_only_localhost() -> None:
    assert Path(RESOLV_CONF).read_text().splitlines()[0] == "nameserver 127.0.0.1"
    hosts = [line.split() for line in Path(HOSTS).read_text().splitlines()]
    assert {h[0] for h in hosts} == {"127.0.0.1", "::1"} and all("localhost" in h for h in hosts)


def plan(*argv: str, tmpfs: tuple[tuple[int, str], ...] = ()) -> LaunchPlan:
    return LaunchPlan(argv=argv, env={}, cwd=None, mounts=(), network=Network.ALLOWLIST, tmpfs=tmpfs)


def test_bwrap_is_started_in_the_prepared_namespace_instead_of_making_one() -> None:
    before = plan("scope", "--", "/usr/bin/bwrap", "--unshare-user", "--unshare-net", "--tmpfs", "/tmp", "--", "x")
    before = plan(*before.argv, tmpfs=((5, "/tmp"),))
    after = in_netns(before, "/usr/bin/bwrap", python="/py")
    assert after.argv == (
        "scope", "--", "/py", "-I", "-S", NETNS, "--", "/usr/bin/bwrap", "--unshare-user", "--tmpfs", "/tmp", "--", "x",
    )  # fmt: skip
    assert [after.argv[i : i + 2] for i, _ in after.tmpfs] == [("--tmpfs", "/tmp")]


def test_a_plan_without_its_own_network_namespace_is_refused() -> None:
    with pytest.raises(JailError, match="no network namespace"):
        in_netns(plan("/usr/bin/bwrap", "--unshare-user", "--", "x", "--unshare-net"), "/usr/bin/bwrap")
    with pytest.raises(JailError, match="no network namespace"):
        in_netns(plan("other", "--unshare-net"), "/usr/bin/bwrap")


@pytest.mark.jail
def test_the_namespace_step_works_on_this_machine() -> None:
    assert check_netns() is None


def test_a_namespace_step_that_cannot_run_says_why() -> None:
    said = check_netns(python="/nonexistent/python3")
    assert said is not None and "did not run" in said


def allowlist_plan(allow: list[str], tmp_path: Path) -> LaunchPlan:
    jail = {"network": "allowlist", "allow_hosts": allow}
    config = parse_config(json.dumps({"version": 1, "servers": {"t": {"command": "/bin/true", "jail": jail}}}))
    server = config.servers["t"]
    assert isinstance(server, LocalServer)
    return launch_plan("t", server, str(tmp_path / "egress.sock"))


@pytest.mark.jail
def test_a_jail_whose_allowlist_lists_names_resolves_through_the_relay_in_the_namespace_step(tmp_path: Path) -> None:
    plan = allowlist_plan(["api.github.com", "*.example.com:8443"], tmp_path)
    assert NETNS in plan.argv and "--unshare-net" not in plan.argv
    at = plan.argv.index("--names")
    assert plan.argv[at : at + 4] == ("--names", "api.github.com,*.example.com", "--ports", "80,443,8443")
    etc = {m.path: m.source for m in plan.mounts if m.path in ("/etc/resolv.conf", "/etc/hosts")}
    assert etc == {"/etc/resolv.conf": RESOLV_CONF, "/etc/hosts": HOSTS}


@pytest.mark.jail
def test_an_allowlist_of_loopback_addresses_alone_keeps_bwraps_own_namespace_and_the_hosts_files(
    tmp_path: Path,
) -> None:
    plan = allowlist_plan(["127.0.0.1:9000"], tmp_path)
    assert NETNS not in plan.argv and "--unshare-net" in plan.argv and "--names" not in plan.argv
    assert {m.source for m in plan.mounts if m.path == "/etc/resolv.conf"} == {None}


def test_a_relay_that_cannot_bind_its_ports_says_so_and_still_runs_the_server() -> None:
    """Where the jail's namespace keeps the ports closed (a read-only /proc/sys), the relay is as
    it was without names: it starts the server and says what does not work, never silently."""
    with socket.socket() as blocker:
        blocker.bind(("127.0.0.1", 0))
        blocker.listen()
        busy = blocker.getsockname()[1]
        relay = [sys.executable, "-I", "-S", RELAY, "--listen", "127.0.0.1:0", "--socket", "/nonexistent.sock"]
        names = ["--names", "api.example.com", "--ports", str(busy), "--dns", "127.0.0.1:0"]
        done = subprocess.run(
            [*relay, *names, "--", sys.executable, "-c", "print('server ran')"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
    assert done.returncode == 0 and done.stdout == "server ran\n", done.stderr
    assert "cannot listen for DNS and the allowed ports" in done.stderr
