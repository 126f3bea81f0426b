"""Exposed names for tools and prompts, and routable resource URIs.

Every tool (and prompt) a backend server offers is shown to the client as
`<server><separator><name>`, or under its own name for a server without a prefix (`bare`).
Clients are strict about names (Claude Desktop drops a whole server over one dot; several clients
cap the length at 64 or less), so names are sanitized and shortened here, and any two names that
end up equal are told apart deterministically and reported.

A server's titles (and a resource's name) that read as Cellblock's are found here too (`voiced`):
the catalog shows such an item without them, and `cellblock check` reports them.

Resource URIs are wrapped as `cellblock://<server>/<original uri>` so a read can be routed back; a
server without a prefix keeps its own URIs wherever they route back to it alone (`UriTable`). An
MCP App's `ui://<rest>` keeps its scheme, which hosts require to render it: it is shown as
`ui://<server>/<rest>`, for every server.

Pure Python on purpose: the rules are unit-tested without a running gateway or the MCP SDK.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from itertools import chain
from types import MappingProxyType
from typing import Any

from cellblock.policy.lookalikes import speaks_as_cellblock

__all__ = [
    "APP_SCHEME",
    "MAX_LENGTH_DEFAULT",
    "SEPARATOR_DEFAULT",
    "URI_SCHEME",
    "Collision",
    "NameTable",
    "UriTable",
    "assign_names",
    "check_separator",
    "expose_uri",
    "is_app",
    "route_uri",
    "voiced",
]

SEPARATOR_DEFAULT = "__"
# 64 is the tightest common cap (Claude API/Desktop, OpenAI, VS Code); `cellblock wrap` lowers it
# further for clients that add their own prefix.
MAX_LENGTH_DEFAULT = 64
URI_SCHEME = "cellblock"
APP_SCHEME = "ui"  # MCP Apps (io.modelcontextprotocol/ui): a host renders only ui:// resources
_APP = len(APP_SCHEME) + 3  # "ui://"

# Mirrors `cellblock.gateway.config.model.SERVER_NAME` (a test keeps them equal); redefined here so this
# module does not import pydantic and yaml. Used with fullmatch: `$` alone would accept "name\n".
_SERVER_NAME = re.compile(r"^[a-z][a-z0-9-]{0,23}$")
_SEPARATOR = re.compile(r"^[A-Za-z0-9_-]{1,4}$")
# Explicit ASCII ranges: `\w` would let non-ASCII letters through, which clients reject.
_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")
_MIN_LENGTH = 16
_HASH_HEX = 8  # 32 bits: enough to separate the few names that collide, short enough to read
_URI_PREFIX = re.compile(rf"^{URI_SCHEME}://([^/]*)/", re.IGNORECASE)
_APP_PREFIX = re.compile(rf"^{APP_SCHEME}://([^/]*)/", re.IGNORECASE)
# URIs in these schemes always name their server: Cellblock's own, and an app's
_OUR_SCHEME = re.compile(rf"^(?:{URI_SCHEME}|{APP_SCHEME}):", re.IGNORECASE)


@dataclass(frozen=True, slots=True)
class Collision:
    """One name that could not get its plain form because another name already had it."""

    exposed: str  # the name it got instead
    server: str
    original: str
    wanted: str  # the plain name it collided on
    why: str = "which another name of the catalog already has"

    def __str__(self) -> str:
        return (
            f"server {self.server!r}: name {self.original!r} wanted {self.wanted!r}, {self.why}; "
            f"it is exposed as {self.exposed!r} instead"
        )


@dataclass(frozen=True, slots=True)
class NameTable:
    """Both directions of the name mapping, plus what had to be renamed.

    The mappings are read-only views, iterated in sorted order so that tool lists built from them
    come out identical every time (clients cache prompts on that).
    """

    by_exposed: Mapping[str, tuple[str, str]]  # exposed -> (server, original)
    by_original: Mapping[tuple[str, str], str]  # (server, original) -> exposed
    collisions: tuple[Collision, ...]


def _digest(server: str, original: str, salt: int = 0) -> str:
    # The hash covers the original name (not the sanitized one), so `a.b` and `a_b`, or two long
    # names that share their first 55 characters, get different suffixes. A server name has no NUL
    # and starts with a letter, so neither key form can equal another (salted keys start with a
    # digit). `surrogatepass` keeps odd JSON strings (lone surrogates) from raising.
    key = f"{server}\x00{original}" if salt == 0 else f"{salt}\x00{server}\x00{original}"
    return hashlib.sha256(key.encode("utf-8", "surrogatepass")).hexdigest()


def _hashed(plain: str, digest: str, hex_chars: int, max_length: int) -> str:
    # Cut the plain name so that "<prefix>_<hex>" fits exactly in max_length; the prefix keeps at
    # least the server's first letter, so the name still starts with a letter.
    return f"{plain[: max_length - 1 - hex_chars]}_{digest[:hex_chars]}"


def _candidates(server: str, original: str, plain: str, max_length: int) -> Iterator[str]:
    """Hash forms to try, in order, for a name that lost its plain form."""
    digest = _digest(server, original)
    # Longer and longer suffixes of the same hash (shortening the prefix to keep the length)...
    for hex_chars in range(_HASH_HEX, min(len(digest), max_length - 2) + 1):
        yield _hashed(plain, digest, hex_chars, max_length)
    # ...and if a server went out of its way to occupy all of those, salted hashes: an endless,
    # deterministic supply, so assignment always terminates instead of failing the whole catalog.
    salt = 1
    while True:
        yield _hashed(plain, _digest(server, original, salt), _HASH_HEX, max_length)
        salt += 1


def check_separator(separator: str) -> None:
    """Refuse a separator that leaves an exposed name ambiguous.

    A server name holds only `[a-z0-9-]`, so a separator with a `_` or an upper-case letter marks
    where the server's name ends wherever the first such character of a name is: `a` + `-` +
    `b-c` and `a-b` + `-` + `c` would both be `a-b-c`, and one server could take another's name.

    Raises:
        ValueError: the separator is malformed or could be read as part of a server name.
    """
    if not _SEPARATOR.fullmatch(separator):
        raise ValueError(f"invalid separator {separator!r}: expected 1-4 characters of [A-Za-z0-9_-]")
    if not re.search(r"[A-Z_]", separator):
        raise ValueError(
            f"separator {separator!r} could be part of a server name, so one server's tool could take "
            "another's exposed name (`a-b-c` is server `a` with tool `b-c`, or `a-b` with `c`); "
            "use one with `_` or an upper-case letter, such as the default `__`"
        )


def _check_server(server: str) -> None:
    if not _SERVER_NAME.fullmatch(server):
        raise ValueError(f"invalid server name {server!r}: expected {_SERVER_NAME.pattern}")


def assign_names(
    items: Iterable[tuple[str, str]],
    *,
    separator: str = SEPARATOR_DEFAULT,
    max_length: int = MAX_LENGTH_DEFAULT,
    bare: Collection[str] = (),
) -> NameTable:
    """Give every (server, original name) pair a unique, client-safe exposed name.

    Call once per kind (tools, prompts) with the whole catalog: the result depends only on the set
    of pairs, never on their order, so the same servers always produce the same names. The servers
    in `bare` have no prefix: their names are shown as they are (sanitized and shortened alike),
    except one that reads as `<server><separator>…`, which would pass for another server's, or one
    that reads as Cellblock's however it is spelled (`policy.lookalikes`): it gets its own server's
    prefix instead, and is reported.
    """
    check_separator(separator)
    if isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < _MIN_LENGTH:
        raise ValueError(f"max_length must be an integer >= {_MIN_LENGTH}, got {max_length!r}")

    # Sorting the de-duplicated pairs up front is what makes everything below order-independent.
    pairs = sorted(set(items))
    wanted: dict[tuple[str, str], str] = {}
    plain_of: dict[tuple[str, str], str] = {}
    clean: set[tuple[str, str]] = set()
    # a prefix at the start of a name: a bare name cannot keep one (any server's, configured or not)
    namespaced = re.compile(rf"[a-z][a-z0-9-]{{0,23}}{re.escape(separator)}")
    prefixed: list[Collision] = []
    unprefixed: set[tuple[str, str]] = set()  # the pairs that want their name without a prefix
    for server, original in pairs:
        _check_server(server)
        raw = f"{server}{separator}{original}"
        if server in bare:
            own = _UNSAFE.sub("_", original)
            if namespaced.match(own):
                why = f"which reads as a name of server {own.partition(separator)[0]!r}"
                prefixed.append(Collision(exposed="", server=server, original=original, wanted=own, why=why))
            elif speaks_as_cellblock(original):
                why = "which reads as one of Cellblock's own"
                prefixed.append(Collision(exposed="", server=server, original=original, wanted=own, why=why))
            else:
                raw = original
                unprefixed.add((server, original))
        plain = _UNSAFE.sub("_", raw)
        plain_of[(server, original)] = plain
        if len(plain) > max_length:
            wanted[(server, original)] = _hashed(plain, _digest(server, original), _HASH_HEX, max_length)
        else:
            wanted[(server, original)] = plain
            if plain == raw:
                clean.add((server, original))

    # Pass 1: every wanted name goes to exactly one claimant. A name used verbatim beats one that
    # only looks like it after sanitizing (the server author meant `a_b`, not `a.b`); ties go to
    # the smallest (server, original).
    claimants: dict[str, list[tuple[str, str]]] = {}
    for pair in pairs:
        claimants.setdefault(wanted[pair], []).append(pair)
    by_original: dict[tuple[str, str], str] = {}
    losers: list[tuple[str, str]] = []
    for name, group in claimants.items():
        winner = min(group, key=lambda p: (p not in clean, p))
        by_original[winner] = name
        losers.extend(p for p in group if p != winner)

    # Pass 2: the others take the first free hash form, in sorted order, after all wanted names
    # are settled, so a loser can never take a name that some other pair wanted as its plain form.
    # One that wanted its name without a prefix takes its server's prefix first: a hash form of
    # the bare name could read as another server's (`a_` + `_1f2e…`).
    taken = set(by_original.values())
    collisions: list[Collision] = []
    for pair in sorted(losers):
        server, original = pair
        base = plain_of[pair]
        if pair in unprefixed:
            base = _UNSAFE.sub("_", f"{server}{separator}{original}")
        first = [base] if pair in unprefixed and len(base) <= max_length else []
        name = next(c for c in chain(first, _candidates(server, original, base, max_length)) if c not in taken)
        taken.add(name)
        by_original[pair] = name
        collisions.append(Collision(exposed=name, server=server, original=original, wanted=wanted[pair]))

    collisions += [replace(c, exposed=by_original[(c.server, c.original)]) for c in prefixed]
    exposed_sorted = sorted((name, pair) for pair, name in by_original.items())
    return NameTable(
        by_exposed=MappingProxyType(dict(exposed_sorted)),
        by_original=MappingProxyType({pair: by_original[pair] for pair in pairs}),
        collisions=tuple(collisions),
    )


def voiced(kind: str, item: Mapping[str, Any]) -> list[str]:
    """The fields of a server's item (its JSON) that a client shows for it and that read as
    Cellblock's however they are spelled (`policy.lookalikes`): a `title`, a tool's
    `annotations.title`, and a resource's or template's `name` (free text there: its identity is
    its URI). A tool's or prompt's name is `assign_names`'s to judge."""
    annotations = item.get("annotations") if kind == "tool" else None
    fields = {
        "title": item.get("title"),
        "annotations.title": annotations.get("title") if isinstance(annotations, Mapping) else None,
        "name": item.get("name") if kind in ("resource", "template") else None,
    }
    return [field for field, text in fields.items() if isinstance(text, str) and speaks_as_cellblock(text)]


def expose_uri(server: str, uri: str) -> str:
    """Wrap a backend resource URI (or URI template) so a read can be routed back to its server.

    The original is appended verbatim, not escaped: a template such as `file:///{path}` keeps its
    variables, and whatever the client expands them to still starts with our prefix. An app's
    `ui://<rest>` becomes `ui://<server>/<rest>`.
    """
    _check_server(server)
    if is_app(uri):
        return f"{uri[:_APP]}{server}/{uri[_APP:]}"
    return f"{URI_SCHEME}://{server}/{uri}"


def is_app(uri: str) -> bool:
    """Whether `uri` is an MCP App's (io.modelcontextprotocol/ui): hosts render ui:// resources."""
    return uri[:_APP].lower() == f"{APP_SCHEME}://"


def route_uri(exposed_uri: str) -> tuple[str, str]:
    """Split an exposed resource URI back into (server, original URI).

    Raises ValueError if the URI was not produced by `expose_uri`.
    """
    # The scheme is matched case-insensitively (RFC 3986 says schemes are); server names are
    # lower-case already, so a client that normalizes the host changes nothing.
    app = _APP_PREFIX.match(exposed_uri)
    match = app or _URI_PREFIX.match(exposed_uri)
    if match is None or not _SERVER_NAME.fullmatch(match.group(1)):
        raise ValueError(
            f"not a Cellblock resource URI: {exposed_uri!r} (expected {URI_SCHEME}://<server>/<uri>, "
            f"or {APP_SCHEME}://<server>/<path> for an app); list the resources again to see the URIs"
        )
    rest = exposed_uri[match.end() :]
    return match.group(1), exposed_uri[:_APP] + rest if app else rest


# RFC 6570 expressions by operator: what an expansion of one can look like, as a regex. Loose on
# purpose (a route, not a validator): `+` and `#` keep reserved characters, the others do not.
_EXPRESSION = re.compile(r"\{([+#./;?&]?)[^{}]*\}")
_EXPANDS = {
    "": r"[^/?#]*",
    "+": r".*",
    "#": r"(?:#.*)?",
    ".": r"(?:\.[^/?#]*)*",
    "/": r"(?:/[^/?#]*)*",
    ";": r"(?:;[^/?#]*)*",
    "?": r"(?:\?[^#]*)?",
    "&": r"(?:&[^#]*)?",
}


def template_pattern(template: str) -> re.Pattern[str]:
    """A regex that every expansion of the URI template `template` fully matches."""
    parts: list[str] = []
    at = 0
    for match in _EXPRESSION.finditer(template):
        parts += [re.escape(template[at : match.start()]), _EXPANDS[match.group(1)]]
        at = match.end()
    parts.append(re.escape(template[at:]))
    return re.compile("".join(parts), re.DOTALL)


@dataclass(frozen=True)
class UriTable:
    """Where a resource URI the client holds goes, and how a server's URI is shown.

    A server with a prefix shows `cellblock://<server>/<uri>`. One without (`bare`) shows its URIs
    as they are wherever they route back to it alone: a URI it lists that no other bare server
    lists first (by server name), or one only its templates match. Anything else, and any URI in
    Cellblock's own scheme or an app's, is wrapped like a prefixed server's, so a URI never reaches a server
    other than the one that gave it. The wrapped form routes for every server.
    """

    bare: frozenset[str] = frozenset()
    exact: Mapping[str, str] = field(default_factory=dict)  # a bare server's listed URI -> the server
    templates: tuple[tuple[str, str, re.Pattern[str]], ...] = ()  # (server, template, its pattern)

    @classmethod
    def build(
        cls, bare: Collection[str], resources: Iterable[tuple[str, str]], templates: Iterable[tuple[str, str]]
    ) -> UriTable:
        """From every (server, URI) and (server, template) the servers offer."""
        exact: dict[str, str] = {}
        for server, uri in sorted(set(resources)):
            if server in bare and not _OUR_SCHEME.match(uri):
                exact.setdefault(uri, server)
        shown: dict[str, tuple[str, str, re.Pattern[str]]] = {}
        for server, template in sorted(set(templates)):
            if server in bare and not _OUR_SCHEME.match(template):
                shown.setdefault(template, (server, template, template_pattern(template)))
        return cls(frozenset(bare), MappingProxyType(exact), tuple(sorted(shown.values())))

    def owners(self, uri: str) -> list[str]:
        """The bare servers a URI outside Cellblock's scheme would go to: one, or none or several
        when it cannot be routed."""
        owner = self.exact.get(uri)
        if owner is not None:
            return [owner]
        return sorted({server for server, _, pattern in self.templates if pattern.fullmatch(uri)})

    def expose(self, server: str, uri: str) -> str:
        """`uri` of `server` as the client sees it."""
        if server in self.bare and not _OUR_SCHEME.match(uri) and self.owners(uri) == [server]:
            return uri
        return expose_uri(server, uri)

    def expose_template(self, server: str, template: str) -> str:
        """A resource template of `server` as the client sees it."""
        if any(owner == server and text == template for owner, text, _ in self.templates):
            return template
        return expose_uri(server, template)

    def route(self, uri: str) -> tuple[str, str]:
        """(server, original URI) for a URI the client holds.

        Raises:
            ValueError: it routes to no server, or to more than one.
        """
        if _OUR_SCHEME.match(uri) or not self.bare:
            return route_uri(uri)
        owners = self.owners(uri)
        if len(owners) == 1:
            return owners[0], uri
        if owners:
            forms = " or ".join(f"{URI_SCHEME}://{owner}/{uri}" for owner in owners)
            raise ValueError(
                f"resource URI {uri!r} matches the templates of servers {', '.join(owners)}: read it as {forms}"
            )
        raise ValueError(
            f"resource URI {uri!r} is not one a server without a prefix lists or matches a template of, "
            f"and not a Cellblock resource URI ({URI_SCHEME}://<server>/<uri>); list the resources again, "
            f"or read it as {URI_SCHEME}://<server>/{uri}"
        )
