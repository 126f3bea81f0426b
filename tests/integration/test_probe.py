"""`cellblock probe`: a sound jail reports nothing; a weak or absent one is caught and exits 1."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cellblock.sandbox.landlock import landlock_abi
from tests.integration.conftest import NO_USERNS
from tests.kernel_keys import keyrings_usable, planted_key

pytestmark = pytest.mark.jail


def probe(tmp_path: Path, servers: str, *args: str, prefix: tuple[str, ...] = ()) -> subprocess.CompletedProcess[str]:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True, exist_ok=True)
    (home / ".ssh" / "id_ed25519").write_text("FAKE KEY\n")
    config = tmp_path / "cellblock.yaml"
    config.write_text(f"version: 1\nservers:\n{servers}")
    env = {**os.environ, "HOME": str(home), "CELLBLOCK_STATE_DIR": str(tmp_path / "state")}
    return subprocess.run(
        [
            *prefix,
            sys.executable,
            "-m",
            "cellblock.gateway.cli.main",
            "probe",
            "--config",
            str(config),
            "--json",
            *args,
        ],
        capture_output=True,
        text=True,
        env=env,
        timeout=300,
        check=False,
    )


def test_a_sound_jail_lets_nothing_through(tmp_path: Path) -> None:
    done = probe(tmp_path, f"  tight:\n    command: {sys.executable}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    attempts = json.loads(done.stdout)["tight"]["attempts"]
    kinds = {a["name"] for a in attempts}
    # the planted key and the config were really attempted, not skipped
    assert {"read", "list", "write", "connect", "resolve", "capabilities", "userns", "remount"} <= kinds
    assert any(a["name"] == "read" and a["target"].endswith("id_ed25519") for a in attempts)
    assert not [a for a in attempts if a["got_through"]]


@pytest.mark.skipif(not keyrings_usable(), reason="this kernel has no keyrings")
def test_the_users_kernel_keys_are_probed_and_out_of_reach(tmp_path: Path) -> None:
    with planted_key() as key:
        done = probe(tmp_path, f"  tight:\n    command: {sys.executable}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    tried = [a for a in json.loads(done.stdout)["tight"]["attempts"] if a["name"] == "keyring"]
    assert key.description in [a["target"] for a in tried]
    assert not [a for a in tried if a["got_through"]]
    assert key.payload.decode() not in done.stdout


def test_a_jail_that_shares_the_keys_is_caught(tmp_path: Path) -> None:
    ssh = tmp_path / "home" / ".ssh"
    done = probe(tmp_path, f"  leaky:\n    command: {sys.executable}\n    jail: {{read_only: ['{ssh}']}}\n")
    assert done.returncode == 1
    through = [a for a in json.loads(done.stdout)["leaky"]["attempts"] if a["got_through"]]
    assert [a["target"] for a in through] == [str(ssh / "id_ed25519")]


def test_an_unjailed_server_is_reported(tmp_path: Path) -> None:
    done = probe(tmp_path, f"  loose:\n    command: {sys.executable}\n    jail: false\n")
    assert done.returncode == 1
    assert "jail: false" in json.loads(done.stdout)["loose"]["attempts"][0]["detail"]


def test_exec_rules_are_probed_when_set(tmp_path: Path) -> None:
    done = probe(tmp_path, f"  pinned:\n    command: {sys.executable}\n    jail: {{exec: {{allow: [/bin/true]}}}}\n")
    assert done.returncode == 0, done.stdout + done.stderr
    attempts = json.loads(done.stdout)["pinned"]["attempts"]
    assert any(a["name"] == "exec" and not a["got_through"] for a in attempts)


def test_a_fork_bomb_is_tried_just_past_the_jails_process_limit_and_stopped(tmp_path: Path) -> None:
    done = probe(tmp_path, f"  tight:\n    command: {sys.executable}\n    jail: {{limits: {{processes: 24}}}}\n")
    (bomb,) = [a for a in json.loads(done.stdout)["tight"]["attempts"] if a["name"] == "fork"]
    assert bomb["target"] == "32 processes" and bomb["amount"] < 24, bomb
    assert not bomb["got_through"] and done.returncode == 0, done.stdout + done.stderr


@pytest.mark.skipif(landlock_abi() < 4, reason="needs Landlock's TCP rules (Linux 6.7)")
def test_a_landlock_jail_is_probed_and_what_it_does_not_enforce_is_named_as_such(tmp_path: Path) -> None:
    """Where namespaces are refused the probe attacks the Landlock jail auto chose: the host's
    processes get through, a gap the jail names (NOT ENFORCED, not an escape); nothing else does."""
    done = probe(tmp_path, f"  tight:\n    command: {sys.executable}\n", prefix=NO_USERNS)
    assert done.returncode == 0, done.stdout + done.stderr
    attempts = json.loads(done.stdout)["tight"]["attempts"]
    assert any(a["name"] == "read" and a["target"].endswith("id_ed25519") for a in attempts)
    assert not [a for a in attempts if a["got_through"]]
    [processes] = [a for a in attempts if a["name"] == "processes"]
    assert processes.get("not_enforced") and "other processes are visible" in processes["detail"], processes
