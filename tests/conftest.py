"""Session-wide fixtures: a private, real Secret Service (D-Bus + gnome-keyring) for keyring tests.

`keyring_env` starts its own ``dbus-daemon`` on a socket in a temporary directory and a
``gnome-keyring-daemon`` on that bus, with HOME and the XDG directories pointed at the same
temporary directory, so nothing reads or writes the real user's keyring.
"""

from __future__ import annotations

import os
import select
import shutil
import subprocess
import tempfile
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import NoReturn

import keyring.backend
import keyring.core
import pytest
from jeepney.bus_messages import message_bus
from jeepney.io.blocking import open_dbus_connection

SECRETS_NAME = "org.freedesktop.secrets"
# The login keyring's password; the keyring lives in a throwaway directory.
KEYRING_PASSWORD = "test"
# Both daemons start in well under a second; a loaded CI machine gets ample slack.
DAEMON_START_TIMEOUT = 10.0
DAEMON_STOP_TIMEOUT = 5.0
POLL_INTERVAL = 0.05


def _unavailable(message: str) -> NoReturn:
    """Fail under CELLBLOCK_REQUIRE_PEERS=1 (CI), else skip: a developer box may lack the daemons."""
    if os.environ.get("CELLBLOCK_REQUIRE_PEERS") == "1":
        pytest.fail(message, pytrace=False)
    pytest.skip(message)


def _read_line(proc: subprocess.Popen[bytes], timeout: float, what: str) -> str:
    """The first line `proc` writes to stdout, or a test failure naming `what` after `timeout` seconds."""
    if proc.stdout is None:
        raise ValueError("process was started without a stdout pipe")
    fd = proc.stdout.fileno()
    deadline = time.monotonic() + timeout
    buffer = b""
    while b"\n" not in buffer:
        remaining = deadline - time.monotonic()
        readable, _, _ = select.select([fd], [], [], max(remaining, 0))
        if not readable:
            pytest.fail(f"{what} printed nothing within {timeout:.0f} s", pytrace=False)
        chunk = os.read(fd, 4096)
        if not chunk:
            pytest.fail(f"{what} exited with status {proc.wait()} before printing its address", pytrace=False)
        buffer += chunk
    return buffer.split(b"\n", 1)[0].decode().strip()


def _wait_for_secret_service(address: str, keyring_daemon: subprocess.Popen[bytes]) -> None:
    """Poll the bus until the Secret Service name has an owner (NameHasOwner does not trigger activation)."""
    deadline = time.monotonic() + DAEMON_START_TIMEOUT
    with open_dbus_connection(bus=address) as connection:
        while True:
            reply = connection.send_and_get_reply(message_bus.NameHasOwner(SECRETS_NAME), timeout=DAEMON_START_TIMEOUT)
            if reply.body[0]:
                return
            if keyring_daemon.poll() is not None:
                pytest.fail(
                    f"gnome-keyring-daemon exited with status {keyring_daemon.returncode} before owning "
                    f"{SECRETS_NAME} (see its stderr above)",
                    pytrace=False,
                )
            if time.monotonic() > deadline:
                pytest.fail(
                    f"{SECRETS_NAME} has no owner on the private bus after {DAEMON_START_TIMEOUT:.0f} s; "
                    "gnome-keyring-daemon --components=secrets did not register",
                    pytrace=False,
                )
            time.sleep(POLL_INTERVAL)


def _stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(DAEMON_STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    for stream in (proc.stdin, proc.stdout):
        if stream is not None:
            stream.close()


def _redetect_keyring() -> None:
    """Make `keyring` choose its backend again: it caches both the viable backends and the choice."""
    if hasattr(keyring.backend.get_all_keyring, "saved_result"):
        keyring.backend.get_all_keyring.reset()
    keyring.core.init_backend()


@contextmanager
def private_secret_service() -> Iterator[str]:
    """A private Secret Service until the block ends; yields its D-Bus address (DBUS_SESSION_BUS_ADDRESS).

    Shared by the `keyring_env` fixture and scripts such as `python -m tests.conformance`; it changes
    nothing in this process's environment.
    """
    dbus_daemon = shutil.which("dbus-daemon")
    keyring_daemon = shutil.which("gnome-keyring-daemon")
    missing = [
        name for name, path in (("dbus-daemon", dbus_daemon), ("gnome-keyring-daemon", keyring_daemon)) if not path
    ]
    if dbus_daemon is None or keyring_daemon is None:
        _unavailable(
            f"no private Secret Service: {' and '.join(missing)} not found; "
            "install the Debian packages gnome-keyring and dbus-daemon (dbus on older releases)"
        )

    # A short path: a unix socket path must fit in 108 bytes.
    with tempfile.TemporaryDirectory(prefix="cb-keyring-") as directory:
        root = Path(directory)
        for sub in ("home", "data", "config", "run"):
            (root / sub).mkdir(mode=0o700)
        # The bus gets the private directories too: a service it activates inherits them.
        private = {
            **os.environ,
            "HOME": str(root / "home"),
            "XDG_DATA_HOME": str(root / "data"),
            "XDG_CONFIG_HOME": str(root / "config"),
            "XDG_RUNTIME_DIR": str(root / "run"),
        }
        private.pop("DBUS_SESSION_BUS_ADDRESS", None)

        bus = subprocess.Popen(
            [dbus_daemon, "--session", "--nofork", "--print-address", f"--address=unix:path={root / 'bus'}"],
            stdout=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            env=private,
        )
        daemons = [bus]
        try:
            address = _read_line(bus, DAEMON_START_TIMEOUT, "dbus-daemon")
            private["DBUS_SESSION_BUS_ADDRESS"] = address
            secrets = subprocess.Popen(
                [keyring_daemon, "--unlock", "--components=secrets", "--foreground"],
                stdin=subprocess.PIPE,
                stdout=subprocess.DEVNULL,
                env=private,
            )
            daemons.append(secrets)
            if secrets.stdin is None:
                raise ValueError("gnome-keyring-daemon was started without a stdin pipe")
            # --unlock reads the password up to end of file.
            secrets.stdin.write(KEYRING_PASSWORD.encode())
            secrets.stdin.close()
            _wait_for_secret_service(address, secrets)
            yield address
        finally:
            for daemon in reversed(daemons):
                _stop(daemon)


@pytest.fixture(scope="session")
def keyring_env() -> Iterator[Mapping[str, str]]:
    """A private Secret Service for the session; yields the environment a subprocess needs to reach it.

    Sets DBUS_SESSION_BUS_ADDRESS and unsets PYTHON_KEYRING_BACKEND in this process for the
    session (both restored afterwards), so `keyring` here uses the same keyring.
    """
    with private_secret_service() as address, pytest.MonkeyPatch.context() as patch:
        patch.setenv("DBUS_SESSION_BUS_ADDRESS", address)
        patch.delenv("PYTHON_KEYRING_BACKEND", raising=False)
        _redetect_keyring()
        try:
            yield {"DBUS_SESSION_BUS_ADDRESS": address}
        finally:
            patch.undo()
            _redetect_keyring()
