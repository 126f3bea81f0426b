"""wrap's browser for a server that drives one: which browser, what it shares, how the server is told."""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
import yaml

from cellblock.gateway.config import browsers
from cellblock.gateway.config.loading import parse_config
from cellblock.gateway.config.starter import starter
from tests.gateway.config.test_starter import Entry

PLAYWRIGHT = "@playwright/mcp@0.0.86"
PUPPETEER = "@modelcontextprotocol/server-puppeteer@2025.5.12"


def _executable(path: Path) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("#!/bin/sh\n")
    path.chmod(0o755)
    return str(path)


@pytest.fixture
def system(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[str, str, str]:
    """A system Chromium (program, the directory its wrapper reads) and fonts, none of this machine's."""
    program = _executable(tmp_path / "usr/bin/chromium")
    (tmp_path / "etc/chromium.d").mkdir(parents=True)
    (tmp_path / "etc/fonts").mkdir()
    monkeypatch.setattr(browsers, "SYSTEM_BROWSERS", ((program, (str(tmp_path / "etc/chromium.d"),)),))
    monkeypatch.setattr(browsers, "FONTS", str(tmp_path / "etc/fonts"))
    return program, str(tmp_path / "etc/chromium.d"), str(tmp_path / "etc/fonts")


def _wrap(home: Path, *args: str, env: Mapping[str, str] | None = None) -> tuple[dict[str, Any], tuple[str, ...]]:
    result = starter("browser", Entry(command="npx", args=("-y", *args), env=env or {}), taken=set(), home=str(home))
    parse_config(yaml.safe_dump({"version": 1, "servers": {result.name: result.config}}))
    return result.config, result.notes


def test_playwrights_server_runs_the_system_chromium_headless_without_its_own_sandbox(
    tmp_path: Path, system: tuple[str, str, str]
) -> None:
    program, reads, fonts = system
    config, notes = _wrap(tmp_path / "home", PLAYWRIGHT)
    assert config["args"] == ["--headless", "--no-sandbox", "--executable-path", program]
    # the pages it is sent to cannot be known: each new host is asked about
    assert config["jail"] == {"network": "ask", "read_only": [reads, fonts]}
    assert any(f"drives a browser: it runs {program}, headless" in n and "remove --headless" in n for n in notes)


def test_what_the_entry_says_of_its_browser_is_kept(tmp_path: Path, system: tuple[str, str, str]) -> None:
    config, _ = _wrap(tmp_path / "home", PLAYWRIGHT, "--headless", "--executable-path=/srv/chrome")
    assert config["args"] == ["--headless", "--executable-path=/srv/chrome", "--no-sandbox"]


def test_without_a_system_browser_the_newest_in_playwrights_cache_is_shared(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(browsers, "SYSTEM_BROWSERS", ())
    monkeypatch.setattr(browsers, "FONTS", str(tmp_path / "no-fonts"))
    home = tmp_path / "home"
    cache = home / ".cache/ms-playwright"
    _executable(cache / "chromium-999/chrome-linux/chrome")
    newest = _executable(cache / "chromium-1200/chrome-linux64/chrome")
    config, _ = _wrap(home, PLAYWRIGHT)
    assert config["args"][-2:] == ["--executable-path", newest]
    assert config["jail"]["read_only"] == ["~/.cache/ms-playwright/chromium-1200"]


def test_a_server_told_to_run_another_browser_than_chromium_is_left_as_it_is(
    tmp_path: Path, system: tuple[str, str, str]
) -> None:
    config, notes = _wrap(tmp_path / "home", PLAYWRIGHT, "--browser=firefox")
    assert config["args"] == ["--browser=firefox"] and "read_only" not in config["jail"]
    assert any("runs firefox, for which wrap names no browser" in n for n in notes)
    config, _ = _wrap(tmp_path / "home", PLAYWRIGHT, "--browser", "chromium")
    assert config["args"][:2] == ["--browser", "chromium"] and config["args"][-1] == system[0]


def test_puppeteers_server_gets_its_launch_options_in_its_environment(
    tmp_path: Path, system: tuple[str, str, str]
) -> None:
    program, reads, fonts = system
    config, _ = _wrap(tmp_path / "home", PUPPETEER)
    assert "args" not in config
    options = json.loads(config["env"]["PUPPETEER_LAUNCH_OPTIONS"])
    assert options == {"headless": True, "executablePath": program, "args": ["--no-sandbox"]}
    assert config["env"]["ALLOW_DANGEROUS"] == "true"  # the server refuses --no-sandbox without it
    assert config["jail"]["read_only"] == [reads, fonts]


def test_with_no_browser_the_note_says_what_to_install(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(browsers, "SYSTEM_BROWSERS", ())
    config, notes = _wrap(tmp_path / "home", PLAYWRIGHT)
    assert "args" not in config and "read_only" not in config["jail"]
    assert any("none was found that the jail can run: install Chromium" in n for n in notes)


def test_a_server_that_drives_no_browser_gets_none(tmp_path: Path, system: tuple[str, str, str]) -> None:
    config, notes = _wrap(tmp_path / "home", "@modelcontextprotocol/server-memory@2026.8.31")
    assert "read_only" not in config["jail"] and "args" not in config
    assert not any("drives a browser" in n for n in notes)
