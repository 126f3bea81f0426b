"""Prompt gets, resource reads and completions: routed, held to the lock, decided, forwarded.

Each is routed by the catalog to the server it came from (a resource by its `cellblock://SERVER/`
URI), refused while the lock holds the item, decided by the server's `prompts:` or `resources:`
rules through the same pipeline and approvals as a tool call (`Pipeline.admit_item`), and
forwarded; what comes back passes on no secret the gateway holds. A read is judged under every
spelling the server may read its URI as (`policy/uris.py`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, NoReturn, TypeVar

import anyio.abc
import mcp.types as types
from mcp.server.context import ServerRequestContext
from mcp.shared.exceptions import MCPError
from mcp_types import SERVER_INFO_META_KEY
from mcp_types.version import MODERN_PROTOCOL_VERSIONS

from cellblock.gateway.downstream.listing import Listing, app_digest
from cellblock.gateway.downstream.rounds import DownstreamError
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.supervisor import START_SECONDS
from cellblock.gateway.namespacing import is_app
from cellblock.gateway.scrub import scrub
from cellblock.gateway.serve.approvals import Approvals, NeedsInput
from cellblock.gateway.serve.items import Standing, held_reason, resource_standing, template_standing
from cellblock.gateway.serve.keeper import CatalogKeeper
from cellblock.gateway.serve.locking import Locks
from cellblock.gateway.serve.pipeline import Asking, Call, NotAdmitted, Pipeline
from cellblock.gateway.serve.replies import SendLog, SessionReply
from cellblock.gateway.serve.shaping import unstamped
from cellblock.policy.rules import Policy
from cellblock.policy.types import Decision, Verdict
from cellblock.policy.uris import spellings

__all__ = ["Reads"]

Ctx = ServerRequestContext[Any, Any]
R = TypeVar("R", bound=types.Result)


@dataclass
class Reads:
    """The SDK handlers for prompts/get, resources/read and completion/complete."""

    keeper: CatalogKeeper  # the catalog, and what each server's lock shows of it
    downstreams: dict[str, Downstream]
    item_policies: dict[str, dict[str, Policy]]  # the `prompts:` and `resources:` rules, by kind and server
    pipeline: Pipeline
    approvals: Approvals
    locks: Locks
    tasks: Callable[[], anyio.abc.TaskGroup]  # where a server is started
    secrets: Callable[[], re.Pattern[str] | None]  # the values no answer may carry
    send_log: SendLog

    async def get_prompt(
        self, ctx: Ctx, params: types.GetPromptRequestParams
    ) -> types.GetPromptResult | types.InputRequiredResult:
        call = Call(f"prompt:{params.name}", dict(params.arguments or {}) or None, kind="prompt")
        catalog = self.keeper.catalog
        owner = catalog.prompt_routes.get(params.name) or catalog.held.get(params.name)
        if owner is not None:
            await self._started(owner[0])
        server, name = self._prompt_route(call, params.name)
        waiting = await self._admit_item(ctx, call, params, name)
        if waiting is not None:
            return waiting
        request = types.GetPromptRequest(params=types.GetPromptRequestParams(name=name, arguments=params.arguments))
        return await self._forward(server, request, types.GetPromptResult)

    async def read_resource(
        self, ctx: Ctx, params: types.ReadResourceRequestParams
    ) -> types.ReadResourceResult | types.InputRequiredResult:
        call, forms = await self._resource(str(params.uri))
        server, uri = call.server, call.tool.removeprefix("resource:")
        # taken now, with the lock's judgment: the catalog may be read again before the answer
        # comes back (a slow read of a server that has it re-read), and hold or drop the app
        approved_app = self._approved_app(server, uri)
        waiting = await self._admit_item(ctx, call, params, self.item_policies["resource"][server].strictest(forms))
        if waiting is not None:
            return waiting
        request = types.ReadResourceRequest(params=types.ReadResourceRequestParams(uri=uri))
        result = await self._forward(server, request, types.ReadResourceResult)
        if approved_app is not None:
            self._same_app(call, server, uri, approved_app, result.contents)
        uris = self.keeper.catalog.uris
        contents = [c.model_copy(update={"uri": uris.expose(server, str(c.uri))}) for c in result.contents]
        # each read is decided again (policy, lock, approvals that can be revoked): none is cached
        # past this decision, nor shared with another user, whatever the server allowed
        return result.model_copy(update={"contents": contents, "ttl_ms": 0, "cache_scope": "private"})

    async def watched(self, uri: str) -> tuple[str, str]:
        """(server, its URI) for a resource a client subscribes to: routed and held to the lock as
        a read is, and refused where its policy denies the read (an `ask` is asked at the read).

        Raises:
            MCPError: refused (audited).
        """
        call, forms = await self._resource(uri)
        server = call.server
        policy = self.item_policies["resource"][server]
        verdict = policy.decide(policy.strictest(forms), None)
        if verdict.decision is Decision.DENY:
            self._refuse_item(call, verdict.rule, f"subscription: {verdict.reason}")
        return server, call.tool.removeprefix("resource:")

    def _approved_app(self, server: str, uri: str) -> str | None:
        """The digest the lock approved for the listed app `uri` names (under any of its
        spellings), or None: no lock, or not a listed app (one a template covers is judged as a
        resource). Called once the read passed the lock, which refuses a held app."""
        if not is_app(uri):  # first: every embedded resource of every call result asks
            return None
        offered = self._offered(server)
        if self._approved(server) is None or offered is None:
            return None
        return next((digest for form in spellings(uri) if (digest := offered.app(form)) is not None), None)

    def page_passes(self, server: str, uri: str, resource: dict[str, Any]) -> bool:
        """Whether a page a tool result of `server` embeds under `uri` may go to the client: one
        that is not a listed app's may (it is not pinned, like an app a template covers); a listed
        app's only as the lock approved it, whole (a page read in several parts is read, not embedded)."""
        approved = self._approved_app(server, uri)
        if approved is None:
            return True
        if self.holds(server, uri):
            return False
        try:
            page = types.EmbeddedResource.model_validate({"type": "resource", "resource": resource}).resource
        except ValueError:
            return False
        return app_digest([page]) == approved

    def _same_app(self, call: Call, server: str, uri: str, approved: str, contents: Sequence[Any]) -> None:
        """An app is read as the lock approved it: one whose content changed since is refused, and
        its server's catalog is read again, which holds the change for review.

        Raises:
            MCPError: the app changed (audited).
        """
        if app_digest(contents) == approved:
            return
        self.downstreams[server].changes.soon()
        self._refuse_item(call, "lock", held_reason("app", uri, server))

    def holds(self, server: str, uri: str) -> bool:
        """Whether the lock holds `server`'s resource `uri` (under any of its spellings)."""
        offered, approved = self._offered(server), self._approved(server)
        return any(resource_standing(offered, approved, form) is Standing.HELD for form in spellings(uri))

    async def _resource(self, exposed: str) -> tuple[Call, tuple[str, ...]]:
        """The resource an exposed URI names, started and held to the lock: its call (server and
        URI) and every spelling the server may read the URI as (escapes decoded, `..` resolved).

        Raises:
            MCPError: it routes nowhere, the lock holds it, or it is in no catalog (audited).
        """
        server, uri = self._route_uri(exposed)
        await self._started(server)
        call = Call(f"resource:{exposed}", None, server, f"resource:{uri}", kind="resource")
        forms = spellings(uri)
        standing = resource_standing(self._offered(server), self._approved(server), uri)
        if standing is Standing.HELD or self.holds(server, uri):
            self._refuse_item(call, "lock", held_reason("resource", uri, server))
        if standing is Standing.UNLISTED and self.item_policies["resource"][server].rule_for(uri)[1] is None:
            # never reviewed, so no default lets it through: only a rule that names it
            self._refuse_item(
                call,
                "route",
                f"resource {uri!r} of server '{server}' is not in its catalog (no listed resource or template "
                f"covers it); to read it anyway, name it in servers.{server}.resources.rules",
            )
        return call, tuple(forms)

    async def complete(self, ctx: Ctx, params: types.CompleteRequestParams) -> types.CompleteResult:
        """Completion for a prompt or template the client may see: held or denied ones get none.
        An `ask` is not asked here: the get or read that follows is."""
        ref = params.ref
        if isinstance(ref, types.PromptReference):
            call = Call(f"prompt:{ref.name}", None, kind="prompt")
            server, name = self._prompt_route(call, ref.name)
            ref = ref.model_copy(update={"name": name})
        else:
            server, name = self._route_uri(ref.uri)
            call = Call(f"resource:{ref.uri}", None, server, f"resource:{name}", kind="resource")
            if template_standing(self._offered(server), self._approved(server), name) is not Standing.LISTED:
                self._refuse_item(call, "lock", held_reason("resource template", name, server))
            ref = ref.model_copy(update={"uri": name})
        policy = self.item_policies[call.kind][server]
        if policy.hidden(name):
            self._refuse_item(call, policy.rule_for(name)[0], f"completion: {policy.decide(name, None).reason}")
        request = types.CompleteRequest(params=params.model_copy(update={"ref": ref, "meta": None}))
        return await self._forward(server, request, types.CompleteResult)

    def _prompt_route(self, call: Call, exposed: str) -> tuple[str, str]:
        """(server, prompt) for an exposed prompt name that is listed; a held or unknown one is refused.

        Raises:
            MCPError: the prompt is held by the lock (audited), or not in the catalog.
        """
        route = self.keeper.catalog.prompt_routes.get(exposed)
        if route is not None:
            call.server, call.tool = route[0], f"prompt:{route[1]}"
            return route
        held = self.keeper.catalog.held.get(exposed)
        offered = self._offered(held[0]) if held is not None else None
        if held is not None and offered is not None and any(p.name == held[1] for p in offered.prompts):
            call.server, call.tool = held[0], f"prompt:{held[1]}"
            self._refuse_item(call, "lock", held_reason("prompt", held[1], held[0]))
        call.tool = f"prompt:{exposed}"
        self._unrouted(call, self.pipeline.unknown(exposed, "prompt"))

    async def _admit_item(self, ctx: Ctx, call: Call, params: Any, name: str) -> types.InputRequiredResult | None:
        """The policy (and, for `ask`, the human) on a routed prompt get or resource read that the
        lock lets through: None to forward it, or the question for a 2026-07-28 client.

        Raises:
            MCPError: refused (audited), or a retry whose approval state does not fit.
        """
        modern = ctx.protocol_version in MODERN_PROTOCOL_VERSIONS
        call.ctx = Asking(ctx.session, ctx.request_id, modern, SessionReply(self.send_log, ctx).tell)
        if params.request_state and modern:  # the retry that carries the human's answer
            why = self.approvals.sealed.carried(call, params.request_state, params.input_responses)
            if why is not None:
                raise MCPError(types.INVALID_PARAMS, f"retry of {call.name} refused: {why}")
        try:
            await self.pipeline.admit_item(call, self.item_policies[call.kind][call.server], name)
        except NeedsInput as needed:
            return needed.result
        except NotAdmitted as refused:
            raise MCPError(types.INVALID_PARAMS, refused.text) from None
        return None

    def _refuse_item(self, call: Call, rule: str, reason: str) -> NoReturn:
        """Audit the refusal of a prompt, resource or completion, and answer the client with it."""
        raise MCPError(types.INVALID_PARAMS, self.pipeline.refusal(call, Verdict(Decision.DENY, rule, reason)))

    async def _started(self, server: str) -> None:
        """Start `server` if it is not running, and wait (bounded) until the lock has seen what it
        offers now: a get or read is judged by that, not by the catalog approved at its last start."""
        ds = self.downstreams[server]
        ds.supervisor.start(self.tasks())
        await ds.supervisor.wait_settled(START_SECONDS)

    def _offered(self, server: str) -> Listing | None:
        """Everything `server` offers, held items included (for one not started: its approved catalog)."""
        ds = self.downstreams[server]
        return ds.listing if ds.listing is not None else self.keeper.shown.get(server)

    def _approved(self, server: str) -> frozenset[str] | None:
        """The items the lock approved for `server`; None when its lock is off. A server whose
        lock is on but not yet read has nothing approved."""
        if server in self.locks.approved:
            return self.locks.approved[server]
        return frozenset() if self.locks.enabled(server) else None

    async def _forward(self, server: str, request: Any, result_type: type[R]) -> R:
        ds = self.downstreams[server]
        ds.supervisor.start(self.tasks())
        try:
            result = await ds.request(request, result_type)
        except DownstreamError as exc:  # the server's error text may hand back a secret as well
            raise MCPError(types.INTERNAL_ERROR, scrub(str(exc), self.secrets())[0]) from exc
        if result.meta and SERVER_INFO_META_KEY in result.meta:  # the gateway's stamp, not the server's
            result = result.model_copy(update={"meta": unstamped(result.meta)})
        try:  # a prompt, resource or completion passes on no secret the gateway holds either
            clean, count = scrub(result.model_dump(by_alias=True, mode="json", exclude_none=True), self.secrets())
            return result_type.model_validate(clean) if count else result
        except ValueError as exc:  # too deep to check, or a number that held a secret in a typed field
            raise MCPError(
                types.INTERNAL_ERROR, f"server '{server}' answered with a secret the gateway holds, not passed on"
            ) from exc

    def _route_uri(self, uri: str) -> tuple[str, str]:
        """(server, its own URI) for an exposed resource URI; one that routes nowhere is refused.

        Raises:
            MCPError: the URI is not a `cellblock://SERVER/` one of a configured server (audited).
        """
        call = Call(f"resource:{uri}", None, tool=f"resource:{uri}", kind="resource")
        try:
            server, original = self.keeper.catalog.route_resource(uri)
        except ValueError as exc:
            self._unrouted(call, str(exc))
        if server not in self.downstreams:
            self._unrouted(call, f"no server named '{server}' for resource {uri}")
        return server, original

    def _unrouted(self, call: Call, reason: str) -> NoReturn:
        """Audit a get, read or completion that routes to no server, and answer the client with why."""
        self.pipeline.refusal(call, Verdict(Decision.DENY, "route", reason))
        raise MCPError(types.INVALID_PARAMS, reason)
