"""The sealed `request_state` of an approval form in the 2026-07-28 era, and the answer a retry carries.

A client of that era is asked through an `InputRequiredResult`; its retry carries the user's answer
and the state the gateway sealed: bound to the call (its exposed name and a digest of its
arguments), to the question the form put ("tool:save", "share:read_write:/home/u/x", "review"),
to an expiry, and redeemable once. The key exists only in this process, so nothing the model
sends can forge an answer.
"""

from __future__ import annotations

import secrets
from typing import Any

import mcp.types as types

from cellblock.gateway.ask import elicitation
from cellblock.gateway.ask.elicitation import Sealer, StateRejected

__all__ = ["APPROVAL_KEY", "STATE_PREFIX", "SealedAnswers", "human_answer"]

# The input key of an approval question inside an InputRequiredResult.
APPROVAL_KEY = "cellblock_approval"
STATE_PREFIX = "ap1."


class SealedAnswers:
    """Seals forms' states, and takes each retry's answer once (`timeout`: how long a state holds)."""

    def __init__(self, timeout: float) -> None:
        self._timeout = timeout
        self._sealer = Sealer(STATE_PREFIX)
        self._used: dict[str, float] = {}

    def seal(self, exposed: str, arguments: dict[str, Any] | None, asked: str = "") -> str:
        """The state of a form about the call `exposed` with `arguments`; `asked`: the question the
        form put ("tool:save", "share:read_write:/home/u/x"), the only one its answer may settle."""
        return self._sealer.seal(exposed, arguments, self._timeout, nonce=secrets.token_hex(8), asked=asked)

    def redeem(self, state: str, exposed: str, arguments: dict[str, Any] | None) -> str | None:
        """None if `state` is a valid, unused approval state for exactly this call; else why not."""
        claim = self._redeemed(state, exposed, arguments)
        return claim if isinstance(claim, str) else None

    def carried(self, call: Any, state: str, responses: dict[str, Any] | None) -> str | None:
        """Take the answer a 2026-07-28 retry of `call` carries: `call.human`, and `call.answered`
        the question its form asked; None, or why `state` refuses the retry."""
        claim = self._redeemed(state, call.name, call.arguments)
        if isinstance(claim, str):
            return claim
        call.human, call.answered = human_answer(responses), str(claim.get("asked", ""))
        return None

    def _redeemed(self, state: str, exposed: str, arguments: dict[str, Any] | None) -> dict[str, Any] | str:
        """The claim of a valid, unused approval state for exactly this call (now used); else why not."""
        try:
            claim = self._sealer.open(state, exposed, arguments)
        except StateRejected as exc:
            return f"the approval state {exc}"
        nonce = str(claim.get("nonce"))
        if nonce in self._used:
            return "the approval state was already used"
        self._used = {n: e for n, e in self._used.items() if e > elicitation.now()}
        self._used[nonce] = float(claim["exp"])
        return claim


def human_answer(responses: dict[str, Any] | None) -> types.ElicitResult:
    """The human's answer to an approval question, as a 2026-07-28 retry carries it (else: cancel)."""
    try:
        return types.ElicitResult.model_validate((responses or {}).get(APPROVAL_KEY), by_name=False)
    except ValueError:
        return types.ElicitResult(action="cancel")
