"""Whether a name (a mapping key, an environment variable, a header) names a secret.

One rule for the audit log, which writes the value under such a key as `[redacted]`, and for
`cellblock wrap`, which moves such a value into the keyring (gateway/config/secretlike.py adds
the names that are about a secret rather than one, like `TOKEN_FILE`).
"""

from __future__ import annotations

import functools
import re

__all__ = ["is_secret_name", "name_words"]

# Parts of a word that mark a secret ("GITHUB_TOKEN", "clientSecret", "DBPASSWORD", "max_tokens").
_SECRET_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "COOKIE", "SESSION", "AUTHORIZATION")
# Whole words that mark a secret ("GITHUB_PAT", "BASIC_AUTH"; not "KEYBOARD", "MONKEY", "PATH", "AUTHOR").
_SECRET_WORDS = frozenset({"KEY", "KEYS", "PAT", "AUTH", "PASS"})
# Keys of a kind, however they are split ("x-api-key", "apiKey", "private_key", "AWSSECRETKEY").
_SECRET_KEYS = ("APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY")


def name_words(name: str) -> list[str]:
    """`name` split at non-alphanumerics and camelCase humps, upper-cased."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.upper()) if w]


@functools.lru_cache(maxsize=4096)  # the same few keys recur on every call; bounded, as keys are the model's
def is_secret_name(name: str) -> bool:
    """Whether `name` names something secret (`Authorization`, `x-api-key`, `db_password`, `GITHUB_PAT`…).

    A word that starts with TOKENIZ is about tokenizers, not tokens.
    """
    words = name_words(name)
    joined = "".join(words)
    return any(key in joined for key in _SECRET_KEYS) or any(
        word in _SECRET_WORDS or (any(part in word for part in _SECRET_PARTS) and not word.startswith("TOKENIZ"))
        for word in words
    )
