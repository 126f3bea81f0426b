"""`Pipeline.admit`: route, lock, policy and approval, each only refusing; every decision audited
before anything is forwarded, and a decision that cannot be audited is a refusal."""

from __future__ import annotations

import base64
import json
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import anyio
import anyio.lowlevel
import mcp.types as types
import pytest

from cellblock.gateway.audit.log import Audit
from cellblock.gateway.downstream.listing import Listing
from cellblock.gateway.serve.catalog import Catalog, build_catalog
from cellblock.gateway.serve.pipeline import Call, NotAdmitted, Pipeline
from cellblock.policy.rules import Policy, parse_rule_entry
from cellblock.policy.types import Decision, Verdict

pytestmark = pytest.mark.anyio

SCHEMA = {"type": "object", "properties": {}}
RULES = {"read": "allow", "delete": "deny", "write": "ask"}


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def decided(admit: Callable[[Call], Awaitable[None]], call: Call) -> types.CallToolResult | None:
    """What `admit` decided: None when the call goes on, else the refusal the client reads."""
    try:
        await admit(call)
    except NotAdmitted as refused:
        return refused.result
    return None


def text(result: types.CallToolResult | None) -> str:
    assert result is not None and result.is_error
    return " ".join(c.text for c in result.content if isinstance(c, types.TextContent))


def catalog(*tools: str, held: tuple[str, ...] = ()) -> Catalog:
    """The catalog of server `fs` offering `tools` and `held`, with the lock holding `held` back."""
    listed = Listing(tools=tuple(types.Tool(name=t, input_schema=SCHEMA) for t in tools))
    offered = Listing(tools=tuple(types.Tool(name=t, input_schema=SCHEMA) for t in (*tools, *held)))
    return build_catalog({"fs": listed}, separator="__", max_length=64, offered={"fs": offered})


class Human:
    """The approver: answers each `ask` with `decision`, and remembers the calls it was asked about."""

    def __init__(self, decision: Decision) -> None:
        self.decision = decision
        self.asked: list[str] = []

    async def __call__(self, call: Call) -> Verdict:
        self.asked.append(call.tool)
        return Verdict(self.decision, "approval:once" if self.decision is Decision.ALLOW else "write", "human")


def pipeline(
    audit: Audit, shown: Catalog, human: Human | None = None, reviewer: Any = None, unavailable: Any = None
) -> Pipeline:
    rules = tuple(parse_rule_entry(pattern, decision) for pattern, decision in RULES.items())
    return Pipeline(
        lambda: shown,
        unavailable or (lambda name: None),
        {"fs": Policy(default=Decision.DENY, rules=rules)},
        audit,
        approver=human or Human(Decision.DENY),
        reviewer=reviewer,
    )


def records(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def decisions(path: Path) -> list[tuple[str, str, str]]:
    return [(r["tool"], r["decision"], r["rule"]) for r in records(path) if r["event"] == "call"]


async def test_an_allowed_call_passes_with_its_route_and_its_allow_audited(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    call = Call("fs__read", {"path": "a"})
    assert await decided(pipeline(Audit(log), catalog("read")).admit, call) is None
    assert (call.server, call.tool) == ("fs", "read")
    assert decisions(log) == [("read", "allow", "read")]
    assert records(log)[0]["arguments"] == {"path": "a"}


async def test_a_denied_call_is_refused_by_the_policy_and_the_refusal_audited(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    refused = await decided(pipeline(Audit(log), catalog("delete")).admit, Call("fs__delete", None))
    assert text(refused).startswith("denied by policy: delete: ")
    assert decisions(log) == [("delete", "deny", "delete")]


@pytest.mark.parametrize(("answer", "passes"), [(Decision.ALLOW, True), (Decision.DENY, False)])
async def test_an_asked_call_passes_only_on_the_humans_allow(tmp_path: Path, answer: Decision, passes: bool) -> None:
    log, human = tmp_path / "audit.jsonl", Human(answer)
    refused = await decided(pipeline(Audit(log), catalog("write"), human).admit, Call("fs__write", None))
    assert human.asked == ["write"] and (refused is None) is passes
    assert decisions(log) == [("write", "allow" if passes else "deny", "approval:once" if passes else "write")]


async def test_an_allowed_or_denied_call_never_asks_the_human(tmp_path: Path) -> None:
    human = Human(Decision.ALLOW)
    admit = pipeline(Audit(tmp_path / "audit.jsonl"), catalog("read", "delete"), human).admit
    assert await decided(admit, Call("fs__read", None)) is None
    assert await decided(admit, Call("fs__delete", None)) is not None  # the approval cannot widen a deny
    assert human.asked == []


async def test_a_name_no_server_has_is_refused_as_unknown_or_with_why_its_server_is_missing(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    unknown = await decided(pipeline(Audit(log), catalog("read")).admit, Call("fs__nothing", None))
    assert text(unknown).startswith("refused: route: unknown tool 'fs__nothing'")
    why = pipeline(Audit(log), catalog(), unavailable=lambda name: "server 'fs' failed to start").admit
    assert text(await decided(why, Call("fs__read", None))) == "refused: route: server 'fs' failed to start"
    assert decisions(log) == [("fs__nothing", "deny", "route"), ("fs__read", "deny", "route")]


async def test_a_tool_the_lock_holds_is_refused_naming_the_review_unless_the_human_accepts_it_now(
    tmp_path: Path,
) -> None:
    log = tmp_path / "audit.jsonl"
    refused = await decided(pipeline(Audit(log), catalog("read", held=("write",))).admit, Call("fs__write", None))
    assert "new or changed since the server was approved" in text(refused) and "cellblock approve fs" in text(refused)
    assert decisions(log) == [("write", "deny", "lock")]

    shown = {"now": catalog("read", held=("read2",))}

    async def accept(call: Call) -> bool:
        shown["now"] = catalog("read", "read2")  # the human approved the changed catalog
        return True

    accepting = Pipeline(
        lambda: shown["now"],
        lambda name: None,
        {"fs": Policy(default=Decision.ALLOW)},
        Audit(log),
        approver=Human(Decision.DENY),
        reviewer=accept,
    )
    assert await decided(accepting.admit, Call("fs__read2", None)) is None


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="needs /dev/full")
async def test_a_call_whose_allow_cannot_be_audited_is_refused(tmp_path: Path) -> None:
    audit = Audit(Path("/dev/full"), key=tmp_path / "audit.key")
    refused = await decided(pipeline(audit, catalog("read")).admit, Call("fs__read", None))
    assert "cannot be written, and no call runs unrecorded" in text(refused)


async def test_a_call_whose_tool_changed_when_its_server_started_is_refused_by_the_recheck(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    shown = {"now": catalog("read")}
    checked = Pipeline(
        lambda: shown["now"],
        lambda name: None,
        {"fs": Policy(default=Decision.ALLOW)},
        Audit(log),
        Human(Decision.DENY),
    )
    call = Call("fs__read", None)
    assert await decided(checked.admit, call) is None
    checked.recheck(call)  # it still routes where it did
    shown["now"] = catalog(held=("read",))  # the server came up offering a changed 'read'
    with pytest.raises(NotAdmitted) as refused:
        checked.recheck(call)
    assert "changed when the server started" in text(refused.value.result)
    assert decisions(log) == [("read", "allow", "default"), ("read", "deny", "lock")]


def test_the_stages_run_in_the_order_the_design_names() -> None:
    stages = pipeline(Audit(Path("/nonexistent/audit.jsonl")), catalog("read")).stages
    assert [stage.__name__ for stage in stages] == [
        "_route",
        "_start",
        "_secrets",
        "_lock",
        "_policy",
        "_share",
        "_approval",
        "_record",
    ]


def now(path: Pipeline, call: Call) -> bool:
    """The fast path's decision: every stage lets the call on without waiting (`decide_now`)."""
    return all(path.decide_now(call, stage) for stage in path.stages)


@pytest.mark.parametrize(("tool", "held"), [("read", ()), ("write", ()), ("delete", ()), ("read", ("read",))])
async def test_the_fast_decision_takes_only_a_call_allowed_without_waiting_and_writes_nothing_else(
    tmp_path: Path, tool: str, held: tuple[str, ...]
) -> None:
    log, human = tmp_path / "audit.jsonl", Human(Decision.ALLOW)
    shown = catalog(*({"read", "write", "delete"} - set(held)), held=held)
    fast = now(pipeline(Audit(log), shown, human, reviewer=lambda call: None), Call(f"fs__{tool}", None))
    assert fast is (tool == "read" and not held) and human.asked == []
    assert decisions(log) == ([("read", "allow", "read")] if fast else [])


# -- secrets held for another server ---------------------------------------------------------------

TOKEN = "ghp_" + "Zq8" * 12


async def test_a_call_carrying_another_servers_secret_is_refused_by_name_and_never_fast(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    audit = Audit(log)
    audit.add_secret(TOKEN, "gh", "secret GITHUB_TOKEN (keyring entry 'gh-token')")
    path = pipeline(audit, catalog("read"))
    encoded = {"blob": base64.b64encode(f"x:{TOKEN}".encode()).decode()}
    assert not now(path, Call("fs__read", encoded))
    refused = await decided(path.admit, Call("fs__read", encoded))
    assert text(refused).startswith(
        "refused: secret: its arguments carry the secret GITHUB_TOKEN (keyring entry 'gh-token') of server 'gh'"
    )
    [record] = records(log)
    assert (record["decision"], record["rule"], record["held_for"]) == ("deny", "secret", ["gh"])
    assert record["carried"] == ["secret GITHUB_TOKEN (keyring entry 'gh-token')"]
    assert encoded["blob"][4:20] not in log.read_text()  # not even its base64: the record hides every form


async def test_a_servers_own_secret_passes_and_a_call_without_one_reads_nothing(tmp_path: Path) -> None:
    log = tmp_path / "audit.jsonl"
    audit = Audit(log)
    audit.add_secret(TOKEN, "fs", "secret TOKEN (keyring entry 'fs-token')")
    path = pipeline(audit, catalog("read"))
    assert now(path, Call("fs__read", {"path": TOKEN}))
    assert records(log)[0]["arguments"] == {"path": "[redacted]"}


def learning(audit: Audit, learn: Any) -> Pipeline:
    rules = tuple(parse_rule_entry(pattern, decision) for pattern, decision in RULES.items())
    return Pipeline(
        lambda: catalog("read"),
        lambda name: None,
        {"fs": Policy(default=Decision.ALLOW, rules=rules)},
        audit,
        approver=Human(Decision.DENY),
        learn=learn,
    )


async def test_a_decision_waits_for_the_one_reading_of_every_servers_credentials(tmp_path: Path) -> None:
    audit, learnt, began = Audit(tmp_path / "audit.jsonl"), [], anyio.Event()
    go = anyio.Event()

    async def learn() -> None:
        began.set()
        await go.wait()  # calls arrive meanwhile
        learnt.append(1)
        audit.add_secret(TOKEN, "gh", "secret GITHUB_TOKEN (keyring entry 'gh-token')")

    path = learning(audit, learn)
    assert not now(path, Call("fs__read", {"path": "a"}))  # not known yet: the SDK's path
    results: list[types.CallToolResult | None] = []

    async def admit(arguments: dict[str, Any]) -> None:
        results.append(await decided(path.admit, Call("fs__read", arguments)))

    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(path.learn_secrets)
            await began.wait()
            tg.start_soon(admit, {"path": TOKEN})
            tg.start_soon(admit, {"path": f"x{TOKEN}"})
            await anyio.wait_all_tasks_blocked()
            assert results == []  # both wait for the reading
            go.set()
    assert learnt == [1] and all(r is not None and r.is_error for r in results)
    await path.learn_secrets()
    assert learnt == [1]  # once
    assert now(path, Call("fs__read", {"path": "a"}))  # known now: the fast path decides


async def test_a_keyring_that_never_answers_refuses_the_call_at_its_deadline(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A locked keyring whose prompt nobody answers: the call is refused with what to do, never let
    through unchecked, and never held for good."""
    monkeypatch.setattr("cellblock.gateway.serve.pipeline.KEYRING_SECONDS", 0.05)
    log = tmp_path / "audit.jsonl"
    path = learning(Audit(log), anyio.sleep_forever)
    with anyio.fail_after(5):
        async with anyio.create_task_group() as tg:
            tg.start_soon(path.learn_secrets)
            refused = await decided(path.admit, Call("fs__read", {"path": "a"}))
            tg.cancel_scope.cancel()
    assert "did not give Cellblock the secrets it holds within 0.05 s (is it locked?)" in text(refused)
    assert decisions(log) == [("read", "deny", "secret")]


async def test_a_keyring_that_fails_refuses_every_call_and_lets_none_through(tmp_path: Path) -> None:
    async def broken() -> None:
        raise RuntimeError("the bus went away")

    log = tmp_path / "audit.jsonl"
    path = learning(Audit(log), broken)
    await path.learn_secrets()
    assert not now(path, Call("fs__read", {"path": "a"}))
    refused = await decided(path.admit, Call("fs__read", {"path": "a"}))
    assert "could not read the secrets it holds from the keyring (RuntimeError)" in text(refused)
    assert decisions(log) == [("read", "deny", "secret")]
