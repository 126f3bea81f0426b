"""`cellblock install` of a hostile package: what its install script does stays within bounds.

Each package comes from a registry on loopback (tests/registry.py) and its npm `postinstall` runs
one attack (`HOSTILE`), then fails on purpose (npm shows a failed script's output, so the
message says what it did). The flood of output is judged by the most memory `cellblock install`
held, against the same install keeping all of its output as the honest control.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.registry import npm_registry

pytestmark = [pytest.mark.jail]

MIB = 1 << 20
MARK = f"cellblock-hostile-install-{os.getpid()}"  # on the attacker's command line, so the host can count it
HOLD = 2  # seconds the fork bomb's children stay: the host sees them all at once
# The attack, run by npm as the package's postinstall: `python3 hostile.py MODE AMOUNT MARK`.
HOSTILE = f"""
import os, sys, time
mode, amount = sys.argv[1], int(sys.argv[2])
if mode == "flood":  # AMOUNT bytes of output, in lines of 10,000
    block = (b"x" * 9999 + b"\\n") * 6
    for _ in range(amount // len(block)):
        sys.stdout.buffer.write(block)
    print("flood: the end")
elif mode == "fork":  # AMOUNT children that stay {HOLD} s
    made = 0
    for _ in range(amount):
        try:
            pid = os.fork()
        except OSError:
            break
        if pid == 0:
            time.sleep({HOLD})
            os._exit(0)
        made += 1
    print(f"made {{made}} of {{amount}}", flush=True)
    time.sleep({HOLD})
elif mode == "memory":  # AMOUNT MiB, each page touched
    chunks = [b"\\x01" * (1 << 20) for _ in range(amount)]
    print(f"had {{len(chunks)}} MiB")
elif mode == "fill":  # AMOUNT files of 1 MiB in the package's own directory (RLIMIT_FSIZE alone allows it)
    os.makedirs("fill")
    for i in range(amount):
        with open(f"fill/{{i}}", "wb") as handle:
            handle.write(b"\\x01" * (1 << 20))
    print(f"wrote {{amount}} MiB")
sys.exit(1)  # the controls' way to have npm show what they did
"""
ATTACKS = {"flood": 200_000_000, "fork": 200, "memory": 512, "fill": 256}
# `cellblock install`, run as the user runs it, saying at its end the most memory it held: its
# own (the installer's processes are in the jail), since it started (VmHWM; ru_maxrss would count
# what the test process held when it spawned it). `lift` takes the cap off the output it keeps.
MEASURED = """
import sys
lift = sys.argv.pop(1) == "lift"
if lift:
    import cellblock.sandbox.spawn
    cellblock.sandbox.spawn.TAIL_BYTES = 1 << 40
from cellblock.gateway.cli.main import main
try:
    sys.exit(main())
finally:
    with open("/proc/self/status") as status:
        peak = next(line.split()[1] for line in status if line.startswith("VmHWM:"))
    print(f"peak-rss-kib {peak}", file=sys.stderr)
"""


def package(mode: str) -> dict[str, str]:
    manifest = {
        "name": f"cb-{mode}",
        "version": "1.0.0",
        "bin": {f"cb-{mode}": "index.js"},
        "scripts": {"postinstall": f"python3 hostile.py {mode} {ATTACKS[mode]} {MARK}"},
    }
    return {"package.json": json.dumps(manifest), "index.js": "#!/usr/bin/env node\n", "hostile.py": HOSTILE}


@pytest.fixture(scope="module")
def place(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Path, dict[str, str]]]:
    """The config's folder and the environment `cellblock install` runs with."""
    tmp = tmp_path_factory.mktemp("installs")
    (tmp / "run").mkdir(mode=0o700)
    with npm_registry({f"cb-{mode}": package(mode) for mode in ATTACKS}) as url:
        env = {
            "CELLBLOCK_DATA_DIR": str(tmp / "data"),
            "CELLBLOCK_STATE_DIR": str(tmp / "state"),
            "XDG_RUNTIME_DIR": str(tmp / "run"),
            "npm_config_registry": url,
        }
        yield tmp, env


def install(
    place: tuple[Path, dict[str, str]], name: str, mode: str, limits: dict[str, Any], lift: bool = False
) -> tuple[subprocess.CompletedProcess[str], int]:
    """`cellblock install NAME` of the `mode` attack under `limits`: how it ended, and the most
    memory (KiB) the command itself held."""
    tmp, env = place
    config = tmp / f"{name}.yaml"
    server = {"install": {"npm": f"cb-{mode}@1.0.0"}, "jail": {"limits": limits}}
    config.write_text(yaml.safe_dump({"version": 1, "servers": {name: server}}))
    command = [sys.executable, "-c", MEASURED, "lift" if lift else "keep", "install", name, "--config", str(config)]
    done = subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=300, check=False)
    *rest, last = done.stderr.rstrip("\n").split("\n")
    assert last.startswith("peak-rss-kib "), done.stderr[-2000:]
    return subprocess.CompletedProcess(done.args, done.returncode, done.stdout, "\n".join(rest)), int(last.split()[1])


@pytest.mark.slow
def test_an_install_script_that_floods_its_output_leaves_the_installers_memory_bounded(
    place: tuple[Path, dict[str, str]],
) -> None:
    flood = ATTACKS["flood"]
    # control: the same install with the cap taken off what it keeps of the output holds all of it
    whole, held = install(place, "flood-whole", "flood", {}, lift=True)
    assert whole.returncode == 1 and "flood: the end" in whole.stderr, whole.stderr[-2000:]
    assert held * 1024 > flood, held

    done, kept = install(place, "flood", "flood", {})
    assert done.returncode == 1, done.stderr[-2000:]
    assert kept * 1024 < flood // 2, f"{kept} KiB held for {flood:,} bytes of output"
    # it read all of it (npm adds its prefixes), kept its end and says how much there was; each
    # line is shown cut
    said = re.search(r"\(the end of its output, ([\d,]+) bytes in all\)", done.stderr)
    assert said is not None and int(said.group(1).replace(",", "")) >= flood, done.stderr[-2000:]
    assert "flood: the end" in done.stderr and len(done.stderr) < 10_000, done.stderr[-2000:]
