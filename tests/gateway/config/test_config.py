"""Config loading: strict models, errors that name file, line and key, expansion, `cellblock check`."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from cellblock.gateway.config.loading import load_config, parse_config
from cellblock.gateway.config.model import ConfigError, JailConfig, LocalServer, RemoteServer
from cellblock.sandbox.types import Limits

GOOD = """\
version: 1
defaults:
  start: lazy
  timeout: 5
names: {separator: "-_", max_length: 40}
servers:
  files:
    command: ~/bin/fs
    args: ["${CB_TEST_DIR}/a", "plain"]
    env: {LOG: "${NOT_EXPANDED}"}
    cwd: ~/work
    start: eager
  web:
    url: https://example.com/mcp
    headers: {X-A: b}
    timeout: 9
    protocol: legacy
"""


def error_of(text: str) -> str:
    with pytest.raises(ConfigError) as caught:
        parse_config(text, "c.yaml")
    return str(caught.value)


def test_a_full_config_loads_with_expansion_and_defaults(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CB_TEST_DIR", "/data")
    monkeypatch.setenv("HOME", "/home/u")
    config = parse_config(GOOD)
    files, web = config.servers["files"], config.servers["web"]
    assert isinstance(files, LocalServer) and isinstance(web, RemoteServer)
    assert files.command == "/home/u/bin/fs" and files.cwd == "/home/u/work"
    assert files.args == ["/data/a", "plain"]
    assert files.env == {"LOG": "${NOT_EXPANDED}"}  # env values are literal
    assert config.start_of("files") == "eager" and config.start_of("web") == "lazy"
    assert config.timeout_of("files") == 5 and config.timeout_of("web") == 9
    assert web.protocol == "legacy" and files.protocol == "auto"
    assert config.names.separator == "-_"


def test_an_empty_config_gets_the_safe_defaults() -> None:
    config = parse_config("version: 1\n")
    assert config.servers == {}
    assert config.defaults.start == "eager" and config.names.max_length == 64


def test_audit_rotation_is_configurable_and_bounded(tmp_path: Path) -> None:
    assert parse_config("version: 1\n").audit.max_bytes == 10 << 20
    config = parse_config("version: 1\naudit:\n  max_bytes: 64KiB\n  keep: 2\n")
    audit = config.audit_log(tmp_path)
    assert (audit.max_bytes, audit.keep, audit.path) == (64 << 10, 2, tmp_path / "audit.jsonl")
    audit.close()
    assert (tmp_path / "audit.key").stat().st_mode & 0o777 == 0o600
    assert "audit.max_bytes" in error_of("version: 1\naudit:\n  max_bytes: 100\n")
    assert "audit.keep" in error_of("version: 1\naudit:\n  keep: 0\n")


def test_unknown_key_names_file_line_and_key() -> None:
    message = error_of("version: 1\nservers:\n  a:\n    command: x\n    comand: y\n")
    assert message == "c.yaml:5: servers.a.comand: unknown key"


def test_bad_enum_value_says_what_is_allowed() -> None:
    message = error_of("version: 1\nservers:\n  a:\n    command: x\n    start: soon\n")
    assert message == "c.yaml:5: servers.a.start: 'soon' is not one of 'eager' or 'lazy'"


CREDENTIALS = """\
version: 1
credentials: {allow_insecure: true}
servers:
  files:
    command: x
    env: {LOG: debug}
    secrets: {API_TOKEN: files-token, DB_PASSWORD: db.pw_2}
  plain:
    url: https://plain.example/mcp
  tok:
    url: https://tok.example/mcp
    auth: {type: bearer}
  sso:
    url: https://sso.example/mcp
    auth: {type: oauth, scope: "read write"}
"""


def test_secrets_and_auth_name_keyring_entries_never_values() -> None:
    config = parse_config(CREDENTIALS)
    files, plain, tok, sso = (config.servers[n] for n in ("files", "plain", "tok", "sso"))
    assert isinstance(files, LocalServer)
    assert files.secrets == {"API_TOKEN": "files-token", "DB_PASSWORD": "db.pw_2"}
    assert files.env == {"LOG": "debug"}
    assert isinstance(plain, RemoteServer) and isinstance(tok, RemoteServer) and isinstance(sso, RemoteServer)
    assert (plain.auth.type, tok.auth.type, sso.auth.type) == ("none", "bearer", "oauth")
    assert (tok.auth.scope, sso.auth.scope) == (None, "read write")
    assert config.credentials.allow_insecure is True
    assert config.credential_entries() == [
        ("files-token", "files", "secret API_TOKEN"),
        ("db.pw_2", "files", "secret DB_PASSWORD"),
        ("tok", "tok", "bearer token"),
        ("sso", "sso", "oauth token"),
    ]


def test_credentials_default_to_no_auth_no_secrets_and_a_secure_keyring_only() -> None:
    config = parse_config("version: 1\nservers:\n  a:\n    command: x\n  b:\n    url: https://h/\n")
    a, b = config.servers["a"], config.servers["b"]
    assert isinstance(a, LocalServer) and isinstance(b, RemoteServer)
    assert a.secrets == {} and b.auth.type == "none" and b.auth.scope is None
    assert config.credentials.allow_insecure is False
    assert config.credential_entries() == []


LOCAL = "version: 1\nservers:\n  a:\n    command: x\n"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "    env: {TOKEN: a}\n    secrets: {TOKEN: tok}\n",
            "c.yaml:3: servers.a: secrets.TOKEN is also set in env; keep it in one place (secrets, for a secret)",
        ),
        *[
            (
                f"    secrets:\n      {name}: tok\n",
                f"c.yaml:3: servers.a: secrets.{name}: the launcher sets {name} itself; pick another variable name",
            )
            for name in ("PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "SHELL", "TERM", "LANG", "LC_ALL", "TZ")
        ],
        *[
            (
                f"    secrets:\n      {name}: tok\n",
                f"c.yaml:3: servers.a: secrets.{name}: the launcher sets {name} itself; pick another variable name",
            )
            for name in ("HTTP_PROXY", "https_proxy", "ALL_PROXY", "No_Proxy")
        ],
    ],
)
def test_a_secret_may_not_take_a_variable_the_config_or_launcher_sets(body: str, expected: str) -> None:
    assert error_of(LOCAL + body) == expected


def test_learn_is_off_by_default_and_needs_a_jail() -> None:
    server = parse_config(LOCAL).servers["a"]
    assert isinstance(server, LocalServer) and server.learn is False
    assert error_of(f"{LOCAL}    learn: true\n    jail: false\n") == (
        "c.yaml:3: servers.a: learn: true records what the jail refused, and jail: false has no jail; give it one"
    )


@pytest.mark.parametrize(
    "entry",
    [
        "a/oauth-tokens",  # the OAuth records' names: no secret may read them
        "''",
        "-lead",
        ".hidden",
        "has space",
        "e" * 65,
        "[x]",
        "{x: y}",
    ],
)
def test_a_bad_keyring_entry_name_is_refused_at_its_line(entry: str) -> None:
    message = error_of(f"{LOCAL}    secrets:\n      TOKEN: {entry}\n")
    assert message.startswith("c.yaml:6: servers.a.secrets.TOKEN: ")
    assert len(message.splitlines()) == 1


@pytest.mark.parametrize("entry", ["a", "A1", "files-token", "db.pw_2", "e" * 64])
def test_good_keyring_entry_names_are_kept(entry: str) -> None:
    server = parse_config(f"{LOCAL}    secrets:\n      TOKEN: {entry}\n").servers["a"]
    assert isinstance(server, LocalServer) and server.secrets == {"TOKEN": entry}


@pytest.mark.parametrize("name", ["1BAD", "BAD-NAME", "A.B", "'A B'", "''"])
def test_a_secret_variable_must_be_an_identifier(name: str) -> None:
    message = error_of(f"{LOCAL}    secrets:\n      {name}: tok\n")
    unquoted = name.strip("'")
    assert message.startswith(f"c.yaml:6: servers.a.secrets.{unquoted}: ")
    assert len(message.splitlines()) == 1


def test_a_bad_secret_variable_is_described_as_an_environment_variable() -> None:
    message = error_of(f"{LOCAL}    secrets:\n      1BAD: tok\n")
    assert message == (
        "c.yaml:6: servers.a.secrets.1BAD: '1BAD' is not an environment variable name "
        "(letters, digits and '_', not starting with a digit)"
    )


def test_a_bad_keyring_entry_name_says_the_rule() -> None:
    message = error_of(f"{LOCAL}    secrets:\n      KEY: 'a b'\n")
    assert message == (
        "c.yaml:6: servers.a.secrets.KEY: keyring entry name 'a b' must be letters, digits, '.', '_' and '-', "
        "start with a letter or digit, at most 64 characters"
    )


REMOTE = "version: 1\nservers:\n  a:\n    url: https://h/\n"


@pytest.mark.parametrize(
    ("body", "expected"),
    [
        (
            "    auth: {type: bearer, scope: read}\n",
            "c.yaml:5: servers.a.auth: scope is only used with type: oauth (type is 'bearer')",
        ),
        (
            "    auth: {scope: read}\n",
            "c.yaml:5: servers.a.auth: scope is only used with type: oauth (type is 'none')",
        ),
        (
            "    auth:\n      type: basic\n",
            "c.yaml:6: servers.a.auth.type: 'basic' is not one of 'none', 'bearer' or 'oauth'",
        ),
        ("    auth:\n      type: oauth\n      scopes: x\n", "c.yaml:7: servers.a.auth.scopes: unknown key"),
        ("    auth:\n      type: bearer\n      token: abc\n", "c.yaml:7: servers.a.auth.token: unknown key"),
        (
            "    secrets: {A B: b}\n",
            "c.yaml:5: servers.a.secrets.A B: 'A B' is not an HTTP header name (letters, digits, '-' and '_')",
        ),
    ],
)
def test_bad_auth_settings_are_named(body: str, expected: str) -> None:
    assert error_of(REMOTE + body) == expected


def test_auth_belongs_to_remote_servers_only() -> None:
    assert error_of(LOCAL + "    auth: {type: bearer}\n") == "c.yaml:5: servers.a.auth: unknown key"


@pytest.mark.parametrize("header", ["Authorization", "authorization", "AUTHORIZATION", "Proxy-Authorization", "Cookie"])
def test_a_credential_header_is_refused_with_the_fix(header: str) -> None:
    message = error_of(f"{REMOTE}    headers:\n      X-A: b\n      {header}: Bearer abc\n")
    assert message == (
        f"c.yaml:5: servers.a.headers: headers.{header} would keep a credential in this file; "
        "use auth: {type: bearer} and store the token with `cellblock auth set NAME`"
    )
    assert "abc" not in message


def test_ordinary_headers_are_kept() -> None:
    server = parse_config(f"{REMOTE}    headers:\n      X-Api-Version: '2'\n      Accept-Language: en\n").servers["a"]
    assert isinstance(server, RemoteServer)
    assert server.headers == {"X-Api-Version": "2", "Accept-Language": "en"}


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 1\ncredentials:\n  allow_insecure: maybe\n", "c.yaml:3: credentials.allow_insecure: "),
        ("version: 1\ncredentials:\n  allow: true\n", "c.yaml:3: credentials.allow: unknown key"),
        ("version: 1\ncredentials: true\n", "c.yaml:2: credentials: "),
    ],
)
def test_bad_credentials_settings_are_named(text: str, expected: str) -> None:
    assert error_of(text).startswith(expected)


def test_a_server_is_jailed_with_nothing_shared_unless_it_says_otherwise() -> None:
    jail = parse_config("version: 1\nservers:\n  a:\n    command: x\n").servers["a"].jail
    assert isinstance(jail, JailConfig)
    assert (jail.network, jail.read_only, jail.read_write, jail.tmp) == ("none", [], [], True)


@pytest.mark.parametrize("off", ["false", "off", "no"])
def test_jail_false_is_the_explicit_way_to_run_unjailed(off: str) -> None:
    assert parse_config(f"version: 1\nservers:\n  a:\n    command: x\n    jail: {off}\n").servers["a"].jail is False


@pytest.mark.parametrize(
    ("jail", "expected"),
    [
        (
            "jail:\n      network: nne",
            "c.yaml:6: servers.a.jail.network: 'nne' is not one of 'none', 'allowlist', 'ask' or 'open'",
        ),
        ("jail: true", "c.yaml:5: servers.a.jail: expected jail settings (a mapping), or false"),
        ("jail: {allow_hosts: [a.com]}", "c.yaml:5: servers.a.jail: allow_hosts is only used with network: allowlist"),
        ("jail: {network: allowlist}", "c.yaml:5: servers.a.jail: network: allowlist needs at least one entry"),
        ("jail: {exec: {sha256: {/bin/x: abc}}}", "c.yaml:5: servers.a.jail.exec.sha256./bin/x:"),
        ("jail: {mounts: []}", "c.yaml:5: servers.a.jail.mounts: unknown key"),
    ],
)
def test_bad_jail_settings_are_named(jail: str, expected: str) -> None:
    assert error_of(f"version: 1\nservers:\n  a:\n    command: x\n    {jail}\n").startswith(expected)


def test_jail_paths_are_expanded(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HOME", "/home/u")
    text = "version: 1\nservers:\n  a:\n    command: x\n    jail: {read_only: [~/p], read_write: ['${HOME}/w']}\n"
    jail = parse_config(text).servers["a"].jail
    assert isinstance(jail, JailConfig)
    assert (jail.read_only, jail.read_write) == (["/home/u/p"], ["/home/u/w"])


def test_approvals_timeout_is_validated() -> None:
    assert parse_config("version: 1\napprovals: {timeout: 30}\n").approvals.timeout == 30
    assert "approvals.timeout" in error_of("version: 1\napprovals: {timeout: 0}\n")


@pytest.mark.parametrize("name", ["Files", "1files", "fi_les", "f" * 25, "fi.les", "-a"])
def test_bad_server_names_are_refused(name: str) -> None:
    message = error_of(f"version: 1\nservers:\n  '{name}':\n    command: x\n")
    assert f"servers.{name}: server name" in message and "c.yaml:3" in message


@pytest.mark.parametrize(("name", "separator"), [("cellblock", "__"), ("cellblock", "_"), ("cellblock", "X")])
def test_no_server_may_name_its_tools_like_the_gateways_own(name: str, separator: str) -> None:
    message = error_of(f"version: 1\nnames: {{separator: '{separator}'}}\nservers:\n  {name}:\n    command: x\n")
    assert f"server name '{name}' would name its tools like the gateway's own" in message
    # control: the same server beside another separator, or another name, is fine
    assert parse_config("version: 1\nnames: {separator: '__'}\nservers:\n  cellblocks:\n    command: x\n")


@pytest.mark.parametrize("separator", ["-", "x", "-x-", "0"])
def test_a_separator_that_could_be_part_of_a_server_name_is_refused(separator: str) -> None:
    # with "-", server `a` + tool `b-c` and server `a-b` + tool `c` both spell `a-b-c`
    message = error_of(f"version: 1\nnames: {{separator: '{separator}'}}\nservers:\n  a:\n    command: x\n")
    assert f"separator '{separator}' could be part of a server name" in message and "c.yaml:2" in message
    # control: with an underscore or a capital in it, the same separator is fine
    for fine in (f"{separator}_", f"{separator}X"[-4:]):
        assert parse_config(f"version: 1\nnames: {{separator: '{fine}'}}\n").names.separator == fine


def test_a_server_needs_exactly_one_of_command_and_url() -> None:
    both = error_of("version: 1\nservers:\n  a:\n    command: x\n    url: http://h/\n")
    neither = error_of("version: 1\nservers:\n  a:\n    env: {}\n")
    for message in (both, neither):
        assert "servers.a: a server needs exactly one of 'command' or 'install'" in message


def test_every_error_is_reported_at_once() -> None:
    message = error_of("version: 1\nservers:\n  a:\n    command: x\n    x: 1\n  b:\n    url: ftp://h\n")
    assert len(message.splitlines()) == 2


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("version: 2\n", "c.yaml:1: version: 2 is not one of 1"),
        ("servers: {}\n", "c.yaml: version: Field required"),
        ("- a\n", "c.yaml: the config must be a mapping"),
        ("version: 1\n  x: :\n", "c.yaml:2: not valid YAML"),
        ("version: 1\ndefaults: {timeout: 0}\n", "c.yaml:2: defaults.timeout:"),
        ("version: 1\nnames: {max_length: 8}\n", "c.yaml:2: names.max_length:"),
    ],
)
def test_malformed_configs_are_named(text: str, expected: str) -> None:
    assert error_of(text).startswith(expected)


def test_an_unset_variable_is_named() -> None:
    message = error_of("version: 1\nservers:\n  a:\n    command: x\n    args: ['${CB_SURELY_UNSET_VAR}']\n")
    assert "${CB_SURELY_UNSET_VAR} is not set" in message and "servers.a.args" in message


def test_missing_file_says_how_to_fix(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "nope.yaml")


def test_config_location_comes_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    path = tmp_path / "from-env.yaml"
    path.write_text("version: 1\n")
    monkeypatch.setenv("CELLBLOCK_CONFIG", str(path))
    assert load_config()[1] == path


def cellblock(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "cellblock.gateway.cli.main", *args], capture_output=True, text=True, check=False
    )


def test_check_exits_0_and_lists_servers_for_a_good_config(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: 1\nservers:\n  a:\n    command: x\n")
    done = cellblock("check", "--config", str(path))
    assert done.returncode == 0
    assert done.stdout.split() == ["a", "eager", "stdio:", "x"]
    assert done.stderr.startswith("cellblock: OK:")


def test_check_exits_2_with_the_error_on_stderr(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("version: 1\nservers:\n  a:\n    command: x\n    bogus: 1\n")
    done = cellblock("check", "--config", str(path))
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == f"cellblock: {path}:5: servers.a.bogus: unknown key\n"


def test_shipped_configs_are_valid(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from cellblock.gateway.config.compile import lint_config

    root = Path(__file__).resolve().parents[3]
    monkeypatch.setenv("CELLBLOCK_PYTHON", sys.executable)
    monkeypatch.setenv("CELLBLOCK_DEMO", str(root / "cellblock" / "demo"))
    monkeypatch.setenv("CELLBLOCK_SCRATCH", "/tmp/scratch")
    for path in [*root.glob("configs/*.yaml"), root / "cellblock" / "demo" / "demo.yaml"]:
        config, _ = load_config(path)
        # and their jails share for writing exactly what their write rules allow (docs/policy.md)
        assert lint_config(config, tmp_path) == [], path


def test_check_exits_1_with_lint_findings_and_names_them(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text(
        "version: 1\nservers:\n  a:\n    command: x\n    tools:\n      rules:\n"
        "        read_file: {decision: allow, args: {path: {under: [/etc]}}}\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "cellblock.gateway.cli.main", "check", "--config", str(path)],
        capture_output=True,
        text=True,
        env={**os.environ, "CELLBLOCK_STATE_DIR": str(tmp_path / "state")},
        check=False,
    )
    assert done.returncode == 1
    assert "lint: server 'a': tools.rules.read_file.args.path: under /etc is not shared" in done.stderr


def test_check_reports_the_names_that_collide_in_the_approved_catalogs(tmp_path: Path) -> None:
    from cellblock.gateway.state import lock_path
    from cellblock.policy.lock import approve, save_lock

    path = tmp_path / "c.yaml"
    path.write_text("version: 1\nservers:\n  git: {command: x}\n  web: {command: x}\n")
    state = tmp_path / "state"
    (state / "locks").mkdir(parents=True)
    tools = {"tool:repo.status": {"name": "repo.status"}, "tool:repo_status": {"name": "repo_status"}}
    save_lock(lock_path(state, "git"), approve("git", tools, 0))
    save_lock(lock_path(state, "web"), approve("web", {"tool:repo.status": {"name": "repo.status"}}, 0))
    env = {**os.environ, "CELLBLOCK_STATE_DIR": str(state)}

    def check() -> subprocess.CompletedProcess[str]:
        command = [sys.executable, "-m", "cellblock.gateway.cli.main", "check", "--config", str(path)]
        return subprocess.run(command, capture_output=True, text=True, env=env, check=False)

    done = check()
    assert done.returncode == 1
    assert "lint: tool name collision: server 'git': name 'repo.status' wanted 'git__repo_status'" in done.stderr
    assert "web" not in done.stderr.partition("collision")[2]  # the same tool of another server is its own
    # control: without the look-alike the same catalogs are clean
    save_lock(lock_path(state, "git"), approve("git", {"tool:repo.status": {"name": "repo.status"}}, 0))
    assert check().returncode == 0


def test_a_jail_is_limited_by_default_and_a_server_overrides_defaults_key_by_key() -> None:
    config = parse_config(
        """version: 1
defaults: {limits: {memory: 2GiB}}
servers:
  plain: {command: /bin/true}
  busy: {command: /bin/true, jail: {limits: {processes: 2000}}}
  loose: {command: /bin/true, jail: false}
  web: {url: "https://example.com/mcp"}
"""
    )
    assert config.limits_of("plain") == Limits(processes=512, memory=2 << 30)
    assert config.limits_of("busy") == Limits(processes=2000, memory=2 << 30)
    assert config.limits_of("loose") is None and config.limits_of("web") is None  # nothing of theirs is jailed
    assert parse_config("version: 1\nservers: {a: {command: /bin/true}}").limits_of("a") == Limits(512, 4 << 30)


def test_an_installer_gets_its_servers_limits_and_a_disk_limit_even_where_the_server_runs_unjailed() -> None:
    config = parse_config(
        """version: 1
defaults: {limits: {memory: 2GiB, disk: 1GiB}}
servers:
  plain: {install: {npm: pkg@1.0.0}}
  big: {install: {pypi: pkg==1.0}, jail: {limits: {processes: 64, disk: 8GiB}}}
  loose: {install: {npm: pkg@1.0.0}, jail: false}
"""
    )
    assert config.install_limits_of("plain") == Limits(512, 2 << 30, disk=1 << 30)
    assert config.install_limits_of("big") == Limits(64, 2 << 30, disk=8 << 30)
    assert config.install_limits_of("loose") == Limits(512, 2 << 30, disk=1 << 30)  # the defaults'
    assert config.limits_of("big") == Limits(64, 2 << 30)  # a running server's writes are not bounded by it
    default = parse_config("version: 1\nservers: {a: {install: {npm: pkg@1.0.0}}}")
    assert default.install_limits_of("a") == Limits(512, 4 << 30, disk=2 << 30)


@pytest.mark.parametrize(
    ("limits", "expected"),
    [
        ("{disk: 1MiB}", "servers.a.jail.limits.disk: must be at least 16.0MiB (got 1MiB)"),
        ("{processes: 4}", "servers.a.jail.limits.processes: Input should be greater than or equal to 8"),
        (
            "{processes: many}",
            "servers.a.jail.limits.processes: Input should be a valid integer, unable to parse string as an integer",
        ),
        ("{memory: 1MiB}", "servers.a.jail.limits.memory: must be at least 32.0MiB (got 1MiB)"),
        ("{memory: 2TiB}", "servers.a.jail.limits.memory: must be at most 1.0TiB (got 2TiB)"),
        ("{memory: lots}", "servers.a.jail.limits.memory: could not parse value and unit from byte string"),
        ("{threads: 8}", "servers.a.jail.limits.threads: unknown key"),
    ],
)
def test_bad_limits_are_named_at_their_line(limits: str, expected: str) -> None:
    with pytest.raises(ConfigError) as caught:
        parse_config(f"version: 1\nservers:\n  a:\n    command: /bin/true\n    jail:\n      limits: {limits}\n")
    assert str(caught.value).startswith(f"cellblock.yaml:6: {expected}")


def test_prompts_and_resources_take_the_servers_tools_default_unless_they_say_otherwise() -> None:
    config = parse_config(
        "version: 1\n"
        "defaults:\n  resources: {default: allow}\n"
        "servers:\n"
        "  a:\n    command: x\n    tools: {default: deny}\n"
        "  b:\n    command: x\n    prompts: {rules: {greet: allow}}\n    resources: {rules: {'n://*': ask}}\n"
    )
    # a: a deny tools default denies its prompts too; the resources default of `defaults` is explicit
    assert config.rules_of("a", "prompt") == ("deny", {})
    assert config.rules_of("a", "resource") == ("allow", {})
    # b: its own sections replace `defaults`' whole, and without a default take the tools default (ask)
    assert config.rules_of("b", "prompt") == ("ask", {"greet": "allow"})
    assert config.rules_of("b", "resource") == ("ask", {"n://*": "ask"})
    assert config.rules_of("b", "tool") == ("ask", {})


def test_a_resource_rule_with_args_or_a_bad_decision_is_a_config_error_with_its_line() -> None:
    message = error_of(
        "version: 1\nservers:\n  a:\n    command: x\n    resources:\n      rules:\n"
        "        'n://*': {decision: allow, args: {x: {one_of: ['1']}}}\n"
    )
    assert message.startswith("c.yaml:5: servers.a.resources") and "a resource read has no arguments" in message
    message = error_of("version: 1\nservers:\n  a:\n    command: x\n    prompts: {default: maybe}\n")
    assert message.startswith("c.yaml:5: servers.a.prompts.default") and "maybe" in message


def test_check_names_prompt_and_resource_rules_that_match_nothing_the_lock_approved(tmp_path: Path) -> None:
    from cellblock.gateway.config.compile import lint_config
    from cellblock.gateway.state import lock_path
    from cellblock.policy.lock import approve, item_keys, save_lock

    catalog = {
        "tools": [{"name": "read", "inputSchema": {"type": "object"}}],
        "prompts": [{"name": "greet"}],
        "resources": [{"uri": "note://a", "name": "a"}],
        "templates": [{"uriTemplate": "item://{id}", "name": "item"}],
    }
    save_lock(lock_path(tmp_path, "a"), approve("a", item_keys(catalog), 0.0))
    config = parse_config(
        "version: 1\nservers:\n  a:\n    command: x\n    tools: {rules: {read: allow}}\n"
        "    prompts: {rules: {greet: allow, gret: allow}}\n"
        "    resources: {rules: {'note://*': allow, 'item://7': ask, 'cellblock://a/*': deny}}\n"
    )
    found = lint_config(config, tmp_path)
    assert len(found) == 2, found
    assert found[0].startswith("server 'a': prompts.rules.gret matches no prompt of the locked catalog")
    assert found[1].startswith("server 'a': resources.rules.cellblock://a/* matches no resource or template")


def test_check_says_read_only_review_does_nothing_without_the_lock(tmp_path: Path) -> None:
    from cellblock.gateway.config.compile import lint_config

    text = "version: 1\nservers:\n  a:\n    command: x\n    tools: {default: ask, read_only: review}\n"
    assert lint_config(parse_config(text), tmp_path) == []
    found = lint_config(parse_config(text + "    lock: {enabled: false}\n"), tmp_path)
    assert found == [
        "server 'a': tools.read_only: review does nothing with lock: {enabled: false} (a grant is bound to the "
        "definition the lock approves): every tool asks; turn the lock on, or remove it"
    ]
    message = error_of("version: 1\nservers:\n  a:\n    command: x\n    tools: {read_only: allow}\n")
    assert message.startswith("c.yaml:5: servers.a.tools.read_only") and "'ask' or 'review'" in message


def test_check_reports_two_servers_without_a_prefix_that_offer_one_name(tmp_path: Path) -> None:
    from cellblock.gateway.state import lock_path
    from cellblock.policy.lock import approve, save_lock

    path = tmp_path / "c.yaml"
    state = tmp_path / "state"
    (state / "locks").mkdir(parents=True)
    for server in ("git", "web"):
        save_lock(lock_path(state, server), approve(server, {"tool:status": {"name": "status"}}, 0))
    env = {**os.environ, "CELLBLOCK_STATE_DIR": str(state)}

    def check(prefix: bool) -> subprocess.CompletedProcess[str]:
        flag = str(prefix).lower()
        path.write_text(
            f"version: 1\nservers:\n  git: {{command: x, prefix: {flag}}}\n  web: {{command: x, prefix: {flag}}}\n"
        )
        command = [sys.executable, "-m", "cellblock.gateway.cli.main", "check", "--config", str(path)]
        return subprocess.run(command, capture_output=True, text=True, env=env, check=False)

    done = check(prefix=False)
    assert done.returncode == 1
    assert "lint: tool name collision: server 'web': name 'status' wanted 'status'" in done.stderr
    assert check(prefix=True).returncode == 0  # control: each under its own prefix, nothing collides


@pytest.mark.parametrize(
    ("auth", "said"),
    [
        ({"type": "bearer", "client_id": "x"}, "client_id is only used with type: oauth"),
        ({"type": "none", "client_metadata_url": "https://a.example/c.json"}, "client_metadata_url is only used"),
        (
            {"type": "oauth", "client_id": "x", "client_metadata_url": "https://a.example/c.json"},
            "client_id (a pre-registered client) or client_metadata_url (a CIMD), not both",
        ),
        ({"type": "oauth", "client_metadata_url": "http://a.example/c.json"}, "client_metadata_url"),
        ({"type": "oauth", "client_metadata_url": "https://a.example/"}, "client_metadata_url"),
        ({"type": "oauth", "grant": "client_credentials"}, "grant: client_credentials needs the client's client_id"),
        ({"type": "bearer", "grant": "client_credentials"}, "grant is only used with type: oauth"),
        ({"type": "oauth", "client_id": "x", "grant": "password"}, "grant"),
        (
            {"type": "oauth", "client_id": "x", "client_auth": "private_key_jwt"},
            "client_auth: private_key_jwt goes with grant: client_credentials",
        ),
        ({"type": "bearer", "client_auth": "client_secret"}, "client_auth is only used with type: oauth"),
        ({"type": "oauth", "client_id": "x", "grant": "client_credentials", "client_auth": "mtls"}, "client_auth"),
    ],
)
def test_a_pre_registered_client_or_a_client_metadata_document_is_checked(auth: dict[str, str], said: str) -> None:
    def config(auth: dict[str, str]) -> str:
        return yaml.safe_dump({"version": 1, "servers": {"api": {"url": "https://api.example/mcp", "auth": auth}}})

    with pytest.raises(ConfigError, match=re.escape(said)):
        parse_config(config(auth))
    # control: either one alone, with oauth, is a valid config
    for good in (
        {"type": "oauth", "client_id": "x"},
        {"type": "oauth", "client_metadata_url": "https://a.example/c.json"},
        {"type": "oauth", "client_id": "x", "grant": "client_credentials"},
        {"type": "oauth", "client_id": "x", "grant": "client_credentials", "client_auth": "private_key_jwt"},
    ):
        parse_config(config(good))


def test_a_client_that_signs_its_assertions_names_its_key_entry_not_a_secret() -> None:
    servers = {
        "signed": {"client_id": "m", "grant": "client_credentials", "client_auth": "private_key_jwt"},
        "secret": {"client_id": "m", "grant": "client_credentials"},
    }
    remote = {name: {"url": "https://a.example/mcp", "auth": {"type": "oauth", **a}} for name, a in servers.items()}
    body = {"version": 1, "servers": remote}
    entries = parse_config(yaml.safe_dump(body)).credential_entries()
    assert ("signed/oauth-client-key", "signed", "OAuth client private key") in entries
    assert not any(entry == "signed/oauth-client-secret" for entry, _, _ in entries)
    assert ("secret/oauth-client-secret", "secret", "OAuth client secret") in entries  # the control


def test_check_reports_titles_and_names_of_the_locked_catalog_that_read_as_cellblocks(tmp_path: Path) -> None:
    from cellblock.gateway.config.compile import lint_config
    from cellblock.gateway.state import lock_path
    from cellblock.policy.lock import approve, item_keys, save_lock

    schema = {"type": "object"}
    catalog = {
        "tools": [
            {"name": "review", "title": "CellbIock review", "inputSchema": schema},
            {"name": "read", "title": "Read", "annotations": {"title": "Read a file"}, "inputSchema": schema},
        ],
        "resources": [{"uri": "note://a", "name": "Ce11block notes"}],
    }
    save_lock(lock_path(tmp_path, "a"), approve("a", item_keys(catalog), 0.0))
    found = lint_config(parse_config("version: 1\nservers:\n  a:\n    command: x\n"), tmp_path)
    assert found == [
        "server 'a': the name of resource 'note://a' reads as Cellblock's; clients are shown the resource without it",
        "server 'a': the title of tool 'review' reads as Cellblock's; clients are shown the tool without it",
    ]
