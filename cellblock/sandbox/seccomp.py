"""The seccomp filter every Linux jail gets: system calls a jailed server has no business making.

The filter allows everything by default and refuses a short list (`RULES`), each entry with the
reason it is there; docs/jail.md explains them in full. A refused call fails with an error the
program can handle, never a kill, so a server that probes for a feature carries on without it:

- `EPERM` for almost everything ("not allowed here", what the kernel itself answers without the
  capability);
- `ENOSYS` for `clone3`, whose flags sit in a struct seccomp cannot read: glibc (`pthread_create`,
  `posix_spawn`) and other runtimes fall back to `clone`, whose flags the filter does check, on
  ENOSYS only;
- `EAFNOSUPPORT` for socket families other than Unix, IPv4, IPv6 and netlink, what the kernel
  answers for a family it does not know.

The program is compiled by libseccomp (through the `pyseccomp` binding) for the machine's own
architecture and its 32-bit compat ABIs, so `int 0x80` on x86_64 or an arm32 program on aarch64
meets the same rules; a compat ABI libseccomp cannot add is left to its bad-architecture action,
which kills. Other architectures are refused: a jail is not started without its filter.
"""

from __future__ import annotations

import contextlib
import errno
import functools
import importlib
import os
import platform
from typing import Any

from cellblock.sandbox.sidecars import FILE_CALLS
from cellblock.sandbox.types import Check, Compare, JailError, Rule

__all__ = [
    "CLONE_NAMESPACES",
    "CLONE_NEWTIME",
    "DISK_WATCHED",
    "DISK_WATCHED_RULES",
    "EXEC_ALLOW_RULES",
    "LANDLOCK_NO_NETWORK_RULES",
    "LANDLOCK_PROXIED_RULES",
    "LANDLOCK_ROOT_INSTALL_RULES",
    "LANDLOCK_ROOT_RULES",
    "LANDLOCK_RULES",
    "LANDLOCK_SIDECAR_RULES",
    "NOTIFY",
    "PIN_STAGE_RULES",
    "RULES",
    "SUMMARY",
    "TIOCLINUX",
    "TIOCSTI",
    "Check",
    "Compare",
    "Rule",
    "build_filter",
    "jail_filter",
    "syscall_name",
]

# Names of libseccomp's own constants (pyseccomp.Arch), per native architecture: the compat ABIs
# whose system calls must meet the same rules.
COMPAT_ARCHES = {"X86_64": ("X86", "X32"), "AARCH64": ("ARM",)}
# What libseccomp's resolver answers for a name it does not know at all (__NR_SCMP_ERROR); a name
# it knows only on another architecture resolves to a negative "pseudo" number, which it applies
# to the architectures that have the call.
_UNKNOWN = -1
_INSTALL = (
    "install it (Debian/Ubuntu: apt-get install libseccomp2, Fedora: dnf install libseccomp), "
    "or set 'jail: false' on the server to run it unjailed"
)
SUMMARY = (
    "on: refuses the kernel keyring, ptrace and other processes' memory, new namespaces, mounts, "
    "bpf, perf_event_open, userfaultfd, io_uring, module and kexec loading, TIOCSTI/TIOCLINUX, "
    "personality changes and socket families other than unix/inet/inet6/netlink (see docs/jail.md)"
)


# A rule's "error" that is no errno: the call waits for the process holding the filter's listener
# to answer it (seccomp user notification; `sandbox/connects.py` answers a Landlock jail's connects).
NOTIFY = -1


def _always(error: int, *names: str) -> list[Rule]:
    return [Rule(name, error) for name in names]


def _flag_set(syscall: str, flag: int) -> Rule:
    """EPERM when `flag` is set in the first argument (the flags of clone and unshare on x86 and arm)."""
    return Rule(syscall, errno.EPERM, arg=0, compare=Compare.MASKED_EQ, datum=flag, mask=flag)


# Keyrings have no namespace and a jail runs as its user's kernel uid: linking the user's _uid.N
# keyring into a session keyring of its own would make every key in it readable.
_KEYRING = _always(errno.EPERM, "add_key", "keyctl", "request_key")
# seccomp cannot tell a child from any other process, so all of ptrace goes: a jail has no use for
# a debugger, and these reach into another process's memory or file descriptors.
_OTHER_PROCESSES = _always(
    errno.EPERM, "ptrace", "process_vm_readv", "process_vm_writev", "process_madvise", "kcmp", "pidfd_getfd"
)
_MOUNTS = _always(
    errno.EPERM,
    "mount",
    "umount",
    "umount2",
    "pivot_root",
    "chroot",
    "open_tree",
    "move_mount",
    "fsopen",
    "fsconfig",
    "fsmount",
    "fspick",
    "mount_setattr",
)
# Kernel interfaces with a long record of privilege escalations and nothing a server needs.
# io_uring runs its operations without passing seccomp (IORING_OP_SOCKET would make the socket
# rule moot); programs that use it fall back to ordinary calls when setup fails.
_ATTACK_SURFACE = _always(
    errno.EPERM,
    "bpf",
    "perf_event_open",
    "userfaultfd",
    "io_uring_setup",
    "io_uring_enter",
    "io_uring_register",
    "lookup_dcookie",
    "uselib",
)
# The machine's own state: its kernel, modules, swap, accounting, quotas, clock and log.
_MACHINE = _always(
    errno.EPERM,
    "kexec_load",
    "kexec_file_load",
    "reboot",
    "init_module",
    "finit_module",
    "delete_module",
    "swapon",
    "swapoff",
    "acct",
    "quotactl",
    "quotactl_fd",
    "settimeofday",
    "stime",
    "clock_settime",
    "clock_settime64",
    "clock_adjtime",
    "clock_adjtime64",
    "adjtimex",
    "syslog",
)
# Port I/O, the LDT and vm86 (x86); memory placement across NUMA nodes, which Docker also refuses.
_HARDWARE = _always(
    errno.EPERM,
    "iopl",
    "ioperm",
    "modify_ldt",
    "vm86",
    "vm86old",
    "mbind",
    "set_mempolicy",
    "get_mempolicy",
    "migrate_pages",
    "move_pages",
    "set_mempolicy_home_node",
)
# File handles outlive the path they were made from: open_by_handle_at opened files outside a
# container (the "Shocker" escape), and name_to_handle_at is what hands the handles out.
_HANDLES = _always(errno.EPERM, "open_by_handle_at", "name_to_handle_at")

# The namespace flags of clone and unshare. CLONE_NEWTIME shares its bit with clone's exit-signal
# byte, and clone cannot make a time namespace anyway, so it is checked for unshare only.
CLONE_NAMESPACES = {
    "CLONE_NEWNS": 0x00020000,
    "CLONE_NEWCGROUP": 0x02000000,
    "CLONE_NEWUTS": 0x04000000,
    "CLONE_NEWIPC": 0x08000000,
    "CLONE_NEWUSER": 0x10000000,
    "CLONE_NEWPID": 0x20000000,
    "CLONE_NEWNET": 0x40000000,
}
CLONE_NEWTIME = 0x00000080
_NAMESPACES = [
    *(_flag_set("clone", flag) for flag in CLONE_NAMESPACES.values()),
    *(_flag_set("unshare", flag) for flag in (*CLONE_NAMESPACES.values(), CLONE_NEWTIME)),
    Rule("setns", errno.EPERM),
    # its flags are in memory seccomp cannot read; ENOSYS makes callers fall back to clone
    Rule("clone3", errno.ENOSYS),
]

# personality: only PER_LINUX (0) and the query (0xffffffff) pass. Any other 32-bit value has a bit
# set whose next bit (cyclically) is clear, so one rule per bit refuses exactly the rest; the mask
# keeps to the low 32 bits, which are all the kernel reads.
_PERSONALITY = [
    Rule(
        "personality", errno.EPERM, arg=0, compare=Compare.MASKED_EQ, datum=1 << i, mask=(1 << i) | (1 << (i + 1) % 32)
    )
    for i in range(32)
]

# Faking input on a terminal (TIOCSTI, CVE-2017-5226) or through a virtual console's selection
# (TIOCLINUX, CVE-2023-28100). The kernel reads 32 bits of the command, so the rest is masked off.
# The numbers are the generic ones, which x86 and arm share.
TIOCSTI = 0x5412
TIOCLINUX = 0x541C
_TERMINAL = [
    Rule("ioctl", errno.EPERM, arg=1, compare=Compare.MASKED_EQ, datum=command, mask=0xFFFFFFFF)
    for command in (TIOCSTI, TIOCLINUX)
]

# Socket families: AF_UNIX (1), AF_INET (2), AF_INET6 (10) and AF_NETLINK (16) only. This also
# closes AF_VSOCK (the hypervisor host), AF_ALG, AF_PACKET and the rarely audited protocol
# families. "GE 17" compares all 64 bits, so a family with garbage in the upper half is refused too.
_ALLOWED_FAMILIES = (1, 2, 10, 16)
_SOCKETS = [
    rule
    for call in ("socket", "socketpair")
    for rule in (
        *(Rule(call, errno.EAFNOSUPPORT, arg=0, datum=f) for f in range(16) if f not in _ALLOWED_FAMILIES),
        Rule(call, errno.EAFNOSUPPORT, arg=0, compare=Compare.GE, datum=17),
    )
]

RULES: tuple[Rule, ...] = (
    *_KEYRING,
    *_OTHER_PROCESSES,
    *_NAMESPACES,
    *_MOUNTS,
    *_ATTACK_SURFACE,
    *_MACHINE,
    *_HARDWARE,
    *_HANDLES,
    *_PERSONALITY,
    *_TERMINAL,
    *_SOCKETS,
)


# With exec.allow, the pin launcher (sandbox/pin.py) enters a user and mount namespace of its own
# to remount the jail's mounts noexec, then installs EXEC_ALLOW_RULES itself: bwrap's filter in
# such a jail (PIN_STAGE_RULES) leaves it exactly that, and the server runs under both. A file made
# in memory is on no mount and so never noexec: memfd_create is refused there.
_PIN_NEEDS = {("unshare", CLONE_NAMESPACES["CLONE_NEWUSER"]), ("unshare", CLONE_NAMESPACES["CLONE_NEWNS"])}
PIN_STAGE_RULES: tuple[Rule, ...] = tuple(
    r for r in RULES if (r.syscall, r.datum) not in _PIN_NEEDS and r.syscall != "mount"
)
EXEC_ALLOW_RULES: tuple[Rule, ...] = (*RULES, Rule("memfd_create", errno.EPERM))
# A jail whose disk is bounded (an installer's: limits.disk) is watched while it writes
# (sandbox/disk.py), which sees what a write adds a moment later. fallocate takes gigabytes in one
# call, as fast as the file system records it, so a jail could fill the disk between two looks:
# it gets EOPNOTSUPP, what a file system without it answers, on which glibc's posix_fallocate
# writes the blocks instead (at the speed the watch keeps up with).
DISK_WATCHED = Rule("fallocate", errno.EOPNOTSUPP)
DISK_WATCHED_RULES: tuple[Rule, ...] = (*RULES, DISK_WATCHED)

# A Landlock jail (sandbox/landlock.py) has no namespace of its own: it shares the host's network,
# IPC objects and Unix sockets, and Landlock (before ABI 9) has no right over connecting to a path
# Unix socket, nor (before ABI 6) to an abstract one. So a new Unix socket is refused outright (the
# session bus, ssh-agent, X11, docker.sock are all one connect away); socketpair stays, which
# runtimes use for their children's pipes and which reaches no one else. On 32-bit x86 the socket
# and IPC calls also come multiplexed, with their arguments in memory seccomp cannot read.
# NETLINK_USERSOCK, alone of the netlink protocols, lets any user send to another process's socket
# by its port id: a channel to every host process that has one. It is refused as the kernel refuses
# a protocol it lacks; the kernel reads the protocol's low 32 bits, so only those are compared.
_AF_UNIX, _AF_NETLINK, _NETLINK_USERSOCK = 1, 16, 2
_HOST_SOCKETS = [
    Rule("socket", errno.EAFNOSUPPORT, arg=0, datum=_AF_UNIX),
    Rule(
        "socket",
        errno.EPROTONOSUPPORT,
        arg=0,
        datum=_AF_NETLINK,
        also=(Check(2, Compare.MASKED_EQ, _NETLINK_USERSOCK, 0xFFFFFFFF),),
    ),
    *_always(errno.EPERM, "socketcall", "ipc"),
]
# System V and POSIX message queues, semaphores and shared memory of the host: found by a key or an
# id anyone can guess, not by a path Landlock governs.
_HOST_IPC = _always(
    errno.EPERM,
    *("shmget", "shmat", "shmctl", "msgget", "msgsnd", "msgrcv", "msgctl", "semget", "semop", "semtimedop"),
    *("semctl", "mq_open", "mq_unlink", "mq_timedsend", "mq_timedreceive", "mq_notify", "mq_getsetattr"),
)
# Landlock governs no file's mode: chmod works on any file the jail's user owns, wherever it is. A
# set-user-ID or set-group-ID bit on one would run it with that owner's rights, for anyone.
_SETID = [
    Rule(call, errno.EPERM, arg=arg, compare=Compare.MASKED_EQ, datum=bit, mask=bit)
    for call, arg in (("chmod", 1), ("fchmod", 1), ("fchmodat", 2), ("fchmodat2", 2))
    for bit in (0o4000, 0o2000)
]
LANDLOCK_RULES: tuple[Rule, ...] = (*RULES, *_HOST_SOCKETS, *_HOST_IPC, *_SETID)
# A Landlock jail run as root (the gateway's user): root owns the system's files, and Landlock does
# not govern their mode, so changing the mode of a file by its path is refused (`chmod 0666
# /etc/shadow`); fchmod of a file the jail could open stays.
LANDLOCK_ROOT_RULES: tuple[Rule, ...] = tuple(_always(errno.EPERM, "chmod", "fchmodat", "fchmodat2"))
# An installer's Landlock jail run as root: npm, pip and uv change the modes of what they install,
# so those calls wait for the gateway, which makes them beneath the install's directory alone
# (`sandbox/modes.py`).
LANDLOCK_ROOT_INSTALL_RULES: tuple[Rule, ...] = tuple(Rule(call, NOTIFY) for call in ("chmod", "fchmodat", "fchmodat2"))
# A Landlock jail with a file granted alone: its opens and removals wait for the gateway, which
# makes a database's journal beside the file and lets every other call go on (`sandbox/sidecars.py`).
LANDLOCK_SIDECAR_RULES: tuple[Rule, ...] = tuple(Rule(call, NOTIFY) for call in FILE_CALLS)
# network: none on Landlock: its TCP rules refuse every bind and connect, but it governs no other
# protocol, nor listen() on an unbound socket (which binds a free port on every address); a TCP Fast
# Open send connects without connect() (6.18's Landlock refuses it too; not every kernel's is known
# to). So an inet socket is TCP only (type, without SOCK_NONBLOCK and SOCK_CLOEXEC, is SOCK_STREAM;
# protocol is 0 or IPPROTO_TCP): UDP, ICMP, SCTP and the rest are refused, and so are listen() (a
# Unix socket cannot be made: only an inet one could listen) and MSG_FASTOPEN.
_SOCK_TYPE_MASK, _SOCK_STREAM, _IPPROTO_TCP, _MSG_FASTOPEN = 0xF, 1, 6, 0x20000000
_NOT_TCP = [
    rule
    for family in (2, 10)
    for rule in (
        *(
            Rule("socket", errno.EPERM, arg=0, datum=family, also=(Check(1, Compare.MASKED_EQ, kind, _SOCK_TYPE_MASK),))
            for kind in range(_SOCK_TYPE_MASK + 1)
            if kind != _SOCK_STREAM
        ),
        *(
            Rule("socket", errno.EPERM, arg=0, datum=family, also=(Check(2, Compare.EQ, protocol),))
            for protocol in range(1, _IPPROTO_TCP)
        ),
        Rule("socket", errno.EPERM, arg=0, datum=family, also=(Check(2, Compare.GE, _IPPROTO_TCP + 1),)),
    )
]
_FAST_OPEN = [
    Rule(call, errno.EPERM, arg=arg, compare=Compare.MASKED_EQ, datum=_MSG_FASTOPEN, mask=_MSG_FASTOPEN)
    for call, arg in (("sendto", 3), ("sendmsg", 2), ("sendmmsg", 3))
]
LANDLOCK_NO_NETWORK_RULES: tuple[Rule, ...] = (*_NOT_TCP, *_FAST_OPEN, Rule("listen", errno.EPERM))
# network: allowlist or ask on Landlock: the same, and each connect() waits for the gateway, which
# connects the socket itself, to the egress proxy's loopback port alone (`sandbox/connects.py`):
# Landlock's TCP rules are by port, and would let that port be reached on any host.
LANDLOCK_PROXIED_RULES: tuple[Rule, ...] = (*LANDLOCK_NO_NETWORK_RULES, Rule("connect", NOTIFY))


def _binding() -> Any:
    """The pyseccomp module (a ctypes binding over the system's libseccomp).

    Imported by name: it ships no type information, so its untyped surface stays inside this module.

    Raises:
        JailError: pyseccomp is not installed, or libseccomp cannot be found or loaded.
    """
    try:
        return importlib.import_module("pyseccomp")
    except ImportError as exc:
        raise JailError(
            f"the jail's seccomp filter needs the Python package pyseccomp, which is missing ({exc}); "
            "install it into the environment cellblock runs in (pip install pyseccomp)"
        ) from exc
    except (OSError, RuntimeError) as exc:  # pyseccomp raises RuntimeError when find_library fails
        raise JailError(
            f"the jail's seccomp filter needs libseccomp, which cannot be loaded ({exc}); {_INSTALL}"
        ) from exc


def build_filter(rules: tuple[Rule, ...] = RULES) -> bytes:
    """Compile `rules` into the BPF program bwrap installs (`--seccomp FD`).

    System calls this libseccomp does not know are skipped: they do not exist on any architecture
    it can build for.

    Raises:
        JailError: libseccomp cannot be loaded, this architecture is not supported, or libseccomp
            refused a rule.
    """
    lib = _binding()
    native = lib.system_arch()
    names = {getattr(lib.Arch, name): name for name in ("X86_64", "AARCH64")}
    if native not in names:
        raise JailError(
            f"the jail's seccomp filter is built for x86_64 and aarch64 only, and this machine is "
            f"{platform.machine()}; run the gateway on one of those, or set 'jail: false' on the server"
        )
    try:
        program = lib.SyscallFilter(lib.ALLOW)
        for compat in COMPAT_ARCHES[names[native]]:
            # one libseccomp cannot add is left out: its calls meet the bad-architecture action, a kill
            with contextlib.suppress(OSError):
                program.add_arch(getattr(lib.Arch, compat))
        for rule in rules:
            number = lib.resolve_syscall(lib.Arch.NATIVE, rule.syscall)
            if number == _UNKNOWN:
                continue
            checks = [] if rule.arg is None else [Check(rule.arg, rule.compare, rule.datum, rule.mask), *rule.also]
            action = lib.NOTIFY if rule.error == NOTIFY else lib.ERRNO(rule.error)
            program.add_rule(action, number, *(_compare(lib, check) for check in checks))
        fd = os.memfd_create("cellblock-seccomp-build", os.MFD_CLOEXEC)
        with os.fdopen(fd, "w+b") as out:
            program.export_bpf(out)
            out.seek(0)
            return out.read()
    except OSError as exc:
        raise JailError(
            f"libseccomp could not build the jail's seccomp filter: {exc}; see 'cellblock doctor', "
            "or set 'jail: false' on the server to run it unjailed"
        ) from exc


def _compare(lib: Any, check: Check) -> Any:
    if check.compare is Compare.MASKED_EQ:
        return lib.Arg(check.arg, lib.MASKED_EQ, check.mask, check.datum)
    return lib.Arg(check.arg, getattr(lib, check.compare.value), check.datum)


@functools.cache
def syscall_name(arch: int, number: int) -> str | None:
    """The name of system call `number` on `arch` (an AUDIT_ARCH value, as a notification gives it),
    or None where libseccomp does not know it.

    Raises:
        JailError: libseccomp cannot be loaded.
    """
    lib = _binding()
    try:
        name = lib.resolve_syscall(arch, number)
    except (OSError, ValueError):
        return None
    return name.decode() if isinstance(name, bytes) else None


@functools.cache
def jail_filter(rules: tuple[Rule, ...] = RULES) -> bytes:
    """The filter every jail gets (or one of the exec.allow pair), compiled once per process.

    Raises:
        JailError: see `build_filter`.
    """
    return build_filter(rules)
