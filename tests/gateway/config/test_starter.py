"""starter: one client entry -> a strict but working Cellblock server config, secrets moved out."""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml

from cellblock.gateway.config.draft import Secret, Starter
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.model import SERVER_NAME
from cellblock.gateway.config.secretlike import looks_secret
from cellblock.gateway.config.starter import server_name, starter
from cellblock.gateway.credentials import ENTRY_NAME

GH_TOKEN = "ghp_" + "Ab3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI2kL4"
BEARER = "mcp-tok-" + "Zq8Wx2Vb6Nm4Lk0Jh5Gf3Ds1Ap9Oi7Uy"
API_KEY = "k-" + "9f86d081884c7d659a2feaa0c55ad015"
SLACK = "xoxb-" + "1234567890-0987654321-AbCdEfGhIjKlMnOpQrStUv"
EVERY_SECRET = (GH_TOKEN, BEARER, API_KEY, SLACK, "hunter2-correct-horse")
FS_PACKAGE = "@modelcontextprotocol/server-filesystem@2025.8.21"
ASK_AND_REVIEW = {"tools": {"default": "ask", "read_only": "review"}, "lock": {"first": "review"}}


@dataclass(frozen=True)
class Entry:
    """The shape of clients.ClientEntry, as starter() reads it."""

    name: str = "x"
    command: str | None = None
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    cwd: str | None = None
    url: str | None = None
    headers: Mapping[str, str] = field(default_factory=dict)
    transport: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)


@pytest.fixture
def home(tmp_path: Path) -> Path:
    """A home with two project folders, a node package and a Python project with a virtualenv."""
    for folder in ("projects", "notes", "srv/dist", "weather/.venv/bin"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "srv/package.json").write_text('{"name": "my-srv"}')
    (tmp_path / "srv/dist/index.js").write_text("")
    (tmp_path / "weather/pyproject.toml").write_text('[project]\nname = "weather"\n')
    (tmp_path / "weather/server.py").write_text("")
    return tmp_path


# A Claude Desktop config's servers, as realistic as they come; each built from the home fixture.
CLIENT: dict[str, Callable[[Path], Entry]] = {
    "filesystem": lambda h: Entry(command="npx", args=("-y", FS_PACKAGE, "~/projects", f"{h}/notes")),
    "github": lambda h: Entry(
        command="npx",
        args=("-y", "@modelcontextprotocol/server-github"),
        env={"GITHUB_PERSONAL_ACCESS_TOKEN": GH_TOKEN},
    ),
    "time": lambda h: Entry(command="uvx", args=("mcp-server-time==2025.9.25", "--local-timezone=Europe/Paris")),
    "my-srv": lambda h: Entry(command="node", args=(f"{h}/srv/dist/index.js",), env={"LOG_LEVEL": "debug"}),
    "weather": lambda h: Entry(command=f"{h}/weather/.venv/bin/python", args=(f"{h}/weather/server.py",)),
    "github-docker": lambda h: Entry(
        command="docker",
        args=("run", "-i", "--rm", "-e", "GITHUB_PERSONAL_ACCESS_TOKEN", "ghcr.io/github/github-mcp-server"),
        env={"GITHUB_PERSONAL_ACCESS_TOKEN": GH_TOKEN},
    ),
    "Linear Remote": lambda h: Entry(
        url="https://mcp.example.com/mcp",
        headers={"Authorization": f"Bearer {BEARER}", "X-API-Key": API_KEY, "X-Client": "claude"},
    ),
    "old-sse": lambda h: Entry(url="https://sse.example.com/sse", transport="sse"),
    "vscode-refs": lambda h: Entry(
        command="npx",
        args=("-y", "@modelcontextprotocol/server-github@2025.4.8"),
        env={"GITHUB_PERSONAL_ACCESS_TOKEN": "${input:tok}", "LOG": "${env:LOG_LEVEL}"},
    ),
    "slack": lambda h: Entry(
        command="npx",
        args=("-y", "@modelcontextprotocol/server-slack@2025.4.25"),
        env={"SLACK_BOT_TOKEN": SLACK, "SLACK_TEAM_ID": "T01234567", "DB_PASSWORD": "hunter2-correct-horse"},
        extra={"autoApprove": ["list_channels"], "disabled": False},
    ),
    "My Server!": lambda h: Entry(command="my-server", args=("--port", "0")),
    "42things": lambda h: Entry(command="42things"),
    "ÜberTool": lambda h: Entry(command="ubertool"),
    "a-very-long-server-name-from-some-client-config": lambda h: Entry(command="x-server"),
}


def derive(home: Path) -> list[Starter]:
    taken: set[str] = set()
    out = []
    for key, make in CLIENT.items():
        result = starter(key, make(home), taken=taken, home=str(home))
        taken.add(result.name)
        out.append(result)
    return out


def one(key: str, home: Path) -> Starter:
    return starter(key, CLIENT[key](home), taken=set(), home=str(home))


def validate(result: Starter) -> None:
    parse_config(yaml.safe_dump({"version": 1, "servers": {result.name: result.config}}, sort_keys=False))


# --- names --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("key", "taken", "expected"),
    [
        ("filesystem", set(), "filesystem"),
        ("My Server!", set(), "my-server"),
        ("42things", set(), "s-42things"),
        ("ÜberTool", set(), "ubertool"),
        ("__init__", set(), "init"),
        ("!!!", set(), "s"),
        ("", set(), "s"),
        ("a-very-long-server-name-from-some-client-config", set(), "a-very-long-server-name"),
        ("github", {"github"}, "github-2"),
        ("GitHub", {"github", "github-2"}, "github-3"),
        ("x" * 30, {"x" * 24}, "x" * 22 + "-2"),
        ("abcdefghijklmnopqrstu-wxyz", {"abcdefghijklmnopqrstu-wx"}, "abcdefghijklmnopqrstu-2"),
    ],
)
def test_server_names_are_valid_unused_and_deterministic(key: str, taken: set[str], expected: str) -> None:
    assert server_name(key, taken) == expected
    assert server_name(key, taken) == expected
    assert SERVER_NAME.fullmatch(expected)


@pytest.mark.parametrize("key", ["-", "9", "ü", "日本語", "A" * 100, "a--b", "a b\tc", "-a-", "z" * 23 + "!x"])
def test_any_key_gives_a_valid_name_even_when_many_are_taken(key: str) -> None:
    taken: set[str] = set()
    for _ in range(12):
        name = server_name(key, taken)
        assert SERVER_NAME.fullmatch(name), name
        assert name not in taken
        taken.add(name)


# --- what is a secret ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("GITHUB_PERSONAL_ACCESS_TOKEN", "x"),
        ("GITHUB_PAT", "x"),
        ("API_KEY", "x"),
        ("OPENAI_API_KEY", "x"),
        ("apiKey", "x"),
        ("APIKEY", "x"),
        ("CLIENT_SECRET", "x"),
        ("DB_PASSWORD", "x"),
        ("MYSQL_PASSWD", "x"),
        ("GOOGLE_APPLICATION_CREDENTIALS_JSON", "{}"),
        ("BASIC_AUTH", "u:p"),
        ("SESSION_ID", "x"),
        ("Authorization", "Basic dXNlcjpwYXNz"),
        ("Proxy-Authorization", "x"),
        ("Cookie", "sid=1"),
        ("X-API-Key", "x"),
        ("X-Auth-Token", "x"),
        ("SOME_VALUE", GH_TOKEN),
        ("SOME_VALUE", "gho_" + "a1" * 10),
        ("SOME_VALUE", "github_pat_" + "A1b2" * 5),
        ("SOME_VALUE", "glpat-" + "x1Y2z3" * 3),
        ("SOME_VALUE", "sk-ant-api03-" + "Q" * 20),
        ("SOME_VALUE", "sk-proj-" + "q1" * 10),
        ("SOME_VALUE", SLACK),
        ("SOME_VALUE", "xoxp-" + "1" * 20),
        ("SOME_VALUE", "AKIAIOSFODNN7EXAMPLE"),
        ("SOME_VALUE", "AIzaSyA-1234567890abcdefghij"),
        ("SOME_VALUE", "Bearer abc123def456"),
        ("SOME_VALUE", "eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxIn0.c2lnbmF0dXJl"),
        ("SOME_VALUE", "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"),
        ("SOME_VALUE", "aB3dE5gH7jK9mN1pQ3sT5vX7zA9cE1gI"),
        ("PASSWORD", "pa$word123"),  # a `$` inside a value is not a reference
    ],
)
def test_secrets_are_recognised_by_name_or_by_shape(name: str, value: str) -> None:
    assert looks_secret(name, value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("KEYBOARD_LAYOUT", "us"),
        ("MONKEY", "x"),
        ("PATH", "/usr/bin"),
        ("LOG_LEVEL", "debug"),
        ("AUTHOR", "Ada"),
        ("MAX_TOKENS", "4096"),
        ("TOKENIZERS_PARALLELISM", "false"),
        ("TOKEN_FILE", "/run/secrets/token"),
        ("SESSION_TIMEOUT", "30"),
        ("ENABLE_AUTH", "true"),
        ("SLACK_TEAM_ID", "T01234567"),
        ("LANG", "sk-SK"),  # a prefix alone is not a token
        ("PACKAGE", "pypi-query-mcp-server"),  # a package's name after a token's prefix
        ("PACKAGE", "sk-learn-model-server"),
        ("DATA_DIR", "/home/user/projects/my-app-2024/data"),
        ("CONFIG", "my_very_long_configuration_value_name_2"),
        ("GITHUB_TOKEN", ""),
        ("GITHUB_TOKEN", "${input:tok}"),
        ("GITHUB_TOKEN", "${env:GITHUB_TOKEN}"),
        ("GITHUB_TOKEN", "${GITHUB_TOKEN}"),
        ("GITHUB_TOKEN", "$GITHUB_TOKEN"),
        ("Authorization", "Bearer ${input:tok}"),
    ],
)
def test_names_values_and_references_that_are_not_secrets(name: str, value: str) -> None:
    assert not looks_secret(name, value)


# --- local servers ------------------------------------------------------------------------------


def test_filesystem_server_is_installed_and_gets_its_directories_writable(home: Path) -> None:
    result = one("filesystem", home)
    assert result.name == "filesystem"
    assert result.config == {
        "install": {"npm": FS_PACKAGE},
        "args": ["~/projects", f"{home}/notes"],
        "jail": {"network": "none", "read_write": ["~/projects", f"{home}/notes"]},
        **ASK_AND_REVIEW,
    }
    assert result.secrets == ()
    assert any(
        n.startswith(f"npx {FS_PACKAGE}: installed once by `cellblock install filesystem`") for n in result.notes
    )
    assert "network: none (@modelcontextprotocol/server-filesystem needs no network)" in result.notes
    parse_config(yaml.safe_dump({"version": 1, "servers": {"filesystem": result.config}}))


def test_an_inline_token_moves_to_the_keyring_and_a_known_api_gets_its_host(home: Path) -> None:
    result = one("github", home)
    assert result.config == {
        "install": {"npm": "@modelcontextprotocol/server-github"},
        "secrets": {"GITHUB_PERSONAL_ACCESS_TOKEN": "github-github-personal-access-token"},
        "jail": {"network": "allowlist", "allow_hosts": ["api.github.com"]},
        **ASK_AND_REVIEW,
    }
    assert result.secrets == (
        Secret(
            key="GITHUB_PERSONAL_ACCESS_TOKEN", entry="github-github-personal-access-token", value=GH_TOKEN, kind="env"
        ),
    )
    assert any(n.startswith("network: allowlist api.github.com (inferred: ") for n in result.notes)
    assert any("the newest release is pinned when installed" in n for n in result.notes)  # unpinned


def test_uvx_is_installed_from_pypi(home: Path) -> None:
    result = one("time", home)
    assert result.config == {
        "install": {"pypi": "mcp-server-time==2025.9.25"},
        "args": ["--local-timezone=Europe/Paris"],
        "jail": {"network": "none"},
        **ASK_AND_REVIEW,
    }
    assert not any("newest release" in n for n in result.notes)


@pytest.mark.parametrize(
    ("command", "args", "install", "rest"),
    [
        ("uv", ("tool", "run", "mcp-server-git@0.6.2", "-r", "~/repo"), {"pypi": "mcp-server-git==0.6.2"}, []),
        ("uvx", ("mcp-server-git@latest",), {"pypi": "mcp-server-git"}, []),
        ("uvx", ("--from", "mcp-server-git==0.6.2", "mcp-server-git"), {"pypi": "mcp-server-git==0.6.2"}, []),
        ("npx", ("--yes", "pkg@1.0.0", "--flag"), {"npm": "pkg@1.0.0"}, ["--flag"]),
        ("npx", ("pkg@latest",), {"npm": "pkg"}, []),
    ],
)
def test_launcher_forms_that_name_one_package_are_installed(
    home: Path, command: str, args: tuple[str, ...], install: dict[str, str], rest: list[str]
) -> None:
    config = starter("p", Entry(command=command, args=args), taken=(), home=str(home)).config
    assert config["install"] == install
    assert config.get("args", [])[: len(rest)] == rest
    assert ("command" in config) == ("--from" in args)  # the package's own program, unless --from names one


@pytest.mark.parametrize(
    ("command", "args", "expected"),
    [
        ("npx", ("pkg@^1",), ["--offline", "pkg@^1"]),  # a range: only npm knows what it means each day
        ("npx", ("-p", "pkg@1.0.0", "pkg-bin", "-y"), ["-p", "pkg@1.0.0", "--offline", "pkg-bin", "-y"]),
        ("uvx", ("--with", "extra", "mcp-server-time"), ["--with", "extra", "mcp-server-time"]),
        ("uvx", ("git+https://example.com/srv.git",), ["git+https://example.com/srv.git"]),
    ],
)
def test_what_only_the_launcher_can_do_keeps_it_with_an_offline_cache(
    home: Path, command: str, args: tuple[str, ...], expected: list[str]
) -> None:
    result = starter("p", Entry(command=command, args=args), taken=(), home=str(home))
    assert "install" not in result.config
    assert result.config["command"] == command
    assert result.config["args"] == expected
    assert any(n.startswith(f"fill the {command} cache once: ") for n in result.notes)


def test_a_node_script_shares_its_package_root_read_only(home: Path) -> None:
    result = one("my-srv", home)
    assert result.config == {
        "command": "node",
        "args": [f"{home}/srv/dist/index.js"],
        "env": {"LOG_LEVEL": "debug"},
        "jail": {"network": "ask", "read_only": [f"{home}/srv"]},
        **ASK_AND_REVIEW,
    }


def test_a_package_under_node_modules_shares_the_outermost_node_modules_for_its_dependencies(home: Path) -> None:
    package = home / "tools/node_modules/@modelcontextprotocol/server-filesystem"
    (package / "dist").mkdir(parents=True)
    (package / "package.json").write_text('{"name": "@modelcontextprotocol/server-filesystem"}')
    (package / "dist/index.js").write_text("")
    result = starter(
        "fs", Entry(command="node", args=(f"{package}/dist/index.js", "~/projects")), taken=(), home=str(home)
    )
    # the package's own name makes it a filesystem server: its directory is writable
    assert result.config["jail"] == {
        "network": "none",
        "read_only": [f"{home}/tools/node_modules"],
        "read_write": ["~/projects"],
    }


def test_a_python_script_shares_its_project_and_nothing_for_the_venv(home: Path) -> None:
    result = one("weather", home)
    assert result.config["jail"] == {"network": "ask", "read_only": [f"{home}/weather"]}


def test_a_script_in_the_home_folder_itself_is_shared_alone(home: Path) -> None:
    (home / "server.py").write_text("")
    result = starter("s", Entry(command="python3", args=("-u", "~/server.py")), taken=(), home=str(home))
    assert result.config["jail"] == {"network": "ask", "read_only": ["~/server.py"]}


def test_the_home_folder_or_root_is_never_shared(home: Path) -> None:
    fs = "@modelcontextprotocol/server-filesystem@1.0.0"
    result = starter("fs", Entry(command="npx", args=("-y", fs, "~", "/", str(home))), taken=(), home=str(home))
    assert "read_write" not in result.config["jail"]
    assert sum("your home or above it" in n for n in result.notes) == 3


def test_relative_paths_are_resolved_against_cwd_and_cwd_is_shared(home: Path) -> None:
    entry = Entry(command="my-server", args=("--data", "./dist", "../notes"), cwd="~/srv/")
    result = starter("s", entry, taken=(), home=str(home))
    assert result.config["cwd"] == "~/srv/"
    assert result.config["jail"]["read_only"] == ["~/srv/dist", "~/notes", "~/srv"]


def test_a_cwd_already_shared_is_not_shared_again_and_home_is_never_shared(home: Path) -> None:
    inside = starter(
        "s", Entry(command="my-server", args=(f"{home}/srv",), cwd=f"{home}/srv/dist"), taken=(), home=str(home)
    )
    assert inside.config["jail"]["read_only"] == [f"{home}/srv"]
    at_home = starter("s", Entry(command="my-server", cwd="~"), taken=(), home=str(home))
    assert at_home.config["jail"] == {"network": "ask"}
    assert any(n.startswith("cwd ~ is your home or above it") for n in at_home.notes)


def test_a_missing_file_in_a_folder_gets_its_folder_writable(home: Path) -> None:
    entry = Entry(command="mcp-server-sqlite", args=("--db-path", "~/notes/test.db"))
    result = starter("s", entry, taken=(), home=str(home))
    assert result.config["jail"] == {"network": "ask", "read_write": ["~/notes"]}
    assert (result.make, result.touch) == ((), ())
    assert any(n.startswith("read_write: ~/notes (~/notes/test.db does not exist yet") for n in result.notes)


def test_a_missing_folder_on_the_way_is_made_by_wrap(home: Path) -> None:
    entry = Entry(command="my-server", args=(f"--db={home}/data/2026/test.db",))
    result = starter("s", entry, taken=(), home=str(home))
    assert result.config["jail"]["read_write"] == [f"{home}/data/2026"]
    assert result.make == (f"{home}/data/2026",)


def test_a_missing_file_in_the_home_itself_is_made_empty_and_shared_alone(home: Path) -> None:
    result = starter("s", Entry(command="my-server", args=("--db-path", "~/test.db")), taken=(), home=str(home))
    assert result.config["jail"] == {"network": "ask", "read_write": ["~/test.db"]}
    assert result.touch == (f"{home}/test.db",)
    assert not (home / "test.db").exists()  # the starter only plans: wrap makes it
    assert any("your home, which is never shared: wrap creates it empty" in n for n in result.notes)


def test_a_filesystem_server_gets_a_missing_folder_made_and_writable(home: Path) -> None:
    entry = Entry(command="npx", args=("-y", FS_PACKAGE, "~/Documents"))
    result = starter("fs", entry, taken=(), home=str(home))
    assert result.config["jail"]["read_write"] == ["~/Documents"]
    assert result.make == (f"{home}/Documents",)


@pytest.mark.parametrize(
    ("arg", "why"),
    [
        ("~/.bashrc", "a hidden folder on its way"),
        ("~/.config/autostart/x.desktop", "a hidden folder on its way"),
        ("~/projects/.git/hooks/pre-commit", "a hidden folder on its way"),
        ("~/bin/tool", "a folder of programs"),
        ("~/Library/LaunchAgents/x.plist", "a folder of programs"),
        ("/srv/elsewhere/test.db", "outside your home"),
        ("~/projects/dist/index.js", "named like a program"),
        ("~", "your home or above it"),
    ],
)
def test_a_missing_path_where_a_write_runs_code_or_leaves_the_home_is_not_shared(
    home: Path, arg: str, why: str
) -> None:
    result = starter("s", Entry(command="my-server", args=("--out", arg)), taken=(), home=str(home))
    assert result.config["jail"] == {"network": "ask"}
    assert (result.make, result.touch) == ((), ())
    assert any(why in n for n in result.notes)


@pytest.mark.parametrize(
    ("arg", "why"),
    [
        ("~/code/app/app.db", "code/app/.git"),  # the folder holds a repository's hooks
        ("~/code/app/venv/lib/x.db", "a virtualenv"),  # inside one: a .pth there runs at each start
        ("~/package.json", "package.json in your home"),  # read upward by every project below
    ],
)
def test_a_missing_path_whose_share_would_hold_what_runs_code_is_not_shared(home: Path, arg: str, why: str) -> None:
    (home / "code" / "app" / ".git" / "hooks").mkdir(parents=True)
    (home / "code" / "app" / "venv").mkdir()
    (home / "code" / "app" / "venv" / "pyvenv.cfg").write_text("home = /usr/bin\n")
    result = starter("s", Entry(command="my-server", args=("--out", arg)), taken=(), home=str(home))
    assert result.config["jail"] == {"network": "ask"}
    assert (result.make, result.touch) == ((), ())
    assert any(why in n and "not shared read_write" in n for n in result.notes), result.notes


def test_a_missing_path_through_a_link_out_of_the_home_is_not_shared(
    home: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    (home / "elsewhere").symlink_to(tmp_path_factory.mktemp("outside"))
    result = starter("s", Entry(command="my-server", args=("~/elsewhere/test.db",)), taken=(), home=str(home))
    assert result.config["jail"] == {"network": "ask"}
    assert any("leads outside your home" in n for n in result.notes)


def test_a_missing_path_in_cellblocks_own_directory_is_not_shared(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CELLBLOCK_DATA_DIR", str(home / "cellblock-data"))
    args = ("--db", "~/cellblock-data/x.db")
    result = starter("s", Entry(command="my-server", args=args), taken=(), home=str(home))
    assert result.config["jail"] == {"network": "ask"}
    assert any("Cellblock's own" in n for n in result.notes)


def test_a_container_is_kept_with_a_warning_that_the_jail_will_stop_it(home: Path) -> None:
    result = one("github-docker", home)
    assert result.config["command"] == "docker"
    assert result.config["secrets"] == {"GITHUB_PERSONAL_ACCESS_TOKEN": "github-docker-github-personal-access-token"}
    assert any(n.startswith("runs a container: the jail does not share the docker socket") for n in result.notes)


def test_fetch_servers_get_ask_and_say_so_with_the_other_choice(home: Path) -> None:
    result = starter("fetch", Entry(command="uvx", args=("mcp-server-fetch",)), taken=(), home=str(home))
    assert result.config["jail"]["network"] == "ask"
    (note,) = [n for n in result.notes if n.startswith("network: ask: mcp-server-fetch fetches whatever URL")]
    assert "once, always, deny" in note and "network: open" in note  # what ask does, and the other way


def test_a_server_the_table_cannot_place_gets_ask_and_one_known_to_need_nothing_keeps_none(home: Path) -> None:
    unknown = starter("weather", Entry(command="npx", args=("-y", "some-weather-mcp")), taken=(), home=str(home))
    assert unknown.config["jail"]["network"] == "ask"
    assert any(n.startswith("network: ask: which hosts it needs is not known") for n in unknown.notes)
    time = starter("time", Entry(command="uvx", args=("mcp-server-time",)), taken=(), home=str(home))
    assert time.config["jail"] == {"network": "none"}
    assert "network: none (mcp-server-time needs no network)" in time.notes


def test_the_git_server_gets_its_repository_writable_and_a_plain_server_its_arguments_read_only(home: Path) -> None:
    repo = home / "projects"
    git = starter(
        "git", Entry(command="uvx", args=("mcp-server-git", "--repository", str(repo))), taken=(), home=str(home)
    )
    assert str(repo) in git.config["jail"]["read_write"]  # git_add and git_commit write to it
    assert str(repo) not in git.config["jail"].get("read_only", [])
    other = starter("other", Entry(command="uvx", args=("mcp-server-other", str(repo))), taken=(), home=str(home))
    assert str(repo) in other.config["jail"]["read_only"] and str(repo) not in other.config["jail"].get(
        "read_write", []
    )


def test_a_self_hosted_gitlab_gets_its_own_host(home: Path) -> None:
    entry = Entry(
        command="npx",
        args=("-y", "@modelcontextprotocol/server-gitlab@2025.4.25"),
        env={"GITLAB_API_URL": "https://git.example.org/api/v4"},
    )
    jail = starter("gitlab", entry, taken=(), home=str(home)).config["jail"]
    assert jail["allow_hosts"] == ["git.example.org"]


GITLAB = "@modelcontextprotocol/server-gitlab@2025.4.25"


@pytest.mark.parametrize(
    ("url", "rule"),
    [
        ("http://192.0.2.7:8929/api/v4", "192.0.2.7:8929"),  # a private or reserved address: an IP entry
        ("https://git.example.org:8443/api/v4", "git.example.org:8443"),
        ("http://[fd00::7]:8080/api/v4", "[fd00::7]:8080"),
        ("http://10.1.2.3/api/v4", "10.1.2.3"),  # no port: 80 and 443, as the URL means
    ],
)
def test_a_self_hosted_api_on_its_own_port_gets_an_entry_for_that_port(home: Path, url: str, rule: str) -> None:
    entry = Entry(command="npx", args=("-y", GITLAB), env={"GITLAB_API_URL": url})
    result = starter("gitlab", entry, taken=(), home=str(home))
    assert result.config["jail"] == {"network": "allowlist", "allow_hosts": [rule]}
    [note] = [n for n in result.notes if n.startswith(f"network: allowlist {rule} (inferred")]
    # an address the proxy lets it reach only because it is listed: the note says so
    assert ("allowed because your config names it" in note) == ("example" not in url), note


@pytest.mark.parametrize("url", ["http://git.example.org:99999/", "ftp://git.example.org/", "http:///api"])
def test_an_api_url_no_entry_can_name_leaves_the_tables_host(home: Path, url: str) -> None:
    entry = Entry(command="npx", args=("-y", GITLAB), env={"GITLAB_API_URL": url})
    assert starter("gitlab", entry, taken=(), home=str(home)).config["jail"]["allow_hosts"] == ["gitlab.com"]


def test_env_references_stay_literal_with_a_note(home: Path) -> None:
    result = one("vscode-refs", home)
    assert result.secrets == ()
    assert result.config["env"]["GITHUB_PERSONAL_ACCESS_TOKEN"] == "${input:tok}"
    assert result.config["env"]["LOG"] == "${env:LOG_LEVEL}"
    assert any(
        n.startswith("env GITHUB_PERSONAL_ACCESS_TOKEN holds the client reference ${input:tok}") for n in result.notes
    )


def test_client_variables_in_args_are_translated_or_flagged(home: Path) -> None:
    entry = Entry(command="my-server", args=("${env:HOME}/x", "${userHome}/y", "${input:dir}"))
    result = starter("s", entry, taken=(), home=str(home))
    assert result.config["args"] == ["${HOME}/x", "~/y", "${input:dir}"]
    assert any(n.startswith("args[0] uses ${HOME}: Cellblock expands it") for n in result.notes)
    assert any(n.startswith("args[2] holds the client variable ${input:dir}") for n in result.notes)


def test_secrets_in_arguments_move_to_the_keyring_and_are_named_in_their_place(home: Path) -> None:
    entry = Entry(
        command="my-server", args=("--api-key", API_KEY, f"--token={BEARER}", "-e", f"T={GH_TOKEN}", "--port", "8")
    )
    result = starter("s", entry, taken=(), home=str(home))
    refs = ["${secrets.API_KEY}", "${secrets.TOKEN}", "${secrets.T}"]
    assert result.config["args"] == ["--api-key", refs[0], f"--token={refs[1]}", "-e", f"T={refs[2]}", "--port", "8"]
    assert result.config["secrets"] == {"API_KEY": "s-api-key", "TOKEN": "s-token", "T": "s-t"}
    assert [(s.key, s.value, s.kind) for s in result.secrets] == [
        ("API_KEY", API_KEY, "env"),
        ("TOKEN", BEARER, "env"),
        ("T", GH_TOKEN, "env"),
    ]
    assert sum(n.startswith("args[") and "held a secret" in n for n in result.notes) == 3
    validate(result)


def test_a_secret_inside_a_url_argument_is_named_where_it_stood(home: Path) -> None:
    url = f"https://app:{API_KEY}@db.example.com/x?api_key={GH_TOKEN}&page=2"
    entry = Entry(command="my-server", args=(url, "--header", f"Authorization: Bearer {BEARER}"))
    result = starter("s", entry, taken=(), home=str(home))
    assert result.config["args"] == [
        "https://app:${secrets.URL_PASSWORD}@db.example.com/x?api_key=${secrets.API_KEY}&page=2",
        "--header",
        "Authorization: Bearer ${secrets.BEARER_TOKEN}",
    ]
    assert {s.key: s.value for s in result.secrets} == {
        "URL_PASSWORD": API_KEY,
        "API_KEY": GH_TOKEN,
        "BEARER_TOKEN": BEARER,
    }
    validate(result)


def test_a_key_given_as_env_and_argument_is_one_secret(home: Path) -> None:
    entry = Entry(command="ctx", args=("--api-key", API_KEY), env={"CTX_API_KEY": API_KEY, "MODE": "plain"})
    result = starter("s", entry, taken=(), home=str(home))
    assert result.config["args"] == ["--api-key", "${secrets.CTX_API_KEY}"]
    assert result.config["secrets"] == {"CTX_API_KEY": "s-ctx-api-key"} and len(result.secrets) == 1


def test_an_argument_secret_is_never_named_like_an_env_variable_or_one_the_launcher_sets(home: Path) -> None:
    entry = Entry(command="x", args=(f"--api-key={API_KEY}", f"--path={GH_TOKEN}", "-k", BEARER), env={"API_KEY": "1"})
    result = starter("s", entry, taken=(), home=str(home))
    assert result.config["args"] == [
        "--api-key=${secrets.API_KEY_2}",
        "--path=${secrets.PATH_2}",
        "-k",
        "${secrets.SECRET}",
    ]
    validate(result)


def test_a_short_option_or_a_plain_value_is_not_taken_for_a_secret_by_its_letter(home: Path) -> None:
    entry = Entry(command="x", args=("-k", "my-project", "--api-key-file", "/run/key", "--token", "${input:tok}"))
    result = starter("s", entry, taken=(), home=str(home))
    assert result.config["args"] == list(entry.args) and result.secrets == ()


def test_version_pins_and_plain_options_are_not_taken_for_secrets(home: Path) -> None:
    args = ("mcp-server-token==1.2", "--max-tokens", "4096", "--password-file=/run/pw", "-e", "GITHUB_TOKEN")
    config = starter("s", Entry(command="uvx", args=args), taken=(), home=str(home)).config
    assert config["install"] == {"pypi": "mcp-server-token==1.2"}
    assert config["args"] == list(args[1:])


def test_client_keys_cellblock_does_not_use_are_listed_with_secret_values_hidden(home: Path) -> None:
    result = starter("s", Entry(command="a", extra={"disabled": True, "apiKey": GH_TOKEN}), taken=(), home=str(home))
    assert any(n.startswith("not carried over: disabled=true") for n in result.notes)
    assert "not carried over: apiKey=(value hidden: it may be a secret)" in result.notes


# --- remote servers -----------------------------------------------------------------------------


def test_a_remote_bearer_token_and_api_key_header_move_to_the_keyring(home: Path) -> None:
    result = one("Linear Remote", home)
    assert result.name == "linear-remote"
    assert result.config == {
        "url": "https://mcp.example.com/mcp",
        "headers": {"X-Client": "claude"},
        "auth": {"type": "bearer"},
        "secrets": {"X-API-Key": "linear-remote-x-api-key"},
        **ASK_AND_REVIEW,
    }
    assert result.secrets == (
        Secret(key="Authorization", entry="linear-remote", value=BEARER, kind="bearer"),
        Secret(key="X-API-Key", entry="linear-remote-x-api-key", value=API_KEY, kind="header"),
    )


def test_an_sse_remote_is_kept_with_a_note(home: Path) -> None:
    result = one("old-sse", home)
    assert result.config == {"url": "https://sse.example.com/sse", **ASK_AND_REVIEW}
    assert any(n.startswith("transport sse: Cellblock speaks Streamable HTTP only") for n in result.notes)


def test_a_bearer_reference_becomes_bearer_auth_to_fill_in(home: Path) -> None:
    entry = Entry(url="https://x.example.com/mcp", headers={"Authorization": "Bearer ${input:tok}"})
    result = starter("x", entry, taken=(), home=str(home))
    assert result.config["auth"] == {"type": "bearer"} and result.secrets == ()
    assert any("cellblock auth set x" in n for n in result.notes)


def test_credentials_in_the_url_are_left_out(home: Path) -> None:
    entry = Entry(url=f"https://user:{BEARER}@mcp.example.com/mcp?api_key={API_KEY}&region=eu")
    result = starter("x", entry, taken=(), home=str(home))
    assert result.config["url"] == "https://mcp.example.com/mcp?region=eu"
    assert any("query parameter 'api_key' holds a secret" in n for n in result.notes)
    assert any(n.startswith("url: the user and password in it are left out") for n in result.notes)
    assert all(BEARER not in n and API_KEY not in n for n in result.notes)


def test_an_entry_with_both_command_and_url_runs_the_command_and_never_shows_the_url(home: Path) -> None:
    entry = Entry(command="my-server", url=f"https://x.example.com/mcp?token={BEARER}")
    result = starter("s", entry, taken=(), home=str(home))
    assert "url" not in result.config and result.config["command"] == "my-server"
    assert "url not carried over: the entry also has a command, which is what runs" in result.notes
    assert all(BEARER not in n for n in result.notes)


def test_an_entry_without_command_or_url_is_refused(home: Path) -> None:
    with pytest.raises(ValueError, match="neither a command nor a url"):
        starter("x", Entry(), taken=(), home=str(home))


# --- the whole table ----------------------------------------------------------------------------


def test_names_in_the_table_are_distinct_and_valid(home: Path) -> None:
    names = [r.name for r in derive(home)]
    assert names == [
        *("filesystem", "github", "time", "my-srv", "weather", "github-docker", "linear-remote", "old-sse"),
        *("vscode-refs", "slack", "my-server", "s-42things", "ubertool", "a-very-long-server-name"),
    ]


def test_no_secret_value_reaches_the_config_or_the_notes(home: Path) -> None:
    results = derive(home)
    moved = {s.value for r in results for s in r.secrets}
    assert moved == set(EVERY_SECRET)  # every inline secret was found
    for result in results:
        written = yaml.safe_dump(result.config) + "\n".join(result.notes) + repr(result)
        leaked = [v for v in EVERY_SECRET if v in written]
        assert not leaked, f"{result.name} leaks {len(leaked)} secret(s)"


def test_notes_are_single_lines(home: Path) -> None:
    for result in derive(home):
        assert result.notes and all(n and "\n" not in n for n in result.notes), result.name


def test_entries_are_valid_keyring_names_and_unique(home: Path) -> None:
    long_key = "X_" + "VERY_LONG_" * 10 + "TOKEN"
    entry = Entry(command="a", env={long_key: "1", long_key + "2": "2", "a__b_TOKEN": "3", "A-B-token": "4"})
    result = starter("a" * 24, entry, taken=(), home=str(home))
    entries = [s.entry for s in result.secrets]
    assert len(set(entries)) == 4
    assert all(ENTRY_NAME.fullmatch(e) and e.startswith("a" * 24 + "-") for e in entries), entries


def test_the_starter_is_deterministic(home: Path) -> None:
    assert derive(home) == derive(home)


@pytest.mark.parametrize("key", list(CLIENT))
def test_every_starter_validates_as_cellblock_config(home: Path, key: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", str(home))
    validate(one(key, home))


def test_a_remote_with_header_secrets_validates(home: Path) -> None:
    validate(one("Linear Remote", home))


def test_a_non_bearer_authorization_becomes_a_secret_header_that_validates(home: Path) -> None:
    entry = Entry(url="https://x.example.com/mcp", headers={"Authorization": f"token {GH_TOKEN}"})
    result = starter("x", entry, taken=(), home=str(home))
    assert result.config["secrets"] == {"Authorization": "x-authorization"} and "auth" not in result.config
    assert result.secrets == (
        Secret(key="Authorization", entry="x-authorization", value=f"token {GH_TOKEN}", kind="header"),
    )
    validate(result)


def test_the_secret_repr_hides_its_value() -> None:
    assert GH_TOKEN not in repr(Secret(key="T", entry="e", value=GH_TOKEN, kind="env"))
    assert re.search(
        r"Secret\(key='T', entry='e', kind='env'\)", repr(Secret(key="T", entry="e", value="v", kind="env"))
    )


def test_the_memory_server_keeps_its_data_in_a_directory_of_its_own_not_beside_its_read_only_code(
    home: Path,
) -> None:
    entry = Entry(command="npx", args=("-y", "@modelcontextprotocol/server-memory@2026.8.31"))
    result = starter("memory", entry, taken=(), home=str(home))
    data = f"{home}/.local/share/mcp-memory"
    assert result.config["env"] == {"MEMORY_FILE_PATH": f"{data}/memory.jsonl"}
    assert result.config["jail"]["read_write"] == [data]
    assert result.make == (data,)  # wrap creates it: a jail grants only what exists
    given = Entry(command="npx", args=entry.args, env={"MEMORY_FILE_PATH": "~/notes/graph.jsonl"})
    chosen = starter("memory", given, taken=(), home=str(home))
    assert chosen.config["jail"]["read_write"] == [f"{home}/notes"] and chosen.make == ()


@pytest.fixture
def project(home: Path) -> Path:
    """A uv project as `uv sync` leaves it: pyproject.toml, a script, and `.venv` with its programs."""
    root = home / "proj"
    (root / ".venv" / "bin").mkdir(parents=True)
    (root / "pyproject.toml").write_text('[project]\nname = "weather-srv"\n')
    (root / "server.py").write_text("")
    for name in ("python", "weather-srv"):
        (root / ".venv" / "bin" / name).write_text("")
    return root


@pytest.mark.parametrize(
    ("args", "command", "rest"),
    [
        (("run", "--directory", "~/proj", "server.py"), "~/proj/.venv/bin/python", ["server.py"]),
        (
            ("--directory", "~/proj", "run", "weather-srv", "--units", "metric"),
            "~/proj/.venv/bin/weather-srv",
            ["--units", "metric"],
        ),
        (("run", "--project=~/proj", "--frozen", "python", "server.py"), "~/proj/.venv/bin/python", ["server.py"]),
    ],
)
def test_uv_run_runs_the_projects_virtualenv_as_it_is(
    home: Path, project: Path, args: tuple[str, ...], command: str, rest: list[str]
) -> None:
    result = starter("weather", Entry(command="uv", args=args), taken=(), home=str(home))
    assert result.config["command"] == command and result.config.get("args", []) == rest
    assert result.config["cwd"] == "~/proj" and "~/proj" in result.config["jail"]["read_only"]
    assert any("run `uv sync` in ~/proj" in n for n in result.notes)


@pytest.mark.parametrize(
    "args",
    [
        ("run", "--with", "mcp", "--directory", "~/proj", "server.py"),  # not the project's environment as it is
        ("run", "--directory", "~/elsewhere", "server.py"),  # no .venv there
        ("run", "server.py"),  # no project named: it depends on the client's working directory
    ],
)
def test_uv_run_that_only_uv_can_do_keeps_uv_with_a_note(home: Path, project: Path, args: tuple[str, ...]) -> None:
    result = starter("weather", Entry(command="uv", args=args), taken=(), home=str(home))
    assert result.config["command"] == "uv"
    assert any(n.startswith("uv run: the jail shares no uv cache") for n in result.notes)
