"""`${secrets.NAME}` in a local server's args: checked with the config, filled only at launch."""

from __future__ import annotations

import sys

import pytest

from cellblock.gateway.cli.show import describe_server
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import Config, ConfigError, LocalServer
from cellblock.gateway.config.secretrefs import fill
from cellblock.gateway.downstream.launch import launch_plan

KEY = "ctx7sk-" + "a81f0c2e9b7d4e65"


def config(body: str) -> Config:
    return parse_config(f"version: 1\nservers:\n  s:\n    command: {sys.executable}\n{body}")


def local(body: str) -> LocalServer:
    server = config(body).servers["s"]
    assert isinstance(server, LocalServer)
    return server


def test_an_argument_names_a_secret_of_the_server() -> None:
    server = local(
        "    args: ['--api-key', '${secrets.API_KEY}', 'u=${secrets.API_KEY}']\n    secrets: {API_KEY: s-key}\n"
    )
    assert server.args == ["--api-key", "${secrets.API_KEY}", "u=${secrets.API_KEY}"]


@pytest.mark.parametrize(
    ("body", "message"),
    [
        ("    args: ['${secrets.API_KEY}']\n", r"args\[0\] names \$\{secrets.API_KEY\}, which secrets: does not have"),
        ("    args: ['${secrets.api-key}']\n    secrets: {A: e}\n", r"args\[0\] has a '\$\{secrets.' that is not"),
        ("    env: {X: '${secrets.A}'}\n    secrets: {A: e}\n", r"env.X holds \$\{secrets"),
        ("    cwd: '/${secrets.A}'\n    secrets: {A: e}\n", r"cwd holds \$\{secrets"),
    ],
)
def test_a_reference_that_nothing_would_fill_is_a_config_error(body: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        config(body)


def test_fill_puts_each_value_where_its_reference_stands_and_leaves_unknown_ones() -> None:
    args = ["--api-key", "${secrets.A}", "https://u:${secrets.B}@h/?k=${secrets.A}", "${secrets.C}", r"\1"]
    values = {"A": KEY, "B": r"p\1$&"}
    assert fill(args, values) == ["--api-key", KEY, rf"https://u:p\1$&@h/?k={KEY}", "${secrets.C}", r"\1"]


def test_the_launched_command_carries_the_value_and_the_config_only_the_reference() -> None:
    server = local("    args: ['--api-key', '${secrets.API_KEY}']\n    secrets: {API_KEY: s-key}\n    jail: false\n")
    plan = launch_plan("s", server, secrets={"API_KEY": KEY})
    assert plan.argv[-2:] == ("--api-key", KEY) and plan.env["API_KEY"] == KEY
    assert server.args == ["--api-key", "${secrets.API_KEY}"]  # the config is never changed


def test_show_describes_the_reference_never_a_value() -> None:
    cfg = config("    args: ['--api-key', '${secrets.API_KEY}']\n    secrets: {API_KEY: s-key}\n    jail: false\n")
    info = describe_server(cfg, "s")
    assert info["command"][1:] == ["--api-key", "${secrets.API_KEY}"] and info["secrets"] == {"API_KEY": "s-key"}
