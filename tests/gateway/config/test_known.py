"""The table of known servers (data, shipped in the package) and what wrap makes of it."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from pydantic import ValidationError

from cellblock.gateway.config.known import DATA_FILE, KNOWN_HOSTS, WORKS_IN, KnownServer, known_servers
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import ConfigError, LocalServer
from cellblock.gateway.config.starter import starter
from cellblock.policy.hosts import parse_rule
from tests.gateway.config.test_starter import Entry


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


def test_wrap_lets_a_known_install_reach_the_hosts_its_scripts_download_from(tmp_path: Path) -> None:
    entry = Entry(command="npx", args=("-y", "@wonderwhy-er/desktop-commander@0.2.52"))
    result = starter("desktop-commander", entry, taken=set(), home=str(tmp_path))
    assert result.config["install"] == {
        "npm": "@wonderwhy-er/desktop-commander@0.2.52",
        "hosts": ["storage.googleapis.com"],
    }
    note = next(n for n in result.notes if n.startswith("install.hosts: storage.googleapis.com"))
    assert "puppeteer" in note and "install.scripts: false" in note
    parse_config(yaml.safe_dump({"version": 1, "servers": {result.name: result.config}}))


def test_wrap_gives_context7_its_api_host_and_an_unknown_install_no_hosts(tmp_path: Path) -> None:
    entry = Entry(command="npx", args=("-y", "@upstash/context7-mcp"))
    result = starter("context7", entry, taken=set(), home=str(tmp_path))
    assert result.config["jail"] == {"network": "allowlist", "allow_hosts": ["context7.com"]}
    assert result.config["install"] == {"npm": "@upstash/context7-mcp"}


def test_wrap_gives_a_server_that_reads_package_registries_those_registries_and_its_own_index(
    tmp_path: Path,
) -> None:
    entry = Entry(command="uvx", args=("pypi-query-mcp-server",))
    result = starter("pypi", entry, taken=set(), home=str(tmp_path))
    assert result.config["jail"] == {"network": "allowlist", "allow_hosts": ["pypi.org", "pypistats.org"]}
    assert result.config["install"] == {"pypi": "pypi-query-mcp-server"}  # its name is no token
    # pointed at a private index, it gets that index instead
    mirror = Entry(
        command="uvx", args=("pypi-query-mcp-server",), env={"PYPI_INDEX_URL": "https://pypi.corp.example/pypi"}
    )
    result = starter("pypi", mirror, taken=set(), home=str(tmp_path))
    assert result.config["jail"] == {"network": "allowlist", "allow_hosts": ["pypi.corp.example"]}


def test_install_hosts_and_scripts_are_read_and_a_bad_host_is_refused_naming_it() -> None:
    install = "{npm: pkg, hosts: [cdn.example, '127.0.0.1:8080'], scripts: false}"
    text = f"version: 1\nservers:\n  a:\n    install: {install}\n"
    server = parse_config(text).servers["a"]
    assert isinstance(server, LocalServer) and server.install is not None
    assert server.install.hosts == ["cdn.example", "127.0.0.1:8080"] and server.install.scripts is False
    with pytest.raises(ConfigError, match=r"servers\.a\.install\.hosts.*scheme"):
        parse_config(text.replace("cdn.example", "'https://cdn.example'"))


def test_wrap_lets_an_install_reach_the_download_host_its_entry_names_and_gives_it_the_variable(
    tmp_path: Path,
) -> None:
    mirror = "http://192.0.2.9:8080/chrome-for-testing"  # a mirror of the user's own, on an address
    env = {"PUPPETEER_CHROME_DOWNLOAD_BASE_URL": mirror, "LOG_LEVEL": "info"}
    entry = Entry(command="npx", args=("-y", "@wonderwhy-er/desktop-commander@0.2.52"), env=env)
    result = starter("desktop-commander", entry, taken=set(), home=str(tmp_path))
    assert result.config["install"] == {
        "npm": "@wonderwhy-er/desktop-commander@0.2.52",
        "hosts": ["storage.googleapis.com", "192.0.2.9:8080"],
        "env": {"PUPPETEER_CHROME_DOWNLOAD_BASE_URL": mirror},  # that variable alone
    }
    assert result.config["env"] == env  # the server keeps its environment as it was
    note = next(n for n in result.notes if n.startswith("install.hosts: 192.0.2.9:8080 and install.env"))
    assert "PUPPETEER_CHROME_DOWNLOAD_BASE_URL (puppeteer" in note and "install.scripts: false" in note
    [server] = parse_config(yaml.safe_dump({"version": 1, "servers": {result.name: result.config}})).servers.values()
    assert isinstance(server, LocalServer) and server.install is not None
    assert server.install.env == {"PUPPETEER_CHROME_DOWNLOAD_BASE_URL": mirror}


@pytest.mark.parametrize("value", ["", "storage.example.org", "file:///tmp/chrome", "http://h.example:0x50/"])
def test_a_download_variable_that_names_no_host_changes_nothing_of_the_install(tmp_path: Path, value: str) -> None:
    entry = Entry(command="npx", args=("-y", "pkg-with-puppeteer@1.0.0"), env={"PUPPETEER_DOWNLOAD_BASE_URL": value})
    result = starter("p", entry, taken=set(), home=str(tmp_path))
    assert result.config["install"] == {"npm": "pkg-with-puppeteer@1.0.0"}


def test_install_env_takes_variable_names_only() -> None:
    bad = {"version": 1, "servers": {"p": {"install": {"npm": "p@1.0.0", "env": {"A=B": "x"}}}}}
    with pytest.raises(ConfigError, match="install"):
        parse_config(yaml.safe_dump(bad))
