"""The jail's seccomp filter: what it refuses, with which errno, and that it refuses nothing else.

Every refusal is a row of `CALLS`: a system call with arguments chosen so that the kernel itself
answers something other than the filter's errno (a bad flag, a missing path, a process that does
not exist), since the filter decides before the kernel looks. Two honest controls:

- in a real jail, the same calls in the same jail built without the filter reach the kernel;
- as root, with every capability, the same calls outside any jail reach the kernel, and fail with
  the filter's errno once the probe installs the very same program. This covers the calls a
  jail's missing capabilities already refuse with EPERM (`needs_capability`), where the jail alone
  cannot tell the two apart. The arguments are harmless even to root: every such call fails.

A socket family this kernel lacks fails with EAFNOSUPPORT without the filter too; the families in
the table (vsock, packet, XDP) were checked on the project's machines.
"""

from __future__ import annotations

import ctypes.util
import errno
import json
import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from cellblock.sandbox import seccomp
from cellblock.sandbox.bwrap import bwrap_plan, check_bwrap
from cellblock.sandbox.seccomp import CLONE_NAMESPACES, CLONE_NEWTIME, TIOCLINUX, TIOCSTI
from cellblock.sandbox.spawn import SECCOMP_FD, run_plan, spawn_args
from cellblock.sandbox.types import JailError, JailSpec, LaunchPlan, Network

PROBE = (Path(__file__).parent / "syscall_probe.py").read_text()
IS_ROOT = os.geteuid() == 0
needs_bwrap = pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
needs_python3 = pytest.mark.skipif(not Path("/usr/bin/python3").exists(), reason="needs the system python3")

NOWHERE = {"str": "/nonexistent-cellblock"}
NO_PID = 0x7FFFFFF0  # above any pid_max
BAD_FD = -1
AT_FDCWD = -100
CLONE_PARENT = 0x00008000  # not accepted by unshare: EINVAL before any namespace is made
CLONE_SIGHAND = 0x00000800  # without CLONE_VM, clone refuses it: EINVAL before any process is made
HIGH = 1 << 32  # garbage in the upper half of a 64-bit register, which the kernel drops for 32-bit arguments
AF = {"AF_UNSPEC": 0, "AF_UNIX": 1, "AF_INET": 2, "AF_INET6": 10, "AF_NETLINK": 16, "AF_PACKET": 17}
AF |= {"AF_VSOCK": 40, "AF_XDP": 44}
SOCK_STREAM, SOCK_DGRAM, SOCK_RAW = 1, 2, 3
ADDR_NO_RANDOMIZE = 0x0040000
PER_BSD = 0x0006
O_NONBLOCK = 0o4000
TIOCGWINSZ = 0x5413
UFFD_USER_MODE_ONLY = 1
BAD_TIMEVAL = {"hex": (0).to_bytes(8, "little").hex() + (2_000_000).to_bytes(8, "little").hex()}  # usec > 1e6


@dataclass(frozen=True)
class Call:
    """One system call; `refused` is the errno the filter answers (None: the filter lets it through)."""

    syscall: str
    args: tuple[Any, ...]
    refused: int | None
    # the kernel asks for a capability the jail lacks before it looks at the arguments, so without
    # the filter the jail may answer EPERM too: only the run with every capability tells them apart
    needs_capability: bool = False
    label: str = ""

    @property
    def id(self) -> str:
        return self.label or self.syscall


EPERM, ENOSYS, EAFNOSUPPORT = errno.EPERM, errno.ENOSYS, errno.EAFNOSUPPORT
CALLS = [
    # the kernel keyring
    Call("add_key", ({"str": "user"}, {"str": "cellblock"}, 0, 0, NO_PID), EPERM),
    Call("keyctl", (0x7FFF,), EPERM),
    Call("request_key", ({"str": "user"}, {"str": "cellblock-absent"}, 0, 0), EPERM),
    # other processes
    Call("ptrace", (16, NO_PID, 0, 0), EPERM),  # PTRACE_ATTACH
    Call("process_vm_readv", (NO_PID, 0, 0, 0, 0, 1), EPERM),
    Call("process_vm_writev", (NO_PID, 0, 0, 0, 0, 1), EPERM),
    Call("process_madvise", (BAD_FD, 0, 0, 0, 0), EPERM),
    Call("kcmp", (NO_PID, NO_PID, 0, 0, 0), EPERM),
    Call("pidfd_getfd", (BAD_FD, 0, 0), EPERM),
    # namespaces
    *(Call("unshare", (f | CLONE_PARENT,), EPERM, label=f"unshare {n}") for n, f in CLONE_NAMESPACES.items()),
    Call("unshare", (CLONE_NEWTIME | CLONE_PARENT,), EPERM, label="unshare CLONE_NEWTIME"),
    *(Call("clone", (f | CLONE_SIGHAND, 0, 0, 0, 0), EPERM, label=f"clone {n}") for n, f in CLONE_NAMESPACES.items()),
    Call("setns", (BAD_FD, 0), EPERM),
    Call("clone3", (0, 0), ENOSYS),
    # mounts
    Call("mount", (0, NOWHERE, 0, 0, 0), EPERM),
    Call("umount2", ({"str": "/"}, 0x80000000), EPERM),  # UMOUNT_UNUSED: EINVAL
    Call("pivot_root", (NOWHERE, NOWHERE), EPERM, needs_capability=True),
    Call("chroot", (NOWHERE,), EPERM),
    Call("open_tree", (AT_FDCWD, NOWHERE, 0), EPERM),
    Call("move_mount", (BAD_FD, {"str": ""}, BAD_FD, {"str": ""}, 0), EPERM, needs_capability=True),
    Call("fsopen", ({"str": "cellblock-absent"}, 0), EPERM, needs_capability=True),
    Call("fsconfig", (BAD_FD, 0, 0, 0, 0), EPERM),
    Call("fsmount", (BAD_FD, 0, 0), EPERM, needs_capability=True),
    Call("fspick", (BAD_FD, {"str": ""}, 0), EPERM, needs_capability=True),
    Call("mount_setattr", (BAD_FD, {"str": ""}, 0, 0, 0), EPERM),
    # kernel attack surface
    Call("bpf", (9999, 0, 0), EPERM),
    Call("perf_event_open", (0, 0, -1, -1, 0), EPERM),
    Call("userfaultfd", (UFFD_USER_MODE_ONLY | 0x7FFF0000,), EPERM),
    Call("io_uring_setup", (0, 0), EPERM),
    Call("io_uring_enter", (BAD_FD, 0, 0, 0, 0, 0), EPERM),
    Call("io_uring_register", (BAD_FD, 0, 0, 0), EPERM),
    Call("lookup_dcookie", (0, 0, 0), EPERM),
    Call("uselib", (0,), EPERM),
    # the machine's own state
    Call("kexec_load", (0, 0x7FFFFFFF, 0, 0x8000), EPERM, needs_capability=True),
    Call("kexec_file_load", (BAD_FD, BAD_FD, 0, 0, 0x8000), EPERM, needs_capability=True),
    Call("reboot", (0, 0, 0, 0), EPERM, needs_capability=True),  # no magic numbers: EINVAL
    Call("init_module", (0, 0, {"str": ""}), EPERM, needs_capability=True),
    Call("finit_module", (BAD_FD, {"str": ""}, 0), EPERM, needs_capability=True),
    Call("delete_module", ({"str": "cellblock_absent"}, O_NONBLOCK), EPERM, needs_capability=True),
    Call("swapon", (NOWHERE, 0), EPERM, needs_capability=True),
    Call("swapoff", (NOWHERE,), EPERM, needs_capability=True),
    Call("acct", ({"str": "/nonexistent-cellblock/acct"},), EPERM, needs_capability=True),
    Call("quotactl", (0x7F, 0, 0, 0), EPERM),
    Call("quotactl_fd", (BAD_FD, 0, 0, 0), EPERM),
    Call("settimeofday", (BAD_TIMEVAL, 0), EPERM),
    Call("clock_settime", (0x7FFF, 0), EPERM),
    Call("clock_adjtime", (0x7FFF, 0), EPERM),
    Call("adjtimex", (0,), EPERM),
    Call("syslog", (10, 0, 0), EPERM, needs_capability=True),  # SYSLOG_ACTION_SIZE_BUFFER: a read
    # hardware, the LDT, NUMA placement
    Call("iopl", (99,), EPERM),
    Call("ioperm", (0, 0, 1), EPERM),
    Call("modify_ldt", (0, {"zeros": 16}, 16), EPERM),
    Call("mbind", (0, 0, 99, 0, 0, 0), EPERM),
    Call("set_mempolicy", (99, 0, 0), EPERM),
    Call("get_mempolicy", (0, 0, 0, 0, 0), EPERM),
    Call("migrate_pages", (NO_PID, 0, 0, 0), EPERM),
    Call("move_pages", (NO_PID, 0, 0, 0, 0, 0xFF00), EPERM),
    Call("set_mempolicy_home_node", (0, 0, 0, 1), EPERM),
    # file handles
    Call("open_by_handle_at", (BAD_FD, 0, 0), EPERM),
    Call("name_to_handle_at", (AT_FDCWD, NOWHERE, 0, 0, 0), EPERM),
    # personality: PER_LINUX and the query only, whatever sits in the upper half
    Call("personality", (ADDR_NO_RANDOMIZE,), EPERM, label="personality ADDR_NO_RANDOMIZE"),
    Call("personality", (PER_BSD,), EPERM, label="personality PER_BSD"),
    Call("personality", (HIGH | ADDR_NO_RANDOMIZE,), EPERM, label="personality ADDR_NO_RANDOMIZE, upper half set"),
    Call("personality", (0xFFFFFFFF,), None, label="personality query"),
    Call("personality", (0,), None, label="personality PER_LINUX"),
    # terminals
    Call("ioctl", ("pty", TIOCSTI, {"hex": "78"}), EPERM, label="ioctl TIOCSTI"),
    Call("ioctl", ("pty", HIGH | TIOCSTI, {"hex": "78"}), EPERM, label="ioctl TIOCSTI, upper half set"),
    Call("ioctl", ("pty", TIOCLINUX, {"hex": "00"}), EPERM, label="ioctl TIOCLINUX"),
    Call("ioctl", ("pty", TIOCGWINSZ, {"zeros": 8}), None, label="ioctl TIOCGWINSZ"),
    # socket families
    Call("socket", (AF["AF_VSOCK"], SOCK_STREAM, 0), EAFNOSUPPORT, label="socket AF_VSOCK"),
    Call("socket", (HIGH | AF["AF_VSOCK"], SOCK_STREAM, 0), EAFNOSUPPORT, label="socket AF_VSOCK, upper half set"),
    Call("socket", (AF["AF_XDP"], SOCK_RAW, 0), EAFNOSUPPORT, label="socket AF_XDP"),
    Call("socket", (AF["AF_PACKET"], SOCK_RAW, 0), EAFNOSUPPORT, label="socket AF_PACKET"),
    Call("socketpair", (AF["AF_VSOCK"], SOCK_STREAM, 0, {"zeros": 8}), EAFNOSUPPORT, label="socketpair AF_VSOCK"),
    Call("socket", (AF["AF_UNIX"], SOCK_STREAM, 0), None, label="socket AF_UNIX"),
    Call("socket", (AF["AF_INET"], SOCK_STREAM, 0), None, label="socket AF_INET"),
    Call("socket", (AF["AF_INET6"], SOCK_DGRAM, 0), None, label="socket AF_INET6"),
    Call("socket", (AF["AF_NETLINK"], SOCK_RAW, 0), None, label="socket AF_NETLINK"),
    Call("socketpair", (AF["AF_UNIX"], SOCK_STREAM, 0, {"zeros": 8}), None, label="socketpair AF_UNIX"),
    Call("unshare", (0x00000400,), None, label="unshare CLONE_FILES"),
]
# Rules for calls this machine's native ABI does not have (vm86, stime, the 32-bit time calls...)
# apply to the compat ABIs only; a 64-bit probe cannot make them.
COMPAT_ONLY = {"umount", "stime", "clock_settime64", "clock_adjtime64", "vm86", "vm86old"}


def numbers() -> dict[str, int]:
    lib: Any = pytest.importorskip("pyseccomp")
    return {call.syscall: lib.resolve_syscall(lib.Arch.NATIVE, call.syscall) for call in CALLS}


def spec_of(calls: list[Call], program: bytes | None = None) -> str:
    nr = numbers()
    return json.dumps(
        {"calls": [{"nr": nr[c.syscall], "args": list(c.args)} for c in calls], "filter": program and program.hex()}
    )


def errname(code: int | str) -> str:
    return code if isinstance(code, str) else ("ok" if code == 0 else errno.errorcode.get(code, str(code)))


def in_jail(calls: list[Call], filtered: bool) -> list[int | str]:
    spec = JailSpec(
        name="probe",
        argv=("/usr/bin/python3", "-I", "-S", "-c", PROBE, spec_of(calls)),
        env={"PATH": "/usr/bin:/bin"},
        home="/root",
    )
    done = run_plan(bwrap_plan(spec, [], check_bwrap(), seccomp=filtered), 120)
    assert done.returncode == 0, done.stderr
    results: list[int | str] = json.loads(done.stdout)
    return results


def outside(calls: list[Call], program: bytes | None) -> list[int | str]:
    done = subprocess.run(
        ["/usr/bin/python3", "-I", "-S", "-c", PROBE, spec_of(calls, program)],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    results: list[int | str] = json.loads(done.stdout)
    return results


def test_every_call_the_filter_refuses_on_this_machine_has_a_row() -> None:
    lib: Any = pytest.importorskip("pyseccomp")
    refused = {rule.syscall for rule in seccomp.RULES}
    native = {n for n in refused if lib.resolve_syscall(lib.Arch.NATIVE, n) >= 0}
    assert native - {c.syscall for c in CALLS} == set()
    assert refused >= COMPAT_ONLY


def test_refusals_are_errnos_and_only_clone3_and_socket_families_differ_from_eperm() -> None:
    errors = {(rule.syscall, rule.error) for rule in seccomp.RULES if rule.error != EPERM}
    assert errors == {("clone3", ENOSYS), ("socket", EAFNOSUPPORT), ("socketpair", EAFNOSUPPORT)}


def failures(calls: list[Call], without: list[int | str], with_filter: list[int | str], jailed: bool) -> list[str]:
    wrong = []
    for call, control, filtered in zip(calls, without, with_filter, strict=True):
        if call.refused is None:
            if filtered != control:
                wrong.append(f"{call.id}: allowed, yet {errname(filtered)} with the filter, {errname(control)} without")
            continue
        if filtered != call.refused:
            wrong.append(f"{call.id}: {errname(filtered)} with the filter, expected {errname(call.refused)}")
        if control == call.refused and not (jailed and call.needs_capability):
            wrong.append(f"{call.id}: {errname(control)} without the filter as well, so this row proves nothing")
    return wrong


@pytest.mark.jail
@needs_bwrap
@needs_python3
def test_in_a_jail_each_call_meets_the_filters_errno_and_reaches_the_kernel_without_it() -> None:
    without, with_filter = in_jail(CALLS, filtered=False), in_jail(CALLS, filtered=True)
    assert failures(CALLS, without, with_filter, jailed=True) == []


@pytest.mark.skipif(not IS_ROOT, reason="needs root: the control holds every capability")
@needs_python3
def test_with_every_capability_each_call_reaches_the_kernel_and_the_filter_still_refuses_it() -> None:
    without, with_filter = outside(CALLS, None), outside(CALLS, seccomp.jail_filter())
    assert failures(CALLS, without, with_filter, jailed=False) == []


# keyctl(0x7fff) through the 32-bit x86 entry (int 0x80), which a 64-bit process may use too:
# push rbx; mov eax, 288 (i386 keyctl); mov ebx, 0x7fff; int 0x80; pop rbx; movsxd rax, eax; ret
INT_0X80_KEYCTL = """
import ctypes, mmap
code = bytes.fromhex("53b820010000bbff7f0000cd805b4863c0c3")
page = mmap.mmap(-1, mmap.PAGESIZE, prot=mmap.PROT_READ | mmap.PROT_WRITE | mmap.PROT_EXEC)
page.write(code)
print(-ctypes.CFUNCTYPE(ctypes.c_long)(ctypes.addressof(ctypes.c_char.from_buffer(page)))())
"""


@pytest.mark.jail
@needs_bwrap
@needs_python3
@pytest.mark.skipif(os.uname().machine != "x86_64", reason="the 32-bit x86 entry exists on x86_64 only")
def test_a_32_bit_system_call_from_a_64_bit_program_meets_the_same_rules() -> None:
    def errno_of(filtered: bool) -> int:
        spec = JailSpec("t", ("/usr/bin/python3", "-I", "-S", "-c", INT_0X80_KEYCTL), {"PATH": "/usr/bin"})
        done = run_plan(bwrap_plan(spec, [], check_bwrap(), seccomp=filtered), 60)
        if done.returncode != 0:
            pytest.skip(f"no 32-bit x86 entry here (ia32_emulation off?): {done.stderr.strip()[-200:]}")
        return int(done.stdout)

    assert errno_of(filtered=False) == errno.EOPNOTSUPP  # the control: the call reaches the kernel
    assert errno_of(filtered=True) == errno.EPERM


THREADS_AND_PROCESSES = """
import os, subprocess, threading
seen = []
thread = threading.Thread(target=lambda: seen.append("thread"))
thread.start()
thread.join()
seen.append("subprocess" if subprocess.run(["/usr/bin/true"]).returncode == 0 else "no subprocess")
pid = os.fork()
if pid == 0:
    os._exit(7)
seen.append("fork" if os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1]) == 7 else "no fork")
print(" ".join(seen))
"""


@pytest.mark.jail
@needs_bwrap
@needs_python3
def test_threads_and_processes_still_start_under_the_filter() -> None:
    # pthread_create and posix_spawn try clone3 first; its ENOSYS makes glibc fall back to clone
    spec = JailSpec("t", ("/usr/bin/python3", "-I", "-S", "-c", THREADS_AND_PROCESSES), {"PATH": "/usr/bin"})
    done = run_plan(bwrap_plan(spec, [], check_bwrap()), 60)
    assert done.stdout.split() == ["thread", "subprocess", "fork"], done.stderr


@pytest.mark.jail
@needs_bwrap
def test_a_plan_run_without_its_filter_handed_over_does_not_start(tmp_path: Path) -> None:
    marker = tmp_path / "ran"
    spec = JailSpec("t", ("/usr/bin/touch", str(marker)), {"PATH": "/usr/bin"}, read_write=(str(tmp_path),))
    plan = bwrap_plan(spec, [], check_bwrap())
    done = subprocess.run(list(plan.argv), capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode != 0 and "Invalid fd" in done.stderr
    assert not marker.exists()
    assert run_plan(plan, 60).returncode == 0 and marker.exists()  # the control: handed over, it runs


def test_spawn_args_hands_bwrap_the_program_in_a_memfd_it_closes_afterwards() -> None:
    program = b"\x06\x00\x00\x00\x00\x00\xff\x7f"  # one instruction: return ALLOW
    plan = LaunchPlan(("bwrap", "--seccomp", SECCOMP_FD, "--", "true"), {}, None, (), Network.NONE, program)
    with spawn_args(plan) as spawn:
        (fd,) = spawn.pass_fds
        assert spawn.argv == ("bwrap", "--seccomp", str(fd), "--", "true")
        assert os.pread(fd, 64, 0) == program and os.lseek(fd, 0, os.SEEK_CUR) == 0
    with pytest.raises(OSError):
        os.fstat(fd)


@pytest.mark.parametrize(
    ("argv", "program"),
    [
        (("bwrap", "--", "true"), b"x" * 8),
        (("bwrap", "--seccomp", SECCOMP_FD, "--seccomp", SECCOMP_FD, "--", "true"), b"x" * 8),
        (("bwrap", "--seccomp", SECCOMP_FD, "--", "true"), None),
    ],
    ids=["a filter and no place for it", "two places", "a place and no filter"],
)
def test_a_plan_whose_command_and_filter_disagree_is_not_started(argv: tuple[str, ...], program: bytes | None) -> None:
    plan = LaunchPlan(argv, {}, None, (), Network.NONE, program)
    with pytest.raises(JailError, match="nothing was started"), spawn_args(plan):
        pytest.fail("spawned")


@pytest.fixture
def fresh_filter() -> Iterator[None]:
    """The filter compiled anew by whoever asks next, and again after the test."""
    seccomp.jail_filter.cache_clear()
    check_bwrap.cache_clear()
    yield
    seccomp.jail_filter.cache_clear()
    check_bwrap.cache_clear()


@pytest.mark.parametrize("found", [None, "/nonexistent-cellblock/libseccomp.so.2"], ids=["not found", "not loadable"])
def test_without_libseccomp_no_jail_is_built_and_the_error_says_what_to_install(
    found: str | None, monkeypatch: pytest.MonkeyPatch, fresh_filter: None
) -> None:
    real = ctypes.util.find_library
    monkeypatch.setattr(ctypes.util, "find_library", lambda name: found if name == "seccomp" else real(name))
    monkeypatch.delitem(sys.modules, "pyseccomp", raising=False)
    spec = JailSpec("s", ("/usr/bin/true",), {"PATH": "/usr/bin"})
    with pytest.raises(JailError) as refused:
        bwrap_plan(spec, [])
    message = str(refused.value)
    assert "libseccomp" in message and "apt-get install libseccomp2" in message and "dnf install libseccomp" in message
    assert bwrap_plan(spec, [], seccomp=False).seccomp is None  # the tests' control needs no library


def test_an_architecture_the_filter_is_not_built_for_is_refused(
    monkeypatch: pytest.MonkeyPatch, fresh_filter: None
) -> None:
    lib: Any = pytest.importorskip("pyseccomp")
    monkeypatch.setattr(lib, "system_arch", lambda: lib.Arch.PPC64LE)
    with pytest.raises(JailError, match="x86_64 and aarch64 only"):
        seccomp.jail_filter()


def test_the_filter_is_compiled_once_per_process(fresh_filter: None) -> None:
    pytest.importorskip("pyseccomp")
    assert seccomp.jail_filter() is seccomp.jail_filter()
    assert len(seccomp.jail_filter()) % 8 == 0  # whole BPF instructions
