"""A starter Cellblock config for one server taken from a client's config (`cellblock wrap`).

`starter()` turns one client entry (Claude Desktop, Cursor, VS Code, …) into the body of
`servers.NAME` in `cellblock.yaml`: strict but working. Every call asks, the catalog is held for
review, the jail shares only the directories the arguments name and has no network unless the
package is a known client of a remote API. Inline secrets leave the config: they come back as
`Secret`s for the keyring and `secrets:` / `auth:` entries that name them. Each inference, and
each thing the user must still do, is one line in `notes`. No secret value is ever in `config` or
`notes`.

Pure apart from looking at the file system (does a path exist, where is a script's package root).
"""

from __future__ import annotations

import json
import math
import os
import posixpath
import re
import shlex
import sys
import tomllib
import unicodedata
from collections import Counter
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol
from urllib.parse import parse_qsl, urlencode, urlsplit, urlunsplit

from cellblock.sandbox.packages import PackageError, parse_package

__all__ = [
    "KNOWN_HOSTS",
    "ClientEntryLike",
    "Secret",
    "Starter",
    "looks_secret",
    "server_name",
    "starter",
]

# Package (or command) name without version -> (what it talks to, the hosts it needs).
KNOWN_HOSTS: Mapping[str, tuple[str, tuple[str, ...]]] = {
    "@modelcontextprotocol/server-github": ("the GitHub API", ("api.github.com",)),
    "github-mcp-server": ("the GitHub API", ("api.github.com",)),
    "@modelcontextprotocol/server-gitlab": ("the GitLab API", ("gitlab.com",)),
    "@modelcontextprotocol/server-slack": ("the Slack API", ("slack.com",)),
    "@modelcontextprotocol/server-brave-search": ("the Brave Search API", ("api.search.brave.com",)),
    "@brave/brave-search-mcp-server": ("the Brave Search API", ("api.search.brave.com",)),
    "@modelcontextprotocol/server-google-maps": ("the Google Maps API", ("maps.googleapis.com",)),
    "mcp-server-sentry": ("the Sentry API", ("sentry.io",)),
    "@sentry/mcp-server": ("the Sentry API", ("sentry.io",)),
    "@notionhq/notion-mcp-server": ("the Notion API", ("api.notion.com",)),
}
# An environment variable that points a known package at another instance (self-hosted GitLab).
_HOST_FROM_ENV = {"@modelcontextprotocol/server-gitlab": "GITLAB_API_URL"}
# Servers that fetch whatever URL they are given: their hosts cannot be inferred.
_FETCHERS = frozenset({"mcp-server-fetch", "@modelcontextprotocol/server-fetch"})
# Servers that keep their data beside their own code unless a variable says where: an installed
# package is read-only, so the data goes to a directory of the user's (variable, default file).
_DATA_FILE = {"@modelcontextprotocol/server-memory": ("MEMORY_FILE_PATH", "~/.local/share/mcp-memory/memory.jsonl")}
# Servers that change the directories their arguments name (besides any filesystem server): the
# git server commits to its --repository
_WORKS_IN = frozenset({"mcp-server-git"})

SERVER_NAME_MAX = 24
ENTRY_MAX = 64  # cellblock.gateway.downstream.credentials.ENTRY_NAME
# stands in for a secret in an argument: Cellblock can pass a keyring value only as an env var
REDACTED = "[redacted]"
# files that mark a script's package root
_PATH_ANCHORS = ("package.json", "pyproject.toml", "setup.py")

_REF_ANYWHERE = re.compile(r"\$\{[^}]*\}")  # ${X}, ${env:X}, ${input:x}, ${workspaceFolder}
_REF_WHOLE = re.compile(r"\$\{[^}]*\}|\$[A-Za-z_][A-Za-z0-9_]*")  # also $X, but only as the whole value
_CELLBLOCK_REF = re.compile(r"\$\{[A-Za-z_][A-Za-z0-9_]*\}")  # what config.expand_path expands
_ENV_REF = re.compile(r"\$\{env:([A-Za-z_][A-Za-z0-9_]*)\}")  # VS Code's, the same as Cellblock's ${X}
_SECRET_PREFIX = re.compile(
    r"^(?:gh[pousr]_|github_pat_|glpat-|sk-|sk_live_|rk_live_|xox[abpors]-|xapp-|AIza|hf_|npm_|pypi-)"
    r"[A-Za-z0-9_\-.]{10,}$"
)
_ASSIGNMENT = re.compile(r"^-{0,2}[A-Za-z_][A-Za-z0-9_.-]*=(?!=)")  # --token=X, TOKEN=X (docker -e)
_AWS_KEY = re.compile(r"^(?:AKIA|ASIA)[A-Z0-9]{16}$")
_JWT = re.compile(r"^eyJ[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+\.[A-Za-z0-9_-]+$")
_AUTH_SCHEME = re.compile(r"^(?:Bearer|Basic)\s+\S{8,}$", re.IGNORECASE)
_TOKEN_CHARS = re.compile(r"^[A-Za-z0-9_\-+/=]{32,}$")
_BEARER = re.compile(r"^\s*Bearer\s+(\S.*?)\s*$", re.IGNORECASE)

# Parts of a name that mark a secret, inside one word ("GITHUB_TOKEN", "clientSecret", "DBPASSWORD").
_SECRET_PARTS = ("TOKEN", "SECRET", "PASSWORD", "PASSWD", "CREDENTIAL", "COOKIE", "SESSION", "AUTHORIZATION")
# Whole words that mark a secret ("API_KEY", "GITHUB_PAT"; not "KEYBOARD", "MONKEY", "PATH").
_SECRET_WORDS = frozenset({"KEY", "KEYS", "PAT", "AUTH", "PASS", "APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY"})
# A last word that makes the name about a secret rather than one ("TOKEN_FILE", "SESSION_TIMEOUT").
_NOT_SECRET_LAST = frozenset(
    {
        *("FILE", "PATH", "DIR", "URL", "URI", "HOST", "PORT", "ENDPOINT", "TIMEOUT", "TTL", "EXPIRY"),
        *("TYPE", "MODE", "LEVEL", "ENABLED", "DISABLED", "COUNT", "LIMIT", "SIZE", "MAX", "MIN"),
        *("LENGTH", "NAME", "PREFIX", "SCOPE", "SCOPES", "TOKENS", "HEADER", "FORMAT"),
    }
)
_PLAIN_VALUES = frozenset({"true", "false", "yes", "no", "on", "off", "none", "null"})

_NODES = frozenset({"node", "nodejs"})
_PYTHON = re.compile(r"^python(?:\d+(?:\.\d+)?)?$")
_NPX_VALUE_OPTIONS = frozenset({"-p", "--package", "-c", "--call", "--registry", "-w", "--workspace"})
_UVX_VALUE_OPTIONS = frozenset(
    {
        *("--from", "--with", "--with-editable", "--with-requirements", "--python", "-p", "--index"),
        *("--index-url", "--extra-index-url", "--default-index", "--cache-dir", "--directory"),
        *("--project", "--config-file", "--env-file", "--constraints", "--overrides", "--build-constraints"),
    }
)
# Client keys with a hint on how to get the same in Cellblock.
_EXTRA_HINTS = {
    "autoApprove": "to allow tools without asking, add them under tools.rules as allow",
    "alwaysAllow": "to allow tools without asking, add them under tools.rules as allow",
    "disabled": "Cellblock starts every server it lists; remove it, or set start: lazy",
    "timeout": "set timeout: SECONDS on the server",
    "bearer_token_env_var": "now auth: bearer, see above",
}


@dataclass(frozen=True)
class Secret:
    """An inline secret of a client entry, to be stored in the keyring under `entry`."""

    key: str  # the environment variable or header name
    entry: str  # the keyring entry (under the service "cellblock")
    value: str = field(repr=False)
    # env / header / bearer: the server gets it from the keyring; stash: a value the config cannot
    # carry (an argument, part of a URL), kept in the keyring only so that unwrap can put it back
    kind: Literal["env", "header", "bearer", "stash"]


@dataclass(frozen=True)
class Starter:
    """The Cellblock config of one server, the secrets it moved out, and what to tell the user."""

    name: str
    config: dict[str, Any]
    secrets: tuple[Secret, ...]
    notes: tuple[str, ...]
    # directories the server keeps its data in, which wrap creates (a jail grants only what exists)
    make: tuple[str, ...] = ()


class ClientEntryLike(Protocol):
    """One server of a client's config (cellblock.gateway.clients.kinds.ClientEntry has this shape)."""

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


def looks_secret(name: str, value: str) -> bool:
    """Whether an env var or header `name` with `value` holds a secret, by its name or the value's shape.

    Empty values and references (`${input:x}`, `${env:X}`, `${X}`, `$X`) hold no secret.
    """
    if not value.strip() or _REF_WHOLE.fullmatch(value.strip()):
        return False
    if _REF_ANYWHERE.search(value):
        return _secret_shape(_REF_ANYWHERE.sub("", value).strip())
    if _secret_shape(value):
        return True
    return _secret_name(name) and value.strip().lower() not in _PLAIN_VALUES


def starter(
    key: str,
    entry: ClientEntryLike,
    *,
    taken: Collection[str],
    home: str,
    cache_root: str = "~/.cache/cellblock",
) -> Starter:
    """The starter config of client entry `key`, under a name not in `taken`.

    `home` expands `~` (to check paths, and in `env` values, which Cellblock takes literally);
    `cache_root` holds the per-server npx and uvx caches.

    Raises:
        ValueError: the entry has neither a command nor a URL.
    """
    draft = _Draft(server_name(key, taken), home)
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
    _extra(draft, entry.extra)
    draft.body["tools"] = {"default": "ask"}
    draft.body["lock"] = {"first": "review"}
    return Starter(
        name=draft.name,
        config=draft.body,
        secrets=tuple(draft.secrets),
        notes=tuple(draft.notes),
        make=tuple(draft.make),
    )


@dataclass
class _Draft:
    """What `starter` builds up for one server."""

    name: str
    home: str
    body: dict[str, Any] = field(default_factory=dict)
    secrets: list[Secret] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    read_only: dict[str, None] = field(default_factory=dict)
    read_write: dict[str, None] = field(default_factory=dict)
    make: list[str] = field(default_factory=list)

    def secret(self, key: str, value: str, kind: Literal["env", "header", "bearer", "stash"]) -> str:
        """Record a secret and return its keyring entry, unique within this server."""
        entry = self.name if kind == "bearer" else _entry_name(self.name, key, {s.entry for s in self.secrets})
        self.secrets.append(Secret(key=key, entry=entry, value=value, kind=kind))
        return entry

    def expand(self, path: str) -> str:
        return self.home + path[1:] if path == "~" or path.startswith("~/") else path

    def path(self, arg: str, cwd: str | None, *, bare: bool = False) -> str | None:
        """`arg` as a normalised absolute or `~/` path, None if it is none; relative ones against `cwd`
        when they start with `./` or `../` (any relative one when `bare`)."""
        if arg.startswith(("/", "~/")) or arg == "~":
            full, tilde = posixpath.normpath(self.expand(arg)), arg.startswith("~")
        elif cwd and self.expand(cwd).startswith("/") and (bare or arg.startswith(("./", "../")) or arg == ".."):
            full, tilde = posixpath.normpath(posixpath.join(self.expand(cwd), arg)), cwd.startswith("~")
        else:
            return None
        home = self.home.rstrip("/")
        if tilde and (full == home or full.startswith(home + "/")):
            return "~" + full[len(home) :]
        return full

    def share(self, path: str, writable: bool) -> None:
        if writable:
            self.read_only.pop(path, None)
            self.read_write[path] = None
        elif path not in self.read_write:
            self.read_only[path] = None


# --- local servers ---------------------------------------------------------------------------


def _local(draft: _Draft, entry: ClientEntryLike, cache_root: str) -> None:
    command = _client_refs(draft, "command", entry.command or "")
    cwd = _client_refs(draft, "cwd", entry.cwd) if entry.cwd else None
    args = [_client_refs(draft, f"args[{i}]", arg) for i, arg in enumerate(entry.args)]
    args = _arg_secrets(draft, args)
    env, secrets = _env(draft, entry.env)
    program = posixpath.basename(command).lower()
    if program == "uv" and "run" in args:
        project = _uv_run(draft, args, cwd)
        if project is not None:
            command, args, cwd = project
            program = posixpath.basename(command).lower()
    launcher, index, spec = _package(program, args)
    package = _package_name(spec, launcher) if spec else None
    script, root = _script(draft, program, args, cwd)
    if package is None and root is not None:
        package = _project_name(draft.expand(root))
    package = package or program
    _paths(draft, args, cwd, writable="filesystem" in package or package in _WORKS_IN, skip=script)
    network = _network(draft, package, entry.env, node=launcher == "npx" or program in _NODES)
    install: dict[str, str] | None = None
    if launcher in ("npx", "uvx") and index is not None and spec is not None:
        found = _installable(draft, launcher, args, index, spec) if _INSTALLS else None
        if found is not None:
            install, command, args = found
        else:
            args = _cache(draft, launcher, args, index, spec, env, cache_root)
    if package in _DATA_FILE:
        _data_file(draft, package, env)
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


# `uv run` options that take a value; the ones that change what runs (--with, --python…) are not
# the project's environment as it is, so such an entry keeps uv
_UV_RUN_PLAIN = frozenset({"--directory", "--project"})
_UV_RUN_FLAGS = frozenset({"--frozen", "--locked", "--no-sync", "--offline", "-q", "--quiet", "--no-dev"})


def _uv_run(draft: _Draft, args: list[str], cwd: str | None) -> tuple[str, list[str], str] | None:
    """(command, args, cwd) that run `uv run [--directory DIR] TARGET ARGS…` from the project's own
    `.venv` as it is: uv would first sync it (network, its cache), which the jail has neither of.
    TARGET is a script (run by the virtualenv's Python) or one of its programs. None when the
    project has no `.venv`, or options change what runs."""
    project = cwd
    at = args.index("run")  # also `uv --directory DIR run …`
    words = [*args[:at], *args[at + 1 :]]
    j = 0
    while j < len(words):
        word = words[j]
        name, eq, value = word.partition("=")
        if name in _UV_RUN_PLAIN:
            if not eq:
                j += 1
                value = words[j] if j < len(words) else ""
            project = value
        elif word in _UV_RUN_FLAGS:
            pass
        elif word.startswith("-"):
            return None
        else:
            break
        j += 1
    target, target_args = (words[j], words[j + 1 :]) if j < len(words) else ("", [])
    full = draft.path(project, None) if project else None
    if not target or full is None or not os.path.isdir(draft.expand(full) + "/.venv/bin"):
        return None
    venv = posixpath.join(full, ".venv", "bin")
    if target.endswith(".py"):
        command, new_args = posixpath.join(venv, "python"), [target, *target_args]
    elif target in ("python", "python3") or os.path.isfile(posixpath.join(draft.expand(venv), target)):
        command, new_args = posixpath.join(venv, target), target_args
    else:
        return None
    draft.share(full, writable=False)
    draft.notes.append(
        f"uv run: runs {full}/.venv as it is (uv would sync it first, with the network and its cache, "
        f"which the jail has not); after changing the project, run `uv sync` in {full}"
    )
    return command, new_args, full


def _client_refs(draft: _Draft, where: str, value: str) -> str:
    """`value` with VS Code's `${env:X}` and `${userHome}` in Cellblock's terms; a note for each variable."""
    value = _ENV_REF.sub(r"${\1}", value)
    if value.startswith("${userHome}"):
        value = "~" + value.removeprefix("${userHome}")
    for ref in _REF_ANYWHERE.findall(value):
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


def _arg_secrets(draft: _Draft, args: list[str]) -> list[str]:
    """Arguments with a secret (by shape, or after `--token`-like options) replaced by REDACTED."""
    out: list[str] = []
    option = ""
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=") if _ASSIGNMENT.match(arg) else ("", "", arg)
        if eq and (_secret_shape(value) or (_secret_name(name) and looks_secret(name, value))):
            out.append(f"{name}={REDACTED}")
            draft.secret(f"arg-{i}", value, "stash")
        elif not arg.startswith("-") and (_secret_shape(arg) or (_secret_name(option) and looks_secret(option, arg))):
            out.append(REDACTED)
            draft.secret(f"arg-{i}", arg, "stash")
        elif parts := _embedded_secrets(arg):
            for part in parts:
                draft.secret(f"arg-{i}", part, "stash")
                arg = arg.replace(part, REDACTED)
            out.append(arg)
        else:
            out.append(arg)
            option = arg if arg.startswith("-") else ""
            continue
        option = ""
        draft.notes.append(
            f"args[{i}] held a secret and now reads {REDACTED}: Cellblock passes secrets only as environment "
            "variables (secrets:), never as arguments; if the server reads one, add it there"
        )
    return out


# a token after "Bearer " (an `Authorization: Bearer X` header passed as an argument), and the
# password of a URL's userinfo (postgresql://app:PASSWORD@db/app)
_EMBEDDED = (
    re.compile(r"\bBearer\s+([^\s\"',;]+)", re.IGNORECASE),
    re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^/\s:@]+:([^@\s/]+)@"),
)


def _embedded_secrets(arg: str) -> list[str]:
    """Secrets inside a longer argument: a bearer token, a URL's password (never a `${reference}`)."""
    found = [m.group(1) for pattern in _EMBEDDED for m in pattern.finditer(arg)]
    return [part for part in found if not part.startswith("$")]


def _package(program: str, args: Sequence[str]) -> tuple[str | None, int | None, str | None]:
    """(launcher, index of the package's argument, package spec) for npx, uvx and `uv tool run`."""
    if program == "npx":
        return ("npx", *_first_positional(args, _NPX_VALUE_OPTIONS, ("-p", "--package")))
    if program == "uvx":
        return ("uvx", *_first_positional(args, _UVX_VALUE_OPTIONS, ("--from",)))
    if program == "uv" and list(args[:2]) == ["tool", "run"]:
        index, spec = _first_positional(args[2:], _UVX_VALUE_OPTIONS, ("--from",))
        return "uvx", None if index is None else index + 2, spec
    return None, None, None


def _first_positional(
    args: Sequence[str], takes_value: Collection[str], names_package: Collection[str]
) -> tuple[int | None, str | None]:
    """The index of the first positional argument and the package: that argument, or an option's."""
    package: str | None = None
    i = 0
    while i < len(args):
        arg = args[i]
        option, eq, value = arg.partition("=")
        if arg == "--":
            i += 1
            break
        if eq and option in names_package:
            package = value
        elif arg in takes_value:
            if arg in names_package and i + 1 < len(args):
                package = args[i + 1]
            i += 1
        elif not arg.startswith("-"):
            return i, package or arg
        i += 1
    return (i, package or args[i]) if i < len(args) else (None, package)


def _package_name(spec: str, launcher: str | None) -> str:
    if launcher == "npx":
        spec = spec.removeprefix("npm:")
        if spec.startswith("@"):
            scope, _, rest = spec.partition("/")
            return f"{scope}/{rest.split('@', 1)[0]}".lower()
        return spec.split("@", 1)[0].lower()
    match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", spec)
    return re.sub(r"[-_.]+", "-", match.group(0)).lower() if match else spec.lower()


def _pinned(spec: str, launcher: str) -> bool:
    if launcher == "npx":
        version = spec.removeprefix("npm:").lstrip("@").partition("@")[2]
    else:
        version = spec.partition("==")[2] or spec.partition("@")[2]
    return version not in ("", "latest")


def _script(draft: _Draft, program: str, args: Sequence[str], cwd: str | None) -> tuple[str | None, str | None]:
    """(script, its package root shared read-only) for `node`/`python SCRIPT`; Nones for `-m`, `-c`…"""
    if program not in _NODES and not _PYTHON.match(program):
        return None, None
    for arg in args:
        if arg in ("-m", "-c", "-e", "--eval", "-p", "--print"):
            return None, None
        if arg.startswith("-"):
            continue
        path = draft.path(arg, cwd, bare=True)
        if path is None or not os.path.isfile(draft.expand(path)):
            draft.notes.append(f"script {arg!r} not found: nothing shared for it; add its folder to jail.read_only")
            return None, None
        root = _package_root(draft, path)
        # a package installed under node_modules finds its dependencies in the outermost
        # node_modules (npm hoists them there), so that whole folder is shared
        parts = root.split("/")
        code = "/".join(parts[: parts.index("node_modules") + 1]) if "node_modules" in parts else root
        draft.share(code, writable=False)
        draft.notes.append(f"read_only: {code} (the code of the script it runs)")
        return path, root
    return None, None


def _package_root(draft: _Draft, script: str) -> str:
    """The nearest parent of `script` holding a package manifest, else its folder; never home or `/`."""
    folder = posixpath.dirname(script)
    current = folder
    while current not in ("/", "~", "") and draft.expand(current) != draft.home:
        if any(os.path.isfile(os.path.join(draft.expand(current), anchor)) for anchor in _PATH_ANCHORS):
            return current
        current = posixpath.dirname(current)
    return script if folder in ("/", "~") or draft.expand(folder) == draft.home else folder


def _project_name(root: str) -> str | None:
    """The package name the manifest in `root` declares (package.json, pyproject.toml), if any."""
    name: Any = None
    try:
        with open(os.path.join(root, "package.json"), encoding="utf-8") as file:
            name = json.load(file).get("name")
    except (OSError, ValueError, AttributeError):
        try:
            with open(os.path.join(root, "pyproject.toml"), "rb") as file:
                name = tomllib.load(file).get("project", {}).get("name")
        except (OSError, ValueError, AttributeError):
            return None
    return _package_name(name, None) if isinstance(name, str) else None


def _env(draft: _Draft, env: Mapping[str, str]) -> tuple[dict[str, str], dict[str, str]]:
    """(literal env, secrets: VAR -> keyring entry), with a note for each reference and secret."""
    literal: dict[str, str] = {}
    secrets: dict[str, str] = {}
    for name, value in env.items():
        if looks_secret(name, value):
            secrets[name] = entry = draft.secret(name, value, "env")
            draft.notes.append(f"{name} is a secret: moved to keyring entry {entry!r} (secrets:)")
            continue
        literal[name] = value
        refs = _references(value)
        if refs:
            hint = "; a secret goes under secrets: (a keyring entry) instead" if _secret_name(name) else ""
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


def _references(value: str) -> str:
    """The client references in `value`, for a note (never the rest of the value)."""
    whole = _REF_WHOLE.fullmatch(value.strip())
    return whole.group(0) if whole else ", ".join(_REF_ANYWHERE.findall(value))


def _paths(draft: _Draft, args: Sequence[str], cwd: str | None, *, writable: bool, skip: str | None) -> None:
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
            draft.notes.append(f"{path} is in its arguments but does not exist: not shared")
    folder = draft.path(cwd, None) if cwd else None
    if cwd and folder is None:
        draft.notes.append(f"cwd {cwd!r} is not an absolute path: make it one (the jail must share it)")
    elif folder is not None:
        real = draft.expand(folder)
        shared = [draft.expand(p) for p in (*draft.read_only, *draft.read_write)]
        if not os.path.isdir(real):
            draft.notes.append(f"cwd {cwd} does not exist: the server will not start until it does")
        elif any(real == s or real.startswith(s.rstrip("/") + "/") for s in shared):
            pass
        elif _home_or_above(real, draft.home):
            draft.notes.append(f"cwd {cwd} is your home or above it, which the jail never shares: pick a folder")
        else:
            draft.share(folder, writable=False)
            draft.notes.append(f"read_only: {folder} (its working directory, which the jail must share)")


def _home_or_above(path: str, home: str) -> bool:
    real, home = os.path.normpath(path), os.path.normpath(home)
    return real == "/" or home == real or home.startswith(real.rstrip("/") + "/")


def _network(draft: _Draft, package: str, env: Mapping[str, str], *, node: bool) -> dict[str, Any]:
    """`network: none`, or an allowlist for a known API client, with the note saying which and why."""
    if package in _FETCHERS:
        draft.notes.append(
            f"network: none, so {package} can fetch nothing until you choose: network: allowlist with "
            "allow_hosts: [the hosts it may fetch] (only those, checked by Cellblock's proxy), or network: open "
            "(any host, as it ran before)"
        )
        return {"network": "none"}
    known = KNOWN_HOSTS.get(package)
    if known is None:
        draft.notes.append("no network: if it needs one, set jail.network")
        return {"network": "none"}
    what, hosts = known
    override = env.get(_HOST_FROM_ENV.get(package, ""), "")
    host = urlsplit(override).hostname if override.startswith(("http://", "https://")) else None
    if host:
        hosts, what = (host,), f"{what} at {host} ({_HOST_FROM_ENV[package]})"
    draft.notes.append(f"network: allowlist {', '.join(hosts)} (inferred: {package} talks to {what})")
    if node:
        draft.notes.append("the allowlist reaches Node's fetch from Node 24 on; older Node fails closed")
    return {"network": "allowlist", "allow_hosts": list(hosts)}


def _data_file(draft: _Draft, package: str, env: dict[str, str]) -> None:
    """A writable directory for the data file of a server that would keep it beside its code."""
    variable, default = _DATA_FILE[package]
    given = env.get(variable)
    if given is not None and not posixpath.isabs(draft.expand(given)):
        draft.notes.append(f"{variable} is relative, so {package} writes beside its code: make it absolute")
        return
    path = draft.expand(given or default)
    env[variable] = path
    directory = posixpath.dirname(path)
    draft.share(directory, writable=True)
    if not os.path.isdir(directory):
        draft.make.append(directory)
    draft.notes.append(f"{package} keeps its data in {path} ({variable}), so {directory} is writable")


# A package is installed in a bubblewrap jail: on Linux only, for now (elsewhere the launcher stays).
_INSTALLS = sys.platform.startswith("linux")
# launcher options that change nothing about what an installed package runs
_NPX_PLAIN = frozenset({"-y", "--yes", "--offline", "-q", "--quiet", "--no-install"})


def _installable(
    draft: _Draft, launcher: str, args: list[str], index: int, spec: str
) -> tuple[dict[str, str], str, list[str]] | None:
    """(install:, command, args) for an npx or uvx entry Cellblock can install instead: the package
    named once, with no launcher options but the plain ones (`-y`; uvx's `--from PKG CMD`). None
    for what only the launcher can do (`--with`, `-p A -p B`, a git URL, a local path)."""
    before = args[:index]
    if launcher == "npx":
        if any(a not in _NPX_PLAIN for a in before):
            return None
        kind, name, version = "npm", _package_name(spec, "npx"), spec.removeprefix("npm:").lstrip("@").partition("@")[2]
        command = ""
    else:
        tool_run = before[:2] == ["tool", "run"]
        options = before[2:] if tool_run else before
        if options not in ([], ["--from", spec]):
            return None
        kind = "pypi"
        name, _, version = spec.partition("==") if "==" in spec else spec.partition("@")
        # `--from PKG CMD` runs CMD of PKG; `uvx PKG` runs PKG's own program
        command = args[index] if options else ""
    pinned = version not in ("", "latest")
    package = (f"{name}@{version}" if kind == "npm" else f"{name}=={version}") if pinned else name
    try:
        parse_package(kind, package)
    except PackageError:
        return None  # a range, a tag, a URL: only the launcher knows what it means
    draft.notes.append(
        f"{launcher} {spec}: installed once by `cellblock install {draft.name}` (wrap runs it) and run "
        "read-only from Cellblock's data directory, checked before each start; "
        + ("pinned" if pinned else "the newest release is pinned when installed")
        + f"; move it with `cellblock update {draft.name}`"
    )
    return {kind: package}, command, args[index + 1 :]


def _cache(
    draft: _Draft, launcher: str, args: list[str], index: int, spec: str, env: dict[str, str], cache_root: str
) -> list[str]:
    """A per-server npx or uvx cache, offline in the jail, and the command that fills it once."""
    cache = posixpath.join(cache_root, f"{'npm' if launcher == 'npx' else 'uv'}-{draft.name}")
    real = draft.expand(cache)
    draft.share(cache, writable=True)
    fill = [a for a in args[: index + 1] if a != "--offline"]
    if launcher == "npx":
        env["npm_config_cache"] = real
        if "-y" not in fill and "--yes" not in fill:
            fill.insert(0, "-y")
        if "--offline" not in args:
            at = next((i for i, a in enumerate(args[:index]) if a in ("-y", "--yes")), index)
            args = [*args[:at], "--offline", *args[at:]]
        command = f"npm_config_cache={shlex.quote(real)} npx {shlex.join(fill)} </dev/null"
    else:
        env["UV_CACHE_DIR"] = real
        env["UV_OFFLINE"] = "1"
        prefix = "uvx" if args[:2] != ["tool", "run"] else "uv"
        command = f"UV_CACHE_DIR={shlex.quote(real)} {prefix} {shlex.join(fill)} </dev/null"
    draft.notes.append(f"fill the {launcher} cache once: {command}")
    if not _pinned(spec, launcher):
        draft.notes.append(f"{spec} has no version: the jail runs whatever the cache holds; pin one")
    return args


# --- remote servers --------------------------------------------------------------------------


def _remote(draft: _Draft, entry: ClientEntryLike) -> None:
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
            if _REF_WHOLE.fullmatch(token):
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
            refs = _references(value)
            draft.notes.append(
                f"header {name} not carried over"
                + (f" (it holds the client reference {refs})" if refs else "")
                + ": Cellblock takes credentials from the keyring only (auth: bearer, secrets:)"
            )
        else:
            headers[name] = value
            refs = _references(value)
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


def _url(draft: _Draft, url: str) -> str:
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


# --- both ------------------------------------------------------------------------------------


def _extra(draft: _Draft, extra: Mapping[str, Any]) -> None:
    for key, value in extra.items():
        shown = "(value hidden: it may be a secret)" if _holds_secret(key, value) else _show(value)
        if isinstance(value, str) and _holds_secret(key, value):
            draft.secret(key, value, "stash")
        hint = _EXTRA_HINTS.get(key)
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
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _entry_name(server: str, key: str, used: Collection[str]) -> str:
    """`<server>-<key>` as a keyring entry name: lowercase, '-' for other characters, unique in `used`."""
    part = re.sub(r"[^a-z0-9]+", "-", key.lower()).strip("-") or "secret"
    base = f"{server}-{part}"[:ENTRY_MAX].rstrip("-")
    entry, number = base, 2
    while entry in used:
        suffix = f"-{number}"
        entry = base[: ENTRY_MAX - len(suffix)].rstrip("-") + suffix
        number += 1
    return entry


def _words(name: str) -> list[str]:
    """`name` split at non-alphanumerics and camelCase humps, upper-cased."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1_\2", name)
    return [w for w in re.split(r"[^A-Za-z0-9]+", spaced.upper()) if w]


def _secret_name(name: str) -> bool:
    words = _words(name)
    if not words or words[-1] in _NOT_SECRET_LAST:
        return False
    return any(
        word in _SECRET_WORDS
        or (any(part in word for part in _SECRET_PARTS) and not word.startswith("TOKENIZ"))
        or word.endswith(("APIKEY", "ACCESSKEY", "SECRETKEY", "PRIVATEKEY"))
        for word in words
    )


def _secret_shape(value: str) -> bool:
    """A well-known token prefix, a JWT, `Bearer …`, or a long high-entropy string."""
    value = value.strip()
    if _SECRET_PREFIX.match(value) or _AWS_KEY.match(value) or _JWT.match(value) or _AUTH_SCHEME.match(value):
        return True
    if not _TOKEN_CHARS.match(value) or (value.startswith("/") and value.count("/") >= 2):
        return False  # not token characters, or a path
    classes = sum(bool(re.search(p, value)) for p in ("[a-z]", "[A-Z]", "[0-9]"))
    separators = sum(c in "_-" for c in value) / len(value)
    return classes >= 2 and separators <= 0.15 and _entropy(value) >= 3.0


def _entropy(value: str) -> float:
    """Shannon entropy of `value` in bits per character."""
    counts = Counter(value)
    return -sum(n / len(value) * math.log2(n / len(value)) for n in counts.values())
