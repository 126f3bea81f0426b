"""Which resource template (RFC 6570) a concrete URI was made from.

A read names a URI; the lock approved resources by URI and templates by their template text. To
know whether the URI being read belongs to an approved template, the template is turned into a
regular expression: each `{...}` expression matches what its operator can expand to (a simple
`{x}` never crosses a `/`, `?` or `#`; `{+x}` and `{#x}` may; `{/x}` is path segments; `{?x}` and
`{&x}` a query). The literal text around them must match exactly.
"""

from __future__ import annotations

import re
from functools import lru_cache

__all__ = ["template_matches"]

_EXPRESSION = re.compile(r"\{([^{}]*)\}")
_SEGMENT = r"[^/?#]*"
_BY_OPERATOR = {
    "+": r"[^#]*",  # reserved expansion keeps '/' and '?'
    "#": r"(?:#.*)?",
    "/": r"(?:/[^/?#]*)*",
    ".": r"(?:\.[^/?#.]*)*",
    ";": r"(?:;[^/?#]*)*",
    "?": r"(?:\?[^#]*)?",
    "&": r"(?:&[^#]*)?",
}


@lru_cache(maxsize=1024)
def _regex(template: str) -> re.Pattern[str]:
    parts: list[str] = []
    end = 0
    for match in _EXPRESSION.finditer(template):
        parts.append(re.escape(template[end : match.start()]))
        body = match[1]
        parts.append(_BY_OPERATOR.get(body[:1], _SEGMENT))
        end = match.end()
    parts.append(re.escape(template[end:]))
    return re.compile("".join(parts), re.DOTALL)


def template_matches(template: str, uri: str) -> bool:
    """Whether `uri` is one that `template` can expand to."""
    return _regex(template).fullmatch(uri) is not None
