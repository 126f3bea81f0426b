"""Whether a value of a client's config holds a secret, by the name it is under or by its shape.

`cellblock wrap` moves such values into the keyring; a reference to one the client fills in
(`${input:x}`, `${env:X}`, `$X`) is no secret, and is named in a note instead.
"""

from __future__ import annotations

import math
import re
from collections import Counter

from cellblock.gateway.audit.secretnames import is_secret_name, name_words

__all__ = ["REF_ANYWHERE", "REF_WHOLE", "looks_secret", "references", "secret_name", "secret_shape"]

REF_ANYWHERE = re.compile(r"\$\{[^}]*\}")  # ${X}, ${env:X}, ${input:x}, ${workspaceFolder}
REF_WHOLE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")  # also $X, but only as the whole value
_SECRET_PREFIX = re.compile(
    r"^(gh[pousr]_|github_pat_|glpat-|sk-|sk_live_|rk_live_|xox[abpors]-|xapp-|AIza|hf_|npm_|pypi-)"
    r"[A-Za-z0-9_\-.]{10,}$"
)
# What follows a token prefix in a package's name (`pypi-query-mcp-server`, `sk-learn-tools`): lower-case
# words joined by separators, which no issued token is.
_WORDS = re.compile(r"^[a-z]+(?:[-_.][a-z]+)*$")
_AWS_KEY = re.compile(r"^(?:AKIA|ASIA)[A-Z0-9]{16}$")
_JWT = re.compile(r"^eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
_AUTH_SCHEME = re.compile(r"^(?:Bearer|Basic)\s+\S{8,}$", re.IGNORECASE)
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9_\-+/=]{32,}$")
# A last word that makes the name about a secret rather than one ("TOKEN_FILE", "SESSION_TIMEOUT").
_NOT_SECRET_LAST = frozenset(
    {
        *("FILE", "PATH", "DIR", "URL", "URI", "HOST", "PORT", "ENDPOINT", "TIMEOUT", "TTL", "EXPIRY"),
        *("TYPE", "MODE", "LEVEL", "ENABLED", "DISABLED", "COUNT", "LIMIT", "SIZE", "MAX", "MIN"),
        *("LENGTH", "NAME", "PREFIX", "SCOPE", "SCOPES", "TOKENS", "HEADER", "FORMAT"),
    }
)
_PLAIN_VALUES = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null"})


def looks_secret(name: str, value: str) -> bool:
    """Whether an env var or header `name` with `value` holds a secret, by its name or the value's shape.

    Empty values and references (`${input:x}`, `${env:X}`, `${X}`, `$X`) hold no secret.
    """
    if not value.strip() or REF_WHOLE.fullmatch(value.strip()):
        return False
    if REF_ANYWHERE.search(value):
        return secret_shape(REF_ANYWHERE.sub("", value).strip())
    if secret_shape(value):
        return True
    return secret_name(name) and value.strip().lower() not in _PLAIN_VALUES


def references(value: str) -> str:
    """The client references in `value`, for a note (never the rest of the value)."""
    whole = REF_WHOLE.fullmatch(value.strip())
    return whole.group(0) if whole else ", ".join(REF_ANYWHERE.findall(value))


def secret_name(name: str) -> bool:
    """Whether `name` names a secret, and not something about one (`TOKEN_FILE`, `SESSION_TIMEOUT`)."""
    words = name_words(name)
    return bool(words) and words[-1] not in _NOT_SECRET_LAST and is_secret_name(name)


def secret_shape(value: str) -> bool:
    """A well-known token prefix, a JWT, `Bearer …`, or a long high-entropy string."""
    value = value.strip()
    prefixed = _SECRET_PREFIX.match(value)
    if prefixed and not _WORDS.match(value[prefixed.end(1) :]):
        return True
    if _AWS_KEY.match(value) or _JWT.match(value) or _AUTH_SCHEME.match(value):
        return True
    if not _TOKEN_CHARS.match(value) or (value.startswith("/") and value.count("/") >= 2):
        return False  # not token characters, or a path
    classes = sum(bool(re.search(p, value)) for p in ("[a-z]", "[A-Z]", "[0-9]"))
    separators = sum(c in "_-" for c in value) / len(value)
    return classes >= 2 and separators <= 0.15 and _entropy(value) >= 3.0


def _entropy(value: str) -> float:
    """Shannon entropy of `value` in bits per character."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
