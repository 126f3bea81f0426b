"""Tool policy: rule precedence, argument constraints (hostile inputs first), config-shaped rules."""

from __future__ import annotations

import fnmatch
import os
import posixpath
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cellblock.policy.constraints import realpath
from cellblock.policy.rules import DEFAULT_RULE, Policy, _literal_count, parse_rule_entry
from cellblock.policy.types import Constraint, ConstraintKind, Decision, ToolRule, Verdict

ALLOW, DENY, ASK = Decision.ALLOW, Decision.DENY, Decision.ASK


def policy(
    rules: Mapping[str, Any], default: Decision = ASK, cwd: str | None = None, home: str | None = None
) -> Policy:
    return Policy(default, tuple(parse_rule_entry(p, b) for p, b in rules.items()), cwd, home)


def constrained(arg: str, spec: Mapping[str, Any], **kw: Any) -> Policy:
    return policy({"tool": {"decision": "allow", "args": {arg: spec}}}, **kw)


# -- precedence ------------------------------------------------------------------------------

PRECEDENCE_RULES = {
    "*": "ask",
    "read_*": "allow",
    "read_secret*": "deny",
    "read_secret_ok": "allow",
    "delete_*": "deny",
    "delete_tmp": "ask",
    "?rite_file": "ask",
    "write_[abc]*": "allow",  # a class is not a literal: 6 literals, fewer than "?rite_file"'s 9
}


@pytest.mark.parametrize(
    ("tool", "decision", "rule"),
    [
        # a longer glob beats a shorter one, whatever their decisions
        ("read_secret_key", DENY, "read_secret*"),
        ("read_secrets", DENY, "read_secret*"),
        ("delete_file", DENY, "delete_*"),
        # an exact name beats every glob, even a deny
        ("read_secret_ok", ALLOW, "read_secret_ok"),
        ("delete_tmp", ASK, "delete_tmp"),
        ("read_file", ALLOW, "read_*"),
        ("write_file", ASK, "?rite_file"),
        ("write_a_thing", ALLOW, "write_[abc]*"),
        ("other", ASK, "*"),
        # globs are case-sensitive and anchored
        ("READ_secret_key", ASK, "*"),
        ("xread_file", ASK, "*"),
    ],
)
def test_the_most_specific_rule_decides(tool: str, decision: Decision, rule: str) -> None:
    verdict = policy(PRECEDENCE_RULES).decide(tool, {})
    assert (verdict.decision, verdict.rule) == (decision, rule)


def test_a_tool_no_rule_matches_gets_the_default() -> None:
    p = policy({"read_*": "allow"}, default=DENY)
    assert p.decide("write_file", None) == Verdict(
        DENY, DEFAULT_RULE, "tool 'write_file' matches no rule and the default denies it"
    )
    assert p.rule_for("write_file") == (DEFAULT_RULE, None)


@pytest.mark.parametrize("order", [("*_file", "read_*"), ("read_*", "*_file")])
def test_equally_specific_globs_resolve_to_the_stricter_decision_in_any_order(order: tuple[str, str]) -> None:
    decisions = {"*_file": "allow", "read_*": "deny"}
    p = policy({pattern: decisions[pattern] for pattern in order})
    assert p.decide("read_file", {}).decision is DENY
    flipped = policy({pattern: {"allow": "deny", "deny": "allow"}[decisions[pattern]] for pattern in order})
    assert flipped.decide("read_file", {}).decision is DENY


def test_equally_specific_globs_with_one_decision_pick_the_smallest_pattern() -> None:
    p = policy({"read_*": "ask", "*_file": "ask"})
    assert p.rule_for("read_file")[0] == "*_file"


def test_a_deny_rule_denies_and_hides_whatever_the_arguments() -> None:
    p = policy({"delete_*": "deny", "read_*": "allow"})
    for arguments in (None, {}, {"path": "/tmp/x"}, {"anything": [1, 2]}):
        assert p.decide("delete_all", arguments) == Verdict(
            DENY, "delete_*", "tool 'delete_all' is denied by rule 'delete_*'"
        )
    assert p.hidden("delete_all")
    assert not p.hidden("read_file")


def test_a_default_deny_hides_unmatched_tools_and_an_ask_does_not() -> None:
    assert policy({}, default=DENY).hidden("anything")
    assert not policy({}, default=ASK).hidden("anything")


def test_constraints_only_narrow_ask_to_deny_never_widen_it() -> None:
    p = policy({"tool": {"decision": "ask", "args": {"mode": {"one_of": ["a"]}}}})
    assert p.decide("tool", {"mode": "a"}).decision is ASK
    assert p.decide("tool", {"mode": "b"}).decision is DENY


def test_a_tool_name_that_is_not_text_is_denied() -> None:
    assert policy({}, default=ALLOW).decide(3, {}).decision is DENY  # type: ignore[arg-type]  # hostile caller


def test_two_rules_with_one_pattern_are_refused() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        Policy(ASK, (ToolRule("a", ALLOW), ToolRule("a", DENY)))


def test_the_lookup_is_the_same_after_the_cache_fills() -> None:
    p = policy({"read_*": "allow"}, default=DENY)
    for i in range(5000):
        p.decide(f"t{i}", None)
    assert p.decide("read_x", None).decision is ALLOW
    assert p.decide("t1", None).decision is DENY


# -- under / not_under -----------------------------------------------------------------------


@pytest.fixture
def tree(tmp_path: Path) -> dict[str, str]:
    """home/u/projects (the root) with symlinks that lead out, one that stays in, and neighbours."""
    base = Path(os.path.realpath(tmp_path))
    home = base / "home" / "u"
    root = home / "projects"
    (root / "sub").mkdir(parents=True)
    (root / "inner").mkdir()
    (home / "projects-evil").mkdir()
    (home / ".ssh").mkdir()
    (home / ".ssh" / "id_rsa").write_text("key")
    outside = base / "outside"
    outside.mkdir()
    (outside / "passwd").write_text("x")
    (root / "link_out").symlink_to(outside)
    (root / "link_file").symlink_to(outside / "passwd")
    (root / "link_up").symlink_to("..")
    (root / "link_in").symlink_to(root / "inner")
    (home / "innocent").symlink_to(home / ".ssh")
    (base / "root_link").symlink_to(root)
    return {"base": str(base), "home": str(home), "root": str(root), "outside": str(outside)}


def under_policy(tree: dict[str, str], roots: list[str] | None = None, cwd: str | None = "sub") -> Policy:
    return constrained(
        "path",
        {"under": roots or ["~/projects"]},
        cwd=None if cwd is None else f"{tree['root']}/{cwd}",
        home=tree["home"],
    )


@pytest.mark.parametrize(
    "path",
    [
        "{root}/../projects-evil/x",
        "{root}-evil/x",
        "{root}-evil",
        "{root}/sub/../../..",
        "{root}/./sub/../../.ssh/id_rsa",
        "{root}/link_out/passwd",
        "{root}/link_out",
        "{root}/link_file",
        "{root}/link_up/.ssh/id_rsa",
        "{root}/link_out/../outside/passwd",
        "~",
        "~/projects-evil/x",
        "~/../u2/projects/x",
        "~/projects/../.ssh",
        "~root/projects/x",
        "~~/projects",
        "../../x",
        "../../projects-evil",
        "sub/../../../outside",
        "{outside}/passwd",
        "/etc/passwd",
        "/",
        "",
        "{root}/x\x00/../../../etc",
        "//etc/passwd",
    ],
)
def test_a_path_that_resolves_outside_the_root_is_denied(tree: dict[str, str], path: str) -> None:
    verdict = under_policy(tree).decide("tool", {"path": path.format(**tree)})
    assert verdict.decision is DENY
    assert verdict.rule == "tool"
    assert verdict.reason.startswith("argument 'path' ")


@pytest.mark.parametrize(
    "path",
    [
        "{root}",
        "{root}/",
        "{root}/a/b.txt",
        "{root}//a",
        "{root}/./a/../b",
        "{root}/link_in/x",
        "{root}/link_up/projects/a",
        "{base}/root_link/a",
        "~/projects",
        "~/projects/",
        "~/projects/a",
        "x.txt",
        "./x.txt",
        "../x.txt",
        "..",
    ],
)
def test_a_path_that_resolves_inside_the_root_is_allowed(tree: dict[str, str], path: str) -> None:
    assert under_policy(tree).decide("tool", {"path": path.format(**tree)}).decision is ALLOW


def test_the_reason_shows_the_value_and_what_it_resolved_to(tree: dict[str, str]) -> None:
    reason = under_policy(tree).decide("tool", {"path": f"{tree['root']}/link_file"}).reason
    assert reason == (
        f"argument 'path' '{tree['root']}/link_file' (resolved to '{tree['outside']}/passwd') "
        f"is not under {tree['root']}"
    )


def test_a_relative_path_is_denied_when_the_server_has_no_cwd(tree: dict[str, str]) -> None:
    verdict = under_policy(tree, cwd=None).decide("tool", {"path": "x.txt"})
    assert verdict.decision is DENY
    assert "relative path" in verdict.reason


def test_a_root_given_through_a_symlink_or_with_a_trailing_slash_is_the_same_root(tree: dict[str, str]) -> None:
    for root in (f"{tree['base']}/root_link", f"{tree['root']}/", "~/projects/"):
        p = under_policy(tree, roots=[root])
        assert p.decide("tool", {"path": f"{tree['root']}/a"}).decision is ALLOW
        assert p.decide("tool", {"path": f"{tree['root']}-evil/a"}).decision is DENY


def test_any_of_several_roots_admits_a_path(tree: dict[str, str]) -> None:
    p = under_policy(tree, roots=["~/projects", tree["outside"]])
    assert p.decide("tool", {"path": f"{tree['outside']}/passwd"}).decision is ALLOW
    assert p.decide("tool", {"path": f"{tree['home']}/.ssh"}).decision is DENY


@pytest.mark.parametrize(
    "path",
    ["~/.ssh/id_rsa", "~/.ssh", "~/x/../.ssh/id_rsa", "~/innocent/id_rsa", "~/.SSH/id_rsa", "../../.ssh"],
)
def test_not_under_denies_every_way_into_the_excluded_directory(tree: dict[str, str], path: str) -> None:
    p = constrained("path", {"not_under": "~/.ssh"}, cwd=f"{tree['root']}/sub", home=tree["home"])
    verdict = p.decide("tool", {"path": path})
    assert verdict.decision is DENY
    assert "which this rule excludes" in verdict.reason


@pytest.mark.parametrize("path", ["~/.sshx/id", "~/projects/a", "~/.ssh-old", "x"])
def test_not_under_allows_paths_beside_the_excluded_directory(tree: dict[str, str], path: str) -> None:
    p = constrained("path", {"not_under": "~/.ssh"}, cwd=f"{tree['root']}/sub", home=tree["home"])
    assert p.decide("tool", {"path": path}).decision is ALLOW


def test_under_and_not_under_together_must_both_hold(tree: dict[str, str]) -> None:
    p = constrained("path", {"under": "~/projects", "not_under": "~/projects/inner"}, home=tree["home"])
    assert p.decide("tool", {"path": "~/projects/a"}).decision is ALLOW
    assert p.decide("tool", {"path": "~/projects/link_in/a"}).decision is DENY


def test_a_tilde_path_is_denied_when_no_home_is_known(tree: dict[str, str]) -> None:
    p = constrained("path", {"under": tree["root"]})
    assert p.decide("tool", {"path": "~/projects/a"}).decision is DENY
    assert p.decide("tool", {"path": f"{tree['root']}/a"}).decision is ALLOW


def test_gap_a_symlink_swapped_in_after_the_decision_is_not_seen(tree: dict[str, str]) -> None:
    """GAP: paths are resolved when the call is decided; a link made between the decision and the
    server's own open() is stopped by the jail's mounts, not by the policy."""
    p = under_policy(tree)
    late = f"{tree['root']}/late"
    assert p.decide("tool", {"path": late}).decision is ALLOW
    os.symlink(tree["outside"], late)
    assert p.decide("tool", {"path": late}).decision is DENY


# -- argument shapes -------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        (None, "argument 'path' is missing"),
        ({}, "argument 'path' is missing"),
        ({"Path": "/ok/a"}, "argument 'path' is missing"),
        ({"path": None}, "argument 'path' is null"),
        ({"path": 3}, "is not a path (got number)"),
        ({"path": True}, "is not a path (got boolean)"),
        ({"path": {"p": "/ok/a"}}, "is not a path (got object)"),
        ({"path": []}, "argument 'path' is an empty array"),
        ({"path": ["/ok/a", "/ok/b", "/etc/passwd"]}, "argument 'path[2]' '/etc/passwd' is not under /ok"),
        ({"path": ["/ok/a", None]}, "argument 'path[1]' is not a path (got null)"),
        ({"path": ["/ok/a", ["/etc"]]}, "argument 'path[1]' is not a path (got array)"),
        (["/ok/a"], "the arguments are not an object (got array)"),
    ],
)
def test_a_constrained_argument_that_is_missing_or_malformed_is_denied(arguments: Any, fragment: str) -> None:
    verdict = constrained("path", {"under": "/ok"}).decide("tool", arguments)
    assert verdict.decision is DENY
    assert fragment in verdict.reason


def test_an_array_of_good_paths_is_allowed_and_unconstrained_arguments_are_ignored() -> None:
    p = constrained("path", {"under": "/ok"})
    assert p.decide("tool", {"path": ["/ok/a", "/ok/b"], "other": "/etc/passwd"}).decision is ALLOW


@pytest.mark.parametrize(
    ("arguments", "fragment"),
    [
        ({"files": [{"path": "/ok/a"}, {"path": "/etc/x"}]}, "argument 'files[1].path' '/etc/x'"),
        ({"files": [{"path": "/ok/a"}, {"name": "x"}]}, "argument 'files[1].path' is missing"),
        ({"files": [{"path": "/ok/a"}, "/ok/b"]}, "argument 'files[1]' is not an object (got text)"),
        ({"files": [{"path": ["/ok/a", "/etc/x"]}]}, "argument 'files[0].path[1]'"),
        ({"files": []}, "argument 'files' is an empty array"),
        ({"files": [[{"path": "/ok/a"}]]}, "array inside an array"),
        ({"files": {"path": "/etc/x"}}, "argument 'files.path' '/etc/x'"),
        ({"files": "/ok/a"}, "argument 'files' is not an object"),
        ({"files.path": "/ok/a"}, "argument 'files' is missing"),
        ({"files.path": "/ok/a", "files": {"path": "/etc/x"}}, "argument 'files.path' '/etc/x'"),
    ],
)
def test_every_element_along_a_nested_argument_path_is_checked(arguments: Any, fragment: str) -> None:
    verdict = constrained("files.path", {"under": "/ok"}).decide("tool", arguments)
    assert verdict.decision is DENY
    assert fragment in verdict.reason


def test_nested_arguments_inside_the_root_are_allowed() -> None:
    p = constrained("files.path", {"under": "/ok"})
    assert p.decide("tool", {"files": [{"path": "/ok/a"}, {"path": ["/ok/b", "/ok/c"]}]}).decision is ALLOW
    assert p.decide("tool", {"files": {"path": "/ok/a"}}).decision is ALLOW


def test_a_long_value_is_shortened_in_the_reason() -> None:
    reason = constrained("path", {"under": "/ok"}).decide("tool", {"path": "/etc/" + "a" * 10_000}).reason
    assert "…" in reason
    assert len(reason) < 600


# -- hosts -----------------------------------------------------------------------------------

HOSTS = ["good.com", "*.api.net", "local.test:8443", "10.0.0.0/8"]


@pytest.mark.parametrize(
    "url",
    [
        "https://user@evil.com@good.com/",
        "https://good.com@evil.com/",
        "https://good.com.evil.com/",
        "https://evil.com\\@good.com/",
        "https://evil.com\\.good.com/",
        "https://evil.com#@good.com",
        "https://evil.com?@good.com",
        "https://evil.com/good.com",
        "https://evil.com/https://good.com",
        "https://good.com:8443/",
        "https://good.com:0/",
        "https://good.com:65536/",
        "https://good.com:/",
        "https://good.com:80:443/",
        "https://good.com:abc/",
        "https://good.com:+443/",
        "https://good.com\t/",
        "https://go od.com/",
        "https://good.com\n.evil.com/",
        "https://good.com\x00.evil.com/",
        "https://good%2ecom/",
        "https://good.com%2eevil.com/",
        "https://g\u043e\u043ed.com/",  # Cyrillic o
        "https://good\u3002com/",  # ideographic full stop
        "https://\uff47\uff4f\uff4f\uff44.com/",  # fullwidth
        "https://[good.com]/",
        "https://[::1/",
        "https://0x0a.0.0.1/",
        "https://167772161/",
        "https://10.1/",
        "https://api.net/",
        "https://local.test/",
        "http://local.test:8444/",
        "ftp://good.com/",
        "file://good.com/etc/passwd",
        "javascript://good.com/%0aalert(1)",
        "//good.com/",
        "good.com",
        "https:/good.com",
        "https:///good.com",
        "https://",
        "",
    ],
)
def test_a_url_whose_host_is_not_allowed_or_is_ambiguous_is_denied(url: str) -> None:
    verdict = constrained("url", {"hosts": HOSTS}).decide("tool", {"url": url})
    assert verdict.decision is DENY
    assert verdict.reason.startswith("argument 'url' ")


@pytest.mark.parametrize(
    "url",
    [
        "https://good.com",
        "https://good.com/",
        "https://GOOD.com./x",
        "HTTPS://Good.Com:443/x?y=1#z",
        "http://good.com:80/",
        "http://good.com:443/",
        "https://user:pw@good.com/",
        "wss://x.api.net/socket",
        "ws://a.b.api.net",
        "https://local.test:8443/",
        "https://10.1.2.3/",
    ],
)
def test_a_url_to_an_allowed_host_and_port_is_allowed(url: str) -> None:
    assert constrained("url", {"hosts": HOSTS}).decide("tool", {"url": url}).decision is ALLOW


@pytest.mark.parametrize(
    "value", [3, None, True, {"url": "https://good.com"}, ["https://good.com", "https://evil.com"]]
)
def test_a_hosts_argument_that_is_not_a_url_string_is_denied(value: Any) -> None:
    assert constrained("url", {"hosts": HOSTS}).decide("tool", {"url": value}).decision is DENY


def test_the_hosts_reason_names_the_normalised_host_and_port() -> None:
    reason = constrained("url", {"hosts": "good.com"}).decide("tool", {"url": "https://EVIL.com./"}).reason
    assert reason == (
        "argument 'url' 'https://EVIL.com./' goes to evil.com port 443, which is not an allowed host (good.com)"
    )


# -- one_of / matches ------------------------------------------------------------------------


@pytest.mark.parametrize(
    "value",
    [
        "READ",
        "read ",
        " read",
        "readwrite",
        "rea",
        4,
        "4",
        "3.0",
        1,
        False,
        None,
        float("nan"),
        {"a": 1},
        ["read", "x"],
    ],
)
def test_one_of_denies_anything_not_equal_to_a_listed_value(value: Any) -> None:
    p = constrained("mode", {"one_of": ["read", "write", "3", "true"]})
    assert p.decide("tool", {"mode": value}).decision is DENY


@pytest.mark.parametrize("value", ["read", "write", "3", 3, 3.0, True, "true", ["read", "write"]])
def test_one_of_allows_equal_text_numbers_by_value_and_json_booleans(value: Any) -> None:
    p = constrained("mode", {"one_of": ["read", "write", "3", "true"]})
    assert p.decide("tool", {"mode": value}).decision is ALLOW


def test_one_of_does_not_confuse_booleans_with_one_and_zero() -> None:
    assert constrained("m", {"one_of": ["1", "0"]}).decide("tool", {"m": True}).decision is DENY
    assert constrained("m", {"one_of": ["true"]}).decide("tool", {"m": 1}).decision is DENY
    assert constrained("m", {"one_of": [1, True]}).decide("tool", {"m": 1}).decision is ALLOW


@pytest.mark.parametrize("value", ["abc;rm", "abc\n", "abc def", "", "ABC", "abc\x00", 3, None, ["abc", "a-b"]])
def test_matches_requires_a_full_match(value: Any) -> None:
    assert constrained("name", {"matches": ["[a-z]+"]}).decide("tool", {"name": value}).decision is DENY


def test_matches_passes_when_any_pattern_fully_matches() -> None:
    p = constrained("name", {"matches": ["[a-z]+", "[0-9]{3}"]})
    assert p.decide("tool", {"name": "abc"}).decision is ALLOW
    assert p.decide("tool", {"name": "123"}).decision is ALLOW
    assert p.decide("tool", {"name": ["abc", "123"]}).decision is ALLOW
    assert p.decide("tool", {"name": "1234"}).decision is DENY


def test_every_constrained_argument_must_pass() -> None:
    p = policy({"tool": {"decision": "allow", "args": {"a": {"one_of": "x"}, "b": {"matches": "[0-9]+"}}}})
    assert p.decide("tool", {"a": "x", "b": "1"}).decision is ALLOW
    assert "argument 'b'" in p.decide("tool", {"a": "x", "b": "z"}).reason
    assert "argument 'a'" in p.decide("tool", {"a": "y", "b": "1"}).reason


# -- building rules --------------------------------------------------------------------------


def test_parse_rule_entry_builds_both_config_forms() -> None:
    assert parse_rule_entry("read_*", "allow") == ToolRule("read_*", ALLOW, {})
    assert parse_rule_entry("read_*", {"decision": "allow", "args": {}}) == ToolRule("read_*", ALLOW, {})
    rule = parse_rule_entry(
        "write_file", {"decision": "ask", "args": {"path": {"under": ["~/x"], "not_under": "~/x/y"}}}
    )
    assert rule.decision is ASK
    assert rule.args["path"] == (
        Constraint(ConstraintKind.UNDER, ("~/x",)),
        Constraint(ConstraintKind.NOT_UNDER, ("~/x/y",)),
    )


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        ("permit", "decision 'permit' is not one of allow, deny, ask"),
        (None, "expected allow, deny, ask or a mapping"),
        ({"args": {"path": {"under": "/x"}}}, "'decision' is missing"),
        ({"decision": "allow", "arguments": {}}, "unknown key(s) arguments"),
        ({"decision": "allow", "args": None}, "'args' must map argument names"),
        ({"decision": "allow", "args": {"path": {}}}, "argument 'path' needs constraints"),
        (
            {"decision": "allow", "args": {"path": {"inside": "/x", "prefix": "/y"}}},
            "argument 'path': unknown constraint 'inside'; use one of under, not_under",
        ),
        ({"decision": "allow", "args": {"path": {"under": []}}}, "has no values"),
        ({"decision": "allow", "args": {"path": {"under": [3]}}}, "is not text"),
        ({"decision": "allow", "args": {"path": {"under": [""]}}}, "non-empty text"),
        ({"decision": "allow", "args": {"a..b": {"under": "/x"}}}, "argument path 'a..b' is not valid"),
        ({"decision": "allow", "args": {"name": {"matches": ["[a-z"]}}}, "not a valid regular expression"),
        ({"decision": "allow", "args": {"url": {"hosts": ["*"]}}}, "would allow every host"),
        ({"decision": "allow", "args": {"url": {"hosts": ["https://good.com"]}}}, "has a scheme"),
        ({"decision": "deny", "args": {"path": {"under": "/x"}}}, "could never apply"),
    ],
)
def test_a_malformed_rule_entry_is_refused_with_a_reason(body: Any, fragment: str) -> None:
    with pytest.raises(ValueError) as info:
        parse_rule_entry("tool", body)
    assert fragment in str(info.value)
    assert "'tool'" in str(info.value)


def test_an_invalid_regex_built_directly_is_refused_when_the_policy_is_built() -> None:
    rule = ToolRule("tool", ALLOW, {"name": (Constraint(ConstraintKind.MATCHES, ("(",)),)})
    with pytest.raises(ValueError, match=r"tool rule 'tool': argument 'name': matches: '\(' is not a valid"):
        Policy(ASK, (rule,))


@pytest.mark.parametrize(
    ("root", "cwd", "home", "fragment"),
    [
        ("projects", None, "/home/u", "relative path and the server has no working directory"),
        ("~/projects", None, None, "no home directory is known"),
        ("~bob/projects", None, "/home/u", "another user's home"),
    ],
)
def test_a_root_that_cannot_be_resolved_is_refused(root: str, cwd: str | None, home: str | None, fragment: str) -> None:
    with pytest.raises(ValueError, match="tool rule 'tool': argument 'path': under: root") as info:
        constrained("path", {"under": root}, cwd=cwd, home=home)
    assert fragment in str(info.value)


def test_a_relative_cwd_or_home_is_refused() -> None:
    with pytest.raises(ValueError, match="cwd must be an absolute path"):
        Policy(ASK, (), "relative/dir", "/home/u")
    with pytest.raises(ValueError, match="home must be an absolute path"):
        Policy(ASK, (), None, "home/u")


def test_a_relative_root_resolves_against_the_cwd(tree: dict[str, str]) -> None:
    p = constrained("path", {"under": "inner"}, cwd=tree["root"])
    assert p.decide("tool", {"path": f"{tree['root']}/inner/a"}).decision is ALLOW
    assert p.decide("tool", {"path": "inner/../sub"}).decision is DENY


# -- properties ------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def plain_root(tmp_path_factory: pytest.TempPathFactory) -> str:
    """A symlink-free directory tree: base/h/projects (the root) and base/h/projects-evil."""
    base = Path(os.path.realpath(tmp_path_factory.mktemp("plain")))
    (base / "h" / "projects" / "a").mkdir(parents=True)
    (base / "h" / "projects-evil").mkdir()
    return str(base / "h" / "projects")


SEGMENT = st.one_of(
    st.sampled_from(["..", ".", "", "a", "projects", "projects-evil", "h", "..."]),
    st.text(alphabet="abz-_.~", min_size=1, max_size=6),
)


GLOB = st.text(alphabet="ab*?", min_size=1, max_size=5) | st.sampled_from(["[ab]*", "a[!a]*", "*[b]"])
NAME = st.text(alphabet="ab", max_size=6)
STRICTNESS = {DENY: 0, ASK: 1, ALLOW: 2}


@settings(max_examples=300, deadline=None)
@given(globs=st.dictionaries(GLOB, st.sampled_from([ALLOW, DENY, ASK]), max_size=12), names=st.lists(NAME, max_size=10))
def test_the_glob_chosen_for_a_name_is_the_first_in_precedence_that_matches(
    globs: dict[str, Decision], names: list[str]
) -> None:
    """The prefix index picks what trying every glob in precedence order would."""
    rules = {g: d.value for g, d in globs.items() if set(g) & set("*?[")}
    p = policy(rules)
    ranked = sorted(rules, key=lambda g: (-_literal_count(g), STRICTNESS[Decision(rules[g])], g))
    for name in names:
        expected = next((g for g in ranked if fnmatch.fnmatchcase(name, g)), DEFAULT_RULE)
        assert p.decide(name, None).rule == expected, (name, ranked)


def _inside(path: str, root: str) -> bool:
    return path == root or path.startswith(root + "/")


@settings(max_examples=300, deadline=None)
@given(segments=st.lists(SEGMENT, max_size=10), relative=st.booleans())
def test_no_generated_path_outside_the_root_is_allowed_and_none_inside_is_denied(
    plain_root: str, segments: list[str], relative: bool
) -> None:
    cwd = f"{plain_root}/a"
    p = constrained("path", {"under": plain_root}, cwd=cwd)
    path = "/".join(segments) if relative else posixpath.dirname(plain_root) + "/" + "/".join(segments)
    if relative and (not path or path.startswith("~")):
        return  # empty and '~' paths have their own tests
    expected = posixpath.normpath(posixpath.join(cwd, path))
    decision = p.decide("tool", {"path": path}).decision
    assert decision is (ALLOW if _inside(expected, plain_root) else DENY), (path, expected)


@settings(max_examples=200, deadline=None)
@given(segments=st.lists(st.one_of(st.just("."), st.text(alphabet="abz-_", min_size=1, max_size=8)), max_size=8))
def test_every_path_built_inside_the_root_is_allowed(plain_root: str, segments: list[str]) -> None:
    p = constrained("path", {"under": plain_root}, cwd=plain_root)
    inside = "/".join(segments)
    assert p.decide("tool", {"path": f"{plain_root}/{inside}"}).decision is ALLOW
    assert p.decide("tool", {"path": inside or "."}).decision is ALLOW
    assert p.decide("tool", {"path": f"{plain_root}-evil/{inside}"}).decision is DENY


def test_a_missing_name_is_resolved_through_its_unicode_twin(tmp_path: Path) -> None:
    root, outside = tmp_path / "root", tmp_path / "outside"
    root.mkdir()
    outside.mkdir()
    (root / "cafe\u0301").symlink_to(outside)  # decomposed name, a link out of the root
    p = constrained("path", {"under": str(root)})
    composed = p.decide("tool", {"path": f"{root}/caf\u00e9/secret"})
    assert composed.decision is Decision.DENY and str(outside) in composed.reason
    plain = p.decide("tool", {"path": f"{root}/new-file"})
    assert plain.decision is Decision.ALLOW  # the control: a new file inside is fine


def test_the_kernels_answer_for_a_path_is_the_one_pythons_walk_gives(tmp_path: Path) -> None:
    (tmp_path / "dir" / "sub").mkdir(parents=True)
    (tmp_path / "file").write_text("x")
    (tmp_path / "link").symlink_to(tmp_path / "dir")
    (tmp_path / "chain").symlink_to(tmp_path / "link" / "sub")
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    (tmp_path / "loop").symlink_to(tmp_path / "loop")
    os.mkfifo(tmp_path / "fifo")  # opened for its name only: nothing blocks, nothing is read
    for name in ("dir", "file", "link", "chain/..", "chain/../../file", "dangling", "loop", "fifo", "new/x/.."):
        path = f"{tmp_path}/{name}"
        assert realpath(path) == os.path.realpath(path), name
