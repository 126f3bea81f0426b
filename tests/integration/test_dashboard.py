"""`cellblock dashboard` in a real headless browser (Debian's Chromium, driven by Playwright),
against a real `cellblock serve` whose client cannot elicit: a call that waits for approval
appears on the already open page, and the page's buttons answer it as `cellblock approve|deny`
do. Hostile arguments render inert and whole, and the page refuses to render inside a frame."""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager, contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from playwright.async_api import Page, async_playwright, expect

from cellblock.gateway.dashboard.servers import server_details
from cellblock.gateway.scan.saved import save_report
from cellblock.gateway.serve.running import network_text
from cellblock.policy.text import visible
from cellblock.sandbox.landlock import landlock_abi
from tests.gateway.dashboard.test_dashboard_scans import report
from tests.integration.conftest import NO_USERNS, ROOT, cli, cli_env, gateway, probe_server, write_config

CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [
    pytest.mark.anyio,
    pytest.mark.slow,
    pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed at /usr/bin/chromium"),
]

# every call to echo waits for the human; the rest is refused
ASK_ECHO = {"default": "deny", "rules": {"echo": "ask"}}
# the page polls every second; a loaded 2-core machine starting a gateway and a browser gets slack
SHOWN_WITHIN = 30_000  # ms, Playwright's unit
# `SCREENSHOTS=1`: the screenshots go to docs/images (the README shows them), else to the test's tmp dir
SCREENSHOTS = ROOT / "docs" / "images"


def text(result: types.CallToolResult) -> str:
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


@asynccontextmanager
async def dashboard(env: dict[str, str], *args: str) -> AsyncIterator[str]:
    """`cellblock dashboard --no-open ARGS` with `env`; yields the address it prints, and ends it
    with Ctrl-C (SIGINT), as a user does."""
    argv = [sys.executable, "-m", "cellblock.gateway.cli.main", "dashboard", "--no-open", *args]
    process = await anyio.to_thread.run_sync(
        lambda: subprocess.Popen(argv, env={**os.environ, **env}, stdout=subprocess.PIPE, text=True)
    )
    try:
        assert process.stdout is not None
        with anyio.fail_after(30):
            line = await anyio.to_thread.run_sync(process.stdout.readline)  # the address, on a line of its own
        assert line.startswith("http://127.0.0.1:") and "/#secret=" in line, line
        yield line.strip()
    finally:
        process.send_signal(signal.SIGINT)
        try:
            code = await anyio.to_thread.run_sync(lambda: process.wait(timeout=15))
        except subprocess.TimeoutExpired:
            process.kill()
            raise
    assert code == 0


@asynccontextmanager
async def browser() -> AsyncIterator[Page]:
    """A page of headless Chromium (the system's: nothing downloaded), with window.__pwned set by
    any script a hostile value manages to run."""
    async with async_playwright() as playwright:
        chromium = await playwright.chromium.launch(executable_path=str(CHROMIUM), args=["--no-sandbox"])
        try:
            context = await chromium.new_context(viewport={"width": 1100, "height": 760})
            page = await context.new_page()
            yield page
        finally:
            await chromium.close()


def config(tmp_path: Path) -> Path:
    return write_config(tmp_path, {"p": probe_server("--name", "p", tools=ASK_ECHO)}, approvals={"timeout": 120})


async def pending_full(env: dict[str, str], ident: str) -> dict[str, Any]:
    done = await anyio.to_thread.run_sync(lambda: cli(env, "pending", "--full", ident, "--json"))
    assert done.returncode == 0, done.stderr
    item: dict[str, Any] = json.loads(done.stdout)
    return item


def screenshot_path(tmp_path: Path, name: str) -> Path:
    if os.environ.get("SCREENSHOTS") == "1":
        SCREENSHOTS.mkdir(exist_ok=True)
        return SCREENSHOTS / name
    return tmp_path / name


async def test_a_waiting_call_appears_and_is_approved_once_then_another_is_denied(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    async with (
        gateway(config(tmp_path), state, env={"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]}) as client,
        dashboard(env) as url,
        browser() as page,
    ):
        await page.goto(url)
        # the secret left the address bar; the session is open, and nothing waits yet
        await page.locator("#no-approvals").wait_for(state="visible", timeout=SHOWN_WITHIN)
        assert "secret" not in page.url
        await page.locator("table.servers td", has_text="ready").wait_for(timeout=SHOWN_WITHIN)
        servers = await page.locator("table.servers tr").all_inner_texts()
        ps = json.loads((await anyio.to_thread.run_sync(lambda: cli(env, "ps", "--json"))).stdout)
        [[server]] = [g["servers"] for g in ps]
        assert any(row.split("\t")[:3] == ["p", server["state"], network_text(server)] for row in servers), servers
        # its details, under the row: the lock, start and jail `ps --json` gives, as the dashboard words them
        shown, details = server_details(server), page.locator("details.server-details[data-server='p']")
        assert server["lock"] == {"status": "off"} and server["jail_detail"]["read_only"] == [
            str(ROOT / "tests" / "servers")
        ]
        await expect(details.locator("summary")).to_have_text(f"lock {shown['lock']}")
        await expect(details.locator(".detail")).to_have_text([f"start {shown['start']}", *shown["jail_lines"]])
        assert server["stderr"] == [] and await details.locator(".stderr-line").count() == 0  # it runs: no stderr shown

        for answer, message in (("once", "approve me"), ("deny", "deny me")):
            results: list[types.CallToolResult] = []

            async def call(message: str, results: list[types.CallToolResult]) -> None:
                results.append(await client.call_tool("p__echo", {"message": message}))

            async with anyio.create_task_group() as tg:
                tg.start_soon(call, message, results)
                card = page.locator(".approval")
                await card.wait_for(timeout=SHOWN_WITHIN)  # the page was open before the call: no reload
                ident = await card.get_attribute("data-id")
                assert ident is not None
                full = await pending_full(env, ident)  # what `cellblock pending --full ID` shows
                assert await card.locator(".argument").all_text_contents() == [visible(a) for a in full["arguments"]]
                assert await card.locator(".identity").text_content() == visible(full["identity"])
                assert (await card.locator(".left").text_content() or "").endswith("s left")
                if answer == "once":
                    await page.screenshot(path=screenshot_path(tmp_path, "dashboard-approvals.png"), full_page=True)
                await card.locator(f"button[data-scope='{answer}']").click()
                await card.wait_for(state="detached", timeout=SHOWN_WITHIN)  # gone at the next poll
            [result] = results
            if answer == "once":
                assert text(result) == "approve me" and not result.is_error
                assert await page.locator("#last-answer").text_content() == f"approved '{ident}' once"
            else:
                assert result.is_error and f"denied from the dashboard ({ident})" in text(result)
                assert await page.locator("#last-answer").text_content() == f"denied '{ident}'"
    events = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    assert [(e["scope"], e["via"]) for e in events if e["event"] == "approval_granted"] == [("once", "dashboard")]
    assert [e.get("via") for e in events if e["event"] == "approval_denied"] == ["dashboard", None]


HOSTILE = {
    "message": "<script>window.__pwned = 'script'</script><img src=x onerror=\"window.__pwned='img'\">",
    "link": "javascript:window.__pwned='link'",
    "long": "A" * 9_990 + "\x1b[31mred\u202e",  # 10,000 characters, an escape and a right-to-left override
}


# a server that writes hostile text to its stderr and exits: the gateway gives up on it
CRASH = "import sys; sys.stderr.write(sys.argv[1]); sys.exit(3)"
STDERR = (
    "starting\n<script>window.__pwned='stderr'</script><img src=x onerror=\"window.__pwned='img'\">\n"
    "\x1b[31mred\u202e\n"
)


# as the gateway keeps them: whole, the escape and the override written as escapes
STDERR_SHOWN = [STDERR.split("\n")[1], "\\u001b[31mred\\u202e"]


async def test_hostile_arguments_render_inert_and_whole(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    crashy = {"command": sys.executable, "args": ["-c", CRASH, STDERR], "start": "eager"}
    config_path = write_config(
        tmp_path, {"p": probe_server("--name", "p", tools=ASK_ECHO), "crashy": crashy}, approvals={"timeout": 120}
    )
    async with (
        gateway(config_path, Path(env["CELLBLOCK_STATE_DIR"]), env={"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]}) as c,
        dashboard(env, "--config", str(config_path)) as url,
        browser() as page,
    ):
        results: list[types.CallToolResult] = []

        async def call() -> None:
            results.append(await c.call_tool("p__echo", HOSTILE))

        await page.goto(url)
        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            card = page.locator(".approval")
            await card.wait_for(timeout=SHOWN_WITHIN)
            ident = await card.get_attribute("data-id")
            assert ident is not None
            full = await pending_full(env, ident)
            shown = await card.locator(".argument").all_text_contents()
            # whole: each line is `pending --full`'s, nothing cut, the escape and override made visible
            assert shown == [visible(a) for a in full["arguments"]] and len(shown) == 3
            assert any(HOSTILE["message"].replace('"', '\\"') in line for line in shown), shown
            assert any(HOSTILE["link"] in line for line in shown)
            [long] = [line for line in shown if line.startswith('"long"')]
            assert "A" * 9_990 + "\\u001b[31mred\\u202e" in long
            # inert: no script ran, and no element or link was made of a value
            assert await page.evaluate("window.__pwned") is None
            assert await page.locator("#approvals script, #approvals img, #approvals a, #approvals iframe").count() == 0
            await card.locator("button[data-scope='deny']").click()
            await card.wait_for(state="detached", timeout=SHOWN_WITHIN)
        assert results[0].is_error
        assert await page.evaluate("window.__pwned") is None
        # the audit timeline: the denied call's row, its hostile text set as text only
        await page.locator("#audit-refresh").click()
        denied = page.locator("#audit-events tr", has_text="approval_denied")
        await denied.first.wait_for(timeout=SHOWN_WITHIN)
        assert await page.locator("#audit-events script, #audit-events img, #audit-events a").count() == 0
        assert await page.evaluate("window.__pwned") is None
        assert await page.locator("#chain").get_attribute("data-state") == "whole"
        # the server that failed: its last stderr lines under its row, as `ps --json` gives them, inert
        await page.locator("table.servers tr", has_text="failed").wait_for(timeout=4 * SHOWN_WITHIN)  # 5 restarts
        ps = json.loads((await anyio.to_thread.run_sync(lambda: cli(env, "ps", "--json"))).stdout)
        [failed] = [s for g in ps for s in g["servers"] if s["name"] == "crashy"]
        assert failed["state"] == "failed" and failed["stderr"] == ["starting", *STDERR_SHOWN], failed
        lines = page.locator("details.server-details[data-server='crashy'] .stderr-line")
        await expect(lines).to_have_text(server_details(failed)["stderr"])  # open: it fails
        assert await page.locator("#gateways script, #gateways img, #gateways a").count() == 0
        assert await page.evaluate("window.__pwned") is None


class _Framer(BaseHTTPRequestHandler):
    """Another site on loopback: a page that frames the dashboard, and one that may be framed."""

    target = ""

    def do_GET(self) -> None:
        if self.path == "/framable.html":
            body = "<p id=inside>framed fine</p>"
        else:
            port = self.server.server_address[1]
            body = (
                f'<iframe id=dashboard src="{self.target}"></iframe>'
                f'<iframe id=control src="http://127.0.0.1:{port}/framable.html"></iframe>'
            )
        data = body.encode()
        self.send_response(200)
        self.send_header("content-type", "text/html")
        self.send_header("content-length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextmanager
def framing_site(target: str) -> Iterator[int]:
    handler = type("Framer", (_Framer,), {"target": target})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield server.server_address[1]
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


async def test_the_page_refuses_to_render_inside_a_frame_of_another_site(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    async with dashboard(env) as url, browser() as page:
        with framing_site(url) as port:
            # localhost, not 127.0.0.1: the framing page is of another origin than both frames
            await page.goto(f"http://localhost:{port}/outer.html", wait_until="load")
            frames = {await (await f.frame_element()).get_attribute("id"): f for f in page.frames if f.parent_frame}
            # the control: a page without the headers renders in the same kind of frame
            assert await frames["control"].locator("#inside").text_content() == "framed fine"
            framed = frames["dashboard"]
            assert framed.url == "chrome-error://chromewebdata/"  # Chromium's page for a refused frame
            assert await framed.locator("#approvals, #status, #gateways").count() == 0


async def test_a_catalog_held_at_first_contact_is_shown_and_approved_and_its_tools_are_listed(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    # echo runs without asking once approved; every other tool asks
    server = probe_server("--name", "p", tools={"default": "ask", "rules": {"echo": "allow"}}, lock={"first": "review"})
    config_path = write_config(tmp_path, {"p": server})
    async with (
        gateway(config_path, state, env={"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]}) as client,
        dashboard(env, "--config", str(config_path)) as url,
        browser() as page,
    ):
        assert not any(t.name.startswith("p__") for t in (await client.list_tools()).tools)  # held
        await page.goto(url)
        card = page.locator(".review[data-server='p']")
        await card.wait_for(timeout=SHOWN_WITHIN)
        diff = await anyio.to_thread.run_sync(lambda: cli(env, "diff", "p", "--config", str(config_path)))
        # the page shows what `cellblock diff p` shows, line for line, and the hash it prints
        shown_hash = await card.get_attribute("data-hash")
        assert shown_hash is not None and f"catalog sha256 {shown_hash}:" in diff.stdout
        assert await card.locator(".diff-line").all_text_contents() == diff.stdout.splitlines()[:-1]
        assert (await card.locator(".what").text_content() or "").endswith("first contact")
        marked = await card.locator(".tool.unasked .name").all_text_contents()
        assert marked == ["echo"] and "slow" in await card.locator(".tool .name").all_text_contents()
        await page.screenshot(path=screenshot_path(tmp_path, "dashboard-review.png"), full_page=True)
        await card.locator("button").click()
        await page.locator("#last-answer", has_text="approved the catalog of 'p'").wait_for(timeout=SHOWN_WITHIN)
        # the gateway listed the tools before it answered: the client's next list has them
        assert "p__echo" in {t.name for t in (await client.list_tools()).tools}
        assert text(await client.call_tool("p__echo", {"message": "approved"})) == "approved"
        await card.wait_for(state="detached", timeout=SHOWN_WITHIN)  # nothing is held any more
        await page.locator("#no-review").wait_for(state="visible", timeout=SHOWN_WITHIN)
        # the audit timeline has the approval, filtered on the page's choice of event
        await page.locator("#audit-refresh").click()
        await page.locator("#filter-kind option[value='lock_approved']").wait_for(
            state="attached", timeout=SHOWN_WITHIN
        )
        await page.locator("#filter-kind").select_option("lock_approved")
        # the filtered table: its header and that one event (the unfiltered one had more)
        await expect(page.locator("#audit-events tr")).to_have_count(2, timeout=SHOWN_WITHIN)
        row = await page.locator("#audit-events tr").nth(1).locator("td").all_text_contents()
        assert row[1:3] == ["lock_approved", "p"] and 'via="dashboard"' in row[-1]
    events = [json.loads(line) for line in (state / "audit.jsonl").read_text().splitlines()]
    assert [e["via"] for e in events if e["event"] == "lock_approved"] == ["dashboard"]


LINK = re.compile(r"http://127\.0\.0\.1:(\d+)/#approval=([a-z2-7]+)")


async def test_an_approval_link_opens_the_call_on_the_page_only_in_the_browser_that_has_the_session(
    tmp_path: Path,
) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    shown = tmp_path / "notified"
    desktop = tmp_path / "bin"
    desktop.mkdir()
    (desktop / "notify-send").write_text(f'#!/bin/sh\nprintf "%s\\n" "$@" >> "{shown}"\n')  # the desktop's part
    (desktop / "notify-send").chmod(0o755)
    heard: list[str] = []
    told = anyio.Event()

    async def log(params: types.LoggingMessageNotificationParams) -> None:
        heard.append(str(params.data))
        if "cellblock approve" in heard[-1]:
            told.set()

    gateway_env = {"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"], "PATH": f"{desktop}:{os.environ['PATH']}"}
    async with (
        gateway(config(tmp_path), state, env=gateway_env, logging_callback=log, log_level="info") as client,
        dashboard(env) as url,
        browser() as page,
    ):
        await page.goto(url)  # `cellblock dashboard` opened the page in this browser: it has the session
        await page.locator("#no-approvals").wait_for(state="visible", timeout=SHOWN_WITHIN)
        results: list[types.CallToolResult] = []

        async def call() -> None:
            results.append(await client.call_tool("p__echo", {"message": "linked"}))

        async with anyio.create_task_group() as tg:
            tg.start_soon(call)
            with anyio.fail_after(30):
                await told.wait()
            said = " ".join(heard)
            found = LINK.search(said)
            assert found is not None, heard
            link, ident = found.group(0), found.group(2)
            # the client and the desktop are given the page's address for that call, never its secret
            assert url.startswith(f"http://127.0.0.1:{found.group(1)}/#secret=") and url.split("=", 1)[1] not in said
            # a browser without the session (a web page, another user's browser) gets nothing from the link
            stranger = await (await page.context.browser.new_context()).new_page()
            await stranger.goto(link)
            await expect(stranger.locator("#status")).to_contain_text("Not signed in", timeout=SHOWN_WITHIN)
            assert await stranger.locator(".approval").count() == 0
            # the control: a new tab of the browser that has the session opens at the call
            tab = await page.context.new_page()
            await tab.goto(link)
            card = tab.locator(".approval.linked")
            await card.wait_for(timeout=SHOWN_WITHIN)
            assert await card.get_attribute("data-id") == ident and "#" not in tab.url
            await card.locator("button[data-scope='once']").click()
            await card.wait_for(state="detached", timeout=SHOWN_WITHIN)
        [result] = results
        assert text(result) == "linked" and not result.is_error
        # the desktop's notifier ran beside the client's message, long done by the time of the answer
        notified = shown.read_text()
        assert link in notified and url.split("=", 1)[1] not in notified
    # the dashboard took its address back when it stopped: a later call is given no link
    assert not (Path(env["XDG_RUNTIME_DIR"]) / "cellblock" / "dashboard.json").exists()


HOSTILE_SERVER = ROOT / "tests" / "servers" / "hostile.py"


@pytest.mark.parametrize("backend", ["bwrap", "landlock"])
async def test_a_jailed_server_cannot_reach_the_page(tmp_path: Path, backend: str) -> None:
    if backend == "landlock" and (landlock_abi() < 4 or shutil.which("unshare") is None):
        pytest.skip("needs Landlock's TCP rules (Linux 6.7) and unshare")
    env = cli_env(tmp_path)
    server: dict[str, Any] = {"command": sys.executable, "args": [str(HOSTILE_SERVER)]}
    sources = {"read_only": [str(HOSTILE_SERVER.parent), str(ROOT / "cellblock" / "sandbox")]}
    servers = {
        "jailed": server | {"jail": sources},  # the default jail: network none
        # the honest control: the same server unjailed reaches the port
        "control": server | {"jail": False},
    }
    if backend == "bwrap":  # an allowlist reaches the hosts it names through the egress proxy, not loopback
        servers["allowlisted"] = server | {"jail": sources | {"network": "allowlist", "allow_hosts": ["example.com"]}}
    prefix = NO_USERNS if backend == "landlock" else ()
    async with dashboard(env) as url:
        port = int(url.removeprefix("http://127.0.0.1:").split("/")[0])
        async with gateway(write_config(tmp_path, servers), Path(env["CELLBLOCK_STATE_DIR"]), prefix=prefix) as client:

            async def connect(name: str) -> dict[str, Any]:
                result = await client.call_tool(f"{name}__connect", {"host": "127.0.0.1", "port": port})
                assert not result.is_error and result.structured_content is not None, text(result)
                return result.structured_content

            assert (await connect("control"))["got_through"]
            reached = {name: (await connect(name))["detail"] for name in servers if name != "control"}
    assert not any(detail.startswith("connected") for detail in reached.values()), reached


async def test_a_kept_scan_report_renders_inert_and_whole(tmp_path: Path) -> None:
    """The reports `cellblock scan` kept, one of them of a server whose tool name, note and
    arguments are hostile: each string is shown escaped, as text, and nothing of it runs."""
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    hostile = HOSTILE["message"] + HOSTILE["link"] + "\x1b[31m\u202e"
    evil = report("evil", tool=hostile)
    evil["server"]["args"].append(hostile)
    save_report(state, "notes", report("notes"))
    save_report(state, "evil", evil)
    async with dashboard(env) as url, browser() as page:
        await page.goto(url)
        card = page.locator(".scan[data-server='evil']")
        await card.wait_for(timeout=SHOWN_WITHIN)
        await page.locator(".scan[data-server='notes']").wait_for(timeout=SHOWN_WITHIN)
        shown = visible(hostile)
        assert "\\u001b[31m\\u202e" in shown  # the escape and the override, made visible
        cells = await card.locator("tr.finding td").all_text_contents()
        assert cells[:3] == ["high", shown, f"secret-read: {shown}: opened ~/.ssh/id_rsa unasked"]
        assert (
            await card.locator(".scan-config").text_content()
            == f"/usr/bin/python3 notes.py --root /home/me/notes {shown}"
        )
        assert await card.locator(".jail.notes .scan-line").all_text_contents() == [f"{shown}: wrote ~/.seen"]
        assert await card.locator(".badge").text_content() == "cellblocknot confined · fs ✗ net ✓ exec ✓"
        assert await card.locator(".scan-counts").text_content() == "high 1 · medium 0 · low 0 · info 1"
        # inert: no script ran, and no element or link was made of a value
        assert await page.locator("#scans script, #scans img, #scans a, #scans iframe").count() == 0
        assert await page.evaluate("window.__pwned") is None
        assert await page.locator("#no-scans").is_hidden()
        section = page.locator("section[aria-labelledby='scans-title']")
        await page.locator(".scan[data-server='evil']").evaluate("card => card.remove()")  # the screenshot: notes alone
        await section.screenshot(path=screenshot_path(tmp_path, "dashboard-scans.png"))


# busy servers, then one that is not: five lines, the rest summed
CHART_SERVERS = {"github": 9, "fs": 7, "web": 5, "db": 4, "slack": 3, "notes": 2, "jira": 1}
HOSTILE_NAMES = ["<img src=x onerror=window.__pwned='legend'>", "<script>window.__pwned='script'</script>"]


def write_calls(state: Path, servers: dict[str, int], start: float) -> None:
    """Calls of `servers` (each as busy as its weight) over the 59 minutes from `start`, some
    refused (web's often), written by the gateway's audit code (its clock set) into the state dir's log."""
    from cellblock.gateway.audit import log as audit_module
    from cellblock.gateway.audit.log import Audit

    state.mkdir(mode=0o700, exist_ok=True)
    clock = [start]
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(audit_module.time, "time", lambda: clock[0])
        audit = Audit(state / "audit.jsonl")
        n = 0
        for minute in range(60):
            for name, weight in servers.items():
                for _ in range(weight * (30 + minute + 9 * (minute % 4)) // 60):
                    n += 1
                    clock[0] = start + minute * 60 + (n % 50 if minute < 59 else 0)
                    refused = n % (3 if name == "web" else 19) == 0
                    audit.write("call", name, tool="read", decision="deny" if refused else "allow", rule="read")
        audit.close()


async def test_the_charts_draw_calls_and_refusals_per_server_and_a_hostile_name_stays_text(tmp_path: Path) -> None:
    env = cli_env(tmp_path)
    state = Path(env["CELLBLOCK_STATE_DIR"])
    now = time.time()
    write_calls(state, CHART_SERVERS, now - 3600)
    async with dashboard(env) as url, browser() as page:
        violations: list[str] = []
        page.on("console", lambda m: violations.append(m.text) if "Content Security Policy" in m.text else None)
        page.on("pageerror", lambda e: violations.append(str(e)))
        await page.goto(url)
        calls = page.locator("#chart-calls")
        await calls.locator("canvas").wait_for(timeout=SHOWN_WITHIN)
        labels = calls.locator(".u-legend .u-series .u-label")
        await expect(labels).to_have_count(7, timeout=SHOWN_WITHIN)  # the time, five servers, the rest
        assert await labels.all_text_contents() == ["time", "github", "fs", "web", "db", "slack", "(2 other servers)"]
        refusals = await page.locator("#chart-refusals .u-legend .u-series .u-label").all_text_contents()
        assert refusals[0] == "time" and "web" in refusals and len(refusals) <= 7
        caption = await page.locator("#calls-caption").text_content()
        assert caption is not None and caption.startswith("calls per server, per minute (")
        # the canvas holds a drawing: some pixel is not transparent
        drawn = await calls.locator("canvas").evaluate(
            "c => c.getContext('2d').getImageData(0, 0, c.width, c.height).data.some((v, i) => i % 4 === 3 && v > 0)"
        )
        assert drawn
        assert violations == []
        section = await page.locator("section[aria-labelledby='audit-title']").bounding_box()
        assert section is not None
        clip = {"x": section["x"], "y": section["y"], "width": section["width"], "height": 760}
        await page.screenshot(path=screenshot_path(tmp_path, "dashboard-audit.png"), clip=clip, full_page=True)

        # servers named to run a script when their names are parsed as HTML
        write_calls(state, {name: 20 for name in HOSTILE_NAMES}, now - 600)
        await page.locator("#audit-refresh").click()
        legend = page.locator("#chart-calls .u-legend .u-series .u-label")
        await expect(legend.filter(has_text=HOSTILE_NAMES[0])).to_have_count(1, timeout=SHOWN_WITHIN)
        shown = await legend.all_text_contents()
        assert HOSTILE_NAMES[0] in shown and HOSTILE_NAMES[1] in shown  # whole, as text
        charts = "section[aria-labelledby='audit-title'] .charts"
        assert await page.locator(f"{charts} img, {charts} script, {charts} a").count() == 0
        assert await page.evaluate("window.__pwned") is None
        assert violations == []
        # the control: an inline style the policy refuses is seen by this test
        async with page.expect_console_message(lambda m: "Content Security Policy" in m.text, timeout=SHOWN_WITHIN):
            await page.evaluate("document.body.setAttribute('style', 'outline: 1px solid red')")
        assert violations


# a server whose held catalog is hostile: markup and a link in a description, a name that passes
# for another (U+0435, a Cyrillic e), an escape, an override and a 10,000-character description
DESCRIBED = """
import sys
sys.path.insert(0, {servers!r})
from raw import Raw, main

class Described(Raw):
    def tools(self):
        schema = {{"type": "object", "properties": {{}}}}
        return [
            {{"name": "read_file", "description": {plain!r}, "inputSchema": schema}},
            {{"name": "r\\u0435ad_file", "description": {hostile!r}, "inputSchema": schema}},
            {{"name": "notes", "description": {long!r}, "inputSchema": schema}},
        ]

main(Described)
"""


async def test_a_held_catalog_with_hostile_descriptions_and_lookalike_names_renders_inert_and_whole(
    tmp_path: Path,
) -> None:
    env = cli_env(tmp_path)
    script = tmp_path / "described.py"
    hostile = HOSTILE["message"] + " " + HOSTILE["link"] + " \x1b[31m\u202e"
    long = "B" * 9_990 + "\x1b[1m\u202eend"
    script.write_text(
        DESCRIBED.format(servers=str(ROOT / "tests" / "servers"), plain="Read a file", hostile=hostile, long=long)
    )
    server = {
        "command": sys.executable,
        "args": [str(script)],
        "jail": {"read_only": [str(tmp_path), str(ROOT / "tests" / "servers")]},
        "lock": {"first": "review"},
    }
    config_path = write_config(tmp_path, {"d": server})
    async with (
        gateway(config_path, Path(env["CELLBLOCK_STATE_DIR"]), env={"XDG_RUNTIME_DIR": env["XDG_RUNTIME_DIR"]}),
        dashboard(env, "--config", str(config_path)) as url,
        browser() as page,
    ):
        await page.goto(url)
        card = page.locator(".review[data-server='d']")
        await card.wait_for(timeout=SHOWN_WITHIN)
        diff = await anyio.to_thread.run_sync(lambda: cli(env, "diff", "d", "--config", str(config_path)))
        shown = await card.locator(".diff-line").all_text_contents()
        # whole: the page's lines are `cellblock diff d`'s, nothing cut
        assert shown == diff.stdout.splitlines()[:-1]
        page_text = "\n".join(shown)
        assert HOSTILE["link"] in page_text and "B" * 9_990 in page_text
        assert "\\u001b[31m" in page_text and "\\u202e" in page_text  # the escape and the override, visible
        # the look-alike is a tool of its own, told apart from the one it passes for
        names = await card.locator(".tool .name").all_text_contents()
        assert "read_file" in names and len(names) == 3 and len(set(names)) == 3, names
        assert await page.locator("#review script, #review img, #review a, #review iframe").count() == 0
        assert await page.evaluate("window.__pwned") is None
