"""`cellblock auth set|login|logout|list`: put credentials into the keyring, and take them out.

A value is read from a hidden prompt or from stdin, never from the command line (argv is visible
to every process). Nothing here prints a value. After a change, running gateways are asked to
start again the servers that use the entry, so a server that failed for want of it comes up.
"""

from __future__ import annotations

import getpass
import sys
import threading
import time
import webbrowser
from collections.abc import Callable
from pathlib import Path
from typing import IO

import anyio

from cellblock.gateway.cli.gateways import ask_all, pid_of
from cellblock.gateway.cli.options import load, quiet_oauth_logs
from cellblock.gateway.config.model import Config, ConfigError, RemoteServer
from cellblock.gateway.credentials import (
    HTTP_TOKEN_ENTRY,
    CredentialError,
    Keyring,
    active_backend,
    client_key_entry,
    client_secret_entry,
    id_token_entry,
    oauth_entries,
)
from cellblock.gateway.downstream.callback import LOGIN_SECONDS
from cellblock.gateway.downstream.clientkey import key_algorithms
from cellblock.gateway.downstream.oauth import KeyringTokenStorage
from cellblock.gateway.downstream.remote import login
from cellblock.gateway.state import state_dir

__all__ = ["auth_command", "auth_list", "auth_login", "auth_logout", "auth_set", "read_private_key", "read_secret"]


def _say(text: str) -> None:
    print(f"cellblock: {text}", file=sys.stderr)


def auth_command(
    action: str, name: str, config_path: str | None, open_browser: bool = True, key_file: str | None = None
) -> int:
    """`cellblock auth ACTION [NAME]` (`list` takes no NAME: ""); running gateways are told of each change.
    `key_file`: where `set --private-key` reads the key (`-`: stdin)."""
    config, _ = load(config_path, name if action == "login" else None)
    if name == HTTP_TOKEN_ENTRY and action in ("set", "logout"):
        return _http_token(config, action)
    if action == "set":
        return auth_set(config, name, _reconnect, key_file=key_file)
    if action == "login":
        return auth_login(config, name, _reconnect, open_browser=open_browser)
    if action == "logout":
        return auth_logout(config, name, _reconnect)
    return auth_list(config)


def _reconnect(server: str) -> None:
    # running gateways start the server again (or reconnect it) so it reads the keyring anew
    for path, reply in ask_all({"op": "reconnect", "server": server}):
        if reply.get("ok") and reply.get("restarted"):
            _say(f"gateway {pid_of(path)} is reconnecting '{server}'")


def _users(config: Config, entry: str) -> list[tuple[str, str]]:
    """(server, what) for every use of keyring entry `entry` in the config."""
    return [(server, what) for name, server, what in config.credential_entries() if name == entry]


def _http_token(config: Config, action: str, stream: IO[str] | None = None) -> int:
    """`auth set --http` and `auth logout --http`: the token clients of `serve --http` must send."""
    store = Keyring(config.credentials.allow_insecure)
    if action == "set":
        store.set(HTTP_TOKEN_ENTRY, read_secret(HTTP_TOKEN_ENTRY, stream))
        _say(
            f"OK: stored the token of `cellblock serve --http` in {store.backend.label}; "
            "it is required from the next start"
        )
        return 0
    if not store.delete(HTTP_TOKEN_ENTRY):
        _say("no token of `cellblock serve --http` is stored")
        return 1
    _say(
        f"OK: removed the token of `cellblock serve --http` from {store.backend.label}; from the next start, "
        "only a loopback address can be served"
    )
    return 0


def read_secret(entry: str, stream: IO[str] | None = None) -> str:
    """The value for `entry`: a hidden prompt on a terminal, else all of stdin (one trailing newline dropped).

    Raises:
        CredentialError: the value is empty.
    """
    stream = stream or sys.stdin
    if stream.isatty():
        value = getpass.getpass(f"value for keyring entry '{entry}' (input hidden): ")
    else:
        value = stream.read()
        value = value[:-2] if value.endswith("\r\n") else value[:-1] if value.endswith("\n") else value
    if not value:
        raise CredentialError(f"no value given for '{entry}'; nothing stored")
    return value


def read_private_key(entry: str, key_file: str, stream: IO[str] | None = None) -> str:
    """A PEM private key from `key_file`, or all of stdin for `-`, checked to be one JWTs are signed with.

    Raises:
        CredentialError: the key was given on the command line, or is not a usable private key.
    """
    if key_file.lstrip().startswith("-----BEGIN"):
        raise CredentialError(
            "a key given as an argument is refused, because anyone can read another process's arguments; "
            "give its file (--private-key KEY.pem) or stdin (--private-key < KEY.pem)"
        )
    stream = stream or sys.stdin
    if key_file == "-" and stream.isatty():
        raise CredentialError(f"give the key for '{entry}' as a file (--private-key KEY.pem) or on stdin (< KEY.pem)")
    try:
        pem = stream.read() if key_file == "-" else Path(key_file).read_text()
    except (OSError, UnicodeDecodeError) as exc:
        raise CredentialError(f"cannot read the key file {key_file}: {type(exc).__name__}") from None
    key_algorithms(pem)  # refuses what cannot sign, before anything is stored
    return pem


def auth_set(
    config: Config,
    entry: str,
    notify: Callable[[str], None],
    stream: IO[str] | None = None,
    key_file: str | None = None,
) -> int:
    """Store the value of keyring entry `entry` (a bearer server's name, or a `secrets:` entry), or
    with `key_file` an OAuth client's private key (entry `client_key_entry(server)`)."""
    users = _users(config, entry)
    if not users and key_file is not None:
        raise ConfigError(
            f"no server signs its OAuth client's assertions with keyring entry '{entry}'; give it "
            "auth: {type: oauth, grant: client_credentials, client_id: ID, client_auth: private_key_jwt} first"
        )
    if not users:
        known = sorted({name for name, _, _ in config.credential_entries()})
        hint = f" (it uses: {', '.join(known)})" if known else ""
        raise ConfigError(
            f"nothing in the config uses keyring entry '{entry}'{hint}; give a remote server "
            f"auth: {{type: bearer}}, or a local one secrets: {{VAR: {entry}}}, first"
        )
    if any(what == "oauth token" for _, what in users):
        raise ConfigError(f"server '{entry}' uses OAuth; its tokens come from `cellblock auth login {entry}`")
    store = Keyring(config.credentials.allow_insecure)
    store.set(entry, read_secret(entry, stream) if key_file is None else read_private_key(entry, key_file, stream))
    uses = ", ".join(f"{what} of '{server}'" for server, what in users)
    _say(f"OK: stored keyring entry '{entry}' ({uses}) in {store.backend.label}")
    for server in sorted({server for server, _ in users}):
        notify(server)
    return 0


def auth_logout(config: Config, name: str, notify: Callable[[str], None]) -> int:
    """Remove what the keyring holds for `name`: its token or secret, and its OAuth records.

    Running gateways reconnect the servers that used it, so they stop using the old credential.
    Tokens are not revoked at the authorization server.
    """
    store = Keyring(config.credentials.allow_insecure)
    entries = (name, *oauth_entries(name), client_secret_entry(name), client_key_entry(name), id_token_entry(name))
    removed = [entry for entry in entries if store.delete(entry)]
    if not removed:
        _say(f"nothing stored for '{name}'")
        return 1
    _say(f"OK: removed {', '.join(repr(e) for e in removed)} from {store.backend.label}")
    for server in sorted({server for server, _ in _users(config, name)}):
        notify(server)
    return 0


def auth_list(config: Config, out: IO[str] | None = None) -> int:
    """Which configured credentials are in the keyring (never their values)."""
    out = out or sys.stdout
    backend = active_backend()
    _say(f"keyring backend: {backend.describe()}")
    entries = config.credential_entries()
    if not entries:
        _say("the config names no credentials (no auth: on remote servers, no secrets: on local ones)")
        return 0
    store = Keyring(config.credentials.allow_insecure)
    print("entry\tserver\tkind\tstate", file=out)
    for entry, server, what in entries:
        state = _oauth_state(store, server) if what == "oauth token" else "set" if store.get(entry) else "NOT SET"
        print(f"{entry}\t{server}\t{what}\t{state}", file=out)
    return 0


def _oauth_state(store: Keyring, server: str) -> str:
    state = anyio.run(KeyringTokenStorage(store, server).token_state)
    if state is None:
        return f"NOT LOGGED IN (run `cellblock auth login {server}`)"
    expires, refresh = state
    if expires is None:
        return "logged in"
    left = expires - time.time()
    if left > 0:
        return f"logged in (access token valid {int(left // 60)}m{int(left % 60):02d}s)"
    return "logged in (access token expired; refreshed at next use)" if refresh else "LOGIN EXPIRED"


def auth_login(config: Config, name: str, notify: Callable[[str], None], open_browser: bool = True) -> int:
    """OAuth login for remote server `name`: browser (or printed URL), redirect caught on loopback."""
    server = config.servers[name]
    if not isinstance(server, RemoteServer) or server.auth.type != "oauth":
        raise ConfigError(f"server '{name}' does not use OAuth (auth: {{type: oauth}}); nothing to log in to")
    store = Keyring(config.credentials.allow_insecure)
    quiet_oauth_logs()

    async def show(url: str) -> None:
        _say(f"to log in to '{name}', open this URL in a browser (waiting {LOGIN_SECONDS / 60:g} minutes):")
        print(url, file=sys.stderr)
        if open_browser:
            # not awaited: some browser commands return only when the browser exits
            threading.Thread(target=webbrowser.open, args=(url,), daemon=True).start()

    # a URL the server points OAuth at that discovery refuses is audited, as in the gateway
    audit = config.audit_log(state_dir())
    try:
        tools = anyio.run(login, name, server, store, show, None, lambda refused: refused.record(audit))
    finally:
        audit.close()
    _say(f"OK: logged in to '{name}' ({tools} tools); tokens are in {store.backend.label}")
    notify(name)
    return 0
