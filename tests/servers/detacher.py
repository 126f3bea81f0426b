"""Detacher: a server (meant to run unjailed) that starts a command as a process of its own.

Run as ``python tests/servers/detacher.py``; it is the raw server (raw.py) with one tool instead of
its own, ``run`` (``argv``, ``out``, ``detach``): it starts ``argv`` and answers at once. With
``detach`` the command runs in a grandchild that has left the server's process tree and session
(fork, setsid, fork again; the middle process exits, so the grandchild's parent is no longer the
server); without it, as the server's direct child. When the command ends, its output, then a line
``exit N``, appear at once in the file ``out`` (written beside it, then renamed).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))  # raw.py beside it

from raw import Raw, main, text


def _run_and_report(argv: list[str], out: str) -> None:
    """Run `argv` to its end, then put its output and exit status at `out` in one step."""
    done = subprocess.run(argv, stdin=subprocess.DEVNULL, capture_output=True, text=True, check=False)
    Path(out + ".part").write_text(done.stdout + done.stderr + f"\nexit {done.returncode}\n")
    os.replace(out + ".part", out)


class Detacher(Raw):
    def tools(self) -> list[dict[str, Any]]:
        schema = {
            "type": "object",
            "properties": {"argv": {"type": "array"}, "out": {"type": "string"}, "detach": {"type": "boolean"}},
        }
        return [{"name": "run", "description": "start a command as a process of this server", "inputSchema": schema}]

    def call(self, ident: Any, params: dict[str, Any]) -> dict[str, Any] | None:
        arguments = params.get("arguments") or {}
        argv, out = [str(a) for a in arguments["argv"]], str(arguments["out"])
        if not arguments.get("detach"):
            child = os.fork()
            if child == 0:
                try:
                    _run_and_report(argv, out)
                finally:
                    os._exit(0)
            return text(f"started {child} as a child")
        middle = os.fork()
        if middle == 0:
            try:
                os.setsid()  # a session and process group of its own
                if os.fork() == 0:
                    try:
                        _run_and_report(argv, out)
                    finally:
                        os._exit(0)
            finally:
                os._exit(0)  # the grandchild is orphaned: the server is no longer its ancestor
        os.waitpid(middle, 0)
        return text("started a detached grandchild")


if __name__ == "__main__":
    main(Detacher)
