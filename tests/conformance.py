"""The official MCP conformance suite's scenarios: servers directly and through Cellblock, clients too.

Run as ``python -m tests.conformance [--write]`` from the repository root (it needs the suite,
`@modelcontextprotocol/conformance` from ``./dev peers``, bubblewrap, and dbus-daemon with
gnome-keyring for the gateway's private keyring). Every server scenario of the suite is run

- directly against ``tests/servers/conformance.py --http PORT`` (the SDK's Streamable HTTP server), and
- against ``cellblock serve --http`` with that server as a local server on stdio in its jail
  (``prefix: false``, a policy that allows everything, no lock, ``sampling: allow``),

and the checks each passed are printed as a markdown table. Every client scenario is run

- with the SDK's own client, and
- with Cellblock as the client (``auth login``, then ``serve`` on stdio driven by the SDK's client),

both by tests/conformance_client.py, into a second table. ``--write`` puts the tables into
docs/protocol.md between ``<!-- conformance:begin -->`` and ``<!-- conformance:end -->``, and between
``<!-- conformance-client:begin -->`` and ``<!-- conformance-client:end -->``; ``--only server|client``
runs one half.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests import peers
from tests.conftest import private_secret_service
from tests.integration.test_http import serving

ROOT = Path(__file__).resolve().parent.parent
SERVER = ROOT / "tests" / "servers" / "conformance.py"
DOC = ROOT / "docs" / "protocol.md"
BEGIN, END = "<!-- conformance:begin -->", "<!-- conformance:end -->"
CLIENT_MARKERS = ("<!-- conformance-client:begin -->", "<!-- conformance-client:end -->")
SCENARIO_TIMEOUT = 60.0
# How long the suite lets a client command run: Cellblock as the client is three Python start-ups.
CLIENT_TIMEOUT = 60.0
# A results directory is `server-<scenario>-<ISO timestamp>`.
RESULT_DIR = re.compile(r"^server-(?P<scenario>.+)-\d{4}-\d\d-\d\dT")


@dataclass(frozen=True)
class Outcome:
    """The checks of one scenario run: SUCCESS, FAILURE and WARNING (INFO checks are not counted)."""

    passed: int = 0
    failed: int = 0
    warnings: int = 0
    errors: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return self.failed == 0 and self.passed > 0

    def cell(self) -> str:
        text = f"{self.passed}/{self.passed + self.failed}"
        if self.warnings:
            text += f", {self.warnings} warning{'s' if self.warnings > 1 else ''}"
        return text


def server_scenarios() -> list[str]:
    """The suite's server scenarios, in the order `conformance list` gives them."""
    return _scenarios("Server scenarios")


def client_scenarios() -> list[str]:
    """The suite's client scenarios, in the order `conformance list` gives them."""
    return _scenarios("Client scenarios")


def _scenarios(kind: str) -> list[str]:
    listing = subprocess.run([*peers.conformance(), "list"], capture_output=True, text=True, check=True).stdout
    names: list[str] = []
    section = ""
    for line in listing.splitlines():
        if line.strip().endswith(":"):
            section = line.strip()
        elif section.startswith(kind) and line.strip().startswith("- "):
            names.append(line.strip()[2:].split()[0])
    return names


def _outcome(checks: list[dict[str, Any]]) -> Outcome:
    statuses = [str(check.get("status")) for check in checks]
    errors = tuple(
        f"{check.get('id')}: {check.get('errorMessage')}"
        for check in checks
        if check.get("status") in ("FAILURE", "WARNING")
    )
    return Outcome(statuses.count("SUCCESS"), statuses.count("FAILURE"), statuses.count("WARNING"), errors)


def run_scenario(url: str, scenario: str) -> Outcome:
    """One scenario against `url`, read from the JSON results the suite saves."""
    command = ["server", "--url", url, "--scenario", scenario]
    return _run(command, {}, SCENARIO_TIMEOUT, lambda path: bool(RESULT_DIR.match(path.parent.name)))


def run_client_scenario(via: str, scenario: str, env: Mapping[str, str]) -> Outcome:
    """One client scenario with tests/conformance_client.py VIA (`direct` or `cellblock`) as the client.

    `env` is added to the client's environment (for `cellblock`, that of a gateway: see gateway_env).
    """
    command = f"{sys.executable} -m tests.conformance_client {via}"
    timeout = f"{CLIENT_TIMEOUT * 1000:.0f}"
    args = ["client", "--command", command, "--scenario", scenario, "--timeout", timeout]
    return _run(args, env, SCENARIO_TIMEOUT + CLIENT_TIMEOUT, None)


def _run(args: list[str], env: Mapping[str, str], seconds: float, wanted: Callable[[Path], bool] | None) -> Outcome:
    with tempfile.TemporaryDirectory(prefix="cb-conformance-") as out:
        command = [*peers.conformance(), *args, "-o", out]
        try:
            done = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=seconds,
                env={**peers.peer_env(), **env},
                cwd=ROOT,
            )
        except subprocess.TimeoutExpired:
            return Outcome(failed=1, errors=(f"no result within {seconds:.0f} s",))
        found = [path for path in Path(out).glob("**/checks.json") if wanted is None or wanted(path)]
        if not found:
            tail = (done.stdout + done.stderr).strip().splitlines()[-5:]
            return Outcome(failed=1, errors=(f"no results saved (exit {done.returncode}): {' / '.join(tail)}",))
        return _outcome(json.loads(found[0].read_text()))


def run_all(url: str, scenarios: list[str]) -> dict[str, Outcome]:
    return {scenario: run_scenario(url, scenario) for scenario in scenarios}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextmanager
def direct() -> Iterator[str]:
    """The conformance server over Streamable HTTP until the block ends; yields its /mcp URL."""
    port = _free_port()
    proc = subprocess.Popen(
        [sys.executable, str(SERVER), "--http", str(port)], stdin=subprocess.DEVNULL, stderr=subprocess.PIPE
    )
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    raise RuntimeError(f"the conformance server did not listen on {port}") from None
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}/mcp"
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        if proc.stderr is not None:
            proc.stderr.close()


def gateway_config(directory: Path) -> Path:
    """A cellblock.yaml with the conformance server alone, as a local server without a prefix."""
    server = {
        "command": sys.executable,
        "args": [str(SERVER)],
        "prefix": False,
        "jail": {"read_only": [str(SERVER.parent)]},
        "tools": {"default": "allow"},
        "prompts": {"default": "allow"},
        "resources": {"default": "allow"},
        "lock": {"enabled": False},
        "sampling": "allow",
    }
    path = directory / "cellblock.yaml"
    path.write_text(yaml.safe_dump({"version": 1, "servers": {"conformance": server}}))
    return path


@contextmanager
def gateway_env() -> Iterator[dict[str, str]]:
    """The environment a gateway needs: a private keyring, its own state and runtime directories."""
    with private_secret_service() as address, tempfile.TemporaryDirectory(prefix="cb-conf-") as directory:
        root = Path(directory)
        (root / "run").mkdir(mode=0o700)
        yield {
            "DBUS_SESSION_BUS_ADDRESS": address,
            "XDG_RUNTIME_DIR": str(root / "run"),
            "CELLBLOCK_STATE_DIR": str(root / "state"),
        }


@contextmanager
def through_cellblock(env: Mapping[str, str]) -> Iterator[str]:
    """`cellblock serve --http` on the conformance server until the block ends; yields its /mcp URL."""
    with (
        tempfile.TemporaryDirectory(prefix="cb-conf-config-") as directory,
        serving(gateway_config(Path(directory)), env) as url,
    ):
        yield url


def compare(scenarios: list[str] | None = None) -> tuple[dict[str, Outcome], dict[str, Outcome]]:
    """Every scenario, directly and through Cellblock (each with its own private keyring)."""
    scenarios = scenarios or server_scenarios()
    with direct() as url:
        straight = run_all(url, scenarios)
    with gateway_env() as env, through_cellblock(env) as url:
        gated = run_all(url, scenarios)
    return straight, gated


def run_clients(via: str, scenarios: list[str], env: Mapping[str, str]) -> dict[str, Outcome]:
    return {scenario: run_client_scenario(via, scenario, env) for scenario in scenarios}


def compare_clients(scenarios: list[str] | None = None) -> tuple[dict[str, Outcome], dict[str, Outcome]]:
    """Every client scenario with the SDK's client, then with Cellblock as the client (a private keyring)."""
    scenarios = scenarios or client_scenarios()
    straight = run_clients("direct", scenarios, {})
    with gateway_env() as env:
        gated = run_clients("cellblock", scenarios, env)
    return straight, gated


def table(
    straight: Mapping[str, Outcome],
    gated: Mapping[str, Outcome],
    heads: tuple[str, str] = ("direct", "through Cellblock"),
) -> str:
    lines = [f"| scenario | {heads[0]} | {heads[1]} |", "| --- | --- | --- |"]
    for scenario, outcome in straight.items():
        through = gated[scenario]
        mark = "" if through.ok == outcome.ok else " ✗"
        lines.append(f"| `{scenario}` | {outcome.cell()} | {through.cell()}{mark} |")
    lines.append(
        f"| **all** | {sum(o.passed for o in straight.values())}/"
        f"{sum(o.passed + o.failed for o in straight.values())} | "
        f"{sum(o.passed for o in gated.values())}/{sum(o.passed + o.failed for o in gated.values())} |"
    )
    return "\n".join(lines)


def write_doc(text: str, doc: Path = DOC, markers: tuple[str, str] = (BEGIN, END)) -> None:
    """Replace what stands between the markers in `doc` with `text`."""
    content = doc.read_text()
    start, end = content.index(markers[0]) + len(markers[0]), content.index(markers[1])
    doc.write_text(f"{content[:start]}\n{text}\n{content[end:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"put the tables into {DOC.relative_to(ROOT)}")
    parser.add_argument("--only", choices=("server", "client"), help="run only the server or the client scenarios")
    parser.add_argument("scenario", nargs="*", help="only these scenarios (default: every scenario)")
    args = parser.parse_args()
    os.chdir(ROOT)
    os.environ.pop("PYTHON_KEYRING_BACKEND", None)  # the gateway must find the private Secret Service
    halves = [
        ("server", server_scenarios(), compare, ("direct", "through Cellblock"), (BEGIN, END)),
        ("client", client_scenarios(), compare_clients, ("SDK client", "Cellblock as the client"), CLIENT_MARKERS),
    ]
    for kind, known, run, heads, markers in halves:
        chosen = [name for name in args.scenario if name in known] if args.scenario else known
        if (args.only and args.only != kind) or not chosen:
            continue
        straight, gated = run(chosen)
        text = table(straight, gated, heads)
        print(text)
        for scenario, outcome in gated.items():
            for error in outcome.errors:
                print(f"{heads[1]}, {scenario}: {error}", file=sys.stderr)
        if args.write:
            write_doc(text, markers=markers)


if __name__ == "__main__":
    main()
