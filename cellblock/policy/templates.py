"""Which resource template (RFC 6570) a concrete URI was made from.

A read names a URI; the lock approved resources by URI and templates by their template text. To
know whether the URI being read belongs to an approved template, each `{...}` expression stands
for what its operator can expand to (a simple `{x}` never crosses a `/`, `?` or `#`; `{+x}` and
`{#x}` may; `{/x}` is path segments; `{?x}` and `{&x}` a query). The literal text around them must
match exactly.

The templates come from the (possibly hostile) server, so matching never backtracks: the template
becomes a short list of steps (a literal character, or a run of characters from a set, optionally
led by one character) and the URI is read once, left to right, keeping the set of steps it could
be at. That is O(len(uri) x steps), whatever the template. A template longer than MAX_TEMPLATE
matches nothing (`template_too_long` says so, and `cellblock check` names it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import lru_cache

__all__ = ["MAX_TEMPLATE", "template_matches", "template_too_long"]

# a server's template is its own text: past this many characters it matches no URI at all
MAX_TEMPLATE = 1024
_EXPRESSION = re.compile(r"\{([^{}]*)\}")


@dataclass(frozen=True)
class _Run:
    """Zero or more characters not in `excluded`; with `lead`, either nothing or `lead` first."""

    excluded: frozenset[str]
    lead: str = ""


_ANY = frozenset[str]()
_SEGMENT = _Run(frozenset("/?#"))
# each operator's expansion; e.g. `(?:/[^/?#]*)*` (path segments) is the same set of strings as
# "nothing, or '/' then any characters but '?' and '#'", which is what `_Run` can say
_BY_OPERATOR = {
    "+": _Run(frozenset("#")),  # reserved expansion keeps '/' and '?'
    "#": _Run(_ANY, "#"),
    "/": _Run(frozenset("?#"), "/"),
    ".": _Run(frozenset("/?#"), "."),
    ";": _Run(frozenset("/?#"), ";"),
    "?": _Run(frozenset("#"), "?"),
    "&": _Run(frozenset("#"), "&"),
}

_Step = str | _Run  # a str is one literal character


@lru_cache(maxsize=1024)
def _steps(template: str) -> tuple[_Step, ...]:
    steps: list[_Step] = []
    end = 0
    for match in _EXPRESSION.finditer(template):
        steps.extend(template[end : match.start()])
        run = _BY_OPERATOR.get(match[1][:1], _SEGMENT)
        if not (steps and steps[-1] == run):  # `{+a}{+b}` expands to what `{+a}` alone can
            steps.append(run)
        end = match.end()
    steps.extend(template[end:])
    return tuple(steps)


def template_too_long(template: str) -> bool:
    """Whether `template` is past MAX_TEMPLATE, and so matches no URI."""
    return len(template) > MAX_TEMPLATE


def template_matches(template: str, uri: str) -> bool:
    """Whether `uri` is one that `template` can expand to (never, for a template too long)."""
    if template_too_long(template):
        return False
    steps = _steps(template)
    # a state is 2*i (at the start of step i) or 2*i+1 (inside run i, its lead read)
    states = _closure(steps, {0})
    for char in uri:
        moved: set[int] = set()
        for state in states:
            i, inside = divmod(state, 2)
            if i == len(steps):
                continue
            step = steps[i]
            if isinstance(step, str):
                if char == step:
                    moved.add(2 * i + 2)
            elif inside or not step.lead:
                if char not in step.excluded:
                    moved.add(2 * i + 1)
            elif char == step.lead:
                moved.add(2 * i + 1)
        if not moved:
            return False
        states = _closure(steps, moved)
    return 2 * len(steps) in states


def _closure(steps: tuple[_Step, ...], states: set[int]) -> set[int]:
    """`states` and every state reached from them without reading a character (a run may end)."""
    todo = list(states)
    seen = set(states)
    while todo:
        i, _ = divmod(todo.pop(), 2)
        if i < len(steps) and isinstance(steps[i], _Run) and 2 * i + 2 not in seen:
            seen.add(2 * i + 2)
            todo.append(2 * i + 2)
    return seen
