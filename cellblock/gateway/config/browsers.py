"""A browser for a server that drives one (`@playwright/mcp`, puppeteer's servers), as wrap writes it.

Such a server looks for Chrome where the user's system keeps it (`/opt/google/chrome`), which the
jail does not show, and starts it with a window and its own sandbox. wrap picks a browser the jail
can run, shares read-only what it needs besides `/usr` (which every jail shows whole), and tells
the server to run it headless and with Chromium's own sandbox off: Chromium's sandbox needs a user
namespace of its own, which the jail forbids (`--disable-userns`), and the jail is the sandbox.
"""

from __future__ import annotations

import glob
import json
import os
from collections.abc import Mapping, Sequence
from typing import Literal

from cellblock.gateway.config.draft import Draft
from cellblock.sandbox.backends import choose

__all__ = ["DRIVERS", "FONTS", "SYSTEM_BROWSERS", "browser_for", "find_browser"]

# Package -> how it is told which browser to run, and how: by its arguments (Playwright's MCP
# server: --executable-path, --headless, --no-sandbox) or puppeteer's launch options in its
# environment (the reference server reads PUPPETEER_LAUNCH_OPTIONS, and refuses --no-sandbox there
# unless ALLOW_DANGEROUS is set).
DRIVERS: Mapping[str, Literal["playwright", "puppeteer"]] = {
    "@playwright/mcp": "playwright",
    "@modelcontextprotocol/server-puppeteer": "puppeteer",
}
# A system's browsers the jail can run, first found wins: (program, what it reads outside /usr).
# Debian's /usr/bin/chromium is a shell script that sources /etc/chromium.d and runs
# /usr/lib/chromium/chromium; Google's Chrome lives whole in /opt/google/chrome.
SYSTEM_BROWSERS: Sequence[tuple[str, tuple[str, ...]]] = (
    ("/usr/bin/chromium", ("/etc/chromium.d",)),
    ("/opt/google/chrome/chrome", ("/opt/google/chrome",)),
)
# Fontconfig's configuration: without it a page renders with no fonts.
FONTS = "/etc/fonts"
# Playwright's own downloads (`npx playwright install chromium`), newest revision first.
PLAYWRIGHT_CACHE = "~/.cache/ms-playwright"
_CACHED = ("chromium-*/chrome-linux*/chrome", "chromium_headless_shell-*/chrome-linux*/headless_shell")


def find_browser(draft: Draft) -> tuple[str, tuple[str, ...]] | None:
    """(the browser program, the paths to share read-only for it), or None when there is none:
    the system's Chromium or Chrome, else the newest Chromium in Playwright's cache."""
    for program, reads in SYSTEM_BROWSERS:
        if os.access(program, os.X_OK):
            return program, tuple(p for p in (*reads, FONTS) if os.path.exists(p))
    cache = draft.expand(PLAYWRIGHT_CACHE)
    found = sorted((p for pattern in _CACHED for p in glob.glob(os.path.join(cache, pattern))), key=_revision)
    for program in reversed(found):
        if os.access(program, os.X_OK):
            build = os.path.dirname(os.path.dirname(program))  # chromium-NNNN
            return program, (build, *((FONTS,) if os.path.exists(FONTS) else ()))
    return None


def browser_for(draft: Draft, package: str, args: list[str], env: dict[str, str]) -> list[str]:
    """`args` of a server that drives a browser, told which one to run headless with no sandbox of
    its own; its shares in `draft`, a note for each choice. Other servers' `args` as they are."""
    driver = DRIVERS.get(package)
    if driver is None:
        return args
    chosen = _option(args, "--browser")
    if chosen is not None and not chosen.startswith(("chrome", "chromium", "msedge")):
        draft.notes.append(
            f"{package} runs {chosen}, for which wrap names no browser: the jail has none unless you share it "
            "(jail.read_only), and it runs headless only with --headless"
        )
        return args
    found = find_browser(draft)
    if found is None:
        draft.notes.append(
            f"{package} drives a browser and none was found that the jail can run: install Chromium "
            "(Debian/Ubuntu: apt-get install chromium) or `npx playwright install chromium`, then wrap again"
        )
        return args
    program, reads = found
    for path in reads:
        draft.share(_tilde(draft, path), writable=False)
    shared = ", ".join(_tilde(draft, p) for p in reads)
    if driver == "playwright":
        told = [a for a in ("--headless", "--no-sandbox") if a not in args]
        if _option(args, "--executable-path") is None:
            told += ["--executable-path", program]
        args = [*args, *told]
        display = "remove --headless"
    else:
        options = {"headless": True, "executablePath": program, "args": ["--no-sandbox"]}
        env.setdefault("PUPPETEER_LAUNCH_OPTIONS", json.dumps(options, separators=(",", ":")))
        env.setdefault("ALLOW_DANGEROUS", "true")  # the server's word for accepting --no-sandbox
        display = 'set "headless": false in PUPPETEER_LAUNCH_OPTIONS'
    draft.notes.append(
        f"{package} drives a browser: it runs {program}, headless, with Chromium's own sandbox off "
        f"(the jail is its sandbox; it forbids the user namespace Chromium's needs); read_only: {shared}. "
        f"To see its window, {display} and share your display (jail.read_only: /tmp/.X11-unix, "
        "env DISPLAY)"
    )
    if choose(package, "auto").backend == "landlock":
        draft.notes.append(
            f"{package} cannot start its browser on this machine: namespaces are refused here, so its jail is "
            "Landlock's, and Chromium needs Unix sockets of its own, which a Landlock jail may not make (before "
            "Landlock ABI 9 one could reach any socket of the host); let bubblewrap build jails here ('cellblock "
            "doctor' names the fix), and it runs"
        )
    return args


def _option(args: Sequence[str], name: str) -> str | None:
    """The value of option `name` in `args` (`--name VALUE` or `--name=VALUE`), None if absent."""
    for index, arg in enumerate(args):
        if arg.startswith(name + "="):
            return arg.partition("=")[2]
        if arg == name and index + 1 < len(args):
            return args[index + 1]
    return None


def _tilde(draft: Draft, path: str) -> str:
    home = draft.home.rstrip("/")
    return "~" + path[len(home) :] if path == home or path.startswith(home + "/") else path


def _revision(program: str) -> int:
    """The revision in `.../chromium-NNNN/...`, to take the newest download."""
    build = os.path.basename(os.path.dirname(os.path.dirname(program)))
    digits = build.rpartition("-")[2]
    return int(digits) if digits.isdigit() else -1
