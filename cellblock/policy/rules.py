"""Per-tool policy: which rule applies to a tool, and whether a call's arguments meet its constraints.

The same machinery decides prompts (by name, with their arguments) and resources (by URI): a
`Policy` whose `kind` is "prompt" or "resource" differs only in the words of its reasons.

Precedence (DESIGN.md, "Rules"): an exact tool name beats a glob; among globs the one with the most
literal (non-wildcard) characters wins; equally specific globs are ordered strictest decision first
(deny, ask, allow) and then by the lexicographically smallest pattern; then `default`.

Argument constraints fail closed: a constrained argument that is missing, null, of the wrong type,
an empty array, or an array with any element outside the constraint denies the call. Argument paths
are dot-separated ("options.path"); a list met along the path or at its end is checked element by
element ("files.path" checks every `files[i].path`).

Each constraint is compiled into a check by `policy/constraints.py`, where paths are resolved (the
only I/O).
"""

from __future__ import annotations

import fnmatch
import math
import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cellblock.policy.constraints import (
    Check,
    Reject,
    compile_constraint,
    expand_home,
    host_rules,
    regexes,
    show,
    type_name,
)
from cellblock.policy.types import Constraint, ConstraintKind, Decision, ToolRule, Verdict, constraint_kind

__all__ = ["DEFAULT_RULE", "READ_ONLY_RULE", "Policy", "parse_rule_entry"]

DEFAULT_RULE = "default"  # Verdict.rule when no rule matches the tool
READ_ONLY_RULE = "read_only"  # Verdict.rule of a tool the user let run without asking

# Tool names are attacker-chosen on a call; the lookup cache is cleared rather than grown past this.
_CACHE_MAX = 4096
_STRICTNESS = {Decision.DENY: 0, Decision.ASK: 1, Decision.ALLOW: 2}
_GLOB_CHARS = frozenset("*?[")
_SCALARS = frozenset({str, int, float, bool})


# -- the policy ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Policy:
    """The tool policy of one server.

    `kind` names what the rules match in reasons ("tool", "prompt", "resource"). `read_only`:
    "review" lets a tool the user let run without asking (`policy/unasked.py`) pass without
    asking where no rule names it and the default would ask; "ask" (the default) never. `cwd` is the
    server's working directory (relative path arguments resolve against it; with None
    they are denied); `home` expands a leading `~` (with None such paths are denied).

    Raises:
        ValueError: a bad default, two rules with the same pattern, a relative `cwd` or `home`, a
            path root that cannot be resolved, a host rule `hosts.parse_rule` refuses, or an
            invalid regular expression; the message names the rule and the argument.
        TypeError: a rule that is not a ToolRule.
    """

    default: Decision
    rules: tuple[ToolRule, ...] = ()
    cwd: str | None = None
    home: str | None = None
    kind: str = "tool"
    read_only: str = "ask"
    _exact: dict[str, _Compiled] = field(init=False, repr=False, compare=False)
    _globs: dict[str, list[tuple[int, re.Pattern[str], _Compiled]]] = field(init=False, repr=False, compare=False)
    _cache: dict[str, tuple[_Compiled | None, Verdict]] = field(init=False, repr=False, compare=False)
    _cwd_real: str | None = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        try:
            default = Decision(self.default)
        except ValueError:
            raise ValueError(f"{self.kind}s.default {self.default!r} is not one of allow, deny, ask") from None
        object.__setattr__(self, "default", default)
        if self.read_only not in ("ask", "review"):
            raise ValueError(f"{self.kind}s.read_only {self.read_only!r} is not one of ask, review")
        object.__setattr__(self, "rules", tuple(self.rules))
        if self.home is not None and not os.path.isabs(self.home):
            raise ValueError(f"home must be an absolute path (got {self.home!r})")
        cwd_real = None
        if self.cwd is not None:
            cwd = expand_home(self.cwd, self.home)
            if cwd is None or not os.path.isabs(cwd):
                raise ValueError(f"cwd must be an absolute path (got {self.cwd!r})")
            cwd_real = os.path.realpath(cwd)
        object.__setattr__(self, "_cwd_real", cwd_real)

        exact: dict[str, _Compiled] = {}
        globs: list[tuple[tuple[int, int, str], str, re.Pattern[str], _Compiled]] = []
        seen: set[str] = set()
        for rule in self.rules:
            if not isinstance(rule, ToolRule):
                raise TypeError(f"policy rules must be ToolRule values (got {type(rule).__name__})")
            if rule.pattern in seen:
                raise ValueError(f"{self.kind} rule {rule.pattern!r} appears twice; keep one")
            seen.add(rule.pattern)
            compiled = self._compile(rule)
            if _GLOB_CHARS.isdisjoint(rule.pattern):
                exact[rule.pattern] = compiled
            else:
                key = (-_literal_count(rule.pattern), _STRICTNESS[rule.decision], rule.pattern)
                regex = re.compile(fnmatch.translate(rule.pattern))
                globs.append((key, _literal_prefix(rule.pattern), regex, compiled))
        globs.sort(key=lambda g: g[0])
        # globs by their literal prefix: a name is tried only against the globs its own prefixes
        # select, in precedence order (a few, where there are hundreds of rules)
        by_prefix: dict[str, list[tuple[int, re.Pattern[str], _Compiled]]] = {}
        for rank, (_, prefix, regex, compiled) in enumerate(globs):
            by_prefix.setdefault(prefix, []).append((rank, regex, compiled))
        object.__setattr__(self, "_exact", exact)
        object.__setattr__(self, "_globs", by_prefix)
        object.__setattr__(self, "_cache", {})

    def decide(self, tool: str, arguments: Mapping[str, Any] | None, *, unasked: bool = False) -> Verdict:
        """Decide one call of `tool` with `arguments` (the call's JSON object, or None); `unasked`:
        the user let this tool run without asking at review, for the definition the lock approves."""
        compiled, verdict = self._lookup(tool)
        if unasked and compiled is None and verdict.decision is Decision.ASK and self.read_only == "review":
            reason = (
                f"{self.kind} {show(tool)} is marked read-only by its server, and the user let it run without "
                "asking at review"
            )
            return Verdict(Decision.ALLOW, READ_ONLY_RULE, reason)
        if compiled is None or not compiled.args or verdict.decision is Decision.DENY:
            return verdict
        failure = compiled.check(arguments)
        if failure is not None:
            return Verdict(Decision.DENY, compiled.rule.pattern, failure)
        return verdict

    def strictest(self, names: Sequence[str], arguments: Mapping[str, Any] | None = None) -> str:
        """Of several names for one item (the spellings of a URI), the one whose verdict is the
        strictest: deny, then ask, then allow; the first of those that tie."""
        return min(names, key=lambda name: _STRICTNESS[self.decide(name, arguments).decision])

    def rule_for(self, tool: str) -> tuple[str, ToolRule | None]:
        """The name of the rule that applies to `tool` (its pattern, or "default") and the rule."""
        compiled, verdict = self._lookup(tool)
        return verdict.rule, (None if compiled is None else compiled.rule)

    def unasked(self, tool: str) -> bool:
        """Whether a call of `tool` runs without asking anyone: its rule (or the default) allows
        it, within the rule's constraints where it has some."""
        return self._lookup(tool)[1].decision is Decision.ALLOW

    def hidden(self, tool: str) -> bool:
        """Whether `tool` is denied whatever its arguments (by its rule or the default): not listed."""
        return self._lookup(tool)[1].decision is Decision.DENY

    # -- internals ---------------------------------------------------------------------------

    def _lookup(self, tool: str) -> tuple[_Compiled | None, Verdict]:
        hit = self._cache.get(tool) if isinstance(tool, str) else None
        if hit is None:
            hit = self._match(tool)
            if isinstance(tool, str):
                if len(self._cache) >= _CACHE_MAX:
                    self._cache.clear()
                self._cache[tool] = hit
        return hit

    def _match(self, tool: str) -> tuple[_Compiled | None, Verdict]:
        if not isinstance(tool, str):
            return None, Verdict(Decision.DENY, DEFAULT_RULE, f"{self.kind} name {show(tool)} is not text")
        compiled = self._exact.get(tool)
        if compiled is None:
            compiled = self._glob_for(tool)
        shown = f"{self.kind} {show(tool)}"
        if compiled is None:
            reasons = {
                Decision.ALLOW: f"{shown} matches no rule and the default allows it",
                Decision.ASK: f"{shown} matches no rule and the default asks for approval",
                Decision.DENY: f"{shown} matches no rule and the default denies it",
            }
            return None, Verdict(self.default, DEFAULT_RULE, reasons[self.default])
        pattern = compiled.rule.pattern
        reasons = {
            Decision.ALLOW: f"{shown} is allowed by rule {pattern!r}",
            Decision.ASK: f"{shown} needs approval by rule {pattern!r}",
            Decision.DENY: f"{shown} is denied by rule {pattern!r}",
        }
        return compiled, Verdict(compiled.rule.decision, pattern, reasons[compiled.rule.decision])

    def _glob_for(self, tool: str) -> _Compiled | None:
        """The glob rule of highest precedence that matches `tool`, if any."""
        best: tuple[int, _Compiled] | None = None
        for end in range(len(tool) + 1):
            for rank, regex, compiled in self._globs.get(tool[:end], ()):
                if (best is None or rank < best[0]) and regex.match(tool):
                    best = (rank, compiled)
                    break  # the rest under this prefix come later in precedence
        return None if best is None else best[1]

    def _compile(self, rule: ToolRule) -> _Compiled:
        args: list[tuple[str, tuple[str, ...], tuple[Check, ...]]] = []
        for name, constraints in rule.args.items():
            checks: list[Check] = []
            for constraint in constraints:
                try:
                    checks.append(compile_constraint(constraint, self._cwd_real, self.home))
                except ValueError as exc:
                    raise ValueError(f"{self.kind} rule {rule.pattern!r}: argument {name!r}: {exc}") from exc
            args.append((name, tuple(name.split(".")), tuple(checks)))
        return _Compiled(rule, tuple(args))


@dataclass(frozen=True, slots=True)
class _Compiled:
    rule: ToolRule
    args: tuple[tuple[str, tuple[str, ...], tuple[Check, ...]], ...]

    def check(self, arguments: Mapping[str, Any] | None) -> str | None:
        """None when every constrained argument passes, else the reason for the first failure."""
        root: object = {} if arguments is None else arguments
        if not isinstance(root, Mapping):
            return f"the arguments are not an object (got {type_name(root)})"
        for name, parts, checks in self.args:
            value = root.get(name) if len(parts) == 1 and type(root) is dict else None
            if value is not None and type(value) in _SCALARS:
                leaves = [(name, value)]  # the common case, without the walk
            else:
                leaves = []
                try:
                    _collect(root, parts, 0, "", leaves)
                except Reject as exc:
                    return str(exc)
            for shown_name, value in leaves:
                for check in checks:
                    try:
                        check.check(value)
                    except Reject as exc:
                        return f"argument {shown_name!r} {exc}"
        return None


def _collect(value: object, parts: tuple[str, ...], index: int, shown: str, out: list[tuple[str, object]]) -> None:
    """Append every (display name, value) that the argument path `parts[index:]` reaches."""
    if index == len(parts):
        if value is None:
            raise Reject(f"argument {shown!r} is null; the rule requires a value")
        if isinstance(value, list | tuple):
            if not value:
                raise Reject(f"argument {shown!r} is an empty array; the rule requires at least one value")
            out.extend((f"{shown}[{i}]", item) for i, item in enumerate(value))
        else:
            out.append((shown, value))
        return
    if type(value) is dict or isinstance(value, Mapping):
        key = parts[index]
        here = f"{shown}.{key}" if shown else key
        if key not in value:
            raise Reject(f"argument {here!r} is missing; the rule requires it")
        _collect(value[key], parts, index + 1, here, out)
    elif isinstance(value, list | tuple):
        if not value:
            raise Reject(f"argument {shown!r} is an empty array; the rule requires at least one value")
        for i, item in enumerate(value):
            if isinstance(item, list | tuple):
                raise Reject(f"argument '{shown}[{i}]' is an array inside an array, which the rule does not walk")
            _collect(item, parts, index, f"{shown}[{i}]", out)
    else:
        raise Reject(f"argument {shown!r} is not an object (got {type_name(value)}), so {parts[index]!r} is missing")


# -- config-shaped rules ---------------------------------------------------------------------


def parse_rule_entry(pattern: str, body: str | Mapping[str, Any], kind: str = "tool") -> ToolRule:
    """Build a ToolRule from one `tools.rules` entry (`kind`: "prompt" or "resource" for those
    sections; a resource rule has no `args`, as a read has no arguments).

    `body` is a decision (`"allow"`) or `{decision: ..., args: {<argument path>: {<kind>: value
    or [values]}}}`. Regular expressions and host rules are checked here; path roots are checked
    when the Policy (which knows the cwd and home) is built.

    Raises:
        ValueError: an unknown key, decision or constraint kind, `args` that is not a mapping, an
            argument without constraints, a constraint without values, a value that is not text,
            an invalid host rule or regular expression, `args` on a `deny` rule, or on a resource rule.
    """
    where = f"{kind} rule {pattern!r}"
    if isinstance(body, str):
        return ToolRule(pattern, _decision(where, body))
    if not isinstance(body, Mapping):
        raise ValueError(f"{where}: expected allow, deny, ask or a mapping with 'decision' (got {type_name(body)})")
    unknown = sorted(str(k) for k in body if k not in ("decision", "args"))
    if unknown:
        raise ValueError(f"{where}: unknown key(s) {', '.join(unknown)}; a rule has 'decision' and 'args'")
    if "decision" not in body:
        raise ValueError(f"{where}: 'decision' is missing; add 'decision: allow', 'ask' or 'deny'")
    decision = _decision(where, body["decision"])
    raw_args = body.get("args", {})
    if kind == "resource" and raw_args:
        raise ValueError(f"{where}: a resource read has no arguments to constrain; remove 'args'")
    if not isinstance(raw_args, Mapping):  # an empty mapping is no constraints, as a dumped model gives
        raise ValueError(f"{where}: 'args' must map argument names to constraints (got {raw_args!r})")
    args: dict[str, tuple[Constraint, ...]] = {}
    for name, spec in raw_args.items():
        if not isinstance(spec, Mapping):
            spec = {}  # no constraints at all: ToolRule says what an argument needs
        constraints: list[Constraint] = []
        for kind_name, raw in spec.items():
            try:
                kind = constraint_kind(kind_name)
                constraint = Constraint(kind, _constraint_values(kind, raw))
                if kind is ConstraintKind.HOSTS:
                    host_rules(constraint.values)
                elif kind is ConstraintKind.MATCHES:
                    regexes(constraint.values)
            except ValueError as exc:
                raise ValueError(f"{where}: argument {name!r}: {exc}") from exc
            constraints.append(constraint)
        args[str(name)] = tuple(constraints)
    return ToolRule(pattern, decision, args)


def _decision(where: str, value: object) -> Decision:
    try:
        if not isinstance(value, str):
            raise ValueError
        return Decision(value)
    except ValueError:
        raise ValueError(f"{where}: decision {value!r} is not one of allow, deny, ask") from None


def _constraint_values(kind: ConstraintKind, raw: object) -> tuple[str, ...]:
    items = [raw] if isinstance(raw, str) or not isinstance(raw, list | tuple) else list(raw)
    values: list[str] = []
    for item in items:
        if isinstance(item, str):
            values.append(item)
        elif kind is ConstraintKind.ONE_OF and isinstance(item, bool):
            values.append("true" if item else "false")
        elif kind is ConstraintKind.ONE_OF and isinstance(item, int | float) and math.isfinite(item):
            values.append(str(item))
        else:
            raise ValueError(f"{kind.value}: value {item!r} is not text; write a string or a list of strings")
    return tuple(values)


# -- helpers ---------------------------------------------------------------------------------


def _literal_prefix(pattern: str) -> str:
    """The characters before `pattern`'s first wildcard: every name it matches starts with them."""
    cut = min((i for i, c in enumerate(pattern) if c in _GLOB_CHARS), default=len(pattern))
    return pattern[:cut]


def _literal_count(pattern: str) -> int:
    """Characters of `pattern` that match only themselves (fnmatch syntax: `*`, `?`, `[...]`)."""
    count, i, n = 0, 0, len(pattern)
    while i < n:
        c = pattern[i]
        i += 1
        if c in "*?":
            continue
        if c == "[":
            j = i
            if j < n and pattern[j] == "!":
                j += 1
            if j < n and pattern[j] == "]":
                j += 1
            while j < n and pattern[j] != "]":
                j += 1
            if j < n:
                i = j + 1  # a class matches one of several characters: not a literal
                continue
        count += 1  # an unclosed '[' is a literal, as in fnmatch
    return count
