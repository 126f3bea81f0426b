"""Lint: policy rules that cannot do what they seem to say, given the jail and the catalog.

Each finding is a sentence that names the server, the rule and the fix. Lint never changes what
is enforced: a rule that lint doubts is still applied exactly as written.
"""

from __future__ import annotations

import fnmatch
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

from cellblock.policy.constraints import within
from cellblock.policy.hosts import HostKind, parse_rule
from cellblock.policy.templates import MAX_TEMPLATE, template_matches, template_too_long
from cellblock.policy.types import ConstraintKind, Decision, ToolRule

__all__ = ["WRITING_WORDS", "JailView", "lint_items", "lint_policy"]

# Without a catalog to read annotations from, a tool whose name has one of these writes.
WRITING_WORDS = ("write", "edit", "create", "move", "delete", "remove", "put", "save", "append", "rename", "mkdir")


@dataclass(frozen=True)
class JailView:
    """What lint needs to know of a server's jail (`None` for a remote or unjailed server)."""

    read_only: tuple[str, ...]
    read_write: tuple[str, ...]
    network: str
    allow_hosts: tuple[str, ...]


def _real(path: str, home: str, cwd: str | None = None) -> str:
    """`path` as the policy resolves it: `~` is `home`, a relative one is under the server's `cwd`."""
    expanded = home + path[1:] if path == "~" or path.startswith("~/") else path
    return os.path.realpath(os.path.join(cwd, expanded) if cwd is not None else expanded)


def _inside(path: str, roots: Iterable[str]) -> bool:
    return any(within(path, r) for r in roots)


def _writes(tool: str, read_only_hint: bool | None) -> bool:
    if read_only_hint is not None:
        return not read_only_hint
    return any(word in tool.lower() for word in WRITING_WORDS)


def _tools_for(pattern: str, tools: Iterable[str]) -> list[str]:
    return [t for t in tools if t == pattern or fnmatch.fnmatchcase(t, pattern)]


def _host_covered(pattern: str, allow: list[str]) -> bool:
    wanted = parse_rule(pattern)
    for entry in allow:
        rule = parse_rule(entry)
        if wanted.port is not None and rule.port is not None and wanted.port != rule.port:
            continue
        if wanted.port is None and rule.port is not None:
            continue  # the constraint allows 80 and 443, the allowlist one port only
        if rule.host == wanted.host and rule.kind == wanted.kind:
            return True
        if rule.kind is HostKind.SUFFIX and wanted.host.endswith("." + rule.host):
            return True
    return False


def lint_policy(
    server: str,
    rules: Iterable[ToolRule],
    jail: JailView | None,
    home: str,
    catalog: Mapping[str, bool | None] | None = None,
    cwd: str | None = None,
) -> list[str]:
    """Findings for one server's rules. `catalog`: locked tool name -> its readOnlyHint, if known;
    `cwd`: the server's working directory, which relative roots resolve against."""
    findings: list[str] = []
    for rule in rules:
        where = f"server '{server}': tools.rules.{rule.pattern}"
        matched = _tools_for(rule.pattern, catalog) if catalog is not None else [rule.pattern]
        if catalog is not None and not matched:
            findings.append(
                f"{where} matches no tool of the locked catalog; check the name (rules use the server's own tool names)"
            )
        if rule.decision is Decision.DENY or jail is None:
            continue
        shared_rw = [_real(p, home) for p in jail.read_write]
        grants = (*jail.read_only, *jail.read_write)
        shared = [_real(p, home) for p in grants]
        for arg, constraints in rule.args.items():
            for constraint in constraints:
                if constraint.kind in (ConstraintKind.UNDER, ConstraintKind.NOT_UNDER):
                    for root in constraint.values:
                        real = _real(root, home, cwd)
                        grant = next((g for g, r in zip(grants, shared, strict=True) if _inside(real, [r])), None)
                        if constraint.kind is ConstraintKind.NOT_UNDER and grant is not None:
                            # the server reaches it through its mounts: only the check keeps calls out,
                            # and a link swapped in after the check gets past it
                            findings.append(
                                f"{where}.args.{arg}: not_under {root} lies inside {grant}, which the jail shares, "
                                f"so only the check keeps the server out of it (not the kernel); share the "
                                f"folders beside {root} instead of {grant}"
                            )
                        if constraint.kind is ConstraintKind.UNDER and not _inside(real, shared):
                            findings.append(
                                f"{where}.args.{arg}: under {root} is not shared with the jail, so the server "
                                "cannot reach it; add it to jail.read_only or jail.read_write"
                            )
                        elif constraint.kind is ConstraintKind.UNDER and any(
                            _writes(t, catalog.get(t) if catalog else None) for t in matched
                        ):
                            holding = [
                                (g, r) for g, r in zip(jail.read_write, shared_rw, strict=True) if _inside(real, [r])
                            ]
                            # a grant around the root lets the kernel allow writes beside it, whatever else is granted
                            wider = [g for g, r in holding if r != real]
                            if not holding:
                                findings.append(
                                    f"{where}.args.{arg}: under {root} is for a tool that writes, but the jail shares "
                                    "it read-only; add it to jail.read_write, or the writes will fail"
                                )
                            elif wider:
                                # the check runs before the server opens the path: a link swapped in
                                # between gets past it, and only the mounts hold then
                                findings.append(
                                    f"{where}.args.{arg}: under {root} is for a tool that writes, but the jail shares "
                                    f"all of {wider[0]} read-write, so only the check keeps writes inside {root} "
                                    f"(not the kernel); share {root} in jail.read_write and {wider[0]} in "
                                    "jail.read_only"
                                )
                if constraint.kind is ConstraintKind.HOSTS:
                    if jail.network == "none":
                        findings.append(f"{where}.args.{arg}: hosts rule, but the jail has no network (network: none)")
                    elif jail.network == "allowlist":
                        for pattern in constraint.values:
                            if not _host_covered(pattern, list(jail.allow_hosts)):
                                findings.append(
                                    f"{where}.args.{arg}: hosts {pattern} is wider than the jail's allow_hosts "
                                    f"({', '.join(jail.allow_hosts)}); the egress proxy refuses what it adds"
                                )
    return findings


def lint_items(server: str, kind: str, rules: Iterable[ToolRule], names: Iterable[str] | None) -> list[str]:
    """Findings for one server's `prompts` or `resources` rules (`kind` "prompt" or "resource").
    `names`: the locked catalog's prompt names, or its resource URIs and template texts, if known.
    A resource rule matches a template when it matches the template's text or the template can
    expand to the rule's URI."""
    if names is None:
        return []
    names = list(names)
    findings = [
        f"server '{server}': resource template {n[:60]!r}... is longer than {MAX_TEMPLATE} characters, so it "
        "matches no URI; a read it would cover is unlisted (only a rule naming that URI lets it through)"
        for n in names
        if kind == "resource" and "{" in n and template_too_long(n)
    ]
    for rule in rules:
        matched = [
            n
            for n in names
            if n == rule.pattern
            or fnmatch.fnmatchcase(n, rule.pattern)
            or (kind == "resource" and template_matches(n, rule.pattern))
        ]
        if not matched:
            what = "prompt" if kind == "prompt" else "resource or template"
            own = "prompt names" if kind == "prompt" else "URIs (not the cellblock:// ones the client sees)"
            findings.append(
                f"server '{server}': {kind}s.rules.{rule.pattern} matches no {what} of the locked catalog; "
                f"check it (rules use the server's own {own})"
            )
    return findings
