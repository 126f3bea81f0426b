"""The secrets in a client entry's arguments, moved to the keyring and named in their place (`wrap`).

Found: a value after an option that names a secret (`--api-key V`, `--token=V`, `-e TOKEN=V`),
a value shaped like a token wherever it stands, a URL's password or a secret query parameter
(`https://u:PASS@host`, `?api_key=V`), a token after `Bearer `. Each becomes a `secrets:` name
and its argument reads `${secrets.NAME}` (config/secretrefs.py), which the launcher fills with
the value when the server starts. A short option (`-k V`) is judged by the value's shape alone:
its letter says nothing of what it takes.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterator
from urllib.parse import unquote_plus, urlsplit

from cellblock.gateway.audit.secretnames import name_words
from cellblock.gateway.config.draft import Draft
from cellblock.gateway.config.secretlike import looks_secret, secret_name, secret_shape
from cellblock.gateway.config.secretrefs import launcher_sets, reference

__all__ = ["arg_secrets", "secrets_in"]

_ASSIGNMENT = re.compile(r"^-{0,2}[A-Za-z_][A-Za-z0-9_.-]*=(?!=)")  # --token=X, TOKEN=X (docker -e)
_BEARER = re.compile(r"\bBearer\s+([^\s\"',;]+)", re.IGNORECASE)
_SHORT = re.compile(r"-[A-Za-z0-9]")  # `-k`: a letter, no name
_URL = re.compile(r"[A-Za-z][A-Za-z0-9+.-]*://[^\s\"'<>]+")


def arg_secrets(draft: Draft, args: list[str], secrets: dict[str, str], env: Collection[str]) -> list[str]:
    """`args` with each secret in them replaced by `${secrets.NAME}`; `secrets` (NAME -> keyring
    entry, the server's env secrets so far) gains each NAME, none of `env`'s names. A value already
    under `secrets:` (the same key given as env and argument) is named by its variable."""
    named = {s.value: s.key for s in draft.secrets if s.key in secrets}
    out: list[str] = []
    for i, (arg, found, head) in enumerate(_each(args)):
        if not found:
            out.append(arg)
            continue
        for hint, raw in found:
            if raw not in named:
                variable = _variable(hint, {*env, *secrets})
                secrets[variable] = entry = draft.secret(variable, raw, "env")
                named[raw] = variable
                draft.notes.append(
                    f"args[{i}] held a secret: moved to keyring entry {entry!r} (secrets: {variable}); "
                    f"the argument reads {reference(variable)}, which the server gets as the value at start"
                )
            arg = arg.replace(raw, reference(named[raw])) if head is None else head + reference(named[raw])
        out.append(arg)
    return out


def secrets_in(args: list[str]) -> set[str]:
    """The secrets in `args` as `arg_secrets` finds them, for what must not be shown (a scan's report)."""
    return {raw for _, found, _ in _each(args) for _, raw in found}


def _each(args: list[str]) -> Iterator[tuple[str, list[tuple[str, str]], str | None]]:
    """Each argument with the secrets in it, as (what to name it after, value), and what stays of
    it before the reference: `NAME=` for an assignment, "" for a whole argument, None for secrets
    inside it (each replaced where it stands)."""
    option = ""
    for arg in args:
        name, eq, value = arg.partition("=") if _ASSIGNMENT.match(arg) else ("", "", arg)
        head: str | None
        if eq and (secret_shape(value) or (secret_name(name) and looks_secret(name, value))):
            found, head = [(name, value)], f"{name}="
        elif not arg.startswith("-") and (secret_shape(arg) or (secret_name(option) and looks_secret(option, arg))):
            found, head = [(option, arg)], ""
        else:
            found, head = _embedded(arg), None
        option = arg if arg.startswith("-") and not found else ""
        yield arg, found, head


def _embedded(arg: str) -> list[tuple[str, str]]:
    """(what to name it after, value) of each secret inside a longer argument: a token after
    `Bearer `, a URL's password, a URL's query parameter that holds one (never a `$reference`)."""
    found = [("bearer-token", m.group(1)) for m in _BEARER.finditer(arg)]
    for match in _URL.finditer(arg):
        try:
            parts = urlsplit(match.group(0))
            password = parts.password
        except ValueError:  # not a URL after all (a bad port, brackets)
            continue
        if password:
            found.append(("url-password", parts.netloc.rpartition("@")[0].partition(":")[2]))
        for pair in parts.query.split("&"):
            key, _, value = pair.partition("=")
            if value and looks_secret(unquote_plus(key), unquote_plus(value)):
                found.append((unquote_plus(key), value))
    return [(hint, value) for hint, value in found if value and not value.startswith("$")]


def _variable(hint: str, taken: Collection[str]) -> str:
    """An environment variable name for a secret found after option (or under key) `hint`:
    `--api-key` -> API_KEY; SECRET when the hint says nothing (`-k`, none); unused in `taken`
    and none the launcher sets itself."""
    words = name_words(hint)
    base = "_".join(words) if words and not _SHORT.fullmatch(hint) else "SECRET"
    base = f"ARG_{base}" if base[0].isdigit() else base
    variable, number = base, 2
    while variable in taken or launcher_sets(variable):
        variable, number = f"{base}_{number}", number + 1
    return variable
