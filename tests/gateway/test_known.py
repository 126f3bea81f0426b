"""The table of known servers (data, shipped in the package) and what wrap makes of it."""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError

from cellblock.gateway.config.known import DATA_FILE, KNOWN_HOSTS, WORKS_IN, KnownServer, known_servers
from cellblock.gateway.config.starter import starter
from cellblock.policy.hosts import parse_rule
from tests.gateway.test_starter import Entry


def test_the_table_is_read_from_the_package_and_every_host_in_it_is_a_valid_rule() -> None:
    table = known_servers()
    assert table["@upstash/context7-mcp"].hosts == ("context7.com",)
    assert table["@wonderwhy-er/desktop-commander"].install_hosts == ("storage.googleapis.com",)
    for known in table.values():
        for host in (*known.hosts, *known.install_hosts, *known.browser_hosts):
            parse_rule(host)
        assert bool(known.install_hosts) == bool(known.install_why)  # a host an install reaches says why
    # what the code used before the table came from it
    assert KNOWN_HOSTS["@notionhq/notion-mcp-server"] == ("the Notion API", ("api.notion.com",))
    assert DATA_FILE["@modelcontextprotocol/server-memory"][0] == "MEMORY_FILE_PATH"
    assert frozenset({"mcp-server-git"}) == WORKS_IN


@pytest.mark.parametrize(
    "entry",
    [{"hosts": ["*"]}, {"install_hosts": ["https://x.example/"]}, {"talks_to": "x", "hostz": ["a.example"]}],
)
def test_a_table_entry_that_is_not_valid_is_refused_when_read(entry: dict[str, object]) -> None:
    with pytest.raises(ValidationError):
        KnownServer.model_validate(entry)


def test_wrap_gives_context7_its_api_host(tmp_path: Path) -> None:
    entry = Entry(command="npx", args=("-y", "@upstash/context7-mcp"))
    result = starter("context7", entry, taken=set(), home=str(tmp_path))
    assert result.config["jail"] == {"network": "allowlist", "allow_hosts": ["context7.com"]}
    assert result.config["install"] == {"npm": "@upstash/context7-mcp"}
