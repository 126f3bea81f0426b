"""What is said of a server's jail: the warnings at its first start (what it keeps from the
server, what it cannot close here, how its limits are enforced), the `server_ready` audit event's
fields and the ready line's words."""

from __future__ import annotations

import logging
from typing import Any

from cellblock.gateway.config.model import ServerConfig
from cellblock.sandbox.landlock import landlock_abi
from cellblock.sandbox.limits import Confinement, describe
from cellblock.sandbox.sockets import ABSTRACT_SCOPE_ABI, abstract_gap
from cellblock.sandbox.types import LaunchPlan, LimitPlan, MountMode, Network

__all__ = ["jail_fields", "jail_line", "tell_jail"]

logger = logging.getLogger(__name__)


def tell_jail(name: str, plan: LaunchPlan) -> None:
    """Say, at a server's first start, what its jail keeps from it though its grants hold it (as a
    warning: the grant is wider than it works), what it cannot close here, and how its limits are
    enforced."""
    hidden = [f"{m.path} ({m.why})" for m in plan.mounts if m.mode is MountMode.HIDDEN]
    if hidden:
        logger.warning("server '%s': its jail keeps from it what its grants hold: %s", name, "; ".join(hidden))
    if plan.network is Network.OPEN and plan.seccomp is not None and landlock_abi() < ABSTRACT_SCOPE_ABI:
        logger.warning("%s", abstract_gap(name, landlock_abi()))
    if plan.backend == "landlock":
        lacks = "; ".join(plan.gaps) or "nothing bubblewrap does"
        logger.warning(
            "server '%s': its jail is Landlock's (ABI %d), which does not enforce here: %s", name, landlock_abi(), lacks
        )
    if plan.limits is not None:
        _tell_limits(name, plan.limits)


def jail_fields(config: ServerConfig, plan: LaunchPlan | None, confined: Confinement | None) -> dict[str, Any]:
    """What the `server_ready` audit event says of a server's jail: its network (or `off`,
    `remote`), the backend that built it, a Landlock jail's ABI and what it does not enforce
    here, and how its limits are enforced."""
    jail = getattr(config, "jail", None)
    fields: dict[str, Any] = {"jail": "remote" if jail is None else "off" if jail is False else jail.network}
    if jail and plan is not None:
        fields["backend"] = plan.backend
        if plan.backend == "landlock":
            fields |= {"landlock_abi": landlock_abi(), "not_enforced": list(plan.gaps)}
    if confined is not None:
        fields["limits"] = describe(confined.plan)
    return fields


def jail_line(fields: dict[str, Any]) -> str:
    """The jail of `jail_fields` in a few words, for the line that says a server is ready."""
    if fields["jail"] in ("off", "remote"):
        return "unjailed" if fields["jail"] == "off" else "remote"
    abi = f" ABI {fields['landlock_abi']}" if "landlock_abi" in fields else ""
    return f"jail {fields.get('backend', '?')}{abi}, network {fields['jail']}"


def _tell_limits(name: str, limits: LimitPlan) -> None:
    """Say how a server's jail limits are enforced here, as a warning where not for the jail as a whole."""
    how = limits.enforcement
    weak = [f"{key} {m.how}" for key, m in (("processes:", how.processes), ("memory:", how.memory)) if not m.whole]
    if weak:
        logger.warning("server '%s': its jail's limits are not all enforced as a whole: %s", name, "; ".join(weak))
    logger.info("server '%s': limits: %s", name, describe(limits))
