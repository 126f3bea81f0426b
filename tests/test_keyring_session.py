"""The private Secret Service from `keyring_env` is real: values round-trip, and no fallback backend is in use."""

from __future__ import annotations

import secrets
import subprocess
import sys
from collections.abc import Mapping

import keyring
import keyring.backends.SecretService
from keyring.backends.chainer import ChainerBackend

SERVICE = "cellblock-test"


def test_a_value_set_in_the_private_keyring_reads_back(keyring_env: Mapping[str, str]) -> None:
    value = secrets.token_hex(16)
    keyring.set_password(SERVICE, "x", value)
    try:
        assert keyring.get_password(SERVICE, "x") == value
    finally:
        keyring.delete_password(SERVICE, "x")
    assert keyring.get_password(SERVICE, "x") is None


def test_keyring_puts_the_secret_service_first(keyring_env: Mapping[str, str]) -> None:
    # keyrings.alt (a test dependency) may add its plaintext file backend behind it in a chain
    backend = keyring.get_keyring()
    first = backend.backends[0] if isinstance(backend, ChainerBackend) else backend
    assert isinstance(first, keyring.backends.SecretService.Keyring), f"got {backend!r}, expected SecretService"


def test_a_subprocess_reaches_the_same_keyring_with_the_yielded_environment(keyring_env: Mapping[str, str]) -> None:
    value = secrets.token_hex(16)
    keyring.set_password(SERVICE, "child", value)
    try:
        read = "import keyring; print(keyring.get_password('cellblock-test', 'child'))"
        child = subprocess.run(
            [sys.executable, "-c", read], env={"PATH": "/usr/bin:/bin", **keyring_env}, capture_output=True, timeout=30
        )
        assert child.returncode == 0, child.stderr.decode()
        assert child.stdout.decode().strip() == value
    finally:
        keyring.delete_password(SERVICE, "child")


def test_the_yielded_environment_names_only_the_private_bus(keyring_env: Mapping[str, str]) -> None:
    assert set(keyring_env) == {"DBUS_SESSION_BUS_ADDRESS"}
    assert keyring_env["DBUS_SESSION_BUS_ADDRESS"].startswith("unix:path=")
