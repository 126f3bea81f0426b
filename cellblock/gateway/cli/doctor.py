"""`cellblock doctor`: can this machine build jails and keep credentials, and what to do about each gap."""

from __future__ import annotations

import os
import platform
import shutil
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

from cellblock import __version__
from cellblock.gateway.cli.options import optional_config
from cellblock.gateway.config.model import Config, JailConfig, LocalServer
from cellblock.gateway.credentials import CredentialError, Keyring, active_backend
from cellblock.gateway.downstream.jailspec import jail_spec
from cellblock.gateway.downstream.launch import launch_plan
from cellblock.sandbox.backends import choose
from cellblock.sandbox.bwrap import check_bwrap, namespace_hint
from cellblock.sandbox.connects import gate_missing
from cellblock.sandbox.jailnet import check_netns
from cellblock.sandbox.landlock import check_landlock, landlock_abi, landlock_gaps, landlock_refusal
from cellblock.sandbox.limits import enforcement
from cellblock.sandbox.types import JailError, JailSpec, LaunchPlan, Mechanism

__all__ = ["Runner", "doctor", "doctor_command", "run_plan"]

# Runs a launch plan to its end: what the macOS self-test starts its jails with (tests substitute it)
Runner = Callable[[LaunchPlan], subprocess.CompletedProcess[str]]
SELF_TEST_TIMEOUT = 30


def _line(ok: bool, what: str, detail: str) -> bool:
    print(f"{'OK  ' if ok else 'FAIL'}  {what}: {detail}")
    return ok


def doctor_command(config_path: str | None) -> int:
    """`cellblock doctor`: with the user's config when it loads, else without."""
    return doctor(optional_config(config_path))


def run_plan(plan: LaunchPlan) -> subprocess.CompletedProcess[str]:
    """Run `plan` to its end, its output captured.

    Raises:
        OSError: its program cannot be started (no sandbox-exec).
        subprocess.TimeoutExpired: it did not end in time.
    """
    return subprocess.run(
        plan.argv, env=dict(plan.env), cwd=plan.cwd, capture_output=True, text=True, timeout=SELF_TEST_TIMEOUT
    )


def doctor(config: Config | None = None, run: Runner = run_plan) -> int:
    """Print one line per check; return 1 if any check failed. `config`: the user's, when it loads;
    `run`: what starts the macOS self-test's jails."""
    results = [_line(True, "cellblock", f"{__version__} on Python {platform.python_version()}, {sys.platform}")]
    if sys.platform.startswith("linux"):
        results.append(_linux())
    elif sys.platform == "darwin":
        results.append(_macos(run))
    else:
        results.append(
            _line(False, "jail", f"Cellblock has no jail for {sys.platform}: only 'jail: false' servers can run")
        )
    results.append(_keyring(config))
    results.append(_keyring_as_clients_start_it(config))
    results += _servers(config)
    return 0 if all(results) else 1


def _servers(config: Config | None) -> list[bool]:
    """Each jailed local server's jail, built as a start would build it: a failure, or what its
    launcher needs that the jail lacks (a warning: the start will say more); on Linux, the
    backend that builds it, and a Landlock jail's gaps."""
    results = []
    for name, server in sorted((config.servers if config else {}).items()):
        if not isinstance(server, LocalServer) or server.jail is False:
            continue
        try:
            landlock = sys.platform.startswith("linux") and choose(name, server.jail.backend or "auto").bwrap is None
            spec, launchers = jail_spec(name, server, server.jail, landlock=landlock)
            why = landlock_refusal(spec, landlock_abi(), launchers) if landlock else None
        except JailError as exc:
            results.append(_line(False, f"server '{name}'", str(exc)))
            continue
        if why is not None:
            results.append(_line(False, f"server '{name}'", f"its Landlock jail cannot start: {why}"))
            continue
        for gap in [*spec.gaps, *(landlock_gaps(spec, landlock_abi(), launchers) if landlock else ())]:
            print(f"WARN  server '{name}': {gap}")
    return results


def _keyring(config: Config | None) -> bool:
    """The active keyring backend; a failure only when the config needs credentials it cannot keep."""
    backend = active_backend()
    if backend.secure:
        return _line(True, "keyring", backend.describe())
    if config is not None and config.credentials.allow_insecure and backend.usable:
        return _line(True, "keyring", f"{backend.describe()}: allowed by credentials.allow_insecure")
    try:
        Keyring()
        refusal = ""
    except CredentialError as exc:
        refusal = str(exc)
    if config is None or not config.credential_entries():
        return _line(True, "keyring", f"{backend.describe()}: unused, no auth: or secrets: configured. {refusal}")
    return _line(False, "keyring", refusal)


# What Claude Desktop and other clients give the process they start, and little else
CLIENT_ENV = ("HOME", "USER", "PATH")
_CHECK = (
    "import sys\nfrom cellblock.gateway.credentials import CredentialError, Keyring\n"
    "try:\n    print(Keyring(allow_insecure=sys.argv[1] == 'yes').backend.describe())\n"
    "except CredentialError as exc:\n    print(exc)\n    raise SystemExit(1)\n"
)


def _keyring_as_clients_start_it(config: Config | None) -> bool:
    """The keyring again, from the environment a client gives: a shell's D-Bus address is not there."""
    env = {name: os.environ[name] for name in CLIENT_ENV if name in os.environ}
    what = "keyring from a client (HOME, USER and PATH only)"
    try:
        insecure = "yes" if config is not None and config.credentials.allow_insecure else "no"
        child = subprocess.run(
            [sys.executable, "-c", _CHECK, insecure], env=env, capture_output=True, text=True, timeout=60
        )
    except subprocess.TimeoutExpired:
        return _line(False, what, "the check did not finish in 60 s: the keyring hangs")
    lines = (child.stdout.strip() or child.stderr.strip()).splitlines()
    told = lines[-1] if lines else f"the check exited with status {child.returncode} and said nothing"
    needed = config is not None and bool(config.credential_entries())
    if child.returncode == 0:
        return _line(True, what, told)
    return _line(not needed, what, told if needed else f"unused, no auth: or secrets: configured. {told}")


def _linux() -> bool:
    """bubblewrap, and Landlock where it cannot build jails: which one `jail.backend: auto` uses,
    and what it does not enforce here."""
    abi = landlock_abi()
    refused = _bwrap()
    if refused is None:
        _line(
            True,
            "landlock",
            f"ABI {abi}: jail.exec.allow can be enforced"
            if abi
            else "missing: servers with jail.exec.allow will not start (the rest work)",
        )
        _line(True, "jail backend", "bubblewrap (jail.backend: auto chooses it)")
        return _limits()
    print(f"WARN  bubblewrap: cannot build jails here: {refused}")
    why = landlock_refusal(JailSpec("doctor", ("/usr/bin/true",), {}), abi)
    try:
        if why is None:
            check_landlock()  # a real jail, its seccomp filter included
    except JailError as exc:
        why = str(exc)
    if why is not None:
        return _line(False, "jail backend", f"none: bubblewrap cannot build jails here, nor Landlock: {why}")
    lacks = "; ".join(landlock_gaps(JailSpec("doctor", ("/usr/bin/true",), {}), abi)) or "nothing"
    _line(
        True,
        "jail backend",
        f"Landlock, ABI {abi} (jail.backend: auto chooses it where bubblewrap cannot); not enforced here: {lacks}",
    )
    gate = gate_missing()
    if gate is not None:  # the rest still works: a warning, not a failure
        print(
            f"WARN  network: allowlist and ask: servers with them will not start here, {gate}: the gateway "
            "makes a Landlock jail's connections itself (docs/jail.md)"
        )
    return _limits()


def _bwrap() -> str | None:
    """Why bubblewrap cannot build a jail here (None: it can), its lines printed."""
    bwrap = shutil.which("bwrap")
    if bwrap is None:
        return "not installed: apt-get install bubblewrap (or dnf install bubblewrap)"
    version = subprocess.run([bwrap, "--version"], capture_output=True, text=True, check=False).stdout.strip()
    _line(True, "bubblewrap", f"{bwrap} ({version})")
    userns = Path("/proc/sys/user/max_user_namespaces")
    if userns.exists() and userns.read_text().strip() == "0":
        return f"user namespaces: {namespace_hint()}"
    try:
        check_bwrap()
    except JailError as exc:
        return f"trial jail: {exc}"
    _line(True, "trial jail", "a jail with new namespaces, no capabilities and the seccomp filter started and exited")
    refused = check_netns()
    if refused is None:
        _line(
            True,
            "allowlist names",
            "listed names resolve inside allowlist jails, and every name in ask jails (DNS and ports 80/443 there)",
        )
    else:
        print(f"WARN  allowlist names: not in allowlist or ask jails here (proxy variables only): {refused}")
    return None


def _macos(run: Runner) -> bool:
    """The self-test profile: a jail built by the code that builds servers' jails, which must start
    /usr/bin/true and must not read a decoy outside it that the same read finds unjailed."""
    with tempfile.TemporaryDirectory(prefix="cellblock-doctor-") as scratch:
        decoy = Path(scratch) / "decoy"
        decoy.write_text("cellblock doctor decoy\n")
        jailed, private = JailConfig(), Path(scratch) / "jail"  # its private /tmp, beside the decoy
        try:
            start = launch_plan("doctor", LocalServer(command="/usr/bin/true", jail=jailed), private=private)
            read = launch_plan(
                "doctor", LocalServer(command="/bin/cat", args=[str(decoy)], jail=jailed), private=private
            )
            control = launch_plan("doctor", LocalServer(command="/bin/cat", args=[str(decoy)], jail=False))
        except JailError as exc:
            return _line(False, "self-test profile", f"cannot be built: {exc}")
        try:
            started, leaked, plain = run(start), run(read), run(control)
        except FileNotFoundError:
            return _line(False, "sandbox-exec", f"{start.argv[0]} not found: macOS jails need it")
        except (OSError, subprocess.TimeoutExpired) as exc:
            return _line(False, "self-test profile", f"sandbox-exec did not run to its end: {exc}")
    if started.returncode != 0:
        said = _last_line(started) or "nothing"
        return _line(False, "self-test profile", f"/usr/bin/true exited {started.returncode} in the jail: {said}")
    _line(True, "self-test profile", "/usr/bin/true started and exited in a generated sandbox-exec profile")
    if plain.returncode != 0:
        return _line(
            False, "self-test decoy", f"unreadable even unjailed, so the test proves nothing: {_last_line(plain)}"
        )
    if leaked.returncode == 0 or "decoy" in leaked.stdout:
        return _line(False, "self-test decoy", f"a jailed cat read {decoy}, outside every grant: the jail leaks")
    return _line(True, "self-test decoy", f"a jailed cat could not read a file outside it ({_last_line(leaked)})")


def _last_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = (done.stderr.strip() or done.stdout.strip()).splitlines()
    return lines[-1] if lines else ""


def _limits() -> bool:
    """What enforces a jail's resource limits here; a failure when nothing bounds its processes."""
    how = enforcement()
    _line(how.memory.mechanism is not Mechanism.NONE, "memory limit", how.memory.how)
    return _line(how.processes.mechanism is not Mechanism.NONE, "process limit", how.processes.how)
