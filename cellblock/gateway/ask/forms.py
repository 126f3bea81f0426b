"""What the human is shown in a form: Cellblock's own questions, and a server's, framed as its own.

Cellblock's forms (an approval, a held catalog) open with one line only Cellblock writes: what
asks and, for a call, a digest of its arguments. What a server supplied (a tool name, a
description, the call's arguments) comes after it and only as data: JSON literals with every
control, line break, bidi override and invisible character escaped (`visible`), names and values
cut to a bound, one line per argument. No text a server chooses can push the arguments out of
sight or restyle the first line.

A call whose arguments do not fit a form whole is first shown cut, with only "Show all
arguments" and "Deny" to choose: nobody allows what they were not shown. The form after it shows
every argument uncut. Only values Cellblock knows are secrets (`Audit.secrets()`) are hidden, not
values under secret-looking keys: the approver sees what the model sent.

A downstream server's own question reaches the human under a fixed first line naming that server
and saying it is not a Cellblock approval; one that speaks in Cellblock's name, offers Cellblock's
approval choices (however it spells them: `policy/lookalikes.py`, the one check for names, titles
and questions), or asks to open a URL a browser cannot safely open is refused (`refusal`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Sequence
from typing import Any
from urllib.parse import urlsplit

import mcp.types as types

from cellblock.gateway.scrub import pattern_of, scrub
from cellblock.policy.hosts import is_loopback
from cellblock.policy.lookalikes import OWN_NAME, skeleton
from cellblock.policy.text import visible

__all__ = [
    "APPROVAL_HEADER",
    "APPROVE_READ_ONLY",
    "CHOICES",
    "LABELS",
    "SHARE_CHOICES",
    "SHOW_FULL",
    "approval_form",
    "args_digest",
    "argument_lines",
    "choice_schema",
    "framed",
    "identity",
    "refusal",
    "review_form",
    "sampling_refusal",
    "share_answers",
    "share_asks",
    "share_form",
    "shown",
    "unsafe_url",
]

# The first words of every form Cellblock writes; no server's question may use them.
APPROVAL_HEADER = "Cellblock approval"
CHOICES = ("allow_once", "allow_session", "allow_always", "deny")
LABELS = ("Allow once", "Allow for this session", "Always allow", "Deny")
SHOW_FULL = "show_full"
REVIEW_CHOICES = ("approve", "keep_held")
REVIEW_LABELS = ("Approve the catalog", "Keep it held")
APPROVE_READ_ONLY = "approve_read_only"  # approve, and let the offered read-only tools run without asking
APPROVE_READ_ONLY_LABEL = "Approve, and run its read-only tools without asking"
# A share of a path with a server (`serve/shares.py`): words of their own, so that an answer to
# one question is never read as the answer to another (a call's approval, a share)
SHARE_CHOICES = ("share_once", "share_always", "deny")
SHARE_LABELS = ("Share until the server stops", "Always share (written to the config)", "Deny")

MAX_NAME = 80  # characters of a tool name on the first line; a longer one is cut and marked
MAX_VALUE = 160  # characters of one argument in a cut view
MAX_ARGS = 20  # arguments listed in a cut view
# A form holding more than this is shown cut first: clients render a form as one block of text,
# and a screenful is what a human reads before deciding.
FORM_BUDGET = 2000
MAX_REVIEW = 20000  # characters of a catalog diff in a form; the rest is for `cellblock diff`
MAX_QUESTION = 4000  # characters of a server's question
MAX_URL = 8192

# What a server's question may not offer, as it looks (`lookalikes.skeleton`): without case,
# spacing or punctuation, look-alike letters read as the ones they resemble.
_APPROVAL_WORDS = frozenset(
    skeleton(word)
    for word in (
        *(*CHOICES[:3], *LABELS[:3], SHOW_FULL, "Show all arguments", "keep_held", *REVIEW_LABELS),
        *(APPROVE_READ_ONLY, APPROVE_READ_ONLY_LABEL, *SHARE_CHOICES[:2], *SHARE_LABELS[:2]),
    )
)
_SCHEMA_DEPTH = 8  # a flat elicitation schema is two deep; deeper is read no further


def args_digest(arguments: dict[str, Any] | None) -> str:
    """The sha256 of the arguments' canonical JSON: shown in forms, bound into sealed states."""
    canonical = json.dumps(arguments or {}, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode()).hexdigest()


def choice_schema(choices: tuple[str, ...], labels: tuple[str, ...]) -> dict[str, Any]:
    """A flat form with one required choice, the only shape every eliciting client renders."""
    return {
        "type": "object",
        "properties": {
            "decision": {"type": "string", "title": "Decision", "enum": list(choices), "enumNames": list(labels)}
        },
        "required": ["decision"],
    }


# -- showing data ------------------------------------------------------------------------------


def _clip(text: str, limit: int | None) -> tuple[str, bool]:
    extra = len(text) - limit if limit is not None else 0
    return (text, False) if extra <= 0 or limit is None else (f"{text[:limit]}…(+{extra} chars)", True)


def shown(value: Any, secrets: Iterable[str] = (), limit: int | None = None) -> str:
    """`value` as a JSON literal a human reads as data: escaped, known secrets hidden, cut at `limit`."""
    clean, _ = scrub(value, pattern_of(tuple(secrets)))
    text = json.dumps(clean, ensure_ascii=False, separators=(", ", ": "), default=str)
    return _clip(visible(text), limit)[0]


def argument_lines(
    arguments: dict[str, Any] | None, secrets: Iterable[str] = (), limit: int | None = None
) -> tuple[list[str], int]:
    """One `"key": value` line per argument, and how many were cut (`limit` None: nothing is).

    With a `limit`, each line is cut at it and at most MAX_ARGS are listed; the rest count as cut.
    """
    secrets = tuple(secrets)
    items = list((arguments or {}).items())
    listed = items if limit is None else items[:MAX_ARGS]
    lines, cut = [], 0
    for key, value in listed:
        line = f"{shown(str(key), secrets)}: {shown(value, secrets)}"
        line, was_cut = _clip(line, limit)
        lines.append(line)
        cut += was_cut
    if len(listed) < len(items):
        lines.append(f"…(+{len(items) - len(listed)} more arguments)")
        cut += len(items) - len(listed)
    return lines, cut


# what the human is asked, by what a rule decides: a tool call, a prompt get, a resource read
_QUESTIONS = {
    "tool": "May this call run?",
    "prompt": "May the client get this prompt from the server?",
    "resource": "May the client read this resource from the server?",
    "egress": "May the server connect to this host and port (its network is ask)?",
}


def identity(server: str, tool: str, arguments: dict[str, Any] | None, kind: str = "tool") -> str:
    """The first line of a call's form: server, a digest of the arguments, and the tool (or the
    prompt, or the resource: `tool` is then "prompt:NAME" or "resource:URI"), bounded."""
    name = tool if kind == "tool" else tool.removeprefix(f"{kind}:")
    # the name comes last: whatever a forged name holds stays inside its quotes, after the digest
    return (
        f"{APPROVAL_HEADER} · server '{visible(server)}' · arguments sha256:{args_digest(arguments)[:12]}"
        f" · {kind} {shown(name, limit=MAX_NAME)}"
    )


# -- Cellblock's forms -------------------------------------------------------------------------


def approval_form(
    server: str,
    tool: str,
    rule: str,
    arguments: dict[str, Any] | None,
    *,
    secrets: Iterable[str] = (),
    full: bool = False,
    kind: str = "tool",
) -> tuple[str, dict[str, Any]]:
    """The question and the flat form schema for one call (`full`: every argument uncut); `kind`
    "prompt" or "resource" asks about a prompt get or a resource read instead (see `identity`).

    A call whose arguments do not fit FORM_BUDGET is shown cut, with the choices SHOW_FULL and
    deny only; the caller asks again with `full` when the human picks SHOW_FULL.
    """
    secrets = tuple(secrets)
    lines, cut = argument_lines(arguments, secrets)
    if not full and (len(lines) > MAX_ARGS or sum(len(line) + 3 for line in lines) > FORM_BUDGET):
        lines, cut = argument_lines(arguments, secrets, MAX_VALUE)
    head = [
        identity(server, tool, arguments, kind),
        f"{_QUESTIONS[kind]} Policy rule {shown(rule)} says ask. The arguments follow as data (escaped JSON):",
    ]
    if cut:
        head.append(f"{cut} of them are cut here. Choose 'Show all arguments' to read every one in full first.")
    body = [f"  {line}" for line in lines] or ["  (no arguments)"]
    if cut:
        return "\n".join([*head, *body]), choice_schema((SHOW_FULL, "deny"), ("Show all arguments", "Deny"))
    return "\n".join([*head, *body]), choice_schema(CHOICES, LABELS)


def share_form(server: str, share: str, tool: str) -> tuple[str, dict[str, Any]]:
    """The question whether to share a path with a server for a call of `tool`: `share` is
    "read_write:PATH" or "read_only:PATH" (`serve/shares.py`)."""
    mode, _, path = share.partition(":")
    how = "read-write" if mode == "read_write" else "read-only"
    message = "\n".join(
        [
            f"{APPROVAL_HEADER} · server '{visible(server)}' · share {how} {shown(path)}",
            f"A call of its tool {shown(tool, limit=MAX_NAME)} names this path, which its jail does not share: "
            "without it, what the tool writes there would land in the server's private home, not here.",
            "Share it until the server stops, always (written to the config), or deny the call.",
        ]
    )
    return message, choice_schema(SHARE_CHOICES, SHARE_LABELS)


def share_asks(server: str, share: str, tool: str) -> str:
    """How a pending share is named wherever it waits (the desktop, the client, `cellblock pending`),
    never as the call's own approval: "server 'notes' asks to share /home/u/x read-write for tool 'notes__save'"."""
    mode, _, path = share.partition(":")
    how = "read-write" if mode == "read_write" else "read-only"
    return f"server {visible(server)!r} asks to share {visible(path)} {how} for tool {visible(tool)!r}"


def share_answers(ident: str) -> str:
    """What the answers to pending share `ident` do."""
    return (
        f"cellblock approve {ident} shares it until the server stops, --always for good, cellblock deny {ident} refuses"
    )


def review_form(
    server: str, diff: str, first: bool = False, read_only: Sequence[str] = (), unasked: Sequence[str] = ()
) -> tuple[str, dict[str, Any]]:
    """The question for a held catalog (`first`: one never approved): the per-item change, and
    approve or keep it held. A diff too long for a form can only be kept held here.

    `read_only`: the tools the server marks read-only that may be let run without asking (a third
    choice); `unasked`: those that keep running without asking after an approval."""
    what = "is new: it offers what follows. Approve it to use it." if first else "changed since you approved it."
    head = f"{APPROVAL_HEADER} · the catalog of server '{visible(server)}' {what}"
    if unasked:
        head += f"\nRuns without asking once approved: {', '.join(visible(n) for n in unasked)}. Every other tool asks."
    if read_only:
        head += (
            f"\nMarked read-only and closed-world by the server: {', '.join(visible(n) for n in read_only)}. "
            "Choose whether they may run without asking; every other tool asks."
        )
    # `describe` escapes what servers wrote; escaping again keeps any line of it from breaking out
    lines = [visible(line) for line in diff.split("\n")]
    kept, size = [], 0
    for line in lines:
        size += len(line) + 1
        if size > MAX_REVIEW:
            break
        kept.append(line)
    if len(kept) == len(lines):
        if read_only:
            choices = (REVIEW_CHOICES[0], APPROVE_READ_ONLY, REVIEW_CHOICES[1])
            labels = (REVIEW_LABELS[0], APPROVE_READ_ONLY_LABEL, REVIEW_LABELS[1])
            return "\n".join([head, "", *kept]), choice_schema(choices, labels)
        return "\n".join([head, "", *kept]), choice_schema(REVIEW_CHOICES, REVIEW_LABELS)
    rest = (
        f"…(+{len(lines) - len(kept)} more lines). Too long to approve here: read it all with "
        f"'cellblock diff {server}', then accept with 'cellblock approve {server}'."
    )
    return "\n".join([head, rest, "", *kept, rest]), choice_schema(("keep_held",), ("Keep it held",))


# -- a server's own question -------------------------------------------------------------------


def _strings(value: Any, depth: int = 0) -> list[str]:
    """Every string in a schema, keys included (titles, enum values, descriptions)."""
    if isinstance(value, str):
        return [value]
    if depth > _SCHEMA_DEPTH:
        return []
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in (*_strings(k, depth + 1), *_strings(v, depth + 1))]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v, depth + 1)]
    return []


def _without(value: Any, keys: tuple[str, ...]) -> Any:
    """`value` (JSON) without the entries under `keys`, at any depth."""
    if isinstance(value, dict):
        return {k: _without(v, keys) for k, v in value.items() if k not in keys}
    if isinstance(value, list):
        return [_without(v, keys) for v in value]
    return value


def _host(url: str) -> str:
    """The host of `url` as a browser shows it after IDNA (a look-alike name shows as xn--)."""
    try:
        return (urlsplit(url).hostname or "").encode("idna").decode("ascii")
    except (ValueError, UnicodeError):
        return shown(url, limit=MAX_NAME)


def unsafe_url(url: str) -> str | None:
    """Why a browser should not be sent to `url`, or None: only `https:`, or `http:` to loopback,
    with a host and no credentials."""
    if len(url) > MAX_URL:
        return f"is longer than {MAX_URL} characters"
    if not url.isprintable() or any(ch.isspace() or ch == "\\" for ch in url):
        return "holds spaces, backslashes, control or invisible characters"
    try:
        parts = urlsplit(url)
        host, _ = parts.hostname, parts.port
    except ValueError:
        return "is malformed"
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http"):
        return f"has the scheme {shown(scheme, limit=20)} (only https:, or http: to this machine)"
    if "@" in parts.netloc:
        return "carries credentials"
    if not host:
        return "has no host"
    try:
        host.encode("idna")
    except UnicodeError:
        return "has a host name that is not valid"
    if scheme == "http" and not is_loopback(host):
        return "is http: to a host that is not this machine (only https:, or http: to loopback)"
    return None


def refusal(params: types.ElicitRequestParams) -> str | None:
    """Why a downstream server's question may not reach the human, or None."""
    if isinstance(params, types.ElicitRequestURLParams):
        why = unsafe_url(params.url)
        if why is not None:
            return f"the URL it asks the user to open {why}"
    schema = params.requested_schema if isinstance(params, types.ElicitRequestFormParams) else None
    texts = [skeleton(text) for text in (params.message, *_strings(schema))]
    if any(OWN_NAME in text for text in texts):
        return "it speaks in Cellblock's name (only Cellblock's own approvals may)"
    if any(text in _APPROVAL_WORDS for text in texts):
        return "it offers Cellblock's approval choices"
    return None


def sampling_refusal(params: types.CreateMessageRequestParams) -> str | None:
    """Why a server's request for the client's model may not be passed on, or None. The client
    receives it from the gateway and shows it (where it shows one) as the gateway's own request, so
    one whose system prompt or messages speak in Cellblock's name is refused, as a question is."""
    shown = params.model_dump(mode="json", include={"system_prompt", "messages"})
    # an image's, a sound's or a blob's base64 is shown as no text: not folded (8 MB of it took 0.4 s)
    texts = _strings(_without(shown, ("data", "blob")))
    if any(OWN_NAME in skeleton(text) for text in texts):
        return "it speaks in Cellblock's name (only Cellblock's own requests may)"
    return None


def framed(server: str, params: types.ElicitRequestParams) -> types.ElicitRequestParams:
    """The same request under a first line naming `server` as the one asking; its text escaped,
    blank lines and leading space dropped, cut at MAX_QUESTION."""
    head = f"Question from server '{visible(server)}' (not a Cellblock approval)"
    if isinstance(params, types.ElicitRequestURLParams):
        head += f"; it asks you to open a page on {_host(params.url)}"
    lines = [visible(line.strip()) for line in params.message.replace("\r\n", "\n").split("\n")]
    body, _ = _clip("\n".join(line for line in lines if line), MAX_QUESTION)
    return params.model_copy(update={"message": f"{head}:\n{body}"})
