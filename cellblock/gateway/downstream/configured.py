"""The downstream servers a config names, each a `Downstream` with what its entry and the defaults
set (timeout, sampling, message size, jail limits), sorted by name."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import mcp.types as types

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.config.model import Config
from cellblock.gateway.downstream.egressask import EgressApproval
from cellblock.gateway.downstream.launch import own_paths
from cellblock.gateway.downstream.offer import Offer
from cellblock.gateway.downstream.questions import SamplingApproval
from cellblock.gateway.downstream.server import Downstream

__all__ = ["downstreams_of"]


def downstreams_of(
    config: Config,
    state: Path,
    source: Path | None,
    runtime: Path | None,
    audit: Audit,
    offer: Offer,
    on_listing: Callable[[Downstream], Awaitable[None]],
    on_log: Callable[[types.LoggingMessageNotificationParams], None],
    approve_sampling: SamplingApproval,
    approve_egress: EgressApproval,
) -> dict[str, Downstream]:
    """One `Downstream` per server of `config`; `on_listing` and `on_log` are the gateway's (a new
    listing, a log outside any call), the approvals ask the human."""
    own = own_paths(config, state, source, runtime)  # the gateway's own files, hidden in every jail
    return {
        name: Downstream(
            name,
            server,
            timeout=config.timeout_of(name),
            on_listing=on_listing,
            on_log=lambda _, params: on_log(params),
            audit=audit,
            runtime=runtime or Path("/nonexistent"),
            sampling=config.sampling_of(name),
            max_message=config.max_message_of(name),
            own=own,
            learn_in=state,
            limits=config.limits_of(name),
            approve_sampling=approve_sampling,
            approve_egress=approve_egress,
            allow_insecure=config.credentials.allow_insecure,
            offer=offer,
        )
        for name, server in sorted(config.servers.items())
    }
