"""Argument constraints compiled into checks: paths under (or not under) roots, hosts, values, patterns.

A check returns None or raises `Reject`, whose message completes "argument 'x' ...". Paths are
resolved as a server will resolve them (`~`, relative, `..`, symlinks, Unicode twins); a URL is read
only where WHATWG and RFC 3986 parsers agree.

Pure: the only I/O is resolving paths (reading symlinks, or on Linux asking the kernel through
/proc). A path is checked as it resolves at the moment of the call; a symlink swapped in afterwards
is the jail's business.
"""

from __future__ import annotations

import math
import os
import re
import sys
import unicodedata
from collections.abc import Iterable, Mapping

from cellblock.policy.hosts import HostRule, host_allowed, normalize_host, parse_rule
from cellblock.policy.types import Constraint, ConstraintKind

__all__ = [
    "Check",
    "Reject",
    "compile_constraint",
    "expand_home",
    "host_rules",
    "realpath",
    "regexes",
    "show",
    "type_name",
    "within",
]

_MAX_SHOWN = 200  # characters of an argument value quoted in a reason
_SCHEME_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}
_URL = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://([^/?#]*)(.*)", re.DOTALL)
_URL_UNSAFE = re.compile(r"[\x00-\x20\x7f\\]")
_PORT = re.compile(r"[0-9]{1,5}")
_INT = re.compile(r"-?[0-9]+")
_FLOAT = re.compile(r"-?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][+-]?[0-9]+)?")
_O_PATH: int | None = getattr(os, "O_PATH", None) if sys.platform == "linux" else None


class Reject(Exception):
    """A value fails a constraint; the message completes "argument 'x' ..."."""


class Check:
    """One compiled constraint; `check` returns None or raises `Reject`."""

    __slots__ = ()

    def check(self, value: object) -> None:
        raise NotImplementedError


class _PathCheck(Check):
    __slots__ = ("cwd", "folded", "home", "inside", "roots")

    def __init__(self, roots: tuple[str, ...], inside: bool, cwd: str | None, home: str | None) -> None:
        self.roots = roots
        self.folded = tuple(r.casefold() for r in roots)
        self.inside = inside
        self.cwd = cwd
        self.home = home

    def check(self, value: object) -> None:
        resolved = _resolve(value, self.cwd, self.home)
        if self.inside:
            if not any(within(resolved, root) for root in self.roots):
                raise Reject(f"{_show_path(value, resolved)} is not under {' or '.join(self.roots)}")
            return
        # Compared case-insensitively as well: on a case-insensitive file system (macOS, Windows)
        # '/ETC/passwd' is '/etc/passwd'. On Linux this only ever denies more.
        folded = resolved.casefold()
        for root, root_folded in zip(self.roots, self.folded, strict=True):
            if within(resolved, root) or within(folded, root_folded):
                raise Reject(f"{_show_path(value, resolved)} is under {root}, which this rule excludes")


class _HostsCheck(Check):
    __slots__ = ("rules", "shown")

    def __init__(self, rules: tuple[HostRule, ...]) -> None:
        self.rules = rules
        self.shown = ", ".join(rule.text for rule in rules)

    def check(self, value: object) -> None:
        host, port = _url_host_port(value)
        if host_allowed(self.rules, host, port) is None:  # normalises the host first
            try:
                host = normalize_host(host)
            except ValueError as exc:
                raise Reject(f"{show(value)} has a host that is not valid ({exc})") from None
            raise Reject(f"{show(value)} goes to {host} port {port}, which is not an allowed host ({self.shown})")


class _OneOfCheck(Check):
    __slots__ = ("bools", "numbers", "shown", "texts")

    def __init__(self, values: tuple[str, ...]) -> None:
        self.texts = frozenset(values)
        self.bools = frozenset(v == "true" for v in values if v in ("true", "false"))
        numbers: set[int | float] = set()
        for v in values:
            if _INT.fullmatch(v):
                numbers.add(int(v))
            elif _FLOAT.fullmatch(v) and math.isfinite(float(v)):
                numbers.add(float(v))
        self.numbers = frozenset(numbers)
        self.shown = ", ".join(repr(v) for v in values)

    def check(self, value: object) -> None:
        if isinstance(value, bool):  # before int: True == 1 must not pass a "1"
            ok = value in self.bools
        elif isinstance(value, int | float):
            ok = (not isinstance(value, float) or math.isfinite(value)) and value in self.numbers
        elif isinstance(value, str):
            ok = value in self.texts
        else:
            raise Reject(f"is not text, a number or a boolean (got {type_name(value)})")
        if not ok:
            raise Reject(f"{show(value)} is not one of {self.shown}")


class _MatchesCheck(Check):
    __slots__ = ("patterns", "shown")

    def __init__(self, patterns: tuple[re.Pattern[str], ...]) -> None:
        self.patterns = patterns
        self.shown = ", ".join(repr(p.pattern) for p in patterns)

    def check(self, value: object) -> None:
        if not isinstance(value, str):
            raise Reject(f"is not text (got {type_name(value)})")
        if not any(p.fullmatch(value) for p in self.patterns):
            raise Reject(f"{show(value)} does not fully match {self.shown}")


def compile_constraint(constraint: Constraint, cwd: str | None, home: str | None) -> Check:
    """The check of `constraint`, with path roots resolved against `cwd` and `home`.

    Raises:
        ValueError: a root that cannot be resolved, a host rule or a regular expression that is not valid.
    """
    kind = constraint.kind
    if kind in (ConstraintKind.UNDER, ConstraintKind.NOT_UNDER):
        roots: list[str] = []
        for value in constraint.values:
            try:
                roots.append(_resolve(value, cwd, home))
            except Reject as exc:
                raise ValueError(f"{kind.value}: root {exc}") from None
        return _PathCheck(tuple(dict.fromkeys(roots)), kind is ConstraintKind.UNDER, cwd, home)
    if kind is ConstraintKind.HOSTS:
        return _HostsCheck(host_rules(constraint.values))
    if kind is ConstraintKind.ONE_OF:
        return _OneOfCheck(constraint.values)
    return _MatchesCheck(regexes(constraint.values))


def host_rules(values: Iterable[str]) -> tuple[HostRule, ...]:
    """The host rules of a `hosts` constraint. Raises ValueError naming a rule `hosts.parse_rule` refuses."""
    rules: list[HostRule] = []
    for value in values:
        try:
            rules.append(parse_rule(value))
        except ValueError as exc:
            raise ValueError(f"hosts: {exc}") from exc
    return tuple(rules)


def regexes(values: Iterable[str]) -> tuple[re.Pattern[str], ...]:
    """The patterns of a `matches` constraint. Raises ValueError naming one that does not compile."""
    compiled: list[re.Pattern[str]] = []
    for value in values:
        try:
            compiled.append(re.compile(value))
        except re.error as exc:
            raise ValueError(f"matches: {value!r} is not a valid regular expression ({exc})") from exc
    return tuple(compiled)


def expand_home(path: str, home: str | None) -> str | None:
    """`path` with a leading `~` replaced by `home`; None when it needs a home that is not known."""
    if path == "~" or path.startswith("~/"):
        return None if home is None else home + path[1:]
    return path


def _resolve(value: object, cwd: str | None, home: str | None) -> str:
    """The real absolute path `value` names: `~`, relative, `..` and symlinks resolved."""
    if not isinstance(value, str):
        raise Reject(f"is not a path (got {type_name(value)})")
    if not value:
        raise Reject("is an empty path")
    if "\x00" in value:
        raise Reject(f"{show(value)} contains a NUL character")
    if value.startswith("~") and not (value == "~" or value.startswith("~/")):
        raise Reject(f"{show(value)} names another user's home ('~user'); write the full path")
    path = expand_home(value, home)
    if path is None:
        raise Reject(f"{show(value)} starts with '~' but no home directory is known")
    if not os.path.isabs(path):
        if cwd is None:
            raise Reject(f"{show(value)} is a relative path and the server has no working directory")
        path = os.path.join(cwd, path)
    try:
        return _with_twins(realpath(path))
    except (OSError, ValueError) as exc:
        raise Reject(f"{show(value)} cannot be resolved ({exc})") from None


def realpath(path: str) -> str:
    """`os.path.realpath(path)`, asked of the kernel where it answers in one step: on Linux, for a
    path that exists, the name /proc gives the descriptor that opening it (O_PATH: no access, no
    side effects, any file type) yields. Elsewhere, and for a path that does not exist, Python's
    own walk; both resolve `..` and every symlink the same way."""
    if _O_PATH is None:
        return os.path.realpath(path)
    try:
        fd = os.open(path, _O_PATH | os.O_CLOEXEC)
    except OSError:
        return os.path.realpath(path)
    try:
        real = os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # no /proc
        real = ""
    finally:
        os.close(fd)
    # a file removed meanwhile reads back with a suffix; an odd answer falls back to the walk
    return real if real.startswith("/") and not real.endswith(" (deleted)") else os.path.realpath(path)


def _with_twins(real: str) -> str:
    """`real`, with each missing part replaced by an existing name that is the same in Unicode NFC.

    Some servers (server-filesystem among them) look a missing name up again by Unicode
    equivalence, so `café` (composed) reaches a symlink named `cafe\u0301` (decomposed). The
    policy must resolve the path the way such a server will, or the symlink leads out unchecked.
    """
    if real.isascii() or os.path.lexists(real):
        return real
    current = os.sep
    parts = [p for p in real.split(os.sep) if p]
    for index, part in enumerate(parts):
        candidate = os.path.join(current, part)
        if not os.path.lexists(candidate):
            twin = _twin(current, part)
            if twin is None:
                return os.path.join(current, *parts[index:])
            candidate = os.path.join(current, twin)
        current = os.path.realpath(candidate)
    return current


def _twin(directory: str, name: str) -> str | None:
    wanted = unicodedata.normalize("NFC", name)
    try:
        entries = os.listdir(directory)
    except OSError:
        return None
    return next((e for e in sorted(entries) if unicodedata.normalize("NFC", e) == wanted), None)


def within(path: str, root: str) -> bool:
    """Whether `path` is `root` or under it, as written (resolve both first where links matter)."""
    return path == root or path.startswith(root.rstrip(os.sep) + os.sep)


def _url_host_port(value: object) -> tuple[str, int]:
    """The host (not yet normalised) and the port (explicit or the scheme's) of an http(s)/ws(s) URL.

    Only syntax that WHATWG and RFC 3986 parsers read the same way is accepted.
    """
    if not isinstance(value, str):
        raise Reject(f"is not a URL (got {type_name(value)})")
    shown = show(value)
    if _URL_UNSAFE.search(value):
        # WHATWG reads '\' as '/' and drops tabs and newlines; Python's urlsplit does neither.
        raise Reject(f"{shown} contains whitespace, a control character or a backslash")
    match = _URL.fullmatch(value)
    if match is None:
        raise Reject(f"{shown} is not an absolute URL (scheme://host/...)")
    scheme, authority = match[1].lower(), match[2]
    if scheme not in _SCHEME_PORTS:
        raise Reject(f"{shown} has scheme {scheme!r}; only http, https, ws and wss URLs can be checked")
    if authority.count("@") > 1:
        # 'https://a@evil@good': parsers disagree on which '@' ends the userinfo
        raise Reject(f"{shown} has more than one '@' before the host")
    hostport = authority.rpartition("@")[2]
    if hostport.startswith("["):
        close = hostport.find("]")
        if close < 0:
            raise Reject(f"{shown} has an unclosed '[' in its host")
        host, rest = hostport[: close + 1], hostport[close + 1 :]
        if rest and not rest.startswith(":"):
            raise Reject(f"{shown} has text after ']' in its host")
        has_port, port_text = bool(rest), rest[1:]
    else:
        if hostport.count(":") > 1:
            raise Reject(f"{shown} has more than one ':' in its host")
        host, sep, port_text = hostport.partition(":")
        has_port = bool(sep)
    if not host:
        raise Reject(f"{shown} has no host")
    port = _SCHEME_PORTS[scheme]
    if has_port:
        if not _PORT.fullmatch(port_text) or not 1 <= int(port_text) <= 65535:
            raise Reject(f"{shown} has port {port_text!r}, not a number from 1 to 65535")
        port = int(port_text)
    return host, port


def _show_path(value: object, resolved: str) -> str:
    shown = show(value)
    return shown if resolved == value else f"{shown} (resolved to {show(resolved)})"


def show(value: object) -> str:
    """`value` as a reason quotes it, cut to a readable length."""
    text = value if isinstance(value, str) else repr(value)
    if len(text) > _MAX_SHOWN:
        text = text[:_MAX_SHOWN] + "…"
    return repr(text) if isinstance(value, str) else text


def type_name(value: object) -> str:
    """The JSON name of `value`'s type, for a reason ("null", "number", "array"...)."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "boolean"
    if isinstance(value, int | float):
        return "number"
    if isinstance(value, str):
        return "text"
    if isinstance(value, list | tuple):
        return "array"
    if isinstance(value, Mapping):
        return "object"
    return type(value).__name__
