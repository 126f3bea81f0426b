"""One server's egress across its runs: the proxy of each run, and what the human answered.

A server with `network: allowlist` or `ask` reaches the network only through its own egress proxy
(`sandbox/egress.py`), made for each run of the server. With `ask`, a host:port outside the rules
is put to the human (`EgressApproval`, the gateway's approvals). What they answered outlives the
run: "always" is written into the config (`host_keeper`) and added to this run's proxy and every
later one's; a "deny" (or no answer) is kept until the gateway stops, so a server that retries is
not asked again; "once" lasts as long as the proxy, the server's run.

A server has at most `MAX_ASKING` questions about its connections open at once (forms or pending
approvals): past them a connection is refused unasked, and the first refused of a burst is audited,
so a server that connects to many names cannot flood the user, nor the gateway's pending approvals.
"""

from __future__ import annotations

import functools
import logging
import os
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from pathlib import Path

import anyio.to_thread

from cellblock.gateway.config.edit import ConfigEditError, allow_host
from cellblock.gateway.config.model import JailConfig, LocalServer, RemoteServer
from cellblock.gateway.downstream.connection import egress_told
from cellblock.gateway.downstream.questions import MAX_QUESTIONS
from cellblock.gateway.downstream.rounds import Caller
from cellblock.gateway.state import StateWriteError
from cellblock.policy.hosts import parse_rule
from cellblock.sandbox.egress import Answer, Asked, EgressProxy
from cellblock.sandbox.httphead import authority

__all__ = ["EgressApproval", "ServerEgress", "allow_command", "host_keeper"]

logger = logging.getLogger(__name__)

# asks the human whether a server may connect to "host:port": the scope granted ("once" or
# "always") or None, and how it was decided (`Approvals.egress`)
EgressApproval = Callable[[str, str, Caller | None], Awaitable[tuple[str | None, str]]]
# most host:ports a server's denials are kept for: attacker-growable, so bounded (past it, asked again)
MAX_DENIED = 1024
# most questions one server's connections may have open at once (distinct host:ports: the proxy
# shares one question per host:port); past it a connection is refused unasked, and not remembered
MAX_ASKING = 4


def allow_command(server: str, target: str) -> str:
    """The sentence a refusal ends with: the command that allows `target` for `server`."""
    return f"allow it with 'cellblock allow-host {server} {target}'"


@dataclass
class ServerEgress:
    """See the module docstring."""

    name: str
    config: LocalServer | RemoteServer
    runtime: Path
    event: Callable[..., None]  # an audit event about this server
    owner: Callable[[], Caller | None]  # the call in flight, whose client may show a form
    approve: EgressApproval | None = None
    proxy: EgressProxy | None = None  # the current run's
    added: list[str] = field(default_factory=list)  # allowed for good since the gateway started
    denied: dict[tuple[str, int], str] = field(default_factory=dict)
    asking: int = 0  # questions open now
    capped: bool = False  # a connection was refused at MAX_ASKING since the questions last all closed

    @property
    def jail(self) -> JailConfig | None:
        """The server's jail, when its network goes through a proxy."""
        jail = self.config.jail if isinstance(self.config, LocalServer) else False
        return jail if jail is not False and jail.proxied else None

    def for_run(self) -> EgressProxy | None:
        """A new proxy for the next run of the server (None: it needs none), on a socket of its
        own per gateway process (two clients may each run a gateway with a server of this name)."""
        jail = self.jail
        if jail is None:
            return None
        socket = str(self.runtime / f"egress-{os.getpid()}-{self.name}.sock")
        rules = [parse_rule(h) for h in dict.fromkeys([*jail.allow_hosts, *self.added])]
        ask = self.ask if jail.network == "ask" and self.approve is not None else None
        told = egress_told(self.name, self.event)
        fix = functools.partial(allow_command, self.name)
        self.proxy = EgressProxy(self.name, rules, socket, told, ask=ask, fix=fix)
        return self.proxy

    async def ask(self, host: str, port: int) -> Asked:
        """The human's answer about `host:port` (the proxy shares one question per host:port)."""
        earlier = self.denied.get((host, port))
        if earlier is not None:
            return Asked(Answer.DENY, f"{earlier}, earlier while this gateway runs")
        if self.approve is None:
            return Asked(Answer.DENY, "nobody to ask")
        if self.asking >= MAX_ASKING:
            if not self.capped:  # the first refused of a burst is audited, not the flood after it
                self.capped = True
                self.event("questions_capped", limit=MAX_ASKING, what="egress_open")
            return Asked(Answer.DENY, f"the server already has {MAX_ASKING} connections waiting for the user's answer")
        caller = self.owner()
        if caller is not None:  # its forms count against the call's questions, as its other questions do
            caller.questions += 1
            if caller.questions == MAX_QUESTIONS + 1:  # the first refused is audited, not the flood after it
                self.event("questions_capped", limit=MAX_QUESTIONS, what="egress")
            if caller.questions > MAX_QUESTIONS:
                return Asked(Answer.DENY, f"the call in flight has put {MAX_QUESTIONS} questions to the user already")
        self.asking += 1
        try:
            scope, how = await self.approve(self.name, authority(host, port), caller)
        finally:
            self.asking -= 1
            self.capped = self.capped and self.asking > 0
        if scope is None:
            if len(self.denied) < MAX_DENIED:
                self.denied[(host, port)] = how
            return Asked(Answer.DENY, how)
        return Asked(Answer.ALWAYS if scope == "always" else Answer.ONCE, how)

    def allow(self, entry: str) -> None:
        """`entry` allowed from now on: in this run's proxy, and the next runs' (the config has it
        too, for the gateway's next start).

        Raises:
            ValueError: `entry` is not an `allow_hosts` entry.
        """
        parse_rule(entry)
        if entry not in self.added:
            self.added.append(entry)
            if self.proxy is not None:
                self.proxy.allow(entry)
        host, _, port = entry.rpartition(":")
        self.denied.pop((host.strip("[]"), int(port)) if port.isdigit() else ("", 0), None)


def host_keeper(
    source: Path | None, egress: Callable[[str], ServerEgress | None]
) -> Callable[[str, str], Awaitable[None]]:
    """How an "always" to a connection is kept (`Approvals.keepers["egress"]`): the host is written
    into the server's allow_hosts in the config at `source` (off the event loop), then allowed live."""

    async def keep(server: str, target: str) -> None:
        if source is None:
            raise StateWriteError(f"the config was not read from a file, so {target} cannot be added to it")
        try:
            said = await anyio.to_thread.run_sync(allow_host, source, server, target)
        except ConfigEditError as exc:
            raise StateWriteError(f"cannot add {target} to the allow_hosts of '{server}': {exc}") from exc
        logger.info("server '%s': %s", server, said)
        found = egress(server)
        if found is not None:
            found.allow(target)

    return keep
