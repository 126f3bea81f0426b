"""`cellblock wrap` / `unwrap`: each client format wrapped to the golden files, secrets moved to a
real (private) keyring and back, and every refusal leaving files and keyring as they were.

The golden inputs are tests/gateway/clients/golden/clients/<stem>.in.*; the outputs are
tests/gateway/clients/golden/wrap/<stem>.client.* (the wrapped client file) and <stem>.cellblock.yaml
(the generated gateway config). Regenerate them with CELLBLOCK_UPDATE_GOLDEN=1, then read every
diff: a golden is only as right as the review it got. The update refuses to write a golden that
holds a secret value.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import stat
from collections.abc import Iterator
from io import StringIO
from pathlib import Path
from typing import Any

import keyring
import keyring.core
import pytest
import yaml
from keyring.errors import PasswordDeleteError

import cellblock.gateway.clients.plan as plan_module
import cellblock.gateway.config.browsers as browsers_module
from cellblock.gateway.clients.backups import is_project_file, kept
from cellblock.gateway.clients.entry import WrapError
from cellblock.gateway.clients.report import list_clients
from cellblock.gateway.clients.unwrap import unwrap
from cellblock.gateway.clients.wrap import plan_wrap, wrap
from cellblock.gateway.config.loading import parse_config

GOLDEN_IN = Path(__file__).parent / "golden" / "clients"
GOLDEN = Path(__file__).parent / "golden" / "wrap"
UPDATE = os.environ.get("CELLBLOCK_UPDATE_GOLDEN") == "1"
CELLBLOCK = "/opt/cellblock/bin/cellblock"
SERVE = ["serve", "--config", "/home/u/.config/cellblock/cellblock.yaml"]
HOME = "/home/u"
SERVICE = "cellblock"
PLACEHOLDER = re.compile(r"<keyring:cellblock/([A-Za-z0-9._-]+)>")

# golden stem -> where its format expects the file, inside the test's folder
PLACES = {
    "claude-desktop": "claude_desktop_config.json",
    "claude-code": ".mcp.json",
    "claude-code-user": ".claude.json",
    "cursor": ".cursor/mcp.json",
    "vscode": ".vscode/mcp.json",
    "windsurf": ".codeium/windsurf/mcp_config.json",
    "gemini": ".gemini/settings.json",
    "codex": ".codex/config.toml",
}
STEMS = list(PLACES)

# Every secret value in each golden input (read off the files by hand).
SECRETS = {
    "claude-desktop": ("ghp_not_a_real_token_0000", "lin_not_real", "notes_not_real"),
    "claude-code": ("sntrys_not_real", "hunter2"),
    "claude-code-user": ("sk_test_not_real",),
    "cursor": ("ctx7_not_real", "sk-not-real"),
    "vscode": ("pplx-not-real", "ghp_not_a_real_token_3333"),
    "windsurf": ("ghp_not_a_real_token_1111", "docs_not_real"),
    "gemini": ("dk_not_real", "ghp_not_a_real_token_2222"),
    "codex": ("docs_not_real", "sk-not-real"),
}
# The keyring entries the generated config names, and the value wrap must store in each (None: one
# the user fills with `cellblock auth set`, as the client took it from elsewhere).
KEYRING: dict[str, dict[str, str | None]] = {
    "claude-desktop": {
        "github-tools-v2-ete-github-token": "ghp_not_a_real_token_0000",
        "linear-bearer-token": "lin_not_real",  # `--header "Authorization: Bearer …"`: an argument's
        "notes": "notes_not_real",
    },
    "claude-code": {"sentry": "sntrys_not_real", "db-tools-prod-pgpassword": "hunter2"},
    "claude-code-user": {"stripe-stripe-secret-key": "sk_test_not_real"},
    "cursor": {"context7-context7-api-key": "ctx7_not_real", "local-files-ao-x-api-key": "sk-not-real"},
    "vscode": {"perplexity-legacy-key": "pplx-not-real", "github-remote-u-beta": "ghp_not_a_real_token_3333"},
    "windsurf": {
        "github-github-personal-access-token": "ghp_not_a_real_token_1111",
        "team-docs-unicode-x-api-key": "docs_not_real",
        "team-docs-unicode": None,  # `Authorization: Bearer ${env:DOCS_TOKEN}`
    },
    "gemini": {"git-deploy-key": "dk_not_real", "github-authorization": "ghp_not_a_real_token_2222"},
    "codex": {
        "docs-docs-token": "docs_not_real",
        "build-tools-v2-api-key": "sk-not-real",
        "figma": None,  # bearer_token_env_var: the user stores the token with `auth set figma`
    },
}


@pytest.fixture(autouse=True)
def fixed_gateway_command(monkeypatch: pytest.MonkeyPatch) -> None:
    """The client entry names a fixed cellblock, so the goldens do not depend on this machine's venv."""
    monkeypatch.setattr(plan_module, "gateway_command", lambda config: (CELLBLOCK, list(SERVE)))


@pytest.fixture(autouse=True)
def fixed_browser(monkeypatch: pytest.MonkeyPatch) -> None:
    """Debian's Chromium, whether or not this machine has it, for the browser-driving servers."""
    found = ("/usr/bin/chromium", ("/etc/chromium.d", "/etc/fonts"))
    monkeypatch.setattr(browsers_module, "find_browser", lambda draft: found)


@pytest.fixture(autouse=True)
def private_state(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> Path:
    """Cellblock's state directory, where wrap keeps every backup, private to the test."""
    state = tmp_path_factory.mktemp("state")
    state.chmod(0o700)
    monkeypatch.setenv("CELLBLOCK_STATE_DIR", str(state))
    return state


@pytest.fixture
def stored(keyring_env: object) -> Iterator[set[str]]:
    """Keyring entries a test lets wrap store; each is deleted afterwards."""
    entries: set[str] = set()
    yield entries
    for entry in entries:
        with contextlib.suppress(PasswordDeleteError):
            keyring.delete_password(SERVICE, entry)


def golden_input(stem: str) -> bytes:
    (path,) = GOLDEN_IN.glob(f"{stem}.in.*")
    return path.read_bytes()


def suffix(stem: str) -> str:
    return Path(PLACES[stem]).suffix


def place(folder: Path, stem: str, data: bytes | None = None) -> Path:
    """The golden input of `stem` (or `data`) written where its client reads it, under `folder`."""
    path = folder / PLACES[stem]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(golden_input(stem) if data is None else data)
    return path


def normalise(text: str, folder: Path) -> str:
    return text.replace(str(folder.resolve()), "<tmp>").replace(str(folder), "<tmp>")


def leaks(stem: str, *texts: str) -> list[str]:
    return [secret for secret in SECRETS[stem] if any(secret in text for text in texts)]


def check_golden(name: str, actual: str, stem: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        assert not leaks(stem, actual), f"not writing {name}: it holds a secret value"
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(actual.encode("utf-8"))
    assert actual == path.read_bytes().decode("utf-8")


def planned_entries(path: Path, config: Path) -> set[str]:
    """The keyring entries wrapping `path` would store."""
    return {secret.entry for _, secret in plan_wrap(path, config).secrets}


def snapshot(*paths: Path) -> dict[Path, tuple[bytes, int] | None]:
    """Each file's bytes and mtime, None when it is missing."""
    return {p: (p.read_bytes(), p.stat().st_mtime_ns) if p.exists() else None for p in paths}


def is_subsequence(lines: list[str], within: list[str]) -> bool:
    rest = iter(within)
    return all(any(line == other for other in rest) for line in lines)


@pytest.fixture
def no_home_u() -> None:
    """The goldens assume the paths under /home/u in the inputs do not exist (the starter looks)."""
    if Path(HOME).exists():
        pytest.skip(f"{HOME} exists on this machine; the goldens assume it does not")


# --- 1. golden files -----------------------------------------------------------------------------


@pytest.mark.parametrize("stem", STEMS)
def test_wrapping_each_client_gives_its_golden_client_file(stem: str, tmp_path: Path, no_home_u: None) -> None:
    plan = plan_wrap(place(tmp_path, stem), tmp_path / "cellblock.yaml", home=HOME)
    check_golden(f"{stem}.client{suffix(stem)}", normalise(plan.new_text, tmp_path), stem)


@pytest.mark.parametrize("stem", STEMS)
def test_wrapping_each_client_gives_its_golden_cellblock_yaml(stem: str, tmp_path: Path, no_home_u: None) -> None:
    plan = plan_wrap(place(tmp_path, stem), tmp_path / "cellblock.yaml", home=HOME)
    check_golden(f"{stem}.cellblock.yaml", normalise(plan.new_config_text, tmp_path), stem)


@pytest.mark.parametrize("stem", STEMS)
def test_the_generated_config_validates_and_every_server_is_strict(stem: str, tmp_path: Path) -> None:
    plan = plan_wrap(place(tmp_path, stem), tmp_path / "cellblock.yaml", home=HOME)
    config = parse_config(plan.new_config_text, "cellblock.yaml")
    assert sorted(config.servers) == sorted(m.starter.name for m in plan.moved)
    for name, server in yaml.safe_load(plan.new_config_text)["servers"].items():
        assert server["tools"] == {"default": "ask", "read_only": "review"}, name
        assert server["lock"] == {"first": "review"}, name
        if "command" in server:
            assert server["jail"]["network"] in ("none", "allowlist", "ask"), name
            assert set(server["jail"]) <= {"network", "allow_hosts", "read_only", "read_write"}, name


@pytest.mark.parametrize("stem", STEMS)
def test_no_secret_value_is_in_the_wrapped_file_the_config_the_backup_or_the_dry_run(
    stem: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    path = place(tmp_path, stem)
    config = tmp_path / "cellblock.yaml"
    plan = plan_wrap(path, config, home=HOME)
    out = StringIO()
    assert wrap(path, config, dry_run=True, out=out, install=False) == 0
    err = capsys.readouterr().err
    assert out.getvalue().strip() and "dry run: nothing changed" in err
    assert leaks(stem, plan.new_text, plan.new_config_text, plan.backup_text, out.getvalue(), err) == []


# --- 2. round trip through the real keyring ------------------------------------------------------


@pytest.mark.parametrize("stem", STEMS)
def test_wrap_stores_each_secret_under_the_entry_the_config_names_and_unwrap_restores_the_file(
    stem: str, tmp_path: Path, stored: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, config = place(tmp_path, stem), tmp_path / "cellblock.yaml"
    backup = kept(path)
    stored |= planned_entries(path, config)
    original = path.read_bytes()
    assert [e for e in KEYRING[stem] if keyring.get_password(SERVICE, e) is not None] == [], "left over"

    assert wrap(path, config, out=StringIO(), install=False) == 0

    wrapped = normalise(path.read_bytes().decode("utf-8"), tmp_path)
    assert wrapped == (GOLDEN / f"{stem}.client{suffix(stem)}").read_bytes().decode("utf-8")
    named = {entry for entry, _, _ in parse_config(config.read_text(), str(config)).credential_entries()}
    assert named == set(KEYRING[stem])
    assert {entry: keyring.get_password(SERVICE, entry) for entry in named} == KEYRING[stem]
    assert backup.exists()

    assert unwrap(path) == 0

    assert path.read_bytes() == original
    assert not backup.exists()
    assert "OK:" in capsys.readouterr().err


@pytest.mark.parametrize("stem", STEMS)
def test_the_backup_is_private_holds_no_secret_and_unwrap_removes_it(
    stem: str, tmp_path: Path, stored: set[str]
) -> None:
    path, config = place(tmp_path, stem), tmp_path / "cellblock.yaml"
    backup = kept(path)
    stored |= planned_entries(path, config)

    wrap(path, config, out=StringIO(), install=False)

    assert stat.S_IMODE(backup.stat().st_mode) == 0o600
    assert leaks(stem, backup.read_text(encoding="utf-8")) == []
    unwrap(path)
    assert not backup.exists()


@pytest.mark.parametrize("stem", STEMS)
def test_a_file_an_older_unwrap_left_with_references_gets_its_values_back_from_the_keyring(
    stem: str, tmp_path: Path, stored: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, config = place(tmp_path, stem), tmp_path / "cellblock.yaml"
    stored |= planned_entries(path, config)
    original = path.read_bytes()
    wrap(path, config, out=StringIO(), install=False)
    # what `unwrap` without --secrets used to leave: the backup's text, references and all, and no backup
    path.write_bytes(kept(path).read_bytes())
    for backup in (kept(path), path.with_name(path.name + ".bak")):
        backup.unlink(missing_ok=True)
    capsys.readouterr()

    assert unwrap(path) == 0

    assert path.read_bytes() == original
    err = capsys.readouterr().err
    if KEYRING[stem] and any(KEYRING[stem].values()):
        assert "written back" in err
    assert leaks(stem, err) == []


def test_wrapping_a_file_with_references_left_in_it_is_refused_naming_unwrap(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    entry = {"command": "/opt/t", "env": {"KEY": "<keyring:cellblock/t-key>"}}
    path.write_text(json.dumps({"mcpServers": {"t": entry}}))
    before = snapshot(path)

    with pytest.raises(WrapError, match=r"<keyring:cellblock/t-key>.*nothing changed.*cellblock unwrap"):
        wrap(path, tmp_path / "cellblock.yaml", out=StringIO(), install=False)

    assert snapshot(path) == before


def test_unwrap_refuses_when_an_entry_is_gone_and_changes_nothing(
    tmp_path: Path, stored: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, config = place(tmp_path, "claude-desktop"), tmp_path / "cellblock.yaml"
    stored |= planned_entries(path, config)
    wrap(path, config, out=StringIO(), install=False)
    keyring.delete_password(SERVICE, "notes")
    before = snapshot(path, kept(path), path.with_name(path.name + ".bak"))

    with pytest.raises(WrapError, match=r"keyring entry 'notes'.*nothing changed.*cellblock auth set notes") as refused:
        unwrap(path)

    assert snapshot(path, kept(path), path.with_name(path.name + ".bak")) == before
    assert leaks("claude-desktop", str(refused.value), capsys.readouterr().err) == []


def test_unwrap_refuses_with_no_usable_keyring_and_changes_nothing(tmp_path: Path, stored: set[str]) -> None:
    path, config = place(tmp_path, "gemini"), tmp_path / "cellblock.yaml"
    stored |= planned_entries(path, config)
    wrap(path, config, out=StringIO(), install=False)
    before = snapshot(path, kept(path))

    with pytest.MonkeyPatch.context() as patch:  # undone before `stored` cleans the real keyring
        patch.setattr(keyring.core, "_keyring_backend", keyring.core._keyring_backend)
        patch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
        keyring.core.init_backend()
        with pytest.raises(WrapError, match=r"cannot be used.*Nothing changed.*cellblock unwrap"):
            unwrap(path)

    assert snapshot(path, kept(path)) == before


def test_a_project_file_gets_the_portable_command_and_no_backup_beside_it(tmp_path: Path, stored: set[str]) -> None:
    path, config = place(tmp_path, "claude-code"), tmp_path / "cellblock.yaml"
    stored |= planned_entries(path, config)
    plan = plan_wrap(path, config, home=HOME)
    assert plan.project and plan.command == ("cellblock", ["serve", "--config", str(config)])
    assert any("belongs to a project" in note for note in plan.notes)

    wrap(path, config, out=StringIO(), install=False)

    assert not path.with_name(path.name + ".bak").exists()
    assert kept(path).exists()


def test_a_project_file_on_the_default_config_names_no_path_of_this_machine(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "somewhere" / "cellblock.yaml"
    monkeypatch.setenv("CELLBLOCK_CONFIG", str(config))
    plan = plan_wrap(place(tmp_path, "cursor"), config, home=HOME)
    assert plan.command == ("cellblock", ["serve"])
    user = plan_wrap(place(tmp_path, "claude-desktop"), config, home=HOME)
    assert not user.project and user.command == (CELLBLOCK, SERVE)


@pytest.mark.parametrize(
    ("kind", "where", "project"),
    [
        ("claude-code", ".mcp.json", True),
        ("cursor", ".cursor/mcp.json", True),
        ("vscode", ".vscode/mcp.json", True),
        ("gemini", ".gemini/settings.json", True),
        ("codex", ".codex/config.toml", True),
        ("claude-desktop", "claude_desktop_config.json", False),
        ("claude-code", ".claude.json", False),
    ],
)
def test_which_files_are_a_projects(kind: str, where: str, project: bool, tmp_path: Path) -> None:
    assert is_project_file(kind, tmp_path / "repo" / where, tmp_path) is project
    assert is_project_file(kind, tmp_path / where, tmp_path) is False  # the user's own, in the home


def test_a_clients_own_timeout_is_carried_over_in_cellblocks_unit(tmp_path: Path) -> None:
    path = tmp_path / ".codex" / "config.toml"
    path.parent.mkdir()
    path.write_text('[mcp_servers.t]\ncommand = "/opt/t"\ntool_timeout_sec = 90\nstartup_timeout_sec = 20\n')
    plan = plan_wrap(path, tmp_path / "cellblock.yaml", home=HOME)
    (moved,) = plan.moved
    assert moved.starter.config["timeout"] == 90
    assert "carried over: tool_timeout_sec=90 as timeout: 90" in moved.starter.notes
    assert any(n.startswith("not carried over: startup_timeout_sec=20") for n in moved.starter.notes)


def test_a_reused_server_names_the_client_keys_it_does_not_take(tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    first = tmp_path / "claude_desktop_config.json"
    first.write_text(json.dumps({"mcpServers": {"t": {"command": "/opt/t"}}}))
    wrap(first, config, out=StringIO(), install=False)
    second = tmp_path / ".gemini" / "settings.json"
    second.parent.mkdir()
    second.write_text(json.dumps({"mcpServers": {"t": {"command": "/opt/t", "timeout": 9000, "trust": True}}}))
    out = StringIO()
    wrap(second, config, out=out, install=False)
    assert "kept as it is: not carried over from" in out.getvalue()
    assert "timeout, trust" in out.getvalue()


# --- 3. safety -----------------------------------------------------------------------------------


@pytest.mark.parametrize("stem", STEMS)
def test_a_dry_run_changes_no_file_and_stores_nothing(
    stem: str, tmp_path: Path, stored: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, config = place(tmp_path, stem), tmp_path / "cellblock.yaml"
    backup = kept(path)
    entries = planned_entries(path, config)
    stored |= entries
    before = snapshot(path, config, backup)

    assert wrap(path, config, dry_run=True, out=StringIO(), install=False) == 0

    assert snapshot(path, config, backup) == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [PLACES[stem].split("/")[0]]
    assert {entry: keyring.get_password(SERVICE, entry) for entry in entries} == dict.fromkeys(entries)
    assert "dry run: nothing changed" in capsys.readouterr().err


def test_wrapping_a_wrapped_file_again_says_so_and_changes_nothing(
    tmp_path: Path, stored: set[str], capsys: pytest.CaptureFixture[str]
) -> None:
    path, config = place(tmp_path, "windsurf"), tmp_path / "cellblock.yaml"
    backup = kept(path)
    stored |= planned_entries(path, config)
    wrap(path, config, out=StringIO(), install=False)
    capsys.readouterr()
    before = snapshot(path, config, backup)

    out = StringIO()
    assert wrap(path, config, out=out, install=False) == 0

    assert "already wrapped" in capsys.readouterr().err
    assert out.getvalue() == ""
    assert snapshot(path, config, backup) == before


def test_an_existing_backup_is_never_overwritten(tmp_path: Path) -> None:
    path, config = place(tmp_path, "claude-code-user"), tmp_path / "cellblock.yaml"
    backup = path.with_name(path.name + ".bak")
    backup.write_text("an earlier backup\n")
    before = snapshot(path, config, backup)

    with pytest.raises(WrapError, match=r"\.claude\.json\.bak exists"):
        wrap(path, config, out=StringIO(), install=False)

    assert snapshot(path, config, backup) == before


def test_a_name_taken_by_another_server_in_cellblock_yaml_is_refused_naming_both(
    tmp_path: Path, stored: set[str]
) -> None:
    path = place(tmp_path, "windsurf")
    # the client's 'Team Docs.Ünïcode' becomes 'team-docs-unicode', taken here by a different server
    config = tmp_path / "cellblock.yaml"
    config.write_text("version: 1\nservers:\n  team-docs-unicode:\n    url: https://other.example.com/mcp\n")
    entries = {"github-github-personal-access-token", "team-docs-unicode-x-api-key"}
    stored |= entries
    before = snapshot(path, config, kept(path))

    with pytest.raises(WrapError, match="name clash, nothing changed") as caught:
        wrap(path, config, out=StringIO(), install=False)

    assert "'Team Docs.Ünïcode'" in str(caught.value) and "'team-docs-unicode'" in str(caught.value)
    assert snapshot(path, config, kept(path)) == before
    assert {entry: keyring.get_password(SERVICE, entry) for entry in entries} == dict.fromkeys(entries)


def test_the_same_server_from_a_second_client_is_reused_not_duplicated(tmp_path: Path) -> None:
    entry = {"command": "/usr/local/bin/notes-mcp", "args": ["--db", "notes.db"], "env": {"LOG_LEVEL": "info"}}
    first = tmp_path / "desktop" / "claude_desktop_config.json"
    first.parent.mkdir()
    first.write_text(json.dumps({"mcpServers": {"Notes": entry}}, indent=2))
    second = tmp_path / ".cursor" / "mcp.json"
    second.parent.mkdir()
    second.write_text(json.dumps({"mcpServers": {"notes": entry}}, indent=2))
    config = tmp_path / "cellblock.yaml"

    wrap(first, config, out=StringIO(), install=False)
    after_first = config.read_text()
    out = StringIO()
    wrap(second, config, out=out, install=False)

    assert list(yaml.safe_load(config.read_text())["servers"]) == ["notes"]
    assert config.read_text() == after_first
    assert "'notes' is already in" in out.getvalue()
    assert list(json.loads(second.read_text())["mcpServers"]) == ["cellblock"]


def test_reusing_a_server_never_swaps_the_second_clients_secret_for_the_first(tmp_path: Path, stored: set[str]) -> None:
    def client(folder: str, token: str) -> Path:
        path = tmp_path / folder / "claude_desktop_config.json"
        path.parent.mkdir()
        server = {"command": "/usr/local/bin/gh-mcp", "env": {"GITHUB_TOKEN": token}}
        path.write_text(json.dumps({"mcpServers": {"github": server}}, indent=2))
        return path

    first, second = client("a", "ghp_first_not_real_0000000"), client("b", "ghp_second_not_real_111111")
    config = tmp_path / "cellblock.yaml"
    stored |= planned_entries(first, config)
    original = second.read_bytes()
    wrap(first, config, out=StringIO(), install=False)

    with pytest.raises(WrapError, match="differs from keyring entry 'github-github-token'"):
        wrap(second, config, out=StringIO(), install=False)

    assert second.read_bytes() == original
    assert not kept(second).exists()
    assert keyring.get_password("cellblock", "github-github-token") == "ghp_first_not_real_0000000"


def test_a_file_that_starts_cellblock_and_other_servers_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "cellblock": {"command": CELLBLOCK, "args": SERVE},
                    "memory": {"command": "/usr/local/bin/memory-mcp"},
                }
            }
        )
    )
    config = tmp_path / "cellblock.yaml"
    before = snapshot(path, config)

    with pytest.raises(WrapError, match=r"also other servers \(memory\); unwrap it first"):
        wrap(path, config, out=StringIO(), install=False)

    assert snapshot(path, config) == before


@pytest.fixture
def no_keyring(monkeypatch: pytest.MonkeyPatch) -> None:
    """keyring's fail backend, as on a machine with no keyring at all; the earlier choice is restored."""
    monkeypatch.setattr(keyring.core, "_keyring_backend", keyring.core._keyring_backend)
    monkeypatch.setenv("PYTHON_KEYRING_BACKEND", "keyring.backends.fail.Keyring")
    keyring.core.init_backend()


def test_secrets_with_no_usable_keyring_are_refused_before_any_file_changes(tmp_path: Path, no_keyring: None) -> None:
    path, config = place(tmp_path, "gemini"), tmp_path / "cellblock.yaml"
    before = snapshot(path, config, kept(path))

    with pytest.raises(WrapError, match="secrets that must move to the keyring, nothing changed"):
        wrap(path, config, out=StringIO(), install=False)

    assert snapshot(path, config, kept(path)) == before


def test_a_client_without_secrets_wraps_with_no_keyring_at_all(tmp_path: Path, no_keyring: None) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": {"memory": {"command": "/usr/local/bin/memory-mcp"}}}))

    assert wrap(path, tmp_path / "cellblock.yaml", out=StringIO(), install=False) == 0

    assert list(json.loads(path.read_text())["mcpServers"]) == ["cellblock"]


@pytest.mark.parametrize("stem", ["vscode", "claude-code-user", "codex"])  # JSONC, several blocks, TOML
def test_a_crlf_file_survives_wrap_and_unwrap_byte_for_byte(stem: str, tmp_path: Path, stored: set[str]) -> None:
    crlf = golden_input(stem).replace(b"\r\n", b"\n").replace(b"\n", b"\r\n")
    path, config = place(tmp_path, stem, crlf), tmp_path / "cellblock.yaml"
    stored |= planned_entries(path, config)

    wrap(path, config, out=StringIO(), install=False)
    wrapped = path.read_bytes()
    unwrap(path)

    assert b"\n" not in wrapped.replace(b"\r\n", b""), "the wrapped file mixes line breaks"
    golden = (GOLDEN / f"{stem}.client{suffix(stem)}").read_bytes().decode("utf-8")
    assert normalise(wrapped.decode("utf-8"), tmp_path) == golden.replace("\n", "\r\n")
    assert path.read_bytes() == crlf


EXISTING_CONFIG = """\
# My gateway. Hand-edited: keep this.
version: 1

defaults:
  timeout: 90  # slow servers

servers:
  # the notes server I set up myself
  files:
    command: /usr/local/bin/files-mcp
    jail:
      network: none

# audit goes to my own place
audit:
  path: /tmp/cellblock-audit.jsonl
"""


def test_merging_into_an_existing_config_keeps_its_text_and_validates(tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    config.write_text(EXISTING_CONFIG)
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": {"memory": {"command": "/usr/local/bin/memory-mcp"}}}))

    wrap(path, config, out=StringIO(), install=False)

    text = config.read_text()
    assert is_subsequence(EXISTING_CONFIG.splitlines(), text.splitlines())
    assert list(parse_config(text, str(config)).servers) == ["files", "memory"]
    assert text.endswith("# audit goes to my own place\naudit:\n  path: /tmp/cellblock-audit.jsonl\n")


@pytest.mark.parametrize(
    "existing",
    [
        pytest.param(
            "version: 1\nservers:  # hand-picked\n  files:\n    command: /usr/local/bin/files-mcp\n",
            id="comment-on-the-servers-line",
        ),
        pytest.param(
            "version: 1\nservers:\n    files:\n        command: /usr/local/bin/files-mcp\n",
            id="four-space-indent",
        ),
    ],
)
def test_merging_keeps_every_existing_server_and_line(existing: str, tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    config.write_text(existing)
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": {"memory": {"command": "/usr/local/bin/memory-mcp"}}}))

    wrap(path, config, out=StringIO(), install=False)

    text = config.read_text()
    assert is_subsequence(existing.splitlines(), text.splitlines())
    assert list(parse_config(text, str(config)).servers) == ["files", "memory"]


def test_merging_into_an_inline_servers_mapping_is_refused(tmp_path: Path) -> None:
    config = tmp_path / "cellblock.yaml"
    existing = "version: 1\nservers: {files: {command: /usr/local/bin/files-mcp}}\n"
    config.write_text(existing)
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": {"memory": {"command": "/usr/local/bin/memory-mcp"}}}))
    before = path.read_bytes()

    with pytest.raises(WrapError, match="written inline"):
        wrap(path, config, out=StringIO(), install=False)

    assert config.read_text() == existing and path.read_bytes() == before


def vscode_file(project: Path, server: dict[str, Any]) -> Path:
    path = project / ".vscode" / "mcp.json"
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps({"servers": {"tool": {"type": "stdio", **server}}}, indent=2))
    return path


def test_workspace_folder_in_a_project_file_becomes_the_project_folder(tmp_path: Path) -> None:
    project = tmp_path / "proj"
    (project / "src").mkdir(parents=True)
    path = vscode_file(
        project,
        {
            "command": "${workspaceFolder}/bin/tool",
            "args": ["--root", "${workspaceFolder}/src"],
            "cwd": "${workspaceFolder}",
        },
    )

    plan = plan_wrap(path, tmp_path / "cellblock.yaml", home=HOME)

    server = yaml.safe_load(plan.new_config_text)["servers"]["tool"]
    assert server["command"] == f"{project}/bin/tool"
    assert server["args"] == ["--root", f"{project}/src"]
    assert server["cwd"] == str(project)
    assert server["jail"]["read_only"] == [f"{project}/src", str(project)]
    assert "${workspaceFolder}" not in plan.new_config_text


@pytest.mark.parametrize(
    "where",
    [".config/Code/User/mcp.json", ".cursor/mcp.json", "claude_desktop_config.json"],
    ids=["vscode-user", "cursor-user", "claude-desktop"],
)
def test_workspace_folder_in_a_user_level_file_is_refused(
    where: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    key = "servers" if "Code" in where else "mcpServers"
    path.write_text(json.dumps({key: {"Tool": {"command": "node", "args": ["${workspaceFolder}/index.js"]}}}))
    config = tmp_path / "cellblock.yaml"
    before = snapshot(path, config)

    with pytest.raises(WrapError, match=r"'Tool' in .* uses \$\{workspaceFolder\}, which only the client knows here"):
        wrap(path, config, out=StringIO(), install=False)

    assert snapshot(path, config) == before


@pytest.mark.parametrize(
    ("cwd", "expected"),
    [("tools/server", "proj/tools/server"), ("./tools", "proj/tools"), ("../shared", "shared")],
)
def test_a_relative_cwd_becomes_absolute_against_the_project_folder(cwd: str, expected: str, tmp_path: Path) -> None:
    path = vscode_file(tmp_path / "proj", {"command": "/usr/local/bin/tool", "cwd": cwd})

    plan = plan_wrap(path, tmp_path / "cellblock.yaml", home=HOME)

    assert yaml.safe_load(plan.new_config_text)["servers"]["tool"]["cwd"] == str(tmp_path / expected)


def test_the_client_files_mode_is_kept(tmp_path: Path) -> None:
    path = tmp_path / "claude_desktop_config.json"
    path.write_text(json.dumps({"mcpServers": {"memory": {"command": "/usr/local/bin/memory-mcp"}}}))
    path.chmod(0o640)

    wrap(path, tmp_path / "cellblock.yaml", out=StringIO(), install=False)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    unwrap(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o640


def test_a_symlinked_client_file_is_written_through_to_its_target(tmp_path: Path) -> None:
    target = tmp_path / "dotfiles" / "claude_desktop_config.json"
    target.parent.mkdir()
    original = json.dumps({"mcpServers": {"memory": {"command": "/usr/local/bin/memory-mcp"}}})
    target.write_text(original)
    link = tmp_path / "claude_desktop_config.json"
    link.symlink_to(target)

    wrap(link, tmp_path / "cellblock.yaml", out=StringIO(), install=False)
    assert link.is_symlink() and link.resolve() == target
    assert list(json.loads(target.read_text())["mcpServers"]) == ["cellblock"]

    unwrap(link)
    assert link.is_symlink() and link.resolve() == target
    assert target.read_text() == original


@pytest.mark.parametrize(
    ("where", "text", "secret"),
    [
        (
            "claude_desktop_config.json",
            '{"mcpServers": {"db": {"command": "/usr/bin/db-mcp", "env": {"DB_PASSWORD": "pässwört-geheim"}}}}',
            "pässwört-geheim",
        ),
        (
            "claude_desktop_config.json",
            '{"mcpServers": {"db": {"command": "/usr/bin/db-mcp", "env": {"DB_PASSWORD": "ab\\/cd-geheim"}}}}',
            "cd-geheim",
        ),
        (
            ".codex/config.toml",
            "[mcp_servers.db]\ncommand = '/usr/bin/db-mcp'\nenv = { DB_PASSWORD = 'C:\\vault\\geheim' }\n",
            "geheim",
        ),
    ],
    ids=["non-ascii-json", "escaped-slash-json", "toml-literal-string"],
)
def test_a_secret_however_it_is_written_is_not_in_the_backup(
    where: str, text: str, secret: str, tmp_path: Path
) -> None:
    path = tmp_path / where
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)

    plan = plan_wrap(path, tmp_path / "cellblock.yaml", home=HOME)

    assert [s.key for _, s in plan.secrets] == ["DB_PASSWORD"]
    assert secret not in plan.backup_text


# --- 4. list ------------------------------------------------------------------------------------


def test_list_clients_says_which_configs_are_wrapped(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    home, project = tmp_path / "home", tmp_path / "proj"
    project.mkdir()
    wrapped = home / ".cursor" / "mcp.json"
    wrapped.parent.mkdir(parents=True)
    wrapped.write_text(json.dumps({"mcpServers": {"memory": {"command": "/usr/local/bin/memory-mcp"}}}))
    wrap(wrapped, tmp_path / "cellblock.yaml", out=StringIO(), install=False)
    plain = home / ".codeium" / "windsurf" / "mcp_config.json"
    plain.parent.mkdir(parents=True)
    plain.write_text(json.dumps({"mcpServers": {"a": {"command": "/bin/a"}, "b": {"url": "https://b.example/mcp"}}}))
    partly = project / ".gemini" / "settings.json"
    partly.parent.mkdir()
    cellblock = {"command": CELLBLOCK, "args": SERVE}
    partly.write_text(json.dumps({"mcpServers": {"cellblock": cellblock, "git": {"command": "/bin/git-mcp"}}}))
    capsys.readouterr()
    out = StringIO()

    assert list_clients(home, project, out) == 0

    assert out.getvalue().splitlines() == [
        f"cursor\twrapped\t{wrapped}",
        f"windsurf\t2 server(s), not wrapped\t{plain}",
        f"gemini\tpartly wrapped (1 other servers)\t{partly}",
    ]


def test_list_clients_says_when_it_finds_none(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = StringIO()

    assert list_clients(tmp_path, tmp_path, out) == 0

    assert out.getvalue() == ""
    assert "no known MCP client config found here" in capsys.readouterr().err
