"""Credentials in the OS keyring: bearer tokens, `secrets:` values, OAuth tokens and client records.

Everything lives under the keyring service `cellblock`. An entry is named after the server (its
bearer token) or by a `secrets:` mapping; OAuth records are `<server>/oauth-tokens` and
`<server>/oauth-client` (and `<server>/oauth-client-secret` or `-key`, a pre-registered client's
secret or private key; `<server>/idp-id-token`, an enterprise identity provider's ID token),
names no user-chosen entry can take (entry names have no `/`); the token
of `cellblock serve --http` is `cellblock/http-token` (`cellblock` is no server's name).

Only a backend that keeps secrets out of plain files is used: Secret Service, macOS Keychain,
Windows Credential Manager, KWallet. A plaintext, null or failing backend is refused with what
to install, unless the config opts in with `credentials: {allow_insecure: true}`.
keyring calls block on D-Bus or the OS, so async code runs them in a worker thread. keyring
itself is imported on first use: it costs ~0.1 s, which a gateway without credentials never pays.
"""

from __future__ import annotations

import os
import re
import stat
import sys
from collections.abc import MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cellblock.policy.errors import CellblockError

__all__ = [
    "ENTRY_NAME",
    "HTTP_TOKEN_ENTRY",
    "SERVICE",
    "Backend",
    "CredentialError",
    "Keyring",
    "active_backend",
    "client_key_entry",
    "client_secret_entry",
    "id_token_entry",
    "oauth_entries",
    "session_bus",
]

SERVICE = "cellblock"
HTTP_TOKEN_ENTRY = "cellblock/http-token"  # what an HTTP client of `cellblock serve --http` must send
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


def session_bus(env: MutableMapping[str, str] | None = None, run_user: Path = Path("/run/user")) -> str | None:
    """The D-Bus session bus this process reaches the Secret Service on, set into `env` when missing.

    A client often starts the gateway with little more than HOME, USER and PATH, so
    DBUS_SESSION_BUS_ADDRESS is missing though the desktop session has a bus. sd-bus and libdbus
    then look at `$XDG_RUNTIME_DIR/bus`, which systemd makes `/run/user/<uid>/bus`; so does this,
    but only for a socket this user owns in a directory of this user's alone that nobody else
    could swap (anyone else's bus could be anyone's keyring).
    Returns the address, or None when there is none to be found.
    """
    env = os.environ if env is None else env
    if env.get("DBUS_SESSION_BUS_ADDRESS"):
        return env["DBUS_SESSION_BUS_ADDRESS"]
    if not sys.platform.startswith("linux"):
        return None
    from cellblock.gateway.state import private_dir, swappable

    uid = os.getuid()
    runtime = env.get("XDG_RUNTIME_DIR", "")
    places = [Path(runtime) / "bus"] if os.path.isabs(runtime) else []
    for place in [*places, run_user / str(uid) / "bus"]:
        try:
            found = place.lstat()
        except OSError:
            continue
        # the address is a path, opened anew at each connect: its directory must be ours alone,
        # with no one else able to swap it, as for the runtime directory (state.py)
        if (
            stat.S_ISSOCK(found.st_mode)
            and found.st_uid == uid
            and private_dir(place.parent, uid)
            and swappable(place.parent) is None
        ):
            env["DBUS_SESSION_BUS_ADDRESS"] = f"unix:path={place}"
            return env["DBUS_SESSION_BUS_ADDRESS"]
    return None


def _name(backend: Any) -> str:
    return f"{type(backend).__module__}.{type(backend).__qualname__}"


def active_backend() -> Backend:
    """The backend to use: keyring's choice (honouring PYTHON_KEYRING_BACKEND and keyringrc), or,
    when keyring chains several, its best secure member alone, so that no read ever falls through
    to a plaintext file that someone else could have planted."""
    session_bus()  # before keyring picks its backend: it asks the bus whether a Secret Service runs
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


def client_secret_entry(server: str) -> str:
    """The entry name holding the secret of a server's pre-registered OAuth client (`auth.client_id`)."""
    return f"{server}/oauth-client-secret"


def client_key_entry(server: str) -> str:
    """The entry name holding the private key (PEM) a pre-registered client signs its assertions with."""
    return f"{server}/oauth-client-key"


def id_token_entry(server: str) -> str:
    """The entry name holding the identity provider's ID token a server's `identity_assertion` grant trades."""
    return f"{server}/idp-id-token"


class Keyring:
    """Checked access to the `cellblock` service in the OS keyring.

    Raises (on construction):
        CredentialError: the backend is missing or insecure and `allow_insecure` is off.
    """

    def __init__(self, allow_insecure: bool = False) -> None:
        self.backend = active_backend()
        if not self.backend.secure and not (allow_insecure and self.backend.usable):
            raise CredentialError(_refusal(self.backend))
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

    # anyio is imported where used: `cellblock serve` imports this module before its early answers,
    # which run no event loop (gateway/wire/early.py)
    async def aget(self, entry: str) -> str | None:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.get, entry)

    async def aset(self, entry: str, value: str) -> None:
        import anyio.to_thread

        await anyio.to_thread.run_sync(self.set, entry, value)

    async def adelete(self, entry: str) -> bool:
        import anyio.to_thread

        return await anyio.to_thread.run_sync(self.delete, entry)


def _bus_places() -> str:
    runtime = os.environ.get("XDG_RUNTIME_DIR", "")
    places = [f"{runtime}/bus"] if os.path.isabs(runtime) else []
    return " or ".join([*places, f"/run/user/{os.getuid()}/bus"])


def _refusal(backend: Backend) -> str:
    """Why this backend is not used, telling "no keyring" from "a keyring this process cannot reach"."""
    chosen = "PYTHON_KEYRING_BACKEND" in os.environ  # the user picked this backend: the bus is not why
    if sys.platform.startswith("linux") and not chosen and session_bus() is None:
        return (
            f"no keyring can be reached from here (keyring found {backend.name}): this process has no "
            f"DBUS_SESSION_BUS_ADDRESS and there is no session bus of yours at {_bus_places()}, "
            "so a keyring running in your desktop session cannot be asked. Start the client from your "
            "desktop session, or give its `cellblock` entry DBUS_SESSION_BUS_ADDRESS (`echo "
            "$DBUS_SESSION_BUS_ADDRESS` in your session prints it)"
        )
    if not backend.usable:
        return f"no keyring that can store anything is available here (keyring found {backend.name}). {_INSTALL}."
    return (
        f"refusing the keyring backend {backend.name}: it does not keep secrets in an OS store. {_INSTALL}. {_OPT_IN}."
    )


def _reason(exc: BaseException) -> str:
    # keyring's messages name the operation, never the value; keep the first line only
    text = str(exc).splitlines()[0] if str(exc) else ""
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__
