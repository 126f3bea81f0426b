"""The fast path's share of the wire (`serve/fastpath.FastPath.take`) under a hostile client; the
calls it answers are tested through `cellblock serve` in tests/integration/test_fastpath.py."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import pytest

from cellblock.gateway.serve.fastpath import FastPath


class InFlight:
    def __init__(self) -> None:
        self.cancelled: list[str] = []

    def cancel(self, reason: str) -> None:
        self.cancelled.append(reason)


# JSON that no request id can be; True and 1.0 are equal to 1 as dictionary keys
@pytest.mark.parametrize("ident", [["cb-1"], {"id": 1}, None, True, 1.0])
def test_a_cancel_naming_a_request_no_id_can_be_cancels_no_call(ident: Any) -> None:
    path = FastPath(SimpleNamespace(), None, {}, lambda: None)  # type: ignore[arg-type]  # reason: a cancel needs neither
    call = InFlight()
    path.in_flight[1] = call  # type: ignore[assignment]  # reason: only its cancel is reached
    cancel = {"jsonrpc": "2.0", "method": "notifications/cancelled", "params": {"requestId": ident}}
    assert path.take(cancel) is False  # the SDK's, to pass over
    assert call.cancelled == [] and 1 in path.in_flight
    assert path.take({**cancel, "params": {"requestId": 1}}) is True and call.cancelled == ["cancelled by the client"]
