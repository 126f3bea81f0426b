"""`cellblock.yaml`: its typed models (`loading` reads the file into them).

The models forbid unknown keys and default to the safe value. The config never holds a secret:
tokens and `secrets:` values are keyring entries it names (see gateway/credentials.py).
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Annotated, Any, Literal

from pydantic import (
    BaseModel,
    ByteSize,
    Discriminator,
    Field,
    Tag,
    field_validator,
    model_validator,
)

from cellblock.gateway.audit.chain import KEY_NAME
from cellblock.gateway.audit.log import DEFAULT_KEEP, DEFAULT_MAX_BYTES, Audit, Observer
from cellblock.gateway.config.auth import AuthConfig
from cellblock.gateway.config.base import ConfigError, StrictModel, expand_path
from cellblock.gateway.config.catalog import CatalogConfig
from cellblock.gateway.config.installs import HostRules, InstallConfig
from cellblock.gateway.config.rulesets import (
    DecisionName,
    PromptsConfig,
    ResourcesConfig,
    RuleConfig,
    RulesConfig,
    ToolsConfig,
)
from cellblock.gateway.config.secretrefs import check_references, launcher_sets
from cellblock.gateway.config.telemetry import TelemetryConfig
from cellblock.gateway.credentials import ENTRY_NAME, client_key_entry, client_secret_entry, id_token_entry
from cellblock.gateway.namespacing import check_separator
from cellblock.sandbox.types import Backend, Limits

__all__ = [
    "ApprovalsConfig",
    "AuditConfig",
    "AuthConfig",
    "Config",
    "ConfigError",
    "CredentialsConfig",
    "DefaultsConfig",
    "ExecConfig",
    "InstallConfig",
    "JailConfig",
    "LimitsConfig",
    "LocalServer",
    "LockConfig",
    "NamesConfig",
    "RemoteServer",
    "RuleConfig",
    "ServerConfig",
    "ToolsConfig",
    "entries_of",
    "expand_path",
]

SERVER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
RESERVED_SERVER = "cellblock"  # the namespace of the gateway's own tools (gateway/serve/status.py)
ENV_NAME = r"^[A-Za-z_][A-Za-z0-9_]*$"
HEADER_NAME = r"^[A-Za-z0-9][A-Za-z0-9_-]*$"


ServerName = Annotated[str, Field(pattern=SERVER_NAME.pattern)]
Start = Literal["eager", "lazy"]
Protocol = Literal["auto", "legacy"]
Seconds = Annotated[float, Field(gt=0, le=3600)]
# The longest message (one JSON-RPC line) taken from a server or the client: "32MiB", "500KB", or bytes.
MessageSize = Annotated[ByteSize, Field(ge=64 << 10, le=1 << 30)]
DEFAULT_MESSAGE_SIZE = 32 << 20
# What one jail may take. Tasks are processes and threads alike (the kernel counts both): a Node
# server runs 10-20, npx on top of it as many again, a Python server's thread pools up to 40 or so,
# a headless browser a few hundred; 512 leaves room for all of that, and a fork bomb stopped at 512
# costs the machine nothing. Memory: V8 sizes its heap to the limit it finds, and a server that
# needs more than 4 GiB is rare; set it higher for one that does.
Processes = Annotated[int, Field(ge=8, le=1_000_000)]
MemorySize = Annotated[ByteSize, Field(ge=32 << 20, le=1 << 40)]
DEFAULT_PROCESSES = 512
DEFAULT_MEMORY = 4 << 30
# What one install of a server's package may write: its tree and the installer's caches. An MCP
# server's tree is tens of MB (server-everything's ~4,000 files), some a few hundred, and the
# caches about as much again; 2 GiB holds that with room, and a postinstall filling the disk stops there.
DiskSize = Annotated[ByteSize, Field(ge=16 << 20, le=1 << 40)]
DEFAULT_DISK = 2 << 30


class LockConfig(StrictModel):
    """The rug-pull lock: `first: review` holds a new server's catalog until approved."""

    enabled: bool = True
    first: Literal["review", "trust"] = "review"


class LimitsConfig(StrictModel):
    """What one jail may take: `{processes: 512, memory: 4GiB}`. A key a server leaves out comes
    from `defaults.limits`, then from the built-in default."""

    processes: Processes | None = None
    # bytes, or "256MiB", "4GiB", ...
    memory: MemorySize | None = None
    # what `cellblock install` may write for the server (its package and the installer's caches)
    disk: DiskSize | None = None


class DefaultsConfig(StrictModel):
    """Values every server gets unless it says otherwise (a server's own `tools` replaces these whole)."""

    start: Start = "eager"
    timeout: Seconds = 60.0
    tools: ToolsConfig = ToolsConfig()
    prompts: PromptsConfig = PromptsConfig()
    resources: ResourcesConfig = ResourcesConfig()
    lock: LockConfig = LockConfig()
    # a server asking the client's model for a completion: refused, asked about, or passed on
    sampling: DecisionName = "deny"
    # a longer message from a server (or the client) is dropped and its request answered with an error
    max_message_size: MessageSize = ByteSize(DEFAULT_MESSAGE_SIZE)
    # what each local server's jail may take, unless its own jail.limits says otherwise
    limits: LimitsConfig = LimitsConfig()
    # what builds each local server's jail on Linux, unless its own jail.backend says otherwise
    backend: Backend = "auto"


class NamesConfig(StrictModel):
    separator: str = "__"
    max_length: int = Field(default=64, ge=16, le=128)

    @field_validator("separator")
    @classmethod
    def _unambiguous(cls, value: str) -> str:
        check_separator(value)
        return value


class ApprovalsConfig(StrictModel):
    # seconds a call waits for a human's answer before it is refused
    timeout: Annotated[float, Field(gt=0, le=3600)] = 120.0


class AuditConfig(StrictModel):
    path: str | None = None
    max_bytes: Annotated[ByteSize, Field(ge=16 << 10, le=1 << 40)] = ByteSize(DEFAULT_MAX_BYTES)
    keep: Annotated[int, Field(ge=1, le=1000)] = DEFAULT_KEEP

    @field_validator("path")
    @classmethod
    def _expand(cls, value: str | None) -> str | None:
        return None if value is None else expand_path(value)


class _ServerBase(StrictModel):
    @model_validator(mode="before")
    @classmethod
    def _one_kind(cls, data: Any) -> Any:
        if isinstance(data, Mapping) and ("command" in data or "install" in data) == ("url" in data):
            raise ValueError(
                "a server needs exactly one of 'command' or 'install' (local, stdio) or 'url' (remote, HTTP)"
            )
        return data

    start: Start | None = None
    # seconds a single call may take before it is cancelled downstream and answered with an error
    timeout: Seconds | None = None
    tools: ToolsConfig | None = None
    prompts: PromptsConfig | None = None
    resources: ResourcesConfig | None = None
    lock: LockConfig | None = None
    sampling: DecisionName | None = None
    # auto: probe the 2026-07-28 protocol and fall back to the handshake; legacy: handshake only
    protocol: Protocol = "auto"
    max_message_size: MessageSize | None = None
    # false: its tools, prompts and resource URIs keep their own names (namespacing.assign_names)
    prefix: bool = True


class ExecConfig(StrictModel):
    """Which executables may run in the jail; empty `allow` means no restriction beyond the mounts."""

    allow: list[str] = []
    # path -> sha256 hex digest, checked before start; the verified bytes are what runs
    sha256: dict[str, Annotated[str, Field(pattern=r"^[0-9a-fA-F]{64}$")]] = {}

    @field_validator("allow")
    @classmethod
    def _expand_allow(cls, value: list[str]) -> list[str]:
        return [expand_path(p) for p in value]

    @field_validator("sha256")
    @classmethod
    def _expand_pins(cls, value: dict[str, str]) -> dict[str, str]:
        return {expand_path(p): digest.lower() for p, digest in value.items()}


class JailConfig(StrictModel):
    """What a local server may reach. The defaults share nothing and allow no network."""

    network: Literal["none", "allowlist", "ask", "open"] = "none"
    allow_hosts: HostRules = []
    read_only: list[str] = []
    read_write: list[str] = []
    tmp: bool = True
    # persistent: a directory of the server's own, kept across starts (docs/jail.md, "The home")
    home: Literal["persistent", "throwaway"] = "persistent"
    # ask: a path in the home a call names outside the grants is put to the user first (serve/shares.py);
    # private: it is the server's own, in its private home, never asked about (docs/jail.md, "Paths a call names")
    call_paths: Literal["ask", "private"] = "ask"
    exec: ExecConfig = ExecConfig()
    limits: LimitsConfig = LimitsConfig()
    # None: `defaults.backend`, which the config fills in when it loads (docs/jail.md, "Backends")
    backend: Backend | None = None

    @field_validator("read_only", "read_write")
    @classmethod
    def _expand_dirs(cls, value: list[str]) -> list[str]:
        return [expand_path(p) for p in value]

    @model_validator(mode="after")
    def _hosts_need_allowlist(self) -> JailConfig:
        if self.allow_hosts and not self.proxied:
            raise ValueError(f"allow_hosts is only used with network: allowlist or ask (network is {self.network!r})")
        if self.network == "allowlist" and not self.allow_hosts:
            raise ValueError("network: allowlist needs at least one entry in allow_hosts")
        return self

    @property
    def proxied(self) -> bool:
        """Its network is the gateway's egress proxy: `allowlist`, or `ask` (which asks about the rest)."""
        return self.network in ("allowlist", "ask")


def _jail_kind(value: Any) -> str:
    return "off" if value is False else "on"


Jail = Annotated[
    Annotated[JailConfig, Tag("on")] | Annotated[Literal[False], Tag("off")],
    Discriminator(_jail_kind),
]


class LocalServer(_ServerBase):
    """A server Cellblock starts as a child process and talks to over stdio."""

    # with install: one of the package's programs by name, by default the package's own
    command: str | None = Field(default=None, min_length=1)
    install: InstallConfig | None = None
    args: list[str] = []
    env: dict[str, str] = {}
    # environment variable -> keyring entry, read when the server starts; never written to disk.
    # `${secrets.NAME}` in args puts the value in that argument too (config/secretrefs.py)
    secrets: dict[Annotated[str, Field(pattern=ENV_NAME)], Annotated[str, Field(pattern=ENTRY_NAME.pattern)]] = {}
    cwd: str | None = None
    # `false` (YAML `off` too) is the only way to run a server unjailed, and it is shown as such
    jail: Jail = JailConfig()
    # trace the jailed server while it serves; `cellblock scan NAME --from-learned` reads the traces
    learn: bool = False

    @field_validator("command", "cwd")
    @classmethod
    def _expand_one(cls, value: str | None) -> str | None:
        return None if value is None else expand_path(value)

    @field_validator("cwd")
    @classmethod
    def _absolute_cwd(cls, value: str | None) -> str | None:
        # relative to what? the gateway's own cwd depends on how the client starts it
        if value is not None and not os.path.isabs(value):
            raise ValueError(f"cwd must be an absolute path (or start with ~), got {value!r}")
        return value

    @field_validator("args")
    @classmethod
    def _expand_args(cls, value: list[str]) -> list[str]:
        return [expand_path(arg) for arg in value]

    @model_validator(mode="after")
    def _a_command_to_run(self) -> LocalServer:
        if self.install is None and self.command is None:
            raise ValueError("a local server needs command: (or install:, to run an installed package)")
        if self.install is not None and self.command is not None and "/" in self.command:
            raise ValueError(
                f"command {self.command!r}: with install, name one of the package's programs (no path), "
                "or leave command out to run the package's own"
            )
        return self

    @model_validator(mode="after")
    def _learn_needs_a_jail(self) -> LocalServer:
        if self.learn and self.jail is False:
            raise ValueError("learn: true records what the jail refused, and jail: false has no jail; give it one")
        return self

    @model_validator(mode="after")
    def _secrets_own_their_names(self) -> LocalServer:
        for name in self.secrets:
            if name in self.env:
                raise ValueError(f"secrets.{name} is also set in env; keep it in one place (secrets, for a secret)")
            if launcher_sets(name):
                raise ValueError(f"secrets.{name}: the launcher sets {name} itself; pick another variable name")
        # `${secrets.NAME}` in args: a secret the server takes on its command line (config/secretrefs.py)
        env = {f"env.{k}": v for k, v in self.env.items()}
        check_references(self.args, {"command": self.command or "", "cwd": self.cwd or "", **env}, self.secrets)
        return self


class RemoteServer(_ServerBase):
    """A server reached over Streamable HTTP."""

    url: str = Field(pattern=r"^https?://")
    headers: dict[str, str] = {}
    auth: AuthConfig = AuthConfig()
    # header -> keyring entry: an API key sent as a header (X-API-Key), never written to disk
    secrets: dict[Annotated[str, Field(pattern=HEADER_NAME)], Annotated[str, Field(pattern=ENTRY_NAME.pattern)]] = {}

    @field_validator("headers")
    @classmethod
    def _no_credentials(cls, value: dict[str, str]) -> dict[str, str]:
        for header in value:
            if header.lower() in ("authorization", "proxy-authorization", "cookie"):
                raise ValueError(
                    f"headers.{header} would keep a credential in this file; use auth: {{type: bearer}} "
                    "and store the token with `cellblock auth set NAME`"
                )
        return value

    @model_validator(mode="after")
    def _secret_headers_own_their_names(self) -> RemoteServer:
        plain = {h.lower() for h in self.headers}
        for header in self.secrets:
            if header.lower() in plain:
                raise ValueError(f"secrets.{header} is also set in headers; keep it in one place (secrets)")
            if header.lower() == "authorization" and self.auth.type != "none":
                raise ValueError(f"secrets.{header} would replace the token of auth: {self.auth.type}")
        return self


def _server_kind(body: Any) -> str:
    keys = body if isinstance(body, Mapping) else vars(body) if isinstance(body, BaseModel) else {}
    return "local" if "command" in keys or "install" in keys else "remote"


ServerConfig = Annotated[
    Annotated[LocalServer, Tag("local")] | Annotated[RemoteServer, Tag("remote")],
    Discriminator(_server_kind),
]


class CredentialsConfig(StrictModel):
    # a keyring backend that keeps secrets in plain files (or nowhere) is refused unless this is set
    allow_insecure: bool = False


class Config(StrictModel):
    version: Literal[1]
    defaults: DefaultsConfig = DefaultsConfig()
    names: NamesConfig = NamesConfig()
    approvals: ApprovalsConfig = ApprovalsConfig()
    audit: AuditConfig = AuditConfig()
    credentials: CredentialsConfig = CredentialsConfig()
    telemetry: TelemetryConfig | None = None
    catalog: CatalogConfig = CatalogConfig()
    servers: dict[ServerName, ServerConfig] = {}

    @model_validator(mode="after")
    def _backends(self) -> Config:
        # each jail names its backend, so what starts a server needs nothing but its own config
        for name, server in self.servers.items():
            if isinstance(server, LocalServer) and server.jail is not False and server.jail.backend is None:
                jail = server.jail.model_copy(update={"backend": self.defaults.backend})
                self.servers[name] = server.model_copy(update={"jail": jail})
        return self

    @model_validator(mode="after")
    def _own_namespace(self) -> Config:
        # no server's tools may be named like the gateway's own: with an unambiguous separator
        # (namespacing.check_separator) only a server called `cellblock` could be
        own = f"{RESERVED_SERVER}{self.names.separator}"
        for name in self.servers:
            if own.startswith(f"{name}{self.names.separator}"):
                raise ValueError(
                    f"server name '{name}' would name its tools like the gateway's own ({own}status); pick another"
                )
        return self

    def unprefixed(self) -> frozenset[str]:
        """The servers whose items keep their own names (`prefix: false`)."""
        return frozenset(name for name, server in self.servers.items() if not server.prefix)

    def credential_entries(self) -> list[tuple[str, str, str]]:
        """Every keyring entry the config refers to: (entry, server, what), in config order."""
        return [
            (entry, name, what) for name, server in self.servers.items() for entry, what in entries_of(name, server)
        ]

    def start_of(self, name: str) -> Start:
        return self.servers[name].start or self.defaults.start

    def audit_file(self, state: Path) -> Path:
        """Where the audit log goes: `audit.path`, else `<state dir>/audit.jsonl`."""
        return Path(self.audit.path) if self.audit.path else state / "audit.jsonl"

    def audit_log(self, state: Path, observer: Observer | None = None) -> Audit:
        """The audit log as this config sets it up, its chain's key in the state dir (which no jail mounts);
        with `observer` told of each event (telemetry), and closed with it.

        Raises:
            OSError: the log or the key cannot be opened or made.
        """
        audit = Audit(self.audit_file(state), int(self.audit.max_bytes), self.audit.keep, key=state / KEY_NAME)
        if observer is not None:
            audit.observe(observer)
        return audit

    def timeout_of(self, name: str) -> float:
        return self.servers[name].timeout or self.defaults.timeout

    def tools_of(self, name: str) -> ToolsConfig:
        return self.servers[name].tools or self.defaults.tools

    def rules_of(self, name: str, kind: str) -> tuple[str, dict[str, Any]]:
        """(default, rules) of a server's `tools`, `prompts` or `resources` (`kind` "tool", "prompt",
        "resource"): its own section, else `defaults`'; a prompts or resources section without a
        `default` takes the server's tools default, so `tools: {default: deny}` denies them too."""
        tools = self.tools_of(name)
        if kind == "tool":
            return tools.default, dict(tools.rules)
        section: RulesConfig = getattr(self.servers[name], f"{kind}s") or getattr(self.defaults, f"{kind}s")
        return section.default or tools.default, dict(section.rules)

    def lock_of(self, name: str) -> LockConfig:
        return self.servers[name].lock or self.defaults.lock

    def sampling_of(self, name: str) -> str:
        return self.servers[name].sampling or self.defaults.sampling

    def limits_of(self, name: str) -> Limits | None:
        """The resource limits of a server's jail (None: remote, or `jail: false`)."""
        server = self.servers[name]
        if not isinstance(server, LocalServer) or server.jail is False:
            return None
        limits = self.install_limits_of(name)
        return Limits(limits.processes, limits.memory)  # a server's own writes go to its grants

    def install_limits_of(self, name: str) -> Limits:
        """What the installer of a local server's package may take: the limits its jail has (the
        defaults' where it runs with `jail: false`), and the disk the install may fill."""
        server = self.servers[name]
        jail = server.jail if isinstance(server, LocalServer) else False
        own, shared = jail.limits if jail is not False else LimitsConfig(), self.defaults.limits
        return Limits(
            processes=own.processes or shared.processes or DEFAULT_PROCESSES,
            memory=int(own.memory or shared.memory or DEFAULT_MEMORY),
            disk=int(own.disk or shared.disk or DEFAULT_DISK),
        )

    def max_message_of(self, name: str) -> int:
        return int(self.servers[name].max_message_size or self.defaults.max_message_size)


def entries_of(name: str, server: ServerConfig) -> list[tuple[str, str]]:
    """The keyring entries server `name` refers to: (entry, what it holds), in config order."""
    entries: list[tuple[str, str]] = []
    if isinstance(server, RemoteServer) and server.auth.type != "none":
        entries.append((name, f"{server.auth.type} token"))
    if isinstance(server, RemoteServer) and server.auth.grant == "identity_assertion":
        entries.append((id_token_entry(name), "identity provider ID token"))
    if isinstance(server, RemoteServer) and server.auth.client_auth == "private_key_jwt":
        entries.append((client_key_entry(name), "OAuth client private key"))
    elif isinstance(server, RemoteServer) and server.auth.client_id is not None:
        entries.append((client_secret_entry(name), "OAuth client secret"))
    if isinstance(server, RemoteServer):
        entries += [(entry, f"secret header {h}") for h, entry in server.secrets.items()]
    else:
        entries += [(entry, f"secret {var}") for var, entry in server.secrets.items()]
    return entries
