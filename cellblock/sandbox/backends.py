"""Which Linux jail a server gets: bubblewrap, or Landlock where namespaces are refused.

`jail.backend` (and `defaults.backend`) say which: `bwrap` (namespaces and seccomp, the strongest)
refuses rather than fall back; `landlock` (Landlock, `no_new_privs` and seccomp, applied by the
server's own first process, no privilege or namespace needed) refuses where the kernel's Landlock
cannot hold what the jail asks; `auto`, the default, is bubblewrap where it can build a jail here,
else Landlock where it can hold this jail, else neither: the server does not start, and the
message names both causes and both fixes. Whichever runs, the plan says so (`LaunchPlan.backend`)
with what it does not enforce on this machine (`LaunchPlan.gaps`): never a silent downgrade.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Literal

from cellblock.sandbox.bwrap import bwrap_plan, check_bwrap
from cellblock.sandbox.landlock import landlock_abi, landlock_plan, landlock_refusal
from cellblock.sandbox.types import Backend, JailError, JailSpec, LaunchPlan, Mount

__all__ = ["Choice", "backend_plan", "choose"]


@dataclass(frozen=True, slots=True)
class Choice:
    """The backend that builds a server's jail here."""

    backend: Literal["bwrap", "landlock"]
    bwrap: str | None = None  # the bwrap binary, when it builds the jail
    refused: JailError | None = None  # why bubblewrap cannot here, when `auto` chose Landlock


def choose(name: str, backend: Backend) -> Choice:
    """What builds server `name`'s jail for `backend`: bubblewrap unless it is `landlock`, or
    unless it is `auto` and bubblewrap cannot build a jail here (its trial jail fails).

    Raises:
        JailError: `bwrap`, and bubblewrap cannot build a jail here.
    """
    if backend == "landlock":
        return Choice("landlock")
    try:
        return Choice("bwrap", check_bwrap())
    except JailError as exc:
        if backend == "bwrap":
            raise JailError(f"server '{name}': jail.backend is bwrap, and {exc}") from exc
        return Choice("landlock", refused=exc)


def backend_plan(
    spec: JailSpec,
    launchers: Sequence[Mount],
    choice: Choice,
    private: str | None,
    secrets: Mapping[str, str] | None = None,
    spawner_env: Sequence[str] = (),
) -> LaunchPlan:
    """The plan of the jail `choice` builds for `spec`. `private`: a directory only the gateway
    uses for this server (a Landlock jail's home and tmp are made in it).

    Raises:
        JailError: Landlock cannot hold what `spec` asks here (with `auto`: and bubblewrap could not
            build it either); the message names the cause of each and what fixes it. Or see
            `bwrap_plan` and `landlock_plan`.
    """
    if choice.bwrap is not None:
        return replace(bwrap_plan(spec, launchers, choice.bwrap, secrets, spawner_env), backend="bwrap")
    abi = landlock_abi()
    why = landlock_refusal(spec, abi) if private is not None else "the gateway gave it no private directory"
    if why is None and private is not None:
        return landlock_plan(spec, launchers, private, secrets, abi)
    if choice.refused is None:
        raise JailError(
            f"server '{spec.name}': jail.backend is landlock, which cannot hold its jail here: {why}; "
            "or use jail.backend: bwrap"
        )
    raise JailError(
        f"server '{spec.name}' cannot be jailed on this machine, so it was not started. "
        f"Bubblewrap: {choice.refused}. Landlock (the backend where namespaces are refused): {why}. "
        "Either fix lets it start"
    )
