"""The official MCP conformance suite's server scenarios, run directly and through Cellblock.

Run as ``python -m tests.conformance [--write]`` from the repository root (it needs the suite,
`@modelcontextprotocol/conformance` from ``./dev peers``, bubblewrap, and dbus-daemon with
gnome-keyring for the gateway's private keyring). Every server scenario of the suite is run

- directly against ``tests/servers/conformance.py --http PORT`` (the SDK's Streamable HTTP server), and
- against ``cellblock serve --http`` with that server as a local server on stdio in its jail
  (``prefix: false``, a policy that allows everything, no lock, ``sampling: allow``),

and the checks each passed are printed as a markdown table. ``--write`` puts the table into
docs/protocol.md between ``<!-- conformance:begin -->`` and ``<!-- conformance:end -->``.
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
from collections.abc import Iterator, Mapping
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
SCENARIO_TIMEOUT = 60.0
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
    listing = subprocess.run([*peers.conformance(), "list"], capture_output=True, text=True, check=True).stdout
    names: list[str] = []
    section = ""
    for line in listing.splitlines():
        if line.strip().endswith(":"):
            section = line.strip()
        elif section.startswith("Server scenarios") and line.strip().startswith("- "):
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
    with tempfile.TemporaryDirectory(prefix="cb-conformance-") as out:
        command = [*peers.conformance(), "server", "--url", url, "--scenario", scenario, "-o", out]
        try:
            done = subprocess.run(
                command, capture_output=True, text=True, timeout=SCENARIO_TIMEOUT, env=peers.peer_env()
            )
        except subprocess.TimeoutExpired:
            return Outcome(failed=1, errors=(f"no result within {SCENARIO_TIMEOUT:.0f} s",))
        found = [path for path in Path(out).glob("*/checks.json") if RESULT_DIR.match(path.parent.name)]
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


def table(straight: Mapping[str, Outcome], gated: Mapping[str, Outcome]) -> str:
    lines = ["| scenario | direct | through Cellblock |", "| --- | --- | --- |"]
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


def write_doc(text: str, doc: Path = DOC) -> None:
    """Replace what stands between the markers in `doc` with `text`."""
    content = doc.read_text()
    start, end = content.index(BEGIN) + len(BEGIN), content.index(END)
    doc.write_text(f"{content[:start]}\n{text}\n{content[end:]}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"put the table into {DOC.relative_to(ROOT)}")
    parser.add_argument("scenario", nargs="*", help="only these scenarios (default: every server scenario)")
    args = parser.parse_args()
    os.chdir(ROOT)
    os.environ.pop("PYTHON_KEYRING_BACKEND", None)  # the gateway must find the private Secret Service
    straight, gated = compare(args.scenario or None)
    text = table(straight, gated)
    print(text)
    for scenario, outcome in gated.items():
        for error in outcome.errors:
            print(f"through Cellblock, {scenario}: {error}", file=sys.stderr)
    if args.write:
        write_doc(text)


if __name__ == "__main__":
    main()
