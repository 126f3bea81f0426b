"""Which Linux jail a server gets (sandbox/backends.py; docs/jail.md, "Backends"): bubblewrap where
it can build one, Landlock where namespaces are refused and Landlock holds the jail, else nothing,
said with both causes; `bwrap` and `landlock` never fall back to the other."""

from __future__ import annotations

import pytest

from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import ConfigError, LocalServer
from cellblock.gateway.downstream.jailreport import jail_fields, jail_line
from cellblock.sandbox import backends
from cellblock.sandbox.backends import Choice, backend_plan, choose
from cellblock.sandbox.types import JailError, JailSpec, LaunchPlan, Network


def _config(text: str) -> dict[str, object]:
    config = parse_config(text, "cellblock.yaml")
    return {n: s.jail.backend for n, s in config.servers.items() if isinstance(s, LocalServer) and s.jail}


def test_every_jail_names_its_backend_auto_unless_the_defaults_or_itself_say_otherwise() -> None:
    plain = "version: 1\nservers:\n  a: {command: /bin/true}\n"
    assert _config(plain) == {"a": "auto"}
    text = (
        "version: 1\ndefaults: {backend: landlock}\nservers:\n  a: {command: /bin/true}\n"
        "  b: {command: /bin/true, jail: {backend: bwrap}}\n  c: {command: /bin/true, jail: false}\n"
    )
    assert _config(text) == {"a": "landlock", "b": "bwrap"}


def test_a_backend_no_one_builds_is_refused_naming_the_key() -> None:
    with pytest.raises(ConfigError, match=r"servers\.a\.jail\.backend"):
        parse_config("version: 1\nservers:\n  a: {command: /bin/true, jail: {backend: docker}}\n", "x")


def _no_bwrap(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse() -> str:
        raise JailError("bubblewrap cannot build a jail on this machine: no user namespaces")

    monkeypatch.setattr(backends, "check_bwrap", refuse)


@pytest.mark.jail
def test_auto_chooses_bubblewrap_where_it_builds_a_jail() -> None:
    choice = choose("s", "auto")
    assert choice.backend == "bwrap" and choice.bwrap is not None and choice.refused is None


def test_auto_chooses_landlock_where_bubblewrap_cannot_and_keeps_why(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_bwrap(monkeypatch)
    choice = choose("s", "auto")
    assert choice.backend == "landlock" and choice.bwrap is None
    assert "no user namespaces" in str(choice.refused)


def test_backend_bwrap_refuses_rather_than_fall_back(monkeypatch: pytest.MonkeyPatch) -> None:
    _no_bwrap(monkeypatch)
    with pytest.raises(JailError, match=r"server 's': jail\.backend is bwrap, and bubblewrap cannot build"):
        choose("s", "bwrap")


def test_backend_landlock_never_tries_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    def fail() -> str:
        raise AssertionError("bubblewrap was tried")

    monkeypatch.setattr(backends, "check_bwrap", fail)
    assert choose("s", "landlock") == Choice("landlock")


def test_where_neither_can_hold_the_jail_the_server_does_not_start_and_both_causes_are_named(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    _no_bwrap(monkeypatch)
    monkeypatch.setattr(backends, "landlock_refusal", lambda spec, abi: "this kernel has no Landlock")
    spec = JailSpec("s", ("/bin/true",), {})
    with pytest.raises(JailError) as refused:
        backend_plan(spec, [], choose("s", "auto"), "/nonexistent")
    said = str(refused.value)
    assert "'s' cannot be jailed on this machine, so it was not started" in said
    assert "no user namespaces" in said and "this kernel has no Landlock" in said


def test_landlock_asked_for_and_unable_says_so_and_names_bubblewrap(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(backends, "landlock_refusal", lambda spec, abi: "this kernel has no Landlock")
    with pytest.raises(JailError, match=r"jail\.backend is landlock, which cannot hold its jail here: this kernel"):
        backend_plan(JailSpec("s", ("/bin/true",), {}), [], Choice("landlock"), "/nonexistent")


def test_the_ready_event_names_the_backend_its_abi_and_what_it_does_not_enforce() -> None:
    server = LocalServer(command="/bin/true")
    plan = LaunchPlan(("x",), {}, None, (), Network.NONE, backend="landlock", gaps=("signals to other processes",))
    fields = jail_fields(server, plan, None)
    assert fields["jail"] == "none" and fields["backend"] == "landlock"
    assert fields["not_enforced"] == ["signals to other processes"] and isinstance(fields["landlock_abi"], int)
    assert jail_line(fields).startswith("jail landlock ABI ")
    bwrap = jail_fields(server, LaunchPlan(("x",), {}, None, (), Network.NONE), None)
    assert bwrap == {"jail": "none", "backend": "bwrap"} and jail_line(bwrap) == "jail bwrap, network none"
    unjailed = jail_fields(LocalServer(command="/bin/true", jail=False), None, None)
    assert unjailed == {"jail": "off"} and jail_line(unjailed) == "unjailed"
