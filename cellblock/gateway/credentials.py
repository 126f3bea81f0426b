"""Credentials in the OS keyring: bearer tokens, `secrets:` values, OAuth tokens and client records.

Everything lives under the keyring service `cellblock`. An entry is named after the server (its
bearer token) or by a `secrets:` mapping; OAuth records are `<server>/oauth-tokens` and
`<server>/oauth-client`, names no user-chosen entry can take (entry names have no `/`).

Only a backend that keeps secrets out of plain files is used: Secret Service, macOS Keychain,
Windows Credential Manager, KWallet. A plaintext, null or failing backend is refused with what
to install, unless the config opts in with `credentials: {allow_insecure: true}`.
keyring calls block on D-Bus or the OS, so async code runs them in a worker thread. keyring
itself is imported on first use: it costs ~0.1 s, which a gateway without credentials never pays.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

import anyio.to_thread

from cellblock.policy.errors import CellblockError

__all__ = [
    "ENTRY_NAME",
    "SERVICE",
    "Backend",
    "CredentialError",
    "Keyring",
    "active_backend",
    "oauth_entries",
]

SERVICE = "cellblock"
ENTRY_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")

# Backends that hold secrets in an OS store. Anything else (keyrings.alt's files, the null and
# fail backends, third-party plugins) is refused unless the user opts in.
_SECURE = {
    "keyring.backends.SecretService.Keyring": "Secret Service",
    "keyring.backends.libsecret.Keyring": "Secret Service (libsecret)",
    "keyring.backends.macOS.Keyring": "macOS Keychain",
    "keyring.backends.Windows.WinVaultKeyring": "Windows Credential Manager",
    "keyring.backends.kwallet.DBusKeyring": "KWallet",
    "keyring.backends.kwallet.DBusKeyringKWallet4": "KWallet",
}

_INSTALL = (
    "Install and unlock an OS keyring: on Linux the Secret Service (Debian/Ubuntu: "
    "`apt install gnome-keyring`, unlocked in your desktop session; headless: run under "
    "`dbus-run-session` with `gnome-keyring-daemon --unlock`); macOS Keychain and Windows "
    "Credential Manager work as they are"
)
_OPT_IN = "To use this backend anyway, set `credentials: {allow_insecure: true}` in cellblock.yaml"


class CredentialError(CellblockError):
    """A credential is missing, or the keyring refused or is not safe to use; says what to do."""


@dataclass(frozen=True)
class Backend:
    """The keyring backend Cellblock would use here, and whether it accepts it."""

    name: str  # module.Class, e.g. keyring.backends.SecretService.Keyring
    label: str  # what a person calls it
    secure: bool
    usable: bool  # False for the fail and null backends: nothing can be stored
    store: Any = None  # the keyring backend object itself

    def describe(self) -> str:
        kind = "secure" if self.secure else "no keyring" if not self.usable else "INSECURE"
        return f"{self.label} ({self.name}; {kind})"


def _name(backend: Any) -> str:
    return f"{type(backend).__module__}.{type(backend).__qualname__}"


def active_backend() -> Backend:
    """The backend to use: keyring's choice (honouring PYTHON_KEYRING_BACKEND and keyringrc), or,
    when keyring chains several, its best secure member alone, so that no read ever falls through
    to a plaintext file that someone else could have planted."""
    import keyring
    from keyring.backends.chainer import ChainerBackend

    chosen = keyring.get_keyring()
    members = list(chosen.backends) if isinstance(chosen, ChainerBackend) else [chosen]
    secure = [m for m in members if _name(m) in _SECURE]
    if secure:
        best = secure[0]  # the chain is ordered by priority
        return Backend(_name(best), _SECURE[_name(best)], secure=True, usable=True, store=best)
    names = [_name(m) for m in members]
    # the fail backend means no keyring at all; the null one silently stores nothing
    usable = bool(names) and not any(n.startswith(("keyring.backends.fail.", "keyring.backends.null.")) for n in names)
    label = " + ".join(n.rsplit(".", 1)[-1] for n in names) or "none"
    return Backend(" + ".join(names) or _name(chosen), label, secure=False, usable=usable, store=chosen)


def oauth_entries(server: str) -> tuple[str, str]:
    """The entry names holding a server's OAuth tokens and its registered client record."""
    return f"{server}/oauth-tokens", f"{server}/oauth-client"


class Keyring:
    """Checked access to the `cellblock` service in the OS keyring.

    Raises (on construction):
        CredentialError: the backend is missing or insecure and `allow_insecure` is off.
    """

    def __init__(self, allow_insecure: bool = False) -> None:
        self.backend = active_backend()
        if not self.backend.usable:
            raise CredentialError(
                f"no keyring that can store anything is available here (keyring found {self.backend.name}). {_INSTALL}."
            )
        if not self.backend.secure and not allow_insecure:
            raise CredentialError(
                f"refusing the keyring backend {self.backend.name}: it does not keep secrets in an OS store. "
                f"{_INSTALL}. {_OPT_IN}."
            )
        import keyring.errors

        self._store = self.backend.store
        self._errors = keyring.errors

    def get(self, entry: str) -> str | None:
        """The value of `entry`, or None when it is not set.

        Raises:
            CredentialError: the keyring failed (locked, unreachable).
        """
        try:
            value: str | None = self._store.get_password(SERVICE, entry)
            return value
        except self._errors.KeyringError as exc:
            raise CredentialError(f"the keyring could not read entry '{entry}': {_reason(exc)}") from None

    def set(self, entry: str, value: str) -> None:
        """Store `value` as `entry`, replacing any earlier value.

        Raises:
            CredentialError: the keyring refused the write.
        """
        try:
            self._store.set_password(SERVICE, entry, value)
        except self._errors.KeyringError as exc:
            raise CredentialError(f"the keyring could not store entry '{entry}': {_reason(exc)}") from None

    def delete(self, entry: str) -> bool:
        """Remove `entry`; False when there was none.

        Raises:
            CredentialError: the keyring refused.
        """
        try:
            self._store.delete_password(SERVICE, entry)
        except self._errors.PasswordDeleteError:
            return False
        except self._errors.KeyringError as exc:
            raise CredentialError(f"the keyring could not delete entry '{entry}': {_reason(exc)}") from None
        return True

    async def aget(self, entry: str) -> str | None:
        return await anyio.to_thread.run_sync(self.get, entry)

    async def aset(self, entry: str, value: str) -> None:
        await anyio.to_thread.run_sync(self.set, entry, value)

    async def adelete(self, entry: str) -> bool:
        return await anyio.to_thread.run_sync(self.delete, entry)


def _reason(exc: BaseException) -> str:
    # keyring's messages name the operation, never the value; keep the first line only
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
