"""The policy sections of the config: `tools`, `prompts` and `resources`, a default and rules."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, ClassVar, Literal

from pydantic import BaseModel, Discriminator, Field, Tag, field_validator, model_validator

from cellblock.gateway.config.base import StrictModel, expand_keep_tilde
from cellblock.policy.rules import Policy, parse_rule_entry
from cellblock.policy.types import Decision

__all__ = ["DecisionName", "PromptsConfig", "ResourcesConfig", "Rule", "RuleConfig", "RulesConfig", "ToolsConfig"]


DecisionName = Literal["allow", "deny", "ask"]
ConstraintName = Literal["under", "not_under", "hosts", "one_of", "matches"]


class RuleConfig(StrictModel):
    """One tool rule with argument constraints: `{decision: allow, args: {path: {under: [~/x]}}}`."""

    decision: DecisionName
    args: dict[str, dict[ConstraintName, str | list[str]]] = {}

    @field_validator("args")
    @classmethod
    def _expand_paths(cls, value: dict[str, dict[str, str | list[str]]]) -> dict[str, dict[str, str | list[str]]]:
        out: dict[str, dict[str, str | list[str]]] = {}
        for arg, constraints in value.items():
            out[arg] = {
                kind: ([expand_keep_tilde(v) for v in ([values] if isinstance(values, str) else values)])
                if kind in ("under", "not_under")
                else values
                for kind, values in constraints.items()
            }
        return out


def _rule_kind(value: Any) -> str:
    return "full" if isinstance(value, Mapping | BaseModel) else "short"


# a rule is either just a decision ("read_*": allow) or a mapping with argument constraints
Rule = Annotated[
    Annotated[DecisionName, Tag("short")] | Annotated[RuleConfig, Tag("full")],
    Discriminator(_rule_kind),
]


class RulesConfig(StrictModel):
    """A default and rules by exact name (or URI) or glob; the shape of `tools`, `prompts`, `resources`."""

    kind: ClassVar[str] = "tool"
    default: DecisionName | None = None
    rules: dict[Annotated[str, Field(min_length=1)], Rule] = {}

    @model_validator(mode="after")
    def _compiles(self) -> RulesConfig:
        # regexes and host patterns are compiled now, so a bad one is a config error with a line
        rules = [
            parse_rule_entry(pattern, body.model_dump() if isinstance(body, RuleConfig) else body, self.kind)
            for pattern, body in self.rules.items()
        ]
        Policy(default=Decision(self.default or "ask"), rules=tuple(rules), cwd=None, home="/", kind=self.kind)
        return self


class ToolsConfig(RulesConfig):
    """Per-tool policy: a default, and rules by exact name or glob; `read_only: review` lets the
    review offer the tools a server marks read-only to run without asking (`policy/unasked.py`)."""

    default: DecisionName = "ask"
    read_only: Literal["ask", "review"] = "ask"


class PromptsConfig(RulesConfig):
    """Per-prompt policy, by prompt name; without a `default`, the server's tools default applies."""

    kind: ClassVar[str] = "prompt"


class ResourcesConfig(RulesConfig):
    """Per-resource policy, by the server's own URI (or glob); without a `default`, the server's tools default."""

    kind: ClassVar[str] = "resource"
