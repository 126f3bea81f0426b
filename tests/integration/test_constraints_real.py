"""Argument constraints (docs/policy.md) in front of real third-party servers, with hostile arguments.

One gateway runs four real servers:

- `files`: npm server-filesystem, told it may use the whole tmp folder, with a jail that shares
  that folder too (read-only; `allowed/` read-write). Its policy allows four tools and only under
  `allowed/`. Neither the server's own checks nor the jail would stop the hostile paths below, so
  every refusal is the policy's doing.
- `rel`: `files` again, started with `cwd: allowed/` (relative paths resolve there for the policy).
- `open`: the same server and jail with every tool allowed: the control that shows the hostile
  paths would have worked without the policy.
- `fetch`: PyPI mcp-server-fetch in a `network: allowlist` jail, with a `hosts:` rule naming one
  local HTTP server.

For each refusal: the client gets a tool error, nothing is read, written or fetched, the server
never saw the call (no `call_end`), and the audit log has `event: call, decision: deny` with the
rule's name and why. Tests named `test_gap_*` pin current behaviour that is wrong (see their
docstrings): the policy's idea of a path differs from server-filesystem's.
"""

from __future__ import annotations

import json
import threading
from collections.abc import AsyncIterator, Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import mcp.types as types
import pytest

from tests import peers
from tests.integration.conftest import gateway, write_config

pytestmark = [pytest.mark.anyio, pytest.mark.peers]

NFD, NFC = "cafe\u0301", "caf\u00e9"  # the same name, decomposed and composed
SECRET = "the secret beside the allowed folder"
EVIL = "the evil twin of the allowed folder"
BODY = b"hello from the allowed page"
HITS: list[tuple[int, str]] = []  # (port, path) of every request either local site saw
REDIRECT: dict[str, str] = {}  # path on the allowed site -> where it redirects


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        HITS.append((self.server.server_address[1], self.path))
        if self.path in REDIRECT:
            self.send_response(302)
            self.send_header("Location", REDIRECT[self.path])
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@pytest.fixture(scope="module")
def sites() -> Iterator[tuple[int, int]]:
    """Two local sites: the allowed port and another one, which must never be reached."""
    servers = [ThreadingHTTPServer(("127.0.0.1", 0), Handler) for _ in range(2)]
    for httpd in servers:
        threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield servers[0].server_address[1], servers[1].server_address[1]
    for httpd in servers:
        httpd.shutdown()
        httpd.server_close()


class Setup:
    def __init__(self, tmp: Path, port: int, other: int) -> None:
        self.tmp = tmp
        self.allowed = tmp / "allowed"
        self.evil = tmp / "allowed-evil"
        self.state = tmp / "state"
        self.port = port
        self.other = other


@pytest.fixture(scope="module")
def setup(tmp_path_factory: pytest.TempPathFactory, sites: tuple[int, int]) -> Setup:
    tmp = tmp_path_factory.mktemp("constraints")
    s = Setup(tmp, *sites)
    s.allowed.mkdir()
    s.evil.mkdir()
    (s.allowed / "hello.txt").write_text("hello inside\n")
    (s.allowed / "second.txt").write_text("second inside\n")
    (tmp / "secret.txt").write_text(SECRET)
    (s.evil / "x").write_text(EVIL)
    (s.allowed / "link.txt").symlink_to(tmp / "secret.txt")  # inside allowed/, pointing out
    # a directory symlink inside allowed/, pointing out, whose name is in NFD (as macOS writes names)
    (s.allowed / NFD).symlink_to(tmp)

    node_modules = str(peers.NODE_MODULES)
    # the server may use all of tmp, and the jail shows all of tmp: only the policy is narrower
    jail = {"read_only": [node_modules, str(tmp)], "read_write": [str(s.allowed)]}
    under = {"under": [str(s.allowed)]}
    rules = {
        "read_text_file": {"decision": "allow", "args": {"path": under}},
        "read_multiple_files": {"decision": "allow", "args": {"paths": under}},
        "write_file": {"decision": "allow", "args": {"path": under}},
        "list_directory": {"decision": "allow", "args": {"path": under}},
    }
    fs = peers.filesystem(tmp)
    fetch = peers.fetch_server("--ignore-robots-txt", "--allow-private-ips")
    hosts = [f"127.0.0.1:{s.port}"]
    write_config(
        tmp,
        {
            "files": {
                "command": fs[0],
                "args": fs[1:],
                "jail": jail,
                "tools": {"default": "deny", "rules": rules},
            },
            # the same policy, for a server started in allowed/: relative paths now resolve there
            "rel": {
                "command": fs[0],
                "args": fs[1:],
                "jail": jail,
                "cwd": str(s.allowed),
                "tools": {"default": "deny", "rules": rules},
            },
            "open": {"command": fs[0], "args": fs[1:], "jail": jail, "tools": {"default": "allow"}},
            "fetch": {
                "command": fetch[0],
                "args": fetch[1:],
                "jail": {"network": "allowlist", "allow_hosts": hosts},
                "tools": {
                    "default": "deny",
                    "rules": {"fetch": {"decision": "allow", "args": {"url": {"hosts": hosts}}}},
                },
            },
        },
    )
    return s


@pytest.fixture(scope="module")
async def client(setup: Setup) -> AsyncIterator[Any]:
    async with gateway(setup.tmp / "cellblock.yaml", setup.state) as c:
        yield c


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def events(setup: Setup) -> list[dict[str, Any]]:
    return [json.loads(line) for line in (setup.state / "audit.jsonl").read_text().splitlines()]


async def refused(client: Any, setup: Setup, server: str, tool: str, arguments: dict[str, Any]) -> tuple[str, str]:
    """Call `server__tool`; assert the policy refused it, recorded the refusal, and never forwarded it.

    Returns the text the client got and the recorded reason.
    """
    before = len(events(setup))
    result = await client.call_tool(f"{server}__{tool}", arguments)
    got = text(result)
    assert result.is_error, got
    assert got.startswith(f"denied by policy: {tool}: "), got
    new = events(setup)[before:]
    calls = [e for e in new if e["event"] == "call"]
    assert len(calls) == 1, new
    assert calls[0]["server"] == server and calls[0]["tool"] == tool
    assert calls[0]["decision"] == "deny" and calls[0]["rule"] == tool
    assert calls[0]["arguments"] == arguments
    # an allowed call ends with `call_end` when the server answers; a refused one never got there
    assert not [e for e in new if e["event"] in ("call_end", "egress")], new
    return got, calls[0]["reason"]


# -- filesystem ------------------------------------------------------------------------------


async def test_the_filesystem_controls_get_through(client: Any, setup: Setup) -> None:
    """Reading, listing and writing inside allowed/ work, so the refusals below are the policy's."""
    before = len(events(setup))
    read = await client.call_tool("files__read_text_file", {"path": str(setup.allowed / "hello.txt")})
    assert not read.is_error and "hello inside" in text(read)
    both = await client.call_tool(
        "files__read_multiple_files", {"paths": [str(setup.allowed / "hello.txt"), str(setup.allowed / "second.txt")]}
    )
    assert not both.is_error and "hello inside" in text(both) and "second inside" in text(both)
    listing = await client.call_tool("files__list_directory", {"path": str(setup.allowed)})
    assert "hello.txt" in text(listing)
    wrote = await client.call_tool("files__write_file", {"path": str(setup.allowed / "new.txt"), "content": "hi"})
    assert not wrote.is_error, text(wrote)
    assert (setup.allowed / "new.txt").read_text() == "hi"
    allowed = [e for e in events(setup)[before:] if e["event"] == "call"]
    assert [(e["tool"], e["decision"], e["rule"]) for e in allowed] == [
        ("read_text_file", "allow", "read_text_file"),
        ("read_multiple_files", "allow", "read_multiple_files"),
        ("list_directory", "allow", "list_directory"),
        ("write_file", "allow", "write_file"),
    ]


async def test_without_the_policy_the_hostile_paths_would_work(client: Any, setup: Setup) -> None:
    """The same server and jail with everything allowed: neither stops these, so only the policy does."""
    for path in (setup.allowed / ".." / "secret.txt", setup.allowed / "link.txt", setup.tmp / "secret.txt"):
        got = await client.call_tool("open__read_text_file", {"path": str(path)})
        assert SECRET in text(got), (path, text(got))
    got = await client.call_tool("open__read_text_file", {"path": str(setup.evil / "x")})
    assert EVIL in text(got)


def hostile_reads(s: Setup) -> list[tuple[str, str]]:
    return [
        (f"{s.allowed}/../secret.txt", "is not under"),  # `..` traversal
        (str(s.allowed / "link.txt"), "is not under"),  # a symlink inside allowed/ pointing out
        ("~/secret.txt", "is not under"),  # the gateway user's home
        ("~root/.bashrc", "another user's home"),
        ("allowed/hello.txt", "relative path and the server has no working directory"),
        ("secret.txt", "relative path and the server has no working directory"),
        (str(s.tmp / "secret.txt"), "is not under"),  # absolute, outside
        ("/etc/passwd", "is not under"),
        (str(s.evil / "x"), "is not under"),  # `<allowed>-evil/x`: a string prefix, not a child
        (f"{s.allowed}/./../allowed-evil/x", "is not under"),
    ]


async def test_hostile_paths_are_refused_before_the_server(client: Any, setup: Setup) -> None:
    for path, why in hostile_reads(setup):
        got, reason = await refused(client, setup, "files", "read_text_file", {"path": path})
        assert why in reason, (path, reason)
        assert SECRET not in got and EVIL not in got and "root:" not in got
    # the resolved target is named, so a reader of the log sees where the symlink led
    _, reason = await refused(client, setup, "files", "read_text_file", {"path": str(setup.allowed / "link.txt")})
    assert f"resolved to '{setup.tmp / 'secret.txt'}'" in reason


async def test_one_bad_path_refuses_the_whole_read_multiple_files(client: Any, setup: Setup) -> None:
    good = [str(setup.allowed / "hello.txt"), str(setup.allowed / "second.txt")]
    for bad, _ in hostile_reads(setup):
        for paths in ([*good, bad], [bad, *good]):
            got, reason = await refused(client, setup, "files", "read_multiple_files", {"paths": paths})
            assert "hello inside" not in got and "second inside" not in got and SECRET not in got
            assert f"argument 'paths[{paths.index(bad)}]'" in reason, reason
    # fail closed: nothing to check is not a pass
    for arguments in ({"paths": []}, {"paths": None}, {}, {"paths": [str(setup.allowed / "hello.txt"), 7]}):
        await refused(client, setup, "files", "read_multiple_files", arguments)


async def test_hostile_writes_and_listings_are_refused(client: Any, setup: Setup) -> None:
    planted = setup.tmp / "planted.txt"
    for path in (f"{setup.allowed}/../planted.txt", str(planted), str(setup.evil / "planted.txt"), "planted.txt"):
        await refused(client, setup, "files", "write_file", {"path": path, "content": "pwned"})
    # through the symlink inside allowed/: the target outside must keep its content
    await refused(client, setup, "files", "write_file", {"path": str(setup.allowed / "link.txt"), "content": "pwned"})
    assert not planted.exists() and not (setup.evil / "planted.txt").exists()
    assert (setup.tmp / "secret.txt").read_text() == SECRET
    for path in (f"{setup.allowed}/..", str(setup.evil), "/", "~"):
        got, _ = await refused(client, setup, "files", "list_directory", {"path": path})
        assert "secret.txt" not in got.replace(str(setup.tmp / "secret.txt"), "")


async def test_tools_without_a_rule_are_hidden_and_refused(client: Any, setup: Setup) -> None:
    names = {t.name for t in (await client.list_tools()).tools}
    files = {n.removeprefix("files__") for n in names if n.startswith("files__")}
    assert files == {"read_text_file", "read_multiple_files", "write_file", "list_directory"}
    assert {"open__move_file", "open__edit_file"} <= names  # the control: the server does offer them
    target = setup.tmp / "moved.txt"
    source = str(setup.allowed / "hello.txt")
    for tool, arguments in (
        ("move_file", {"source": source, "destination": str(target)}),
        ("edit_file", {"path": source, "edits": [{"oldText": "hello", "newText": "pwned"}]}),
    ):
        before = len(events(setup))
        result = await client.call_tool(f"files__{tool}", arguments)
        assert result.is_error and text(result).startswith(f"denied by policy: default: tool '{tool}'")
        new = events(setup)[before:]
        assert [(e["event"], e["tool"], e["decision"], e["rule"]) for e in new] == [("call", tool, "deny", "default")]
        assert "default denies it" in new[0]["reason"]
    assert not target.exists() and (setup.allowed / "hello.txt").read_text() == "hello inside\n"


async def test_a_unicode_equivalent_name_cannot_lead_the_server_through_a_symlink(client: Any, setup: Setup) -> None:
    """`allowed/café` (NFC) does not exist, but server-filesystem looks a missing name up again by
    Unicode equivalence and would follow `allowed/cafe\u0301` (NFD), a symlink to tmp. The policy
    resolves missing names the same way, so both spellings are refused."""
    for name in (NFC, NFD):
        await refused(client, setup, "files", "read_text_file", {"path": f"{setup.allowed}/{name}/secret.txt"})


async def test_a_relative_path_with_cwd_set_means_what_the_server_makes_of_it(client: Any, setup: Setup) -> None:
    """Known limit, documented in docs/policy.md: with `cwd: allowed/` the policy reads `secret.txt`
    as allowed/secret.txt, but server-filesystem resolves it against its own first root — its
    command-line directory, or, once it has asked the gateway for roots, the first directory the
    jail shares (the order of those two events is a race) — so it opens another file than the one
    the policy judged. Setting `cwd` is only safe for servers that resolve relative paths against
    their working directory; without `cwd` (the default) relative paths are refused. Either way the
    server stays inside what its jail shares.
    """
    before = len(events(setup))
    result = await client.call_tool("rel__read_text_file", {"path": "secret.txt"})
    call = next(e for e in events(setup)[before:] if e["event"] == "call")
    assert (call["decision"], call["rule"]) == ("allow", "read_text_file")
    # not the file the policy judged: the secret beside allowed/, or a miss in another shared root
    assert SECRET in text(result) or ("ENOENT" in text(result) and f"{setup.allowed}/" not in text(result))
    # the control: relative paths that leave cwd are still refused
    _, reason = await refused(client, setup, "rel", "read_text_file", {"path": "../secret.txt"})
    assert "is not under" in reason


# -- fetch -----------------------------------------------------------------------------------


async def test_fetch_control_reaches_the_allowed_page(client: Any, setup: Setup) -> None:
    before = len(HITS)
    result = await client.call_tool("fetch__fetch", {"url": f"http://127.0.0.1:{setup.port}/ok", "raw": True})
    assert not result.is_error, text(result)
    assert BODY.decode() in text(result)
    assert HITS[before:] == [(setup.port, "/ok")]


def hostile_urls(s: Setup) -> list[tuple[str, str]]:
    p = s.port
    return [
        (f"http://user@evil.example@127.0.0.1:{p}/", "more than one '@'"),
        (f"http://127.0.0.1:{p}.evil.example/", "not a number"),
        ("http://evil.example/", "not an allowed host"),
        (f"http://127.0.0.1:{s.other}/", f"127.0.0.1 port {s.other}, which is not an allowed host"),
        ("file:///etc/passwd", "scheme 'file'"),
        (f"http://127.0.0.1:{p}\\@evil.example/", "backslash"),
        (f"http://evil.example@127.0.0.1:{p}@evil.example/", "more than one '@'"),
        (f"http://127.0.0.1:{p} @evil.example/", "whitespace"),
        (f"http://127.0.0.1:{p}\t/", "whitespace"),
        (f"http://0x7f.0.0.1:{p}/", "host that is not valid"),  # another spelling of 127.0.0.1
        (f"http://localhost:{p}/", "not an allowed host"),  # another name for the same place
        (f"//127.0.0.1:{p}/", "not an absolute URL"),
        (f"ftp://127.0.0.1:{p}/", "scheme 'ftp'"),
    ]


async def test_hostile_urls_are_refused_and_reach_nothing(client: Any, setup: Setup) -> None:
    before = len(HITS)
    for url, why in hostile_urls(setup):
        got, reason = await refused(client, setup, "fetch", "fetch", {"url": url, "raw": True})
        assert why in reason, (url, reason)
        assert BODY.decode() not in got
    for arguments in ({"url": None}, {"raw": True}, {"url": 7}, {"url": []}):
        await refused(client, setup, "fetch", "fetch", arguments)
    assert HITS[before:] == [], "a refused URL reached a local site"
    # the egress proxy never saw a refused URL: `refused` checks no `egress` event followed each one


async def test_an_uppercase_scheme_is_the_same_url_and_is_allowed(client: Any, setup: Setup) -> None:
    """`HTTP://` is `http://`: schemes are case-insensitive (RFC 3986 3.1, WHATWG lowercases them).

    docs/policy.md lists what `hosts:` refuses as ambiguous (`user@a@b`, backslashes, whitespace);
    case is not among them, because no parser reads `HTTP://127.0.0.1:p/` as another host. So it is
    allowed, and it goes to the allowed host and nowhere else.
    """
    before_hits, before = len(HITS), len(events(setup))
    result = await client.call_tool("fetch__fetch", {"url": f"HTTP://127.0.0.1:{setup.port}/upper", "raw": True})
    assert not result.is_error, text(result)
    assert BODY.decode() in text(result)
    assert HITS[before_hits:] == [(setup.port, "/upper")]
    new = events(setup)[before:]
    call = next(e for e in new if e["event"] == "call")
    assert (call["decision"], call["rule"]) == ("allow", "fetch")
    egress = [(e["host"], e["port"], e["decision"]) for e in new if e["event"] == "egress"]
    assert egress == [("127.0.0.1", setup.port, "allow")]


async def test_a_redirect_off_the_allowed_host_is_the_jails_to_stop(client: Any, setup: Setup) -> None:
    """`hosts:` checks the argument, not where the server goes next: a page on the allowed host that
    redirects elsewhere passes the policy, and the allowlist jail's proxy is what refuses the hop."""
    REDIRECT["/hop"] = f"http://127.0.0.1:{setup.other}/landed"
    before_hits, before = len(HITS), len(events(setup))
    result = await client.call_tool("fetch__fetch", {"url": f"http://127.0.0.1:{setup.port}/hop", "raw": True})
    assert result.is_error and BODY.decode() not in text(result)
    assert HITS[before_hits:] == [(setup.port, "/hop")]  # the other site saw nothing
    new = events(setup)[before:]
    call = next(e for e in new if e["event"] == "call")
    assert (call["decision"], call["rule"]) == ("allow", "fetch")
    egress = [(e["port"], e["decision"]) for e in new if e["event"] == "egress"]
    assert egress == [(setup.port, "allow"), (setup.other, "deny")]


async def test_a_list_of_allowed_urls_passes_the_policy_and_the_server_rejects_it(client: Any, setup: Setup) -> None:
    """Current behaviour: a constraint checks every element of a list, so `url: [<allowed url>]` passes
    `hosts:` although the tool's schema says `url` is a string; the server's own validation refuses
    it, and nothing is fetched. The policy does not look at the tool's input schema."""
    before_hits, before = len(HITS), len(events(setup))
    url = f"http://127.0.0.1:{setup.port}/listed"
    result = await client.call_tool("fetch__fetch", {"url": [url], "raw": True})
    assert result.is_error
    call = next(e for e in events(setup)[before:] if e["event"] == "call")
    assert (call["decision"], call["rule"]) == ("allow", "fetch")
    assert HITS[before_hits:] == []
