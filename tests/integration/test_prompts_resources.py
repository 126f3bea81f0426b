"""The lock and the policy on prompts and resources, through the gateway and the probe server.

A held prompt, resource or template cannot be got, read or completed until `cellblock approve`;
`prompts:` and `resources:` rules decide as tool rules do, with the server's tools default when
they give none; `ask` goes through the same approvals (form and CLI) as a tool call.

The gateway runs in memory (tests/harness.py): `cellblock approve SERVER` changes the lock in the
state dir, which the running gateway rereads. The test where `cellblock pending`, `approve ID` and
`deny` reach the gateway through its control socket runs `cellblock serve`.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import anyio
import mcp.types as types
import pytest
from mcp.shared.exceptions import MCPError
from mcp_types import SERVER_INFO_META_KEY

from tests.harness import build, connected
from tests.integration.conftest import eventually, gateway, probe_server, write_config
from tests.integration.test_approvals import Human, cli, pending_ids

pytestmark = pytest.mark.anyio

README = "cellblock://p/probe://static/readme"
ITEM = "cellblock://p/probe://item/7"
GREET = types.PromptReference(type="ref/prompt", name="p__greet")
ITEM_TEMPLATE = types.ResourceTemplateReference(type="ref/resource", uri="cellblock://p/probe://item/{id}")


def events(state: Path) -> list[dict[str, Any]]:
    path = state / "audit.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def decisions(state: Path) -> list[tuple[str, str, str]]:
    return [(e["tool"], e["decision"], e["rule"]) for e in events(state) if e["event"] == "call"]


async def refused(attempt: Any) -> str:
    with pytest.raises(MCPError) as caught:
        await attempt
    return str(caught.value)


async def test_a_first_contact_catalog_holds_its_prompts_resources_and_templates_until_approved(
    tmp_path: Path,
) -> None:
    state = tmp_path / "state"
    server = probe_server("--name", "p", lock={"enabled": True, "first": "review"}, tools={"default": "allow"})
    config = write_config(tmp_path, {"p": server})
    async with connected(build(config, state)) as client:
        assert not (await client.list_prompts()).prompts and not (await client.list_resources()).resources
        for attempt in (
            client.get_prompt("p__greet", {"name": "Ada"}),
            client.read_resource(README),
            client.read_resource(ITEM),
            client.complete(GREET, {"name": "name", "value": "al"}),
            client.complete(ITEM_TEMPLATE, {"name": "id", "value": "1"}),
        ):
            why = await refused(attempt)
            assert "of server 'p' is new or changed" in why and "cellblock approve p" in why, why
        # control: the same get, read and completion once the human approved the catalog
        approved = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "approve", "p", "--config", str(config)))
        assert approved.returncode == 0, approved.stderr

        async def listed() -> bool:
            return "p__greet" in {p.name for p in (await client.list_prompts()).prompts}

        await eventually(listed)  # the gateway rereads the lock file the CLI wrote
        assert "Ada" in str((await client.get_prompt("p__greet", {"name": "Ada"})).messages[0].content)
        assert "readme" in str((await client.read_resource(README)).contents[0])
        assert "item 7" in str((await client.read_resource(ITEM)).contents[0])
        assert (await client.complete(GREET, {"name": "name", "value": "al"})).completion.values == ["alice", "albert"]
    held = [d for d in decisions(state) if d[2] == "lock"]
    assert ("prompt:greet", "deny", "lock") in held and ("resource:probe://static/readme", "deny", "lock") in held
    assert ("prompt:greet", "allow", "default") in decisions(state)


async def test_a_resource_added_after_approval_cannot_be_read_until_approved(tmp_path: Path) -> None:
    state = tmp_path / "state"
    server = probe_server("--name", "p", lock={"enabled": True, "first": "trust"}, tools={"default": "allow"})
    config = write_config(tmp_path, {"p": server})
    new = "cellblock://p/probe://new/note"
    async with connected(build(config, state)) as client:
        added = await client.call_tool("p__add_resource", {"uri": "probe://new/note", "text": "new content"})
        assert not added.is_error
        # the gateway reviews the changed catalog when the server announces it
        await eventually(
            lambda: any(
                "resource:probe://new/note" in e.get("items", []) for e in events(state) if e["event"] == "lock_changed"
            )
        )
        assert new not in {str(r.uri) for r in (await client.list_resources()).resources}
        why = await refused(client.read_resource(new))
        assert why.startswith("refused: lock: resource 'probe://new/note' of server 'p'") and "approve p" in why
        assert "new content" not in why
        assert "readme" in str((await client.read_resource(README)).contents[0])  # the approved rest reads on
        # control: after the approval the same read returns the content
        approved = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "approve", "p", "--config", str(config)))
        assert approved.returncode == 0, approved.stderr

        async def listed() -> bool:
            return new in {str(r.uri) for r in (await client.list_resources()).resources}

        await eventually(listed)  # the gateway rereads the lock file the CLI wrote
        read = await client.read_resource(new)
        assert [getattr(c, "text", None) for c in read.contents] == ["new content"]
    assert ("resource:probe://new/note", "deny", "lock") in decisions(state)
    assert ("resource:probe://new/note", "allow", "default") in decisions(state)


DENY_TOOLS = {"default": "deny", "rules": {"echo": "allow"}}


@pytest.fixture(scope="module")
def anyio_backend() -> str:
    return "asyncio"


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_under_a_deny_tools_default_prompts_and_resources_are_unlisted_and_refused(
    tmp_path: Path, mode: str
) -> None:
    state = tmp_path / "state"
    config = write_config(tmp_path, {"p": probe_server("--name", "p", tools=DENY_TOOLS)})
    async with connected(build(config, state), mode=mode) as client:
        assert not (await client.list_prompts()).prompts
        assert not (await client.list_resources()).resources
        assert not (await client.list_resource_templates()).resource_templates
        why = await refused(client.get_prompt("p__greet", {"name": "Ada"}))
        assert why == "denied by policy: default: prompt 'greet' matches no rule and the default denies it"
        why = await refused(client.read_resource(README))
        assert why.startswith("denied by policy: default: resource 'probe://static/readme'")
        assert "denied" in await refused(client.read_resource(ITEM))
        assert "denied" in await refused(client.complete(GREET, {"name": "name", "value": "al"}))
    assert ("prompt:greet", "deny", "default") in decisions(state)
    assert ("resource:probe://item/7", "deny", "default") in decisions(state)


async def test_allow_rules_let_a_prompt_and_a_resource_through_a_deny_default(tmp_path: Path) -> None:
    """The control of the test above: the same server, the same gets and reads, with rules that allow them."""
    state = tmp_path / "state"
    server = probe_server(
        "--name",
        "p",
        tools=DENY_TOOLS,
        prompts={"rules": {"greet": {"decision": "allow", "args": {"name": {"one_of": ["Ada"]}}}}},
        resources={"rules": {"probe://static/*": "allow"}},
    )
    async with connected(build(write_config(tmp_path, {"p": server}), state)) as client:
        assert [p.name for p in (await client.list_prompts()).prompts] == ["p__greet"]
        assert [str(r.uri) for r in (await client.list_resources()).resources] == [README]
        assert not (await client.list_resource_templates()).resource_templates  # probe://item/{id} stays denied
        assert "Ada" in str((await client.get_prompt("p__greet", {"name": "Ada"})).messages[0].content)
        assert "readme" in str((await client.read_resource(README)).contents[0])
        # the prompt's argument constraint is the tool rules' own check
        why = await refused(client.get_prompt("p__greet", {"name": "Mallory"}))
        assert why.startswith("denied by policy: greet: argument 'name' 'Mallory' is not one of 'Ada'")
        assert "denied" in await refused(client.read_resource(ITEM))
    assert ("prompt:greet", "allow", "greet") in decisions(state)
    assert ("resource:probe://static/readme", "allow", "probe://static/*") in decisions(state)


async def test_a_uri_no_listed_item_covers_is_refused_unless_a_rule_names_it(tmp_path: Path) -> None:
    state = tmp_path / "state"
    open_server = probe_server("--name", "p")  # tools (so prompts and resources) default allow
    async with connected(build(write_config(tmp_path, {"p": open_server}), state)) as client:
        why = await refused(client.read_resource("cellblock://p/probe://elsewhere/secret"))
        assert "not in its catalog" in why and "servers.p.resources.rules" in why
    assert ("resource:probe://elsewhere/secret", "deny", "route") in decisions(state)
    # control: a rule that names the URI lets the read reach the server (which has no such resource)
    named = probe_server("--name", "p", resources={"rules": {"probe://elsewhere/*": "allow"}})
    async with connected(build(write_config(tmp_path, {"p": named}), state)) as client:
        why = await refused(client.read_resource("cellblock://p/probe://elsewhere/secret"))
        assert "not in its catalog" not in why and "Unknown resource" in why, why
    assert ("resource:probe://elsewhere/secret", "allow", "probe://elsewhere/*") in decisions(state)


ASK_ITEMS = {
    "tools": {"default": "deny"},
    "prompts": {"rules": {"greet": "ask"}},
    "resources": {"rules": {"probe://static/readme": "ask"}},
}


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_ask_puts_a_get_and_a_read_to_the_human_in_the_clients_form(tmp_path: Path, mode: str) -> None:
    human = Human("allow_once")
    server = probe_server("--name", "p", **ASK_ITEMS)
    state = tmp_path / "state"
    async with connected(
        build(write_config(tmp_path, {"p": server}), state), mode=mode, elicitation_callback=human
    ) as client:
        assert "Ada" in str((await client.get_prompt("p__greet", {"name": "Ada"})).messages[0].content)
        assert "readme" in str((await client.read_resource(README)).contents[0])
        human.decision = "deny"
        assert "did not get it" in await refused(client.read_resource(README))
    prompt_form, read_form, _ = human.asked
    assert prompt_form.startswith("Cellblock approval · server 'p' · ") and prompt_form.split("\n")[0].endswith(
        ' · prompt "greet"'
    )
    assert "May the client get this prompt" in prompt_form and '"name": "Ada"' in prompt_form
    assert read_form.split("\n")[0].endswith(' · resource "probe://static/readme"')
    assert "May the client read this resource" in read_form
    asked = [e["tool"] for e in events(state) if e["event"] == "approval_asked"]
    assert asked == ["prompt:greet", "resource:probe://static/readme", "resource:probe://static/readme"]


async def test_ask_without_a_form_waits_for_the_cli_which_shows_what_is_read(tmp_path: Path) -> None:
    (tmp_path / "run").mkdir(mode=0o700)
    server = probe_server("--name", "p", **ASK_ITEMS)
    config = write_config(tmp_path, {"p": server}, approvals={"timeout": 30})
    reads: list[Any] = []
    async with gateway(config, tmp_path / "state", env={"XDG_RUNTIME_DIR": str(tmp_path / "run")}) as client:

        async def read() -> None:
            try:
                reads.append(await client.read_resource(README))
            except MCPError as exc:
                reads.append(exc)

        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            [ident] = await pending_ids(tmp_path, 1)
            table = (await anyio.to_thread.run_sync(lambda: cli(tmp_path, "pending"))).stdout.splitlines()
            assert table[1].split("\t")[2] == "resource probe://static/readme", table
            full = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "pending", "--full", ident))
            assert full.stdout.split("\n")[0].endswith(' · resource "probe://static/readme"'), full.stdout
            approved = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "approve", ident, "--config", str(config)))
            assert approved.returncode == 0, approved.stderr
        assert "readme" in str(reads[0].contents[0])

        # the hostile half: the same read, denied from the CLI, returns nothing of the resource
        async with anyio.create_task_group() as tg:
            tg.start_soon(read)
            [ident] = await pending_ids(tmp_path, 1)
            denied = await anyio.to_thread.run_sync(lambda: cli(tmp_path, "deny", ident))
            assert denied.returncode == 0, denied.stderr
    assert isinstance(reads[1], MCPError) and "denied from the CLI" in str(reads[1])
    assert "Probe readme" not in str(reads[1])


@pytest.mark.parametrize("mode", ["legacy", "auto"])
async def test_a_get_a_read_and_a_completion_carry_the_gateways_server_info_not_the_servers(
    tmp_path: Path, mode: str
) -> None:
    """A 2026-07-28 server stamps its own `serverInfo` on every result: the gateway drops it, as for a
    tool call, so a 2026-07-28 client sees the gateway's stamp and a handshake-era one none."""
    config = write_config(tmp_path, {"p": probe_server("--name", "p")})
    async with connected(build(config, tmp_path / "state"), mode=mode) as c:
        results = [
            await c.get_prompt("p__greet", {"name": "Ada"}),
            await c.read_resource(README),
            await c.complete(GREET, {"name": "name", "value": "al"}),
        ]
        for result in results:
            stamp = (result.meta or {}).get(SERVER_INFO_META_KEY)
            assert stamp is None or stamp["name"] == "cellblock", (type(result).__name__, stamp)
