"""`cellblock unwrap`: a wrapped client's file given back whole, its secret values included.

unwrap PATH puts the original servers mapping back from the backup wrap kept (`PATH.bak`, or the
copy under Cellblock's state directory when `PATH.bak` is gone or the file is a project's) and
writes each secret value back where wrap took it from, read from the keyring
(gateway/clients/placeholders.py), so the client starts its servers as it did before. A file an
older unwrap left with `<keyring:…>` references in it gets its values the same way. It is all or
nothing: when a value cannot be read, nothing is written and the message says what to do. The
values stay in the keyring (cellblock.yaml, which unwrap never changes, may still use them), and
are never printed.
"""

from __future__ import annotations

import sys
from pathlib import Path

from cellblock.gateway.clients.backups import beside, kept, stored_backups
from cellblock.gateway.clients.blocks import detect, read_blocks, replace_span
from cellblock.gateway.clients.entry import WrapError, is_cellblock_entry, read_client_file
from cellblock.gateway.clients.placeholders import PlaceholderError, references, resolve
from cellblock.gateway.credentials import CredentialError, Keyring
from cellblock.gateway.state import atomic_write_text

__all__ = ["unwrap"]


def unwrap(path: Path, allow_insecure: bool = False) -> int:
    """Put the servers of PATH's backup back into PATH, secret values included (from the keyring,
    which must be a safe one unless `allow_insecure`). Returns the exit code.

    Raises:
        WrapError: no backup, the file and its backup do not match, or a secret cannot be read
            back; nothing was changed.
    """
    text = read_client_file(path)
    try:
        kind = detect(path, text)
        now = {b.where: b for b in read_blocks(kind, text)}
    except ValueError as exc:
        raise WrapError(str(exc)) from None
    wrapped = [b for b in now.values() if b.entries and all(is_cellblock_entry(e) for e in b.entries)]
    if not wrapped:
        if references(text):  # left by an older unwrap without secrets: give the values back now
            filled = resolve_secrets(path, text, kind, allow_insecure, str(path))
            return _write(path, filled, [], len(references(text)))
        raise WrapError(f"{path} does not start Cellblock; nothing to unwrap")
    backups = stored_backups(path)
    if not backups:
        raise WrapError(
            f"no backup of {path}: neither {beside(path)} nor {kept(path)} exists, so its own servers cannot be "
            "put back; write them into it by hand (cellblock.yaml still lists them)"
        )
    saved = read_client_file(backups[0])
    try:
        before = {b.where: b for b in read_blocks(kind, saved)}
    except ValueError as exc:
        raise WrapError(f"{backups[0]}: {exc}") from None
    missing = [b.where for b in wrapped if b.where not in before]
    if missing:
        raise WrapError(f"{backups[0]} has no servers at {', '.join('.'.join(w) for w in missing)}; restore it by hand")
    restored = text
    for block in sorted(wrapped, key=lambda b: b.start, reverse=True):
        original = saved[before[block.where].start : before[block.where].end]
        restored = replace_span(restored, block.start, block.end, original)
    secrets = len(references(restored))
    return _write(path, resolve_secrets(path, restored, kind, allow_insecure, str(backups[0])), backups, secrets)


def resolve_secrets(path: Path, text: str, kind: str, allow_insecure: bool, where: str) -> str:
    """`text` with every secret reference replaced by its value from the keyring.

    Raises:
        WrapError: the keyring cannot be opened or read, or an entry is not in it.
    """
    if not references(text):
        return text
    try:
        store = Keyring(allow_insecure)
    except CredentialError as exc:
        raise WrapError(
            f"{path} needs its secret values back from the keyring, which cannot be used: {exc}. Nothing changed; "
            f"make the keyring reachable (docs/credentials.md), then run `cellblock unwrap {path}` again"
        ) from None
    try:
        return resolve(text, store, toml=kind == "codex", where=where)
    except PlaceholderError as exc:
        raise WrapError(str(exc)) from None


def _write(path: Path, restored: str, backups: list[Path], secrets: int) -> int:
    atomic_write_text(path.resolve(), restored, path.stat().st_mode & 0o777)
    for backup in backups:
        backup.unlink()
    if backups:
        _say(f"OK: {path} starts its own servers again; cellblock.yaml is unchanged")
    if secrets:
        _say(
            f"{secrets} secret value(s) were written back into {path} from the keyring, where they also stay "
            "(cellblock.yaml may use them; `cellblock auth logout ENTRY` removes one)"
        )
    return 0


def _say(text: str) -> None:
    print(f"cellblock: {text}", file=sys.stderr)
