"""One escape attempt in a held jail, looked at while it holds what it took.

Imported by the tests, and run as a script by an unprivileged user, as a gateway of that user
would do it (only the jail's own user may lower its rlimits, without CAP_SYS_RESOURCE), from a
copy outside the checkout with a copy of the `cellblock` package beside it:

    python3 -I held.py PLAN_JSON     # prints {"result": ..., "reason": ...}

It uses only the standard library and `cellblock.sandbox`, which the system Python can import.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))  # the copy of the package beside it (-I adds none)

from cellblock.sandbox.spawn import settle, spawn_args
from cellblock.sandbox.types import (
    Enforcement,
    LaunchPlan,
    LimitPlan,
    Limits,
    Mechanism,
    Method,
    Network,
)

__all__ = ["HOLDER", "RLIMITS", "attack", "main"]

RLIMITS = Enforcement(
    Method(Mechanism.RLIMIT, "RLIMIT_NPROC in the jail's own user namespace", whole=True),
    Method(Mechanism.RLIMIT, "RLIMIT_DATA, per process only", whole=False),
)
# The jail's command: run one attempt, print its result, then keep the jail as it is until stdin closes.
HOLDER = """
import importlib.util, json, os, sys
folder = sys.argv[1]
spec = importlib.util.spec_from_file_location(
    "escape_attempts", os.path.join(folder, "__init__.py"), submodule_search_locations=[folder]
)
module = importlib.util.module_from_spec(spec)
sys.modules["escape_attempts"] = module
spec.loader.exec_module(module)
print(json.dumps(module.run_spec([json.loads(sys.argv[2])])[0].to_dict()), flush=True)
sys.stdin.read()
"""


def attack(prefix: list[str], plan: LaunchPlan) -> tuple[dict[str, Any] | None, str | None]:
    """The attempt's result (None when the jail was killed first), and the limit the jail reached,
    looked at while the attempt still holds what it took."""
    with spawn_args(plan) as spawn:
        command, pipe = [*prefix, *spawn.argv], subprocess.PIPE
        with subprocess.Popen(command, stdin=pipe, stdout=pipe, text=True, pass_fds=spawn.pass_fds) as process:
            assert process.stdin is not None and process.stdout is not None
            confinement = spawn.release()
            assert confinement is not None
            try:
                line = process.stdout.readline()
                reason = confinement.breach()
            finally:
                process.stdin.close()
                process.wait(60)
                settle(confinement)
    assert confinement.made == [], "the jail's cgroups are removed once it has ended"
    return (json.loads(line) if line else None), reason


def main() -> None:
    """Attack with the plan `sys.argv[1]` describes (argv and limits), enforced by rlimits."""
    given = json.loads(sys.argv[1])
    tmpfs = tuple((point, held, files) for point, held, files in given.get("tmpfs", ()))
    limits = LimitPlan("attacker", Limits(given["processes"], given["memory"]), RLIMITS, tmpfs)
    plan = LaunchPlan(tuple(given["argv"]), {}, None, (), Network.NONE, limits=limits)
    result, reason = attack([], plan)
    print(json.dumps({"result": result, "reason": reason}))


if __name__ == "__main__":
    main()
