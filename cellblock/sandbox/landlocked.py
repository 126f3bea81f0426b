"""A Landlock jail's first process: lock itself down, then become the server.

Run by the gateway's own interpreter, isolated (``python3 -I -S``), where no namespace can be
made (`sandbox/landlock.py` builds the command)::

    landlocked.py --abi N [--info-fd N --block-fd M] [--setenv KEY VALUE ...] [--keep KEY ...]
                  [--unsetenv KEY ...] --seccomp FD
                  [--read PATH ...] [--run PATH ...] [--write PATH ...] [--write-run PATH ...]
                  [--exec FILE ...] [--device PATH ...] [--no-network] [--gate FD [--proxy-port PORT]]
                  --chdir DIR -- ARGV...

In this one process, single-threaded, before `execve` (a Landlock domain binds the thread that
enters it and what it starts afterwards, so every thread and child of the server is bound):

1. a session of its own, and SIGKILL when the gateway dies;
2. with `--info-fd`/`--block-fd` (bwrap's options, `sandbox/spawn.py`'s `Hold`): its pid reported,
   then it waits until the gateway has put it under the jail's limits;
3. the Landlock ruleset made (every path opened while it still may), its working directory set;
4. as root, every capability dropped (`pin.drop_capabilities`; as another user the bounding set
   needs CAP_SETPCAP, and `no_new_privs` keeps it from gaining any);
5. `no_new_privs` and the Landlock domain: each file right the ABI knows handled, allowed only
   beneath the paths given (``--read``: read; ``--run``: read and execute; ``--write``: read and
   write; ``--write-run``: both; ``--exec``: execute that file; ``--device``: read, write and
   ioctl); with ``--no-network`` TCP bind and connect handled with no rule (ABI 4); abstract Unix
   sockets and signals scoped to the domain (ABI 6); with ``--proxy-port`` (``network: allowlist``
   or ``ask``) TCP bind and connect handled with no rule too where the ABI has them: the gateway
   makes each connection (below);
6. the seccomp filter read from FD (`seccomp.LANDLOCK_RULES` and the network's); with ``--gate``
   installed with a listener, which is sent to the gateway over the Unix socket at descriptor FD
   and closed here: each call the filter hands on (a connect, a root installer's chmod, an open
   of a jail with a file granted alone) then waits for the gateway (`sandbox/connects.py`), and
   fails once nobody holds the listener. ``--proxy-port`` points the proxy variables at the
   gateway's egress listener on 127.0.0.1:PORT;
7. `execve` of ARGV with each ``--setenv`` and the variables of its own environment named by
   ``--keep`` (secrets, which never go into an argv), less each ``--unsetenv``: what the spawner
   added besides goes.

Any step that fails stops here: the server is not started. Standard library only (and pin.py's).
"""

from __future__ import annotations

import ctypes
import os
import signal
import sys

# (no json, pathlib or contextlib: every module imported here is time each jail's start waits for)
if __name__ == "__main__":
    # run isolated, its own directory is not on sys.path: the package's root is, for pin.py alone
    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.realpath(__file__)))))

from cellblock.sandbox import pin  # importable only once the root is on sys.path, above

__all__ = ["access", "handled", "main"]

EXIT_CANNOT_START = 126
PR_SET_PDEATHSIG = 1
# Landlock's file rights (linux/landlock.h), and the ABI that brought each group.
EXECUTE, WRITE_FILE, READ_FILE, READ_DIR = 1 << 0, 1 << 1, 1 << 2, 1 << 3
REMOVE_DIR, REMOVE_FILE, MAKE_CHAR, MAKE_DIR = 1 << 4, 1 << 5, 1 << 6, 1 << 7
MAKE_REG, MAKE_SOCK, MAKE_FIFO, MAKE_BLOCK, MAKE_SYM = 1 << 8, 1 << 9, 1 << 10, 1 << 11, 1 << 12
REFER, TRUNCATE, IOCTL_DEV = 1 << 13, 1 << 14, 1 << 15
FS_BY_ABI = ((1, (1 << 13) - 1), (2, REFER), (3, TRUNCATE), (5, IOCTL_DEV))
NET_TCP, NET_ABI = 0x1 | 0x2, 4  # bind and connect
SCOPES, SCOPE_ABI = 0x1 | 0x2, 6  # abstract Unix sockets and signals
READ = READ_FILE | READ_DIR
# write: make and remove files, directories, links and pipes, rename them within what is writable
# (no devices, no sockets: a Unix socket cannot be made anyway)
WRITE = READ | WRITE_FILE | REMOVE_DIR | REMOVE_FILE | MAKE_DIR | MAKE_REG | MAKE_FIFO | MAKE_SYM | REFER | TRUNCATE
ACCESS = {
    "--read": READ,
    "--run": READ | EXECUTE,
    "--write": WRITE,
    "--write-run": WRITE | EXECUTE,
    "--exec": EXECUTE,
    "--device": READ | WRITE_FILE | IOCTL_DEV,
}
VALUED = {*ACCESS, "--abi", "--info-fd", "--block-fd", "--keep", "--unsetenv", "--seccomp", "--chdir"}
VALUED |= {"--gate", "--proxy-port"}  # the calls the gateway makes, and the proxy (step 6)
_PROXY_VARS = ("http_proxy", "https_proxy", "HTTP_PROXY", "HTTPS_PROXY")


def handled(abi: int) -> int:
    """Every file right Landlock at `abi` knows."""
    return sum(bits for since, bits in FS_BY_ABI if abi >= since)


def access(option: str, abi: int) -> int:
    """The rights `option` (``--read``, ...) allows, of those `abi` knows."""
    return ACCESS[option] & handled(abi)


def _say(text: str) -> None:
    sys.stderr.write(f"cellblock-landlock: {text}\n")


def _parse(argv: list[str]) -> tuple[list[tuple[str, str]], dict[str, str], list[str]]:
    """(option, value) pairs in order, the ``--setenv`` variables, and the command after ``--``.

    Raises:
        ValueError: an unknown option, one without its value, no Landlock ABI, or no command.
    """
    if "--" not in argv:
        raise ValueError("no '--' before the command")
    split = argv.index("--")
    options, command = argv[:split], argv[split + 1 :]
    pairs: list[tuple[str, str]] = []
    setenv: dict[str, str] = {}
    at = 0
    while at < len(options):
        word = options[at]
        if word == "--no-network":
            pairs.append((word, ""))
            at += 1
        elif word == "--setenv" and at + 2 < len(options):
            setenv[options[at + 1]] = options[at + 2]
            at += 3
        elif word in VALUED and at + 1 < len(options):
            pairs.append((word, options[at + 1]))
            at += 2
        else:
            raise ValueError(f"unknown option or missing value: {word}")
    if not command:
        raise ValueError("no command")
    if int(dict(pairs).get("--abi", "0")) < 1:
        raise ValueError("no Landlock ABI (--abi N, 1 or more)")
    return pairs, setenv, command


def _held(info: int, block: int) -> None:
    """Report this process to the gateway, then wait until it has put the jail under its limits.

    Raises:
        OSError: the gateway went away (or never let it go) before that.
    """
    with os.fdopen(info, "w") as out:
        out.write(f'{{"child-pid": {os.getpid()}}}')  # as bwrap's --info-fd reports it
    with os.fdopen(block, "rb", buffering=0) as wait:
        if not wait.read(1):
            raise OSError("the gateway ended the jail before its limits were in place")


def _lock_down(pairs: list[tuple[str, str]], abi: int) -> None:
    """Steps 3 to 6 of the module's docstring.

    Raises:
        OSError: a step failed (its message names it).
        ValueError: the options are not whole (no --chdir, no --seccomp).
    """
    values = dict(pairs)
    if "--chdir" not in values or "--seccomp" not in values:
        raise ValueError("--chdir and --seccomp are needed")
    if "--gate" in values:
        # imported while the interpreter's own files may still be read (in the domain, only the
        # server's are), and only here: the other jails' starts do not wait for it
        import socket
    with os.fdopen(int(values["--seccomp"]), "rb") as handle:
        program = handle.read()
    net = NET_TCP if abi >= NET_ABI and ("--no-network" in values or "--proxy-port" in values) else 0
    if "--no-network" in values and not net:
        raise OSError(f"network: none needs Landlock ABI {NET_ABI} for its TCP rules; this plan asks for ABI {abi}")
    rules = [(path, access(option, abi)) for option, path in pairs if option in ACCESS]
    ruleset = pin.landlock_ruleset(handled(abi), rules, net, SCOPES if abi >= SCOPE_ABI else 0)
    try:
        os.chdir(values["--chdir"])
        if os.geteuid() == 0:
            pin.drop_capabilities()
    except BaseException:
        os.close(ruleset)
        raise
    pin.restrict_self(ruleset)
    if "--gate" not in values:
        pin.install_seccomp(program)
        return
    with socket.socket(fileno=int(values["--gate"])) as gate:
        listener = pin.install_seccomp(program, listener=True)
        try:
            socket.send_fds(gate, [b"L"], [listener])
        finally:
            os.close(listener)


def main(argv: list[str]) -> int:
    try:
        pairs, setenv, command = _parse(argv)
        abi = int(dict(pairs)["--abi"])
    except ValueError as exc:
        _say(f"usage: {exc}; nothing was started")
        return EXIT_CANNOT_START
    if os.getsid(0) != os.getpid():  # not a session leader already (spawned with a session of its own)
        os.setsid()
    try:
        if ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError("PR_SET_PDEATHSIG was refused")
        have = pin.landlock_version()
        if have < abi:
            raise OSError(f"this kernel has Landlock ABI {have}, and the jail was planned for ABI {abi}")
        held = dict(pairs)
        if "--info-fd" in held and "--block-fd" in held:
            _held(int(held["--info-fd"]), int(held["--block-fd"]))
        # the server's environment is the plan's alone: what the spawner added besides goes
        kept = {key for option, key in pairs if option == "--keep"} - {k for o, k in pairs if o == "--unsetenv"}
        env = {key: value for key, value in os.environ.items() if key in kept} | setenv
        if "--proxy-port" in held:
            env = {k: v for k, v in env.items() if k not in ("no_proxy", "NO_PROXY")}
            env |= dict.fromkeys(_PROXY_VARS, f"http://127.0.0.1:{int(held['--proxy-port'])}")
        _lock_down(pairs, abi)
    except (OSError, ValueError) as exc:
        _say(f"cannot lock the jail down: {exc}; the server is not started")
        return EXIT_CANNOT_START
    try:
        os.execve(command[0], command, env)
    except OSError as exc:
        _say(f"cannot start {command[0]}: {exc.strerror}")
    return EXIT_CANNOT_START


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
