"""A starter Cellblock config for one server taken from a client's config (`cellblock wrap`).

`starter()` turns one client entry (Claude Desktop, Cursor, VS Code, …) into the body of
`servers.NAME` in `cellblock.yaml`: strict but working. Every call asks (but for the tools the
server marks read-only that the user lets run without asking at review: `read_only: review`), the
catalog is held for review, the jail shares only the directories the arguments name and has no
network unless the package is a known client of a remote API. Inline secrets leave the config:
they come back as `Secret`s for the keyring and `secrets:` / `auth:` entries that name them (an
argument's as `${secrets.NAME}` in its place, `argsecrets`). Each inference, and each thing the
user must still do, is one line in `notes`. No secret value is ever in `config` or `notes`.

Beside it: `draft` (what is built up), `secretlike` (what holds a secret), `launchers` (npx, uvx,
`uv run`, node or python SCRIPT), `known` (what Cellblock knows of particular servers) and
`browsers` (the browser a server that drives one runs in its jail).
Pure apart from looking at the file system (does a path exist, where is a script's package root).
"""

from __future__ import annotations

import json
import os
import posixpath
import re
import unicodedata
from collections.abc import Collection, Mapping, Sequence
from typing import Any, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cellblock.gateway.config.argsecrets import arg_secrets
from cellblock.gateway.config.browsers import browser_for
from cellblock.gateway.config.draft import Draft, Starter
from cellblock.gateway.config.known import (
    DATA_FILE,
    EXTRA_HINTS,
    WORKS_IN,
    carry,
    data_file,
    install_hosts,
    install_variables,
    network_for,
)
from cellblock.gateway.config.launchers import (
    INSTALLS,
    fill_cache,
    installable,
    launched_package,
    package_name,
    project_name,
    script_root,
    uv_run,
)
from cellblock.gateway.config.missing import share_missing
from cellblock.gateway.config.secretlike import (
    REF_ANYWHERE,
    REF_WHOLE,
    looks_secret,
    references,
    secret_name,
)
from cellblock.policy.constraints import within
from cellblock.policy.text import cut

__all__ = ["SERVER_NAME_MAX", "ClientEntryLike", "server_name", "starter"]

SERVER_NAME_MAX = 24
_CELLBLOCK_REF = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")  # what config.expand_path expands
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")  # VS Code's, the same as Cellblock's ${X}
_BEARER = re.compile(r"^\s*Bearer\s+(\S.*?)\s*$", re.IGNORECASE)


class ClientEntryLike(Protocol):
    """One server of a client's config (cellblock.gateway.clients.blocks.ClientEntry has this shape)."""

    @property
    def name(self) -> str: ...
    @property
    def command(self) -> str | None: ...
    @property
    def args(self) -> Sequence[str]: ...
    @property
    def env(self) -> Mapping[str, str]: ...
    @property
    def cwd(self) -> str | None: ...
    @property
    def url(self) -> str | None: ...
    @property
    def headers(self) -> Mapping[str, str]: ...
    @property
    def transport(self) -> str | None: ...
    @property
    def extra(self) -> Mapping[str, Any]: ...


def server_name(key: str, taken: Collection[str]) -> str:
    """A valid, unused Cellblock server name (`^[a-z][a-z0-9-]{0,23}$`) made from a client's key.

    Accents are dropped, other runs of characters become '-', a leading digit gets 's-'; a taken
    name gets '-2', '-3', … within 24 characters.
    """
    ascii_key = unicodedata.normalize("NFKD", key).encode("ascii", "ignore").decode()
    base = re.sub(r"[^a-z0-9]+", "-", ascii_key.lower()).strip("-")
    if not base or base[0].isdigit():
        base = f"s-{base}"
    base = base[:SERVER_NAME_MAX].rstrip("-")
    if base not in taken:
        return base
    number = 2
    while True:
        suffix = f"-{number}"
        candidate = base[: SERVER_NAME_MAX - len(suffix)].rstrip("-") + suffix
        if candidate not in taken:
            return candidate
        number += 1


def starter(
    key: str,
    entry: ClientEntryLike,
    *,
    taken: Collection[str],
    home: str,
    cache_root: str = "~/.cache/cellblock",
    client: str = "",
) -> Starter:
    """The starter config of client entry `key`, under a name not in `taken`.

    `home` expands `~` (to check paths, and in `env` values, which Cellblock takes literally);
    `cache_root` holds the per-server npx and uvx caches; `client` (a client kind) says what its
    own keys mean (known.CARRIED).

    Raises:
        ValueError: the entry has neither a command nor a URL.
    """
    draft = Draft(server_name(key, taken), home)
    if entry.command:
        if entry.url:
            draft.notes.append("url not carried over: the entry also has a command, which is what runs")
        _local(draft, entry, cache_root)
    elif entry.url:
        _remote(draft, entry)
        variable = entry.extra.get("bearer_token_env_var")
        if isinstance(variable, str) and "auth" not in draft.body:
            # Codex sends the token found in that variable; Cellblock takes it from the keyring
            draft.body["auth"] = {"type": "bearer"}
            draft.notes.append(
                f"the client sent a bearer token from ${variable}: auth: bearer; "
                f"store it with `cellblock auth set {draft.name}`"
            )
    else:
        raise ValueError(f"client entry {key!r} has neither a command nor a url")
    _extra(draft, entry.extra, client)
    # every call asks; the review offers to let the tools the server marks read-only run without asking
    draft.body["tools"] = {"default": "ask", "read_only": "review"}
    draft.body["lock"] = {"first": "review"}
    return Starter(
        name=draft.name,
        config=draft.body,
        secrets=tuple(draft.secrets),
        notes=tuple(draft.notes),
        make=tuple(draft.make),
        touch=tuple(draft.touch),
    )


def _local(draft: Draft, entry: ClientEntryLike, cache_root: str) -> None:
    command = _client_refs(draft, "command", entry.command or "")
    cwd = _client_refs(draft, "cwd", entry.cwd) if entry.cwd else None
    args = [_client_refs(draft, f"args[{i}]", arg) for i, arg in enumerate(entry.args)]
    env, secrets = _env(draft, entry.env)
    args = arg_secrets(draft, args, secrets, entry.env)
    program = posixpath.basename(command).lower()
    if program == "uv" and "run" in args:
        project = uv_run(draft, args, cwd)
        if project is not None:
            command, args, cwd = project
            program = posixpath.basename(command).lower()
    launcher, index, spec = launched_package(program, args)
    package = package_name(spec, launcher) if spec else None
    script, root = script_root(draft, program, args, cwd)
    if package is None and root is not None:
        package = project_name(draft.expand(root))
    package = package or program
    _paths(draft, args, cwd, writable="filesystem" in package or package in WORKS_IN, skip=script)
    network = network_for(draft, package, entry.env)
    args = browser_for(draft, package, args, env)
    install: dict[str, Any] | None = None
    if launcher in ("npx", "uvx") and index is not None and spec is not None:
        found = installable(draft, launcher, args, index, spec) if INSTALLS else None
        if found is not None:
            install, command, args = found
            # what its install scripts download from: known for the package, or named by the entry's env
            given_hosts, given_env = install_variables(draft, entry.env)
            if hosts := list(dict.fromkeys([*install_hosts(draft, package), *given_hosts])):
                install = {**install, "hosts": hosts}
            if given_env:
                install = {**install, "env": given_env}
        else:
            args = fill_cache(draft, launcher, args, index, spec, env, cache_root)
    if package in DATA_FILE:
        data_file(draft, package, env)
    if program in ("docker", "podman"):
        draft.notes.append(
            "runs a container: the jail does not share the docker socket, so this will fail; "
            "run it with jail: false if you trust it"
        )
    elif program == "uv" and launcher is None and "run" in args:
        draft.notes.append(
            "uv run: the jail shares no uv cache or uv-managed Python and has no network; if it fails, "
            "run the project's .venv/bin/python directly"
        )
    if entry.transport not in (None, "stdio"):
        draft.notes.append(f"transport {entry.transport!r} ignored: a server with a command speaks stdio")

    body = draft.body
    if install is not None:
        body["install"] = install
    if command:
        body["command"] = command
    if args:
        body["args"] = args
    if env:
        body["env"] = env
    if secrets:
        body["secrets"] = secrets
    if cwd:
        body["cwd"] = cwd
    jail: dict[str, Any] = dict(network)
    if draft.read_only:
        jail["read_only"] = list(draft.read_only)
    if draft.read_write:
        jail["read_write"] = list(draft.read_write)
    body["jail"] = jail


def _client_refs(draft: Draft, where: str, value: str) -> str:
    """`value` with VS Code's `${env:X}` and `${userHome}` in Cellblock's terms; a note for each variable."""
    value = _ENV_REF.sub(r"${\1}", value)
    if value.startswith("${userHome}"):
        value = "~" + value.removeprefix("${userHome}")
    for ref in REF_ANYWHERE.findall(value):
        if _CELLBLOCK_REF.fullmatch(ref):
            draft.notes.append(
                f"{where} uses {ref}: Cellblock expands it from its own environment when the config loads "
                "(an unset one is a config error); make sure it is set, or write the value"
            )
        else:
            draft.notes.append(
                f"{where} holds the client variable {ref}, which Cellblock passes literally; write the value"
            )
    return value


def _env(draft: Draft, env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(literal env, secrets: VAR -> keyring entry), with a note for each reference and secret."""
    literal: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for name, value in env.items():
        if looks_secret(name, value):
            secrets[name] = entry = draft.secret(name, value, "env")
            draft.notes.append(f"{name} is a secret: moved to keyring entry {entry!r} (secrets:)")
            continue
        literal[name] = value
        refs = references(value)
        if refs:
            hint = "; a secret goes under secrets: (a keyring entry) instead" if secret_name(name) else ""
            draft.notes.append(
                f"env {name} holds the client reference {refs}: Cellblock passes env values literally "
                f"(it expands ${{NAME}} only in paths), so write the value{hint}"
            )
        elif draft.path(value, None) and os.path.exists(draft.expand(value)):
            draft.notes.append(
                f"env {name} names {value}, which the jail does not share; add it to jail.read_only "
                "or read_write if the server uses it"
            )
    return literal, secrets


def _paths(draft: Draft, args: Sequence[str], cwd: str | None, *, writable: bool, skip: str | None) -> None:
    """Share each directory or file the arguments name; a filesystem server's directories writable."""
    for arg in args:
        value = arg.partition("=")[2] if arg.startswith("--") and "=" in arg else arg
        path = draft.path(value, cwd)
        if path is None or path == skip or "${" in value:
            if value.startswith(("./", "../")) and not cwd:
                draft.notes.append(f"{value!r} is relative and the entry has no cwd: not shared")
            continue
        real = draft.expand(path)
        if os.path.exists(real) and _home_or_above(real, draft.home):
            draft.notes.append(f"{path} not shared: it is your home or above it; share the folders it needs")
        elif os.path.isdir(real):
            mode = "read_write" if writable else "read_only"
            draft.share(path, writable=writable)
            why = "the server is given this directory to work on" if writable else "named in its arguments"
            draft.notes.append(f"{mode}: {path} ({why}; adjust jail.{mode} if it needs less or more)")
        elif os.path.isfile(real):
            draft.share(path, writable=False)
            draft.notes.append(f"read_only: {path} (a file named in its arguments)")
        else:
            share_missing(draft, path, writable=writable)
    folder = draft.path(cwd, None) if cwd else None
    if cwd and folder is None:
        draft.notes.append(f"cwd {cwd!r} is not an absolute path: make it one (the jail must share it)")
    elif folder is not None:
        real = draft.expand(folder)
        shared = [draft.expand(p) for p in (*draft.read_only, *draft.read_write)]
        if not os.path.isdir(real):
            draft.notes.append(f"cwd {cwd} does not exist: the server will not start until it does")
        elif any(within(real, s) for s in shared):
            pass
        elif _home_or_above(real, draft.home):
            draft.notes.append(f"cwd {cwd} is your home or above it, which the jail never shares: pick a folder")
        else:
            draft.share(folder, writable=False)
            draft.notes.append(f"read_only: {folder} (its working directory, which the jail must share)")


def _home_or_above(path: str, home: str) -> bool:
    real, home = os.path.normpath(path), os.path.normpath(home)
    return real == "/" or within(home, real)


def _remote(draft: Draft, entry: ClientEntryLike) -> None:
    body = draft.body
    body["url"] = _url(draft, entry.url or "")
    body["headers"] = headers = dict[str, str]()
    body["auth"] = {"type": "none"}
    secrets: dict[str, str] = {}
    for name, value in entry.headers.items():
        lower = name.lower()
        bearer = _BEARER.match(value) if lower == "authorization" else None
        if bearer is not None:
            body["auth"] = {"type": "bearer"}
            token = bearer.group(1)
            if REF_WHOLE.fullmatch(token):
                draft.notes.append(
                    f"Authorization held the client reference {token}: auth: bearer; "
                    f"store the token with `cellblock auth set {draft.name}`"
                )
            else:
                draft.secret(name, token, "bearer")
                draft.notes.append(f"Authorization: Bearer token moved to keyring entry {draft.name!r} (auth: bearer)")
        elif looks_secret(name, value):
            secrets[name] = entry_name = draft.secret(name, value, "header")
            draft.notes.append(f"header {name} is a secret: moved to keyring entry {entry_name!r} (secrets:)")
        elif lower in ("authorization", "proxy-authorization", "cookie"):
            refs = references(value)
            draft.notes.append(
                f"header {name} not carried over"
                + (f" (it holds the client reference {refs})" if refs else "")
                + ": Cellblock takes credentials from the keyring only (auth: bearer, secrets:)"
            )
        else:
            headers[name] = value
            refs = references(value)
            if refs:
                draft.notes.append(
                    f"header {name} holds the client reference {refs}: Cellblock sends header values literally; "
                    "write the value (a secret goes under secrets:)"
                )
    if not headers:
        del body["headers"]
    if body["auth"] == {"type": "none"}:
        del body["auth"]
    if secrets:
        body["secrets"] = secrets
    transport = (entry.transport or "").lower().replace("_", "-")
    if transport == "sse":
        draft.notes.append(
            "transport sse: Cellblock speaks Streamable HTTP only; kept, but it will fail unless the server "
            "also serves Streamable HTTP (often at /mcp instead of /sse)"
        )
    elif transport not in ("", "http", "streamable-http", "streamablehttp"):
        draft.notes.append(f"transport {entry.transport!r} unknown: Cellblock speaks Streamable HTTP")


def _url(draft: Draft, url: str) -> str:
    """`url` without credentials in its userinfo or query, with a note for each one left out."""
    parts = urlsplit(url)
    netloc = parts.netloc.rpartition("@")[2]
    if netloc != parts.netloc:
        draft.notes.append("url: the user and password in it are left out; Cellblock cannot send them from the keyring")
        if parts.password:
            draft.secret("url-password", parts.password, "stash")
    query = parse_qsl(parts.query, keep_blank_values=True)
    kept = [(k, v) for k, v in query if not looks_secret(k, v)]
    for k, v in (q for q in query if q not in kept):
        draft.secret(f"url-{k}", v, "stash")
        draft.notes.append(
            f"url: query parameter {k!r} holds a secret and is left out: Cellblock cannot send it from the "
            "keyring; if the server takes a header or a bearer token instead, use secrets: or auth: bearer"
        )
    if netloc == parts.netloc and len(kept) == len(query):
        return url
    return urlunsplit(parts._replace(netloc=netloc, query=urlencode(kept)))


def _extra(draft: Draft, extra: Mapping[str, Any], client: str) -> None:
    for key, value in extra.items():
        if carry(draft, client, key, value):
            continue
        shown = "(value hidden: it may be a secret)" if _holds_secret(key, value) else _show(value)
        if isinstance(value, str) and _holds_secret(key, value):
            draft.secret(key, value, "stash")
        hint = EXTRA_HINTS.get(key)
        draft.notes.append(f"not carried over: {key}={shown}" + (f" ({hint})" if hint else ""))


def _holds_secret(key: str, value: Any) -> bool:
    if key.lower().endswith("env_var"):
        return False  # names a variable (Codex's bearer_token_env_var), holds no value
    if isinstance(value, str):
        return looks_secret(key, value)
    if isinstance(value, Mapping):
        return any(_holds_secret(str(k), v) for k, v in value.items())
    if isinstance(value, list | tuple):
        return any(_holds_secret(key, v) for v in value)
    return False


def _show(value: Any, limit: int = 80) -> str:
    """`value` as compact JSON on one line, cut to `limit` characters."""
    text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)
    return cut(text, limit)
