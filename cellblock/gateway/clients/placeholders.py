"""The references that stand for secrets in a wrapped client's backup, and the one way back.

wrap writes `<keyring:cellblock/ENTRY>` where a secret value stood in the client's file (in the
backup; an older `unwrap` left them in the file itself). `resolve` is the only code that turns
them back into values: every kind of reference wrap writes is resolved here, from the keyring,
so a new kind (a secret in an argument, say) extends `references` and nothing else.
"""

from __future__ import annotations

from cellblock.gateway.clients.literals import fill_literals
from cellblock.gateway.credentials import CredentialError, Keyring
from cellblock.policy.errors import CellblockError

__all__ = ["PLACEHOLDER", "PlaceholderError", "placeholder", "references", "resolve"]

# What stands for a secret value in a backup (and in a file an older unwrap left without secrets).
PLACEHOLDER = "<keyring:cellblock/{entry}>"


class PlaceholderError(CellblockError):
    """A reference cannot be resolved; nothing was written. The message names the entry and the fix
    (never a value)."""


def placeholder(entry: str) -> str:
    return PLACEHOLDER.format(entry=entry)


def references(text: str) -> list[str]:
    """The keyring entries `text` refers to, sorted, each once."""
    head, _, tail = PLACEHOLDER.partition("{entry}")
    found: set[str] = set()
    at = text.find(head)
    while at != -1:
        end = text.find(tail, at + len(head))
        if end == -1:
            break
        found.add(text[at + len(head) : end])
        at = text.find(head, end)
    return sorted(found)


def resolve(text: str, store: Keyring, *, toml: bool, where: str) -> str:
    """`text` with every reference replaced by its keyring value, escaped for the string literal it
    stands in. All or nothing: a value that cannot be had raises, and no value is in the message.

    Raises:
        PlaceholderError: an entry is not in the keyring, the keyring cannot be read, or a reference
            stands outside any string literal (the file was edited by hand).
    """
    entries = references(text)
    values: dict[str, str] = {}
    for entry in entries:
        try:
            value = store.get(entry)
        except CredentialError as exc:
            raise PlaceholderError(f"{where}: {exc}; nothing changed. Unlock the keyring, then run it again") from None
        if value is None:
            raise PlaceholderError(
                f"{where} refers to keyring entry '{entry}', which is not in the keyring; nothing changed. "
                f"Store the value with `cellblock auth set {entry}`, then run this again"
            )
        values[placeholder(entry)] = value
    filled = fill_literals(text, values, toml=toml)
    left = references(filled)
    if left:
        raise PlaceholderError(
            f"{where}: {placeholder(left[0])} stands outside a string, so its value cannot be written there; "
            "nothing changed. Put it back inside the quotes it was in, then run this again"
        )
    return filled
