"""Opening answers from the last start (`gateway/wire/early.py`): what is answered, what stops the
answering, what is handed over, and what the fingerprint covers."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from cellblock.gateway.wire.early import (
    MAX_ANSWERS,
    RECORD,
    Early,
    EarlyAnswers,
    fingerprint,
    load_answers,
    request_key,
)

HELLO = {"protocolVersion": "2025-11-25", "capabilities": {}, "clientInfo": {"name": "t", "version": "1"}}
ANSWERS = {
    request_key("initialize", HELLO): '{"protocolVersion":"2025-11-25","serverInfo":{"name":"cellblock"}}',
    request_key("tools/list", {}, "t"): '{"tools":[{"name":"a__echo"}]}',
}


def line(ident: Any, method: str, params: Any = None) -> bytes:
    message: dict[str, Any] = {"jsonrpc": "2.0", "method": method}
    if ident is not None:
        message["id"] = ident
    if params is not None:
        message["params"] = params
    return json.dumps(message).encode() + b"\n"


class Pipes:
    """An `EarlyAnswers` between two pipes, as between the client and the gateway."""

    def __init__(self, answers: dict[str | None, str] = ANSWERS) -> None:
        self.client_out, self.gateway_in = os.pipe()
        self.gateway_out, self.client_in = os.pipe()
        self.early = EarlyAnswers({k: v for k, v in answers.items() if k is not None}, self.client_out, self.client_in)
        self.early.start()

    def send(self, data: bytes) -> None:
        os.write(self.gateway_in, data)

    def answers(self, count: int) -> list[dict[str, Any]]:
        got = b""
        while got.count(b"\n") < count:
            got += os.read(self.gateway_out, 65536)
        return [json.loads(x) for x in got.splitlines()]

    def ended_by_itself(self) -> bool:
        self.early._thread.join(10)
        return not self.early._thread.is_alive()

    def stop(self) -> tuple[Any, bytes]:
        """The handover, and all the client sent: what the thread read, then what it left in the pipe."""
        handover = self.early.stop()
        assert _unread(self.gateway_out) == b"", "answered more than expected"
        sent = handover.data + _unread(self.client_out)
        for fd in (self.client_out, self.gateway_in, self.gateway_out, self.client_in):
            os.close(fd)
        return handover, sent


def _unread(fd: int) -> bytes:
    os.set_blocking(fd, False)
    data = b""
    try:
        while chunk := os.read(fd, 65536):
            data += chunk
    except BlockingIOError:
        pass
    return data


def test_the_recorded_opening_is_answered_and_everything_read_is_handed_over() -> None:
    pipes = Pipes()
    sent = line(1, "initialize", HELLO) + line(None, "notifications/initialized") + line(2, "tools/list", {})
    pipes.send(sent)
    first, second = pipes.answers(2)
    assert first == {"jsonrpc": "2.0", "id": 1, "result": json.loads(ANSWERS[request_key("initialize", HELLO)])}
    assert second["id"] == 2 and second["result"] == {"tools": [{"name": "a__echo"}]}
    call = line(3, "tools/call", {"name": "a__echo", "arguments": {}})
    pipes.send(call + b'{"jsonrpc":"2.0","id":4,"method":"tools/li')  # and half a line
    assert pipes.ended_by_itself()
    handover, received = pipes.stop()
    assert received == sent + call + b'{"jsonrpc":"2.0","id":4,"method":"tools/li'  # nothing lost, in order
    assert handover.data.startswith(sent)  # the answered lines are handed over, to be answered again
    assert set(handover.served) == {1, 2}
    assert handover.served[2] == (request_key("tools/list", {}, "t"), ANSWERS[request_key("tools/list", {}, "t")])


@pytest.mark.parametrize(
    "stopper",
    [
        line(1, "tools/call", {"name": "a__echo"}),  # a call is always the gateway's
        line(1, "initialize", {**HELLO, "clientInfo": {"name": "other", "version": "1"}}),  # not recorded
        line(1, "tools/list", {"cursor": "2"}),  # a later page
        line(None, "notifications/cancelled", {"requestId": 1}),
        line(True, "tools/list", {}),  # not a valid id
        b"not json\n",
        b'["a", "batch"]\n',
        b'{"id": 1, "method": "tools/list"}\n',  # not JSON-RPC 2.0
    ],
)
def test_anything_else_stops_the_answering_and_waits_for_the_gateway(stopper: bytes) -> None:
    pipes = Pipes()
    after = line(2, "tools/list", {})  # recorded, but behind something that is not
    pipes.send(stopper + after)
    assert pipes.ended_by_itself()
    handover, received = pipes.stop()
    assert received == stopper + after
    assert handover.served == {}


@pytest.mark.parametrize("again", [7, 8])
def test_a_request_is_answered_early_once_and_its_repeat_waits_for_the_gateway(again: int) -> None:
    """The same id again is a client's mistake, and the same request under a new id a client
    listing again: either is the gateway's to answer."""
    pipes = Pipes()
    opening = line(1, "initialize", HELLO) + line(7, "tools/list", {})
    pipes.send(opening)
    pipes.answers(2)
    pipes.send(line(again, "tools/list", {}))
    assert pipes.ended_by_itself()
    handover, received = pipes.stop()
    assert list(handover.served) == [1, 7] and received == opening + line(again, "tools/list", {})


def test_a_handshake_era_list_is_answered_only_for_the_client_that_opened_with_its_name() -> None:
    """What a list holds may depend on who asks (`catalog.search: auto`): the record holds the
    list `t` got, and another client's list, after its own recorded handshake, waits for the gateway."""
    other = {**HELLO, "clientInfo": {"name": "u", "version": "1"}}
    pipes = Pipes({**ANSWERS, request_key("initialize", other): ANSWERS[request_key("initialize", HELLO)]})
    opening = line(1, "initialize", other) + line(2, "tools/list", {})
    pipes.send(opening)
    [hello] = pipes.answers(1)
    assert hello["id"] == 1 and pipes.ended_by_itself()
    handover, received = pipes.stop()
    assert list(handover.served) == [1] and received == opening
    # the control: `t`, whose list it is, is answered it
    pipes = Pipes()
    pipes.send(line(1, "initialize", HELLO) + line(2, "tools/list", {}))
    assert [a["result"] for a in pipes.answers(2)][1] == {"tools": [{"name": "a__echo"}]}
    pipes.stop()


def test_stop_returns_at_once_when_the_client_sends_nothing() -> None:
    pipes = Pipes()
    pipes.early._thread.join(0.2)
    assert pipes.early._thread.is_alive()  # waiting for the client
    done = threading.Event()
    threading.Thread(target=lambda: (pipes.stop(), done.set()), daemon=True).start()
    assert done.wait(10)


def test_a_client_that_leaves_ends_the_answering(tmp_path: Path) -> None:
    pipes = Pipes()
    pipes.send(line(1, "initialize", HELLO))
    pipes.answers(1)
    os.close(pipes.gateway_in)
    pipes.gateway_in = os.open(os.devnull, os.O_WRONLY)  # so that stop() has something to close
    assert pipes.ended_by_itself()
    handover, received = pipes.stop()
    assert handover.data == received == line(1, "initialize", HELLO)


# -- the fingerprint and the record -----------------------------------------------------------


def setup_state(tmp_path: Path) -> tuple[Path, Path]:
    config = tmp_path / "cellblock.yaml"
    config.write_text("version: 1\nservers: {}\n")
    state = tmp_path / "state"
    (state / "locks").mkdir(parents=True)
    (state / "locks" / "a.json").write_text('{"server": "a"}')
    (state / "catalogs").mkdir()
    return config, state


def test_the_fingerprint_follows_what_the_answers_depend_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    config, state = setup_state(tmp_path)
    monkeypatch.delenv("CELLBLOCK_EXTRA", raising=False)
    base = fingerprint(config, state)
    assert base is not None and fingerprint(config, state) == base
    # what the opening answers do not depend on
    (state / "audit.jsonl").write_text("{}\n")
    (state / RECORD).write_text("{}")
    (state / "approvals.json").write_text("{}")
    monkeypatch.setenv("SOME_OTHER_VARIABLE", "x")
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", "/elsewhere")  # the files it holds count, not its name
    assert fingerprint(config, state) == base

    changes = [
        lambda: config.write_text("version: 1\nservers: {}\n# edited\n"),
        lambda: (state / "locks" / "a.json").write_text('{"server": "a", "changed": true}'),
        lambda: (state / "locks" / "b.pending.json").write_text("{}"),
        lambda: (state / "catalogs" / "c.json").write_text("{}"),
        lambda: monkeypatch.setenv("CELLBLOCK_EXTRA", "1"),
        lambda: monkeypatch.setenv("HOME", str(tmp_path)),
    ]
    seen = {base}
    for change in changes:
        change()
        now = fingerprint(config, state)
        assert now not in seen
        seen.add(now)


def test_no_config_no_fingerprint(tmp_path: Path) -> None:
    assert fingerprint(tmp_path / "missing.yaml", tmp_path) is None


def test_the_record_is_used_only_under_its_own_fingerprint(tmp_path: Path) -> None:
    config, state = setup_state(tmp_path)
    early = Early(state / RECORD, fingerprint(config, state), {})
    assert early.record("k", '{"a":1}') and not early.record("k", '{"a":1}')
    early.save()
    assert (state / RECORD).stat().st_mode & 0o777 == 0o600
    assert load_answers(state, fingerprint(config, state)) == {"k": '{"a":1}'}
    assert load_answers(state, "another") == {}
    assert load_answers(state, None) == {}
    for damaged in ("not json", "[]", '"a string"', "{}", '{"fingerprint": null}'):
        (state / RECORD).write_text(damaged)
        assert load_answers(state, fingerprint(config, state)) == {}
    (state / RECORD).write_text(json.dumps({"fingerprint": fingerprint(config, state), "answers": {"k": 1}}))
    assert load_answers(state, fingerprint(config, state)) == {}  # an answer must be JSON text


def test_the_record_keeps_the_latest_answers_of_clients_that_come_and_go(tmp_path: Path) -> None:
    config, state = setup_state(tmp_path)
    early = Early(state / RECORD, fingerprint(config, state), {})
    # each client that opens (its name and version in its initialize) adds its answers
    for n in range(MAX_ANSWERS * 3):
        early.record(request_key("initialize", {"clientInfo": {"name": f"client {n}", "version": "1"}}) or "", "{}")
    early.record(request_key("tools/list", {}, "client 0") or "", '{"tools":[]}')
    early.save()
    kept = load_answers(state, fingerprint(config, state))
    assert len(kept) == MAX_ANSWERS
    assert request_key("tools/list", {}, "client 0") in kept  # the latest answered stays
    assert request_key("initialize", {"clientInfo": {"name": "client 0", "version": "1"}}) not in kept


def test_nothing_is_saved_without_a_fingerprint(tmp_path: Path) -> None:
    _, state = setup_state(tmp_path)
    blind = Early(state / RECORD, None, {})
    assert not blind.record("k", "{}")
    blind.save()
    assert not (state / RECORD).exists()


def test_the_answers_start_before_the_sdk_pydantic_or_an_event_loop_is_loaded() -> None:
    """What `cellblock serve` imports up to `Early.begin` loads none of them: that is the head start."""
    code = (
        "import sys\n"
        "import cellblock.gateway.cli.main, cellblock.gateway.cli.serve, cellblock.gateway.wire.early\n"
        "import cellblock.gateway.state\n"
        "loaded = {m.split('.')[0] for m in sys.modules}\n"
        "print(sorted(loaded & {'mcp', 'mcp_types', 'pydantic', 'yaml', 'asyncio', 'anyio'}))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_the_fingerprint_covers_every_cellblock_module() -> None:
    import cellblock
    from cellblock.gateway.wire import early

    assert Path(cellblock.__file__).resolve().parent == early.CODE
