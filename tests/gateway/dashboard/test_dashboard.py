"""The dashboard's web app against every refusal it promises (docs/dashboard.md). Each attack has
its honest control: the same request with the right cookie, Origin, Host and CSRF token gets
through; and each asserts what reached the gateways through a refused request: nothing."""

from __future__ import annotations

import json
import os
import re
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from starlette.testclient import TestClient

from cellblock.gateway.dashboard.app import COOKIE, HEADERS, MAX_SESSIONS, create_app
from cellblock.gateway.dashboard.view import answer_text, catalog_answer_text
from cellblock.gateway.serve.running import Answered, approval_link, publish_dashboard, withdraw_dashboard

PORT = 48213  # the app never binds it: the TestClient calls the app in process
ORIGIN = f"http://127.0.0.1:{PORT}"
SECRET = "s3cret-of-this-run"
HOSTILE = "<script>window.__pwned=1</script>"
STATE = {
    "gateways": [{"pid": "1", "config": "/c.yaml", "pending": 1, "servers": []}],
    "approvals": [{"id": "k3x9", "server": "fs", "arguments": [f'"text": "{HOSTILE}"']}],
    "review": [],
    "errors": [],
}


class FakeGateways:
    """The gateways: a fixed state, and every answer that reached them recorded."""

    def __init__(self) -> None:
        self.answers: list[dict[str, Any]] = []
        self.reads = 0

    def state(self) -> dict[str, Any]:
        self.reads += 1
        return STATE

    def answer(self, message: dict[str, Any]) -> Answered:
        self.answers.append(message)
        return Answered(True, 1)


@pytest.fixture
def gateways() -> FakeGateways:
    return FakeGateways()


@pytest.fixture
def client(gateways: FakeGateways) -> Iterator[TestClient]:
    with TestClient(create_app(PORT, SECRET, gateways), base_url=ORIGIN) as test_client:
        yield test_client


def send(
    client: TestClient,
    method: str,
    path: str,
    *,
    host: str | None = f"127.0.0.1:{PORT}",
    origin: str | None = ORIGIN,
    cookie: str | None = None,
    csrf: str | None = None,
    json_body: Any = None,
    form: str | None = None,
) -> Any:
    """One request with exactly these headers: the client's cookie jar is emptied first."""
    client.cookies.clear()
    headers = {}
    for name, value in (("host", host), ("origin", origin), ("x-csrf-token", csrf)):
        if value is not None:
            headers[name] = value
    if cookie is not None:
        headers["cookie"] = f"{COOKIE}={cookie}"
    if form is not None:
        headers["content-type"] = "application/x-www-form-urlencoded"
        return client.request(method, path, headers=headers, content=form)
    return client.request(method, path, headers=headers, json=json_body)


def session(client: TestClient) -> tuple[str, str]:
    """A session opened as the page opens it: its cookie and its CSRF token."""
    opened = send(client, "POST", "/session", json_body={"secret": SECRET})
    assert opened.status_code == 200, opened.text
    cookie = re.search(f"{COOKIE}=([^;]+)", opened.headers["set-cookie"])
    assert cookie is not None
    return cookie.group(1), opened.json()["csrf"]


def assert_strict_headers(response: Any) -> None:
    for name, value in HEADERS.items():
        assert response.headers.get_list(name) == [value], (name, response.headers)


@pytest.mark.parametrize(
    ("path", "media"),
    [
        ("/", "text/html"),
        ("/dom.js", "text/javascript"),
        ("/dashboard.js", "text/javascript"),
        ("/dashboard.css", "text/css"),
        ("/scans.js", "text/javascript"),
        ("/scans.css", "text/css"),
    ],
)
def test_the_page_its_script_and_its_style_carry_the_strict_headers(client: TestClient, path: str, media: str) -> None:
    response = send(client, "GET", path)
    assert response.status_code == 200 and response.headers["content-type"].startswith(media)
    assert_strict_headers(response)
    assert response.headers["content-security-policy"] == (
        "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self'; "
        "base-uri 'none'; form-action 'none'; frame-ancestors 'none'"
    )


def test_the_page_has_no_inline_script_or_style_and_the_script_never_parses_html() -> None:
    static = Path(create_app.__code__.co_filename).parent / "static"
    page = (static / "index.html").read_text()
    scripts = ["/dom.js", "/scans.js", "/vendor/uPlot.iife.min.js", "/charts.js", "/dashboard.js"]
    assert re.findall(r"<script[^>]*>", page) == [f'<script src="{src}" defer>' for src in scripts]
    assert "<style" not in page and " style=" not in page and " on" not in page.replace("\n", " ").lower()
    for src in scripts:  # the vendored uPlot too: it sets its legend's labels as text
        script = (static / src.lstrip("/")).read_text()
        for sink in ("innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "Function(", ".href"):
            assert sink not in script, (src, sink)
        assert "textContent" in script  # the control: what the script does use


def test_the_secret_opens_a_session_with_an_httponly_strict_cookie(client: TestClient) -> None:
    opened = send(client, "POST", "/session", json_body={"secret": SECRET})
    assert opened.status_code == 200 and set(opened.json()) == {"csrf"}
    cookie = opened.headers["set-cookie"]
    attributes = {part.strip().lower() for part in cookie.split(";")[1:]}
    assert {"httponly", "samesite=strict", "path=/"} <= attributes, cookie
    assert SECRET not in cookie and SECRET not in opened.text
    assert_strict_headers(opened)


@pytest.mark.parametrize(
    "attack",
    [
        {"json_body": {"secret": "guessed"}},
        {"json_body": {"secret": SECRET[:-1]}},
        {"json_body": {}},
        {"origin": None},
        {"origin": "http://evil.example"},
        {"origin": "null"},
        {"host": "evil.example"},
        {"form": f"secret={SECRET}"},
    ],
    ids=["wrong-secret", "prefix", "no-secret", "no-origin", "cross-origin", "null-origin", "rebinding", "form-post"],
)
def test_a_session_is_refused_without_the_secret_from_the_page(client: TestClient, attack: dict[str, Any]) -> None:
    request: dict[str, Any] = {"json_body": {"secret": SECRET}, **attack}
    refused = send(client, "POST", "/session", **request)
    assert refused.status_code in (403, 415) and "set-cookie" not in refused.headers
    assert_strict_headers(refused)
    # the control: the page's own request opens one
    assert send(client, "POST", "/session", json_body={"secret": SECRET}).status_code == 200


@pytest.mark.parametrize(
    "attack",
    [{"cookie": None}, {"cookie": "forged"}, {"csrf": None}, {"csrf": "forged"}, {"host": "evil.example:80"}],
    ids=["no-cookie", "wrong-cookie", "no-csrf", "wrong-csrf", "rebinding"],
)
def test_the_queue_is_not_read_without_the_session(
    client: TestClient, gateways: FakeGateways, attack: dict[str, Any]
) -> None:
    cookie, csrf = session(client)
    refused = send(client, "GET", "/api/state", **{"cookie": cookie, "csrf": csrf, **attack})
    assert refused.status_code == 403 and HOSTILE not in refused.text and gateways.reads == 0
    assert_strict_headers(refused)
    shown = send(client, "GET", "/api/state", cookie=cookie, csrf=csrf)  # the control
    assert shown.status_code == 200 and shown.json() == STATE and gateways.reads == 1
    assert_strict_headers(shown)


APPROVE = {"id": "k3x9", "scope": "once"}
ATTACKS = {
    "no-cookie": {"cookie": None},
    "wrong-cookie": {"cookie": "forged"},
    "no-origin": {"origin": None},
    "cross-origin": {"origin": "http://evil.example"},
    "other-port": {"origin": "http://127.0.0.1:1"},
    "null-origin": {"origin": "null"},
    "rebinding": {"host": "evil.example"},
    "localhost-name": {"host": f"localhost:{PORT}"},
    "no-csrf": {"csrf": None},
    "wrong-csrf": {"csrf": "forged"},
    # what a page elsewhere can send without preflight: a form post, no custom header, its Origin
    "cross-site-form": {"form": "id=k3x9&scope=always", "csrf": None, "origin": "http://evil.example"},
    "form-with-csrf": {"form": "id=k3x9&scope=always"},
}


@pytest.mark.parametrize("path", ["/api/approve", "/api/deny"])
@pytest.mark.parametrize("attack", list(ATTACKS.values()), ids=list(ATTACKS))
def test_no_answer_gets_through_without_cookie_origin_host_and_csrf(
    client: TestClient, gateways: FakeGateways, path: str, attack: dict[str, Any]
) -> None:
    cookie, csrf = session(client)
    refused = send(client, "POST", path, **{"cookie": cookie, "csrf": csrf, "json_body": APPROVE, **attack})
    assert refused.status_code in (403, 415), refused.text
    assert_strict_headers(refused)
    assert gateways.answers == []
    # the control: the same answer, sent as the page sends it
    answered = send(client, "POST", path, cookie=cookie, csrf=csrf, json_body=APPROVE)
    assert answered.status_code == 200 and answered.json()["ok"] is True, answered.text
    op = path.removeprefix("/api/")
    said = {"op": op, "id": "k3x9", "via": "dashboard", **({"scope": "once"} if op == "approve" else {})}
    assert gateways.answers == [said]


APPROVE_CATALOG = {"server": "fs", "hash": "0f" * 32}


@pytest.mark.parametrize("attack", list(ATTACKS.values()), ids=list(ATTACKS))
def test_no_catalog_is_approved_without_cookie_origin_host_and_csrf(
    client: TestClient, gateways: FakeGateways, attack: dict[str, Any]
) -> None:
    cookie, csrf = session(client)
    sent = {"cookie": cookie, "csrf": csrf, "json_body": APPROVE_CATALOG, **attack}
    if "form" in attack:
        sent["form"] = f"server=fs&hash={'0f' * 32}"
    refused = send(client, "POST", "/api/approve-catalog", **sent)
    assert refused.status_code in (403, 415), refused.text
    assert_strict_headers(refused)
    assert gateways.answers == []
    # the control: the same approval, sent as the page sends it, bound to the hash it showed
    answered = send(client, "POST", "/api/approve-catalog", cookie=cookie, csrf=csrf, json_body=APPROVE_CATALOG)
    assert answered.status_code == 200 and answered.json() == {"ok": True, "message": answered.json()["message"]}
    assert gateways.answers == [{"op": "approve_catalog", "server": "fs", "hash": "0f" * 32}]


@pytest.mark.parametrize(
    "body",
    [
        {"server": "fs"},  # no hash: an approval not bound to what was shown
        {"server": "fs", "hash": ""},
        {"server": "fs", "hash": "0F" * 32},
        {"server": "fs", "hash": "0f" * 31},
        {"server": "fs", "hash": "0f" * 32 + "\n"},
        {"server": "fs", "hash": 7},
        {"server": "", "hash": "0f" * 32},
        {"hash": "0f" * 32},
    ],
)
def test_an_approval_of_a_catalog_must_carry_the_sha256_shown(
    client: TestClient, gateways: FakeGateways, body: dict[str, Any]
) -> None:
    cookie, csrf = session(client)
    refused = send(client, "POST", "/api/approve-catalog", cookie=cookie, csrf=csrf, json_body=body)
    assert refused.status_code == 400 and gateways.answers == []
    assert_strict_headers(refused)


@pytest.mark.parametrize(
    ("answered", "said"),
    [
        (Answered(True, 1), "approved the catalog of 'f\\u001bs' (sha256 0f0f0f0f0f0f…)"),
        (
            Answered(False, 1, ("7: the catalog held for 'fs' changed\x07",)),
            "gateway 7: the catalog held for 'fs' changed\\u0007",
        ),
        (Answered(False, 0), "no running gateway"),
        (Answered(False, 2), "no running gateway serves 'f\\u001bs'"),
    ],
)
def test_an_approval_of_a_catalog_is_told_in_the_words_of_the_cli(answered: Answered, said: str) -> None:
    assert catalog_answer_text("f\x1bs", "0f" * 32, answered) == said


def test_a_csrf_token_of_another_session_is_refused(client: TestClient, gateways: FakeGateways) -> None:
    cookie, _ = session(client)
    _, other_csrf = session(client)
    refused = send(client, "POST", "/api/approve", cookie=cookie, csrf=other_csrf, json_body=APPROVE)
    assert refused.status_code == 403 and gateways.answers == []


@pytest.mark.parametrize(
    "path",
    [
        "/api/approve?id=k3x9&scope=always",
        "/api/deny?id=k3x9",
        "/session",
        f"/api/approve-catalog?server=fs&hash={'a' * 64}",
    ],
)
def test_nothing_changes_on_get(client: TestClient, gateways: FakeGateways, path: str) -> None:
    cookie, csrf = session(client)
    refused = send(client, "GET", path, cookie=cookie, csrf=csrf)
    assert refused.status_code == 405 and gateways.answers == []
    assert_strict_headers(refused)


@pytest.mark.parametrize("host", ["evil.example", f"127.0.0.1:{PORT + 1}", "127.0.0.1", f"[::1]:{PORT}", ""])
@pytest.mark.parametrize("path", ["/", "/dashboard.js", "/nowhere"])
def test_a_rebinding_host_gets_not_even_the_page(client: TestClient, host: str, path: str) -> None:
    refused = send(client, "GET", path, host=host)
    assert refused.status_code == 403 and "Cellblock" not in refused.text
    assert_strict_headers(refused)
    assert send(client, "GET", "/").status_code == 200  # the control


def test_an_unknown_path_and_a_bad_answer_carry_the_headers(client: TestClient) -> None:
    cookie, csrf = session(client)
    missing = send(client, "GET", "/nowhere")
    bad = send(client, "POST", "/api/approve", cookie=cookie, csrf=csrf, json_body={"id": "k3x9", "scope": "ever"})
    assert missing.status_code == 404 and bad.status_code == 400
    for response in (missing, bad):
        assert_strict_headers(response)


def test_sessions_are_capped_the_oldest_going_first(client: TestClient) -> None:
    first = session(client)
    for _ in range(MAX_SESSIONS):
        session(client)
    cookie, csrf = first
    assert send(client, "GET", "/api/state", cookie=cookie, csrf=csrf).status_code == 403


@pytest.mark.parametrize(
    ("message", "answered", "said"),
    [
        ({"op": "approve", "id": "k3x9", "scope": "session"}, Answered(True, 1), "approved 'k3x9' for this session"),
        ({"op": "deny", "id": "k3x9"}, Answered(True, 2), "denied 'k3x9'"),
        ({"op": "deny", "id": "k\x1b"}, Answered(False, 1), "no pending approval 'k\\u001b'"),
        ({"op": "deny", "id": "k"}, Answered(False, 0), "no running gateway"),
        ({"op": "approve", "id": "k"}, Answered(False, 1, ("7: nope\x07",)), "gateway 7: nope\\u0007"),
    ],
)
def test_an_answer_is_told_in_the_words_of_the_cli(message: dict[str, Any], answered: Answered, said: str) -> None:
    assert answer_text(message, answered).startswith(said)


@pytest.mark.anyio
async def test_a_body_past_the_limit_is_refused_before_it_is_read_whole(gateways: FakeGateways) -> None:
    """Any local process may send here with any Origin: what it sends is read no further than the
    limit (the app called as the server calls it, its body given a kilobyte at a time)."""
    app = create_app(PORT, SECRET, gateways)
    given: list[int] = []

    async def receive() -> dict[str, Any]:
        given.append(1)
        if len(given) == 1:
            return {"type": "http.request", "body": b'{"secret": "', "more_body": True}
        return {"type": "http.request", "body": b"x" * 1024, "more_body": len(given) < 10_000}  # 10 MB in all

    said: list[dict[str, Any]] = []

    async def send_message(message: dict[str, Any]) -> None:
        said.append(message)

    headers = [(b"host", f"127.0.0.1:{PORT}".encode()), (b"origin", ORIGIN.encode())]
    headers += [(b"content-type", b"application/json")]
    scope = {"type": "http", "method": "POST", "path": "/session", "raw_path": b"/session", "query_string": b""}
    scope |= {"headers": headers, "http_version": "1.1", "scheme": "http", "server": ("127.0.0.1", PORT)}
    await app(scope, receive, send_message)
    assert said[0]["status"] == 413
    assert len(given) < 10, f"{len(given)} KiB were read"
    assert gateways.answers == []


def test_a_page_opened_from_an_approval_link_gets_its_session_from_the_cookie_alone(client: TestClient) -> None:
    cookie, csrf = session(client)
    resumed = send(client, "POST", "/session", cookie=cookie, json_body={})
    assert resumed.status_code == 200 and resumed.json() == {"csrf": csrf} and "set-cookie" not in resumed.headers
    assert_strict_headers(resumed)


@pytest.mark.parametrize(
    "attack",
    [
        {"cookie": None},
        {"cookie": "forged"},
        {"origin": None},
        {"origin": "http://127.0.0.1:1"},  # another local web server: the browser sends it our cookie
        {"origin": "http://evil.example"},
        {"host": "evil.example"},
        {"form": "x=1"},
    ],
    ids=["no-cookie", "wrong-cookie", "no-origin", "other-port", "cross-origin", "rebinding", "form-post"],
)
def test_the_cookie_alone_opens_no_session_from_anywhere_else(client: TestClient, attack: dict[str, Any]) -> None:
    cookie, csrf = session(client)
    refused = send(client, "POST", "/session", **{"cookie": cookie, "json_body": {}, **attack})
    assert refused.status_code in (403, 415) and csrf not in refused.text and "set-cookie" not in refused.headers
    assert_strict_headers(refused)
    # the control: the page's own request, from the dashboard's origin with its cookie
    assert send(client, "POST", "/session", cookie=cookie, json_body={}).json() == {"csrf": csrf}


def test_a_gateway_links_an_approval_to_the_running_dashboard_only(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    run = tmp_path / "run"
    run.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(run))
    assert approval_link("k3x9abcd") is None  # no dashboard runs
    published = publish_dashboard(PORT)
    assert published is not None and published.stat().st_mode & 0o777 == 0o600
    assert approval_link("k3x9abcd") == f"http://127.0.0.1:{PORT}/#approval=k3x9abcd"
    assert SECRET not in published.read_text()
    # a dashboard that died without taking its address back gives no link
    gone = subprocess.Popen(["true"])
    gone.wait()
    published.write_text(json.dumps({"pid": gone.pid, "port": PORT}))
    assert approval_link("k3x9abcd") is None
    # another dashboard's address is not taken back by this one; its own is
    published.write_text(json.dumps({"pid": os.getpid() + 1_000_000, "port": PORT}))
    withdraw_dashboard(published)
    assert published.exists()
    publish_dashboard(PORT)
    withdraw_dashboard(published)
    assert not published.exists() and approval_link("k3x9abcd") is None
