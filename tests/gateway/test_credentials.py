"""Which keyring backend Cellblock accepts, and checked access to the `cellblock` service in it.

The backend tests pick a backend with PYTHON_KEYRING_BACKEND; the Secret Service tests use the
real, private one from `keyring_env` (tests/conftest.py).
"""

from __future__ import annotations

import contextlib
import os
import secrets
import socket
import sys
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import ClassVar

import keyring.backend
import keyring.core
import pytest
from keyring.backends import SecretService
from keyring.backends.chainer import ChainerBackend
from keyring.errors import PasswordDeleteError
from keyrings.alt.file import PlaintextKeyring

from cellblock.gateway.credentials import (
    ENTRY_NAME,
    SERVICE,
    CredentialError,
    Keyring,
    active_backend,
    oauth_entries,
    session_bus,
)

PLAINTEXT = "keyrings.alt.file.PlaintextKeyring"


@pytest.fixture
def use_backend(monkeypatch: pytest.MonkeyPatch) -> Callable[[str], keyring.backend.KeyringBackend]:
    """Make keyring choose `name`, as PYTHON_KEYRING_BACKEND would at start; the choice is restored afterwards."""
    # keyring caches its choice in a module global: record it so that monkeypatch puts it back
    monkeypatch.setattr(keyring.core, "_keyring_backend", keyring.core._keyring_backend)

    def use(name: str) -> keyring.backend.KeyringBackend:
        monkeypatch.setenv("PYTHON_KEYRING_BACKEND", name)
        keyring.core.init_backend()
        return keyring.core.get_keyring()

    return use


@pytest.fixture
def use_chain(monkeypatch: pytest.MonkeyPatch) -> Callable[..., None]:
    """Make keyring use a chain of exactly `members`, in that order; the choice is restored afterwards."""

    def use(*members: keyring.backend.KeyringBackend) -> None:
        class Chain(ChainerBackend):
            # keyring's own ChainerBackend discovers its members; these are fixed
            backends: ClassVar[list[keyring.backend.KeyringBackend]] = list(members)

        monkeypatch.setattr(keyring.core, "_keyring_backend", Chain())

    return use


def plaintext_in(directory: Path) -> PlaintextKeyring:
    store = PlaintextKeyring()
    store.file_path = str(directory / "keyring_pass.cfg")  # never the real user's data directory
    return store


@pytest.fixture
def entry(keyring_env: Mapping[str, str]) -> Iterator[str]:
    """A fresh entry name in the private Secret Service, removed afterwards."""
    name = f"test-{secrets.token_hex(6)}"
    yield name
    with contextlib.suppress(PasswordDeleteError):
        SecretService.Keyring().delete_password(SERVICE, name)


@pytest.mark.parametrize("backend", ["keyring.backends.fail.Keyring", "keyring.backends.null.Keyring"])
@pytest.mark.parametrize("allow_insecure", [False, True])
def test_a_backend_that_stores_nothing_is_refused_even_when_insecure_is_allowed(
    use_backend: Callable[[str], object], backend: str, allow_insecure: bool
) -> None:
    use_backend(backend)
    assert active_backend().usable is False
    with pytest.raises(CredentialError) as caught:
        Keyring(allow_insecure=allow_insecure)
    message = str(caught.value)
    assert message.startswith(f"no keyring that can store anything is available here (keyring found {backend})")
    assert "gnome-keyring" in message


def test_a_plaintext_backend_is_refused_with_what_to_install_and_how_to_opt_in(
    use_backend: Callable[[str], object],
) -> None:
    use_backend(PLAINTEXT)
    found = active_backend()
    assert (found.name, found.secure, found.usable) == (PLAINTEXT, False, True)
    assert "INSECURE" in found.describe()
    with pytest.raises(CredentialError) as caught:
        Keyring()
    message = str(caught.value)
    assert message.startswith(f"refusing the keyring backend {PLAINTEXT}: it does not keep secrets in an OS store")
    assert "apt install gnome-keyring" in message
    assert "credentials: {allow_insecure: true}" in message


def test_a_plaintext_backend_is_used_when_insecure_is_allowed_and_it_is_plain_text(
    use_backend: Callable[[str], keyring.backend.KeyringBackend], tmp_path: Path
) -> None:
    chosen = use_backend(PLAINTEXT)
    assert isinstance(chosen, PlaintextKeyring)
    chosen.file_path = str(tmp_path / "keyring_pass.cfg")
    store = Keyring(allow_insecure=True)
    assert store.backend.secure is False
    store.set("tok", "plain-value-123")
    assert store.get("tok") == "plain-value-123"
    # the reason it is refused by default: the value sits in a file (base64 is no protection)
    assert "cGxhaW4tdmFsdWUtMTIz" in (tmp_path / "keyring_pass.cfg").read_text()


def test_a_chain_of_only_insecure_backends_is_refused(
    use_chain: Callable[..., None], tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a session bus to ask (without one, the refusal says first that no keyring could be reached)
    monkeypatch.setenv("DBUS_SESSION_BUS_ADDRESS", f"unix:path={tmp_path / 'bus'}")
    use_chain(plaintext_in(tmp_path))
    found = active_backend()
    assert (found.name, found.secure, found.usable) == (PLAINTEXT, False, True)
    with pytest.raises(CredentialError, match="refusing the keyring backend"):
        Keyring()


def test_the_private_secret_service_is_accepted_as_secure(keyring_env: Mapping[str, str]) -> None:
    found = Keyring().backend
    assert (found.name, found.label, found.secure) == ("keyring.backends.SecretService.Keyring", "Secret Service", True)
    assert isinstance(found.store, SecretService.Keyring)


@pytest.mark.parametrize("plaintext_first", [True, False])
def test_a_chain_uses_only_its_secure_member_so_a_planted_plaintext_entry_is_never_read(
    keyring_env: Mapping[str, str], use_chain: Callable[..., None], tmp_path: Path, entry: str, plaintext_first: bool
) -> None:
    plain, secure = plaintext_in(tmp_path), SecretService.Keyring()
    plain.set_password(SERVICE, entry, "planted")
    use_chain(*((plain, secure) if plaintext_first else (secure, plain)))
    assert keyring.core.get_keyring().get_password(SERVICE, entry) == "planted"  # keyring itself falls through

    store = Keyring()
    assert store.backend.name == "keyring.backends.SecretService.Keyring" and store.backend.secure
    assert store.get(entry) is None
    store.set(entry, "real")
    assert secure.get_password(SERVICE, entry) == "real"
    assert plain.get_password(SERVICE, entry) == "planted"  # written to the Secret Service only


def test_set_get_replace_delete_round_trip(keyring_env: Mapping[str, str], entry: str) -> None:
    store = Keyring()
    assert store.get(entry) is None
    store.set(entry, "first")
    assert store.get(entry) == "first"
    store.set(entry, "second")
    assert store.get(entry) == "second"
    assert SecretService.Keyring().get_password(SERVICE, entry) == "second"  # really under the `cellblock` service
    assert store.delete(entry) is True
    assert store.get(entry) is None


def test_deleting_a_missing_entry_says_false(keyring_env: Mapping[str, str], entry: str) -> None:
    assert Keyring().delete(entry) is False


@pytest.mark.anyio
@pytest.mark.parametrize("anyio_backend", ["asyncio"])
async def test_the_async_calls_reach_the_same_entries(keyring_env: Mapping[str, str], entry: str) -> None:
    store = Keyring()
    await store.aset(entry, "v")
    assert store.get(entry) == "v"
    assert await store.aget(entry) == "v"
    assert await store.adelete(entry) is True
    assert await store.adelete(entry) is False


def test_oauth_entries_cannot_be_named_by_a_user() -> None:
    tokens, client = oauth_entries("notes")
    assert (tokens, client) == ("notes/oauth-tokens", "notes/oauth-client")
    assert not ENTRY_NAME.match(tokens) and not ENTRY_NAME.match(client)


def _socket_at(path: Path) -> socket.socket:
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    listener = socket.socket(socket.AF_UNIX)
    listener.bind(str(path))
    return listener


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="where a Linux desktop session puts its bus")
def test_a_missing_bus_address_is_found_where_desktop_sessions_put_the_bus(tmp_path: Path) -> None:
    given = {"DBUS_SESSION_BUS_ADDRESS": "unix:path=/somewhere/bus"}
    assert session_bus(given, tmp_path) == "unix:path=/somewhere/bus"  # what the client gave wins
    assert session_bus({}, tmp_path) is None
    env: dict[str, str] = {}
    with _socket_at(tmp_path / str(os.getuid()) / "bus"):
        assert session_bus(env, tmp_path) == f"unix:path={tmp_path / str(os.getuid()) / 'bus'}"
    assert env == {"DBUS_SESSION_BUS_ADDRESS": f"unix:path={tmp_path / str(os.getuid()) / 'bus'}"}  # keyring reads it
    runtime = tmp_path / "xdg"
    with _socket_at(runtime / "bus"):
        assert session_bus({"XDG_RUNTIME_DIR": str(runtime)}, tmp_path / "none") == f"unix:path={runtime / 'bus'}"


def test_only_a_socket_of_this_user_is_taken_for_the_bus(tmp_path: Path) -> None:
    place = tmp_path / str(os.getuid()) / "bus"
    place.parent.mkdir(mode=0o700)
    place.write_text("not a socket")
    assert session_bus({}, tmp_path) is None
    place.unlink()
    place.symlink_to("/run/dbus/system_bus_socket")
    assert session_bus({}, tmp_path) is None
    place.unlink()
    if os.getuid() != 0:
        pytest.skip("handing a socket to another user needs root")
    with _socket_at(place):
        assert session_bus({}, tmp_path) is not None  # control: the same socket, while it is ours
        os.chown(place, 65534, 65534)
        assert session_bus({}, tmp_path) is None  # another user's bus could be anyone's keyring


def test_a_bus_in_a_directory_others_could_swap_is_not_taken(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # the address is a path opened anew at each connect: whoever may change its directory (or a
    # link on its way) could put their own bus there after the check
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    runtime = shared / "rt"
    with _socket_at(runtime / "bus"):
        assert session_bus({"XDG_RUNTIME_DIR": str(runtime)}, tmp_path / "none") is None
        shared.chmod(0o700)
        assert session_bus({"XDG_RUNTIME_DIR": str(runtime)}, tmp_path / "none") is not None  # control
        runtime.chmod(0o755)  # a directory others may read: not this user's alone
        assert session_bus({"XDG_RUNTIME_DIR": str(runtime)}, tmp_path / "none") is None
    monkeypatch.chdir(runtime)
    runtime.chmod(0o700)
    with _socket_at(runtime / "bus2"):
        assert session_bus({"XDG_RUNTIME_DIR": str(runtime)}, tmp_path / "none") is not None  # the old one
        (runtime / "bus").unlink()
        (runtime / "bus2").rename(runtime / "bus")
        assert session_bus({"XDG_RUNTIME_DIR": "."}, tmp_path / "none") is None  # relative: never
