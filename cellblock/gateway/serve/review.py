"""The user's review of a held catalog from inside the client, and the status tool.

While the lock holds something, the gateway offers two tools of its own (`serve/status.py`):
`cellblock__status` says what waits and what to run, and `cellblock__review` puts one held
server's catalog before the user in the client's form. Only the user's answer approves; the
same form is offered when a call meets a held tool (`Pipeline`'s reviewer).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types

from cellblock.gateway.ask.forms import APPROVE_READ_ONLY
from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.model import Config
from cellblock.gateway.downstream.rounds import error_result
from cellblock.gateway.downstream.server import Downstream
from cellblock.gateway.downstream.startable import cannot_start
from cellblock.gateway.downstream.supervisor import State
from cellblock.gateway.serve.approvals import APPROVAL_KEY, Approvals, NeedsInput, can_elicit, review_form
from cellblock.gateway.serve.control import NOT_FOUND
from cellblock.gateway.serve.keeper import CatalogKeeper
from cellblock.gateway.serve.locking import (
    Locks,
    approve_pending,
    catalog_hash,
    held_catalog,
    read_only_offer,
    unasked_marks,
)
from cellblock.gateway.serve.pipeline import Call
from cellblock.gateway.serve.status import REVIEW, ServerStatus, status_text
from cellblock.gateway.state import lock_path, pending_path
from cellblock.policy.errors import CellblockError
from cellblock.policy.lock import Lock, LockError, check, load_lock, load_pending
from cellblock.policy.lockdiff import describe

__all__ = ["Review"]

CallResult = types.CallToolResult | types.InputRequiredResult


@dataclass
class Review:
    """The review tool, the status tool, and the control socket's `held` and `approve`."""

    config: Config
    state: Path
    audit: Audit
    approvals: Approvals
    locks: Locks
    downstreams: dict[str, Downstream]
    keeper: CatalogKeeper  # lists what an approval lets through

    async def review(self, call: Call) -> CallResult:
        """The review tool: the held catalog of the server named put before the user in the
        client's form. Only the user's answer approves (see `_review_lock`)."""
        held = sorted(name for name, items in self.locks.held.items() if items)
        server = (call.arguments or {}).get("server")
        if set(call.arguments or {}) - {"server"} or server not in held:
            return error_result(f"name one server whose catalog is held: {', '.join(held) or 'none is'}")
        call.server = str(server)
        if call.ctx is None or not can_elicit(call.ctx.session):
            return error_result(
                f"this client shows no forms: the user runs `cellblock review` (or `cellblock diff {server}`, "
                f"then `cellblock approve {server}`) in a terminal"
            )
        try:
            approved = await self.review_lock(call)
        except NeedsInput as needed:
            return needed.result
        if not approved:
            return _text_result(f"The user keeps the catalog of '{server}' held: its tools stay unlisted.")
        return _text_result(f"The user approved the catalog of '{server}': its tools are listed now.")

    async def status(self) -> types.CallToolResult:
        servers = [
            ServerStatus(
                name,
                held=len(self.locks.held.get(name, ())),
                first_contact=not lock_path(self.state, name).exists(),
                # in the gateway's words only: what a server wrote is not for the model before approval
                down=ds.error_without_output
                if ds.supervisor.state in (State.FAILED, State.RESTARTING)
                else await cannot_start(ds)
                if ds.supervisor.state is State.STOPPED
                else None,
            )
            for name, ds in self.downstreams.items()
        ]
        return _text_result(status_text(servers, self.approvals.listing(), self.keeper.own_tool(REVIEW)))

    def held(self) -> list[dict[str, Any]]:
        """The control socket's `held`: each held catalog of this gateway's servers as `cellblock
        diff` shows it, with its `catalog_hash` (what an approval is bound to) and its tools, each
        marked if the policy runs it without asking once approved."""
        state, config = self.state, self.config
        found: list[dict[str, Any]] = []
        for server in config.servers:
            if not pending_path(state, server).exists():
                continue
            try:
                current = held_catalog(state, server)
                if current is None:
                    continue  # approved since the look
                first = not lock_path(state, server).exists()
                diff = describe(check(_lock_or_none(state, server), current), server, first)
                kept = read_only_offer(config, state, server, current)[1]
                marks = unasked_marks(config, server, current, kept)
                shown_hash = catalog_hash(current)
            except CellblockError as exc:
                found.append({"server": server, "error": str(exc)})
                continue
            tools = [{"name": name, "unasked": runs} for name, runs in marks.items()]
            found.append({"server": server, "first": first, "hash": shown_hash, "diff": diff, "tools": tools})
        return found

    async def approve_catalog(self, server: Any, shown_hash: Any) -> dict[str, Any]:
        """The control socket's `approve_catalog`: accept the held catalog of `server` only if it is
        still the one whose `catalog_hash` is `shown_hash` (a catalog that changed after it was
        shown is not approved by it), as `cellblock approve SERVER --hash` does; the tools are
        listed before the reply."""
        if not isinstance(server, str) or server not in self.config.servers:
            return {"ok": False, "error": f"no server {server!r} in this gateway", "code": NOT_FOUND}
        if not isinstance(shown_hash, str) or not shown_hash:
            return {"ok": False, "error": "approve_catalog takes the 'hash' of the catalog shown"}
        state = self.state
        try:
            count = approve_pending(state, self.audit, server, via="dashboard", shown_hash=shown_hash)
            current = held_catalog(state, server) if count is None else None
        except CellblockError as exc:
            return {"ok": False, "error": str(exc)}
        if count is None:
            if current is None:
                return {"ok": False, "error": f"nothing is held for '{server}': nothing approved"}
            return {
                "ok": False,
                "error": f"the catalog held for '{server}' changed since it was shown (its sha256 is now "
                f"{catalog_hash(current)}): nothing approved; review it again",
            }
        await self.keeper.on_listing(self.downstreams[server])
        return {"ok": True, "items": count}

    async def review_lock(self, call: Call) -> bool:
        """Offer the held catalog of the call's server for approval through the client's form."""
        # the retry's answer belongs to this question only if its form asked it
        answer, call.human = call.human if call.answered == "review" else None, None
        state, server = self.state, call.server
        pending = load_pending(pending_path(state, server))
        if pending is None:
            return False
        shown = dict(pending.items)
        offer, kept = read_only_offer(self.config, state, server, shown)
        if answer is None:
            if call.ctx is None or not can_elicit(call.ctx.session):
                return False
            lock = lock_path(state, server)
            first = not lock.exists()
            message, schema = review_form(
                server,
                describe(check(load_lock(lock), shown), server, first),
                first,
                read_only=[key.removeprefix("tool:") for key in offer],
                unasked=kept,
            )
            if call.ctx.modern:
                request = types.ElicitRequest(
                    params=types.ElicitRequestFormParams(message=message, requested_schema=schema)
                )
                raise NeedsInput(
                    types.InputRequiredResult(
                        input_requests={APPROVAL_KEY: request},
                        request_state=self.approvals.sealed.seal(call.name, call.arguments, "review"),
                    )
                )
            try:
                # the human has approvals.timeout to decide; silence keeps the catalog held
                with anyio.fail_after(self.config.approvals.timeout):
                    ask = call.ctx.session.elicit_form
                    answer = await ask(message, schema, related_request_id=call.ctx.request_id)
            except Exception:  # noqa: BLE001 - no answer (timeout, a client that failed or left): stays held
                return False
        decision = (answer.content or {}).get("decision")
        if answer.action != "accept" or decision not in ("approve", APPROVE_READ_ONLY):
            self.audit.note("lock_kept", call.server, via="elicitation")
            return False
        unasked = frozenset(offer) if decision == APPROVE_READ_ONLY else frozenset()
        approve_pending(state, self.audit, server, via="elicitation", shown=shown, unasked=unasked)
        await self.keeper.on_listing(self.downstreams[call.server])
        return True


def _lock_or_none(state: Path, server: str) -> Lock | None:
    # a damaged lock approves nothing: the gateway holds every item, and so does the diff
    try:
        return load_lock(lock_path(state, server))
    except LockError:
        return None


def _text_result(text: str) -> types.CallToolResult:
    return types.CallToolResult(content=[types.TextContent(type="text", text=text)])
