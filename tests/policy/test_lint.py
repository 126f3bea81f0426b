"""Lint: rules the jail or the catalog make pointless are named; sound rules produce nothing."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from cellblock.policy.lint import JailView, lint_policy
from cellblock.policy.rules import parse_rule_entry
from cellblock.policy.types import ToolRule


def rules(**entries: str | dict[str, Any]) -> list[ToolRule]:
    return [parse_rule_entry(pattern, body) for pattern, body in entries.items()]


def jail(tmp_path: Path, network: str = "none", hosts: tuple[str, ...] = ()) -> JailView:
    return JailView((str(tmp_path / "ro"),), (str(tmp_path / "rw"),), network, hosts)


def test_a_sound_policy_has_no_findings(tmp_path: Path) -> None:
    found = lint_policy(
        "fs",
        rules(
            write_file={"decision": "allow", "args": {"path": {"under": [str(tmp_path / "rw")]}}},
            read_file={"decision": "allow", "args": {"path": {"under": [str(tmp_path / "ro")]}}},
        ),
        jail(tmp_path),
        "/home/u",
        {"write_file": False, "read_file": True},
    )
    assert found == []


def test_a_writing_tool_constrained_to_a_read_only_share_is_named(tmp_path: Path) -> None:
    found = lint_policy(
        "fs",
        rules(write_file={"decision": "allow", "args": {"path": {"under": [str(tmp_path / "ro")]}}}),
        jail(tmp_path),
        "/home/u",
    )
    assert len(found) == 1 and "write_file" in found[0] and "read-only" in found[0]


def test_a_policy_path_the_jail_does_not_share_is_named(tmp_path: Path) -> None:
    found = lint_policy(
        "fs", rules(read_file={"decision": "allow", "args": {"path": {"under": ["/etc"]}}}), jail(tmp_path), "/h"
    )
    assert len(found) == 1 and "under /etc is not shared" in found[0]


def test_a_host_rule_wider_than_the_allowlist_is_named(tmp_path: Path) -> None:
    body = {"decision": "allow", "args": {"url": {"hosts": ["*.github.com", "api.github.com"]}}}
    found = lint_policy("web", rules(fetch=body), jail(tmp_path, "allowlist", ("api.github.com",)), "/h")
    assert len(found) == 1 and "*.github.com is wider" in found[0]
    no_net = lint_policy("web", rules(fetch=body), jail(tmp_path), "/h")
    assert no_net and "no network" in no_net[0]


def test_a_rule_that_matches_no_locked_tool_is_named(tmp_path: Path) -> None:
    found = lint_policy("fs", rules(**{"read_fil": "allow", "list_*": "allow"}), None, "/h", {"read_file": True})
    assert len(found) == 2 and all("matches no tool of the locked catalog" in f for f in found)
    assert "read_fil " in found[0] and "list_*" in found[1]


def test_a_write_grant_wider_than_the_writing_tools_under_is_named(tmp_path: Path) -> None:
    # `under:` is checked before the server opens the path; a symlink swapped in between gets past the
    # check, so the jail's mounts must hold the same line, or only the check does
    body = {"decision": "allow", "args": {"path": {"under": [str(tmp_path / "rw" / "scratch")]}}}
    found = lint_policy("fs", rules(write_file=body), jail(tmp_path), "/home/u", {"write_file": False})
    assert len(found) == 1 and f"shares all of {tmp_path / 'rw'} read-write" in found[0]
    # the fix it names: the parent read-only, only the scratch folder writable
    narrow = JailView((str(tmp_path / "rw"),), (str(tmp_path / "rw" / "scratch"),), "none", ())
    assert lint_policy("fs", rules(write_file=body), narrow, "/home/u", {"write_file": False}) == []
    # granting the root itself as well does not narrow the wider grant around it
    both = JailView((), (str(tmp_path / "rw"), str(tmp_path / "rw" / "scratch")), "none", ())
    assert len(lint_policy("fs", rules(write_file=body), both, "/home/u", {"write_file": False})) == 1
    # a tool that only reads may be constrained inside a wider share
    assert lint_policy("fs", rules(read_file=body), jail(tmp_path), "/home/u", {"read_file": True}) == []


def test_a_not_under_root_inside_a_grant_is_named_and_one_outside_every_grant_is_not(tmp_path: Path) -> None:
    secret = str(tmp_path / "ro" / "keys")
    body = {"decision": "allow", "args": {"path": {"not_under": [secret, "/etc"]}}}
    found = lint_policy("fs", rules(read_file=body), jail(tmp_path), "/h")
    # /etc is not shared at all: the kernel keeps the server out, and lint says nothing of it
    assert len(found) == 1, found
    assert f"not_under {secret} lies inside {tmp_path / 'ro'}" in found[0] and "only the check" in found[0]


def test_a_relative_root_is_judged_where_the_server_resolves_it(tmp_path: Path) -> None:
    body = {"decision": "allow", "args": {"path": {"under": ["rw"]}}}
    # resolved against the server's cwd it is the read-write share itself: sound
    assert lint_policy("fs", rules(write_file=body), jail(tmp_path), "/h", cwd=str(tmp_path)) == []
    # the control: against another cwd the same root is outside the jail, and lint says so
    elsewhere = lint_policy("fs", rules(write_file=body), jail(tmp_path), "/h", cwd=str(tmp_path / "other"))
    assert len(elsewhere) == 1 and "under rw is not shared" in elsewhere[0]
