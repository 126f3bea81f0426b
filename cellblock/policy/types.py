"""Policy domain types: a decision, a verdict, and the rules and argument constraints behind them.

These are plain frozen values; `policy/rules.py` compiles them into a `Policy` that decides calls.
Construction validates shape only (kinds, non-empty values, argument paths); what needs the
server's cwd and home (path roots) or a parser (regexes, host rules) is checked when a `Policy` is
built.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import StrEnum
from types import MappingProxyType

__all__ = ["Constraint", "ConstraintKind", "Decision", "ToolRule", "Verdict", "constraint_kind"]


class Decision(StrEnum):
    ALLOW = "allow"
    DENY = "deny"
    ASK = "ask"


class ConstraintKind(StrEnum):
    UNDER = "under"  # a path that resolves inside one of the roots
    NOT_UNDER = "not_under"  # a path that resolves inside none of the roots
    HOSTS = "hosts"  # a URL whose host (and port) one of the host rules allows
    ONE_OF = "one_of"  # equal to one of the values
    MATCHES = "matches"  # fully matched by one of the regular expressions


_KNOWN = ", ".join(k.value for k in ConstraintKind)


def constraint_kind(name: str) -> ConstraintKind:
    """The constraint kind called `name`.

    Raises:
        ValueError: no kind is called that; the message lists those there are.
    """
    try:
        return ConstraintKind(name)
    except ValueError:
        raise ValueError(f"unknown constraint {name!r}; use one of {_KNOWN}") from None


@dataclass(frozen=True, slots=True)
class Verdict:
    """The outcome for one call.

    `rule` is the exact tool name or glob pattern that matched, or "default"; `reason` is one
    sentence the model (and the audit log) can read.
    """

    decision: Decision
    rule: str
    reason: str


@dataclass(frozen=True, slots=True)
class Constraint:
    """One constraint on one argument: `kind` and its values (roots, host rules, values or regexes).

    Raises:
        ValueError: an unknown kind, no values, or a value that is not text.
    """

    kind: ConstraintKind
    values: tuple[str, ...]

    def __post_init__(self) -> None:
        kind = constraint_kind(self.kind)
        values = (self.values,) if isinstance(self.values, str) else tuple(self.values)
        if not values:
            # an empty list would allow nothing (or, for not_under, exclude nothing): say so instead
            raise ValueError(f"constraint {kind.value!r} has no values; list at least one")
        for value in values:
            if not isinstance(value, str) or not value:
                raise ValueError(f"constraint {kind.value!r}: every value must be non-empty text (got {value!r})")
        object.__setattr__(self, "kind", kind)
        object.__setattr__(self, "values", values)


@dataclass(frozen=True, slots=True)
class ToolRule:
    """A rule for the tools whose name is `pattern` (an exact name or an fnmatch-style glob).

    `args` maps an argument path ("path", or "options.path" for nested objects) to the constraints
    its value must meet; every constraint of every listed argument must pass.

    Raises:
        ValueError: an empty pattern, an unknown decision, an empty argument path or path segment,
            or `args` on a `deny` rule (they could never apply).
    """

    pattern: str
    decision: Decision
    args: Mapping[str, tuple[Constraint, ...]] = field(default_factory=lambda: MappingProxyType({}))

    def __post_init__(self) -> None:
        if not isinstance(self.pattern, str) or not self.pattern:
            raise ValueError(f"tool rule pattern must be non-empty text (got {self.pattern!r})")
        try:
            decision = Decision(self.decision)
        except ValueError:
            raise ValueError(
                f"tool rule {self.pattern!r}: decision {self.decision!r} is not one of allow, deny, ask"
            ) from None
        args: dict[str, tuple[Constraint, ...]] = {}
        for name, constraints in self.args.items():
            if not isinstance(name, str) or not name or any(not part for part in name.split(".")):
                raise ValueError(
                    f"tool rule {self.pattern!r}: argument path {name!r} is not valid; "
                    f"write a name, or names joined by '.' for nested objects (e.g. 'options.path')"
                )
            group = tuple(constraints)
            if not group:
                raise ValueError(
                    f"tool rule {self.pattern!r}: argument {name!r} needs constraints ({_KNOWN}), "
                    "e.g. {under: [~/projects]}"
                )
            for constraint in group:
                if not isinstance(constraint, Constraint):
                    raise ValueError(
                        f"tool rule {self.pattern!r}: argument {name!r}: {constraint!r} is not a Constraint"
                    )
            args[name] = group
        if args and decision is Decision.DENY:
            raise ValueError(
                f"tool rule {self.pattern!r} denies the tool, so its argument constraints could never apply; "
                f"remove 'args', or use 'allow' or 'ask'"
            )
        object.__setattr__(self, "decision", decision)
        object.__setattr__(self, "args", MappingProxyType(args))
