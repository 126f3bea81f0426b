"""`learn: true`: a real jail traced through the gateway's learning wrapper, the trace it leaves
(0600, in a 0700 directory, without a program's arguments, the environment or a socket's bytes),
and the grants `scan --from-learned` proposes from it."""

from __future__ import annotations

import re
import shutil
import stat
import sys
from pathlib import Path

import pytest

from cellblock.gateway.config.model import LocalServer
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.gateway.downstream.learning import learn_dir, learned_traces, learning
from cellblock.gateway.scan.fromlearned import read_learned, widen
from cellblock.sandbox.spawn import run_plan
from cellblock.sandbox.tracecap import CUT, main, redact
from cellblock.sandbox.types import Limits
from tests.sandbox.test_trace import SCRIPT as TRACED
from tests.sandbox.test_trace import scripted

pytestmark = [
    pytest.mark.jail,
    pytest.mark.skipif(shutil.which("bwrap") is None or shutil.which("strace") is None, reason="needs bwrap, strace"),
]

ENV_SECRET = "env-value-7f3a9c1e"
KEYRING_SECRET = "keyring-value-5d2b8e4a"
# the tracer's own test script, which also tells what it was given (the lengths: never the values)
SCRIPT = TRACED + 'print(len(os.environ["LEAK"]), len(os.environ["PLAIN"]))\n'


def test_a_learned_trace_proposes_what_the_jail_refused_and_holds_no_secret(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    shared, hidden, script = scripted(tmp_path, SCRIPT)
    server = LocalServer.model_validate(
        {
            "command": sys.executable,
            "args": ["-c", script],
            "env": {"PLAIN": ENV_SECRET},
            "learn": True,
            "jail": {"read_only": [str(shared.parent)]},
        }
    )
    plan = launch_plan("t", server, secrets={"LEAK": KEYRING_SECRET}, limits=Limits(processes=64, memory=1 << 30))
    state = tmp_path / "state"
    monkeypatch.setenv("LEAK", KEYRING_SECRET)  # as the gateway spawns it: the secrets in bwrap's environment
    done = run_plan(learning(plan, "t", server, state), 60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("hi") and f"{len(KEYRING_SECRET)} {len(ENV_SECRET)}" in done.stdout
    (trace,) = learned_traces(state, "t")
    assert stat.S_IMODE(trace.stat().st_mode) == 0o600
    assert stat.S_IMODE(learn_dir(state, "t").stat().st_mode) == 0o700
    text = trace.read_text()
    assert re.search(r'execve\("[^"]*bwrap", \[\.\.\.\]', text)  # bwrap's own start is in the file …
    assert ENV_SECRET not in text and KEYRING_SECRET not in text  # … but none of its arguments
    # control: bwrap's own argv holds the env: value (--setenv), which strace alone would print
    assert ENV_SECRET in plan.argv and KEYRING_SECRET not in plan.argv
    proposal = widen(server, read_learned([trace]))
    assert proposal.proposed["read_only"] == [str(hidden)]
    assert proposal.proposed["read_write"] == [str(shared.parent)]  # it wrote in its read-only grant
    assert proposal.proposed["network"] == "allowlist"  # the jail had no network for it
    assert proposal.proposed["allow_hosts"] == ["192.0.2.7:443"]
    notes = "\n".join(proposal.notes)
    assert f"read_only + {hidden}: openat {hidden} refused by the jail (ENOENT)" in notes
    assert f"read_write + {shared.parent}: " in notes and "(EROFS)" in notes
    assert "allow_hosts + 192.0.2.7:443: connect 192.0.2.7:443 refused by the jail (ENETUNREACH)" in notes
    assert "--from-learned --apply" in proposal.text("t")


def test_without_learn_the_plan_is_as_it_was(tmp_path: Path) -> None:
    server = LocalServer.model_validate({"command": sys.executable, "jail": {}})
    plan = launch_plan("t", server)
    assert learning(plan, "t", server, tmp_path) is plan
    assert not (tmp_path / "learn").exists()


def test_the_writer_drops_arguments_and_socket_bytes_but_keeps_a_lookup() -> None:
    bwrap = b'1 1.0 execve("/usr/bin/bwrap", ["bwrap", "--setenv", "K", "v]\\"x"], 0x1 /* 3 vars */) = 0\n'
    assert redact(bwrap) == b'1 1.0 execve("/usr/bin/bwrap", [...], 0x1 /* 3 vars */) = 0\n'
    sent = b'2 1.1 sendto(3<TCP:[1]>, "Authorization: Bearer tok", 25, 0, NULL, 0) = 25\n'
    assert b"tok" not in redact(sent) and b'sendto(3<TCP:[1]>, "", 25' in redact(sent)
    got = b'2 1.2 <... recvfrom resumed>"token=abc", 9, 0, NULL, NULL) = 9\n'
    assert b"abc" not in redact(got)
    query = b'2 1.3 sendto(4, "\\1\\2\\0\\0\\0\\1\\0\\0\\0\\0\\0\\0\\3foo\\0", 17, 0, {sin_port=htons(53)}) = 17'
    assert redact(query) == query


def test_the_writer_cuts_at_its_limit_and_reads_on(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import io

    lines = b"".join(f'1 1.{i} openat(AT_FDCWD, "/f{i}", O_RDONLY) = -1 ENOENT\n'.encode() for i in range(1000))
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(lines)))
    out = tmp_path / "t.trace"
    assert main(["tracecap", str(out), "4096"]) == 0
    data = out.read_bytes()
    assert len(data) <= 4096 + len(CUT) and data.endswith(CUT)
    assert stat.S_IMODE(out.stat().st_mode) == 0o600


def test_without_strace_the_server_runs_jailed_and_the_log_says_nothing_is_learned(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    server = LocalServer.model_validate({"command": sys.executable, "learn": True, "jail": {}})
    plan = launch_plan("t", server)
    monkeypatch.setattr("cellblock.gateway.downstream.learning.shutil.which", lambda name: None)
    assert learning(plan, "t", server, tmp_path) is plan
    assert "strace is not installed" in caplog.text and "NOTHING IS LEARNED" in caplog.text
    assert not (tmp_path / "learn").exists()
