"""A `network: ask` jail's relay: every name answered at once, nothing refused at DNS time."""

from __future__ import annotations

import socket

from cellblock.sandbox.egress import ASK_PORTS, relayed
from cellblock.sandbox.relay import MAX_NAMES, Names, dns_answer
from tests.sandbox.test_jailnet import answers, query, rcode


def test_in_ask_mode_any_name_gets_an_address_of_its_own_and_nothing_is_reported() -> None:
    names = Names([], any_name=True)
    given = []
    for name in ("phone-home.example.com", "api.other.test", "x.y.z.test"):
        response, refused = dns_answer(query(name), names)
        assert response is not None and refused is None  # nothing to refuse: the proxy asks at connect
        assert rcode(response) == 0 and answers(response) == 1
        address = socket.inet_ntoa(response[-4:])
        assert address.startswith("127.100.") and names.name_at(address) == name
        given.append(address)
    assert len(set(given)) == 3


def test_in_ask_mode_a_name_that_is_not_a_host_names_letters_is_still_nxdomain() -> None:
    names = Names([], any_name=True)
    packet = query("x.example.com")
    label = b"a\r\nX: y"
    packet = packet[:12] + bytes([len(label)]) + label + packet[14:]
    response, refused = dns_answer(packet, names)
    assert response is not None and rcode(response) == 3 and refused is None


def test_in_ask_mode_the_names_given_addresses_are_still_bounded() -> None:
    names = Names([], any_name=True)
    for index in range(MAX_NAMES):
        assert names.address_for(f"n{index}.test") is not None
    assert names.address_for("one-more.test") is None


def test_without_ask_an_unlisted_name_is_not_covered() -> None:
    assert not Names(["api.example.com"]).covers("phone-home.example.com")


def test_an_ask_jails_relay_answers_every_name_and_carries_the_web_ports_and_the_listed_ones() -> None:
    argv, mounts = relayed(["server"], "/usr/bin/python3", "/home/u", "/usr/bin", ["h.test:8443"], ask=True)
    assert "--any-name" in argv
    ports = argv[argv.index("--ports") + 1].split(",")
    assert sorted(int(p) for p in ports) == sorted({*ASK_PORTS, 8443})
    assert any(m.path == "/etc/resolv.conf" for m in mounts)
    plain, _ = relayed(["server"], "/usr/bin/python3", "/home/u", "/usr/bin", ["127.0.0.1:9000"])
    assert "--any-name" not in plain and "--ports" not in plain
