"""Where a resource read stands against the lock: a listed item, a held one, or outside the catalog.

A read names a URI. It is *listed* when the server lists that resource, or a template that can
expand to it, and the lock approved that item (or the server has no lock); *held* when the only
items it belongs to are new or changed since approval, or the whole catalog waits for its first
review; *unlisted* when nothing the server lists covers it (a URI from a tool result, or one the
client made up). An unlisted URI was never reviewed, so only a `resources` rule that names it can
let it be read (the section's default does not); see docs/policy.md.
"""

from __future__ import annotations

from enum import Enum

from cellblock.gateway.downstream.listing import Listing
from cellblock.policy.templates import template_matches

__all__ = ["Standing", "held_reason", "resource_standing", "template_standing"]


class Standing(Enum):
    LISTED = "listed"
    HELD = "held"
    UNLISTED = "unlisted"


def resource_standing(listing: Listing | None, approved: frozenset[str] | None, uri: str) -> Standing:
    """How the read of `uri` (the server's own URI) stands, given everything the server offers
    (`listing`, held items included) and what its lock approved (`None`: no lock)."""
    if approved is not None and not approved:
        return Standing.HELD  # first contact, or a damaged lock: nothing is approved yet
    if listing is None:
        return Standing.UNLISTED
    if any(str(r.uri) == uri for r in listing.resources):
        standing = _approved(approved, f"resource:{uri}")
        if standing is Standing.LISTED and listing.app(uri) is not None:
            return _approved(approved, f"app:{uri}")  # an app is judged by its content too
        return standing
    keyed = [(t.uri_template, _approved(approved, f"template:{t.uri_template}")) for t in listing.templates]
    # approved templates first, and the first that covers `uri` settles it: a held template (a
    # hostile server's, perhaps) is matched only when no approved one covers the URI
    keyed.sort(key=lambda pair: pair[1] is not Standing.LISTED)
    for template, standing in keyed:
        if template_matches(template, uri):
            return standing
    return Standing.UNLISTED


def template_standing(listing: Listing | None, approved: frozenset[str] | None, template: str) -> Standing:
    """How a completion for `template` (a template's text, or a resource's URI) stands."""
    if approved is not None and not approved:
        return Standing.HELD
    if listing is not None and any(t.uri_template == template for t in listing.templates):
        return _approved(approved, f"template:{template}")
    if listing is not None and any(str(r.uri) == template for r in listing.resources):
        return _approved(approved, f"resource:{template}")
    return Standing.UNLISTED


def held_reason(kind: str, name: str, server: str) -> str:
    """The refusal of a held prompt or resource: what, whose, and the commands that release it."""
    return (
        f"{kind} {name!r} of server '{server}' is new or changed since the server was approved (or the server "
        f"was never approved); see 'cellblock diff {server}', accept with 'cellblock approve {server}'"
    )


def _approved(approved: frozenset[str] | None, key: str) -> Standing:
    return Standing.LISTED if approved is None or key in approved else Standing.HELD
