"""What the kernel and the dynamic loader read to start a program: its ELF loader and libraries.

`read_elf` reads the few fields of an ELF file that say what else it needs: the loader named in
its program header (`PT_INTERP`), the libraries its dynamic section names (`DT_NEEDED`), and
where it asks them to be looked for (`DT_RUNPATH`, `DT_RPATH`). `find_library` looks a library
up as glibc's loader does: the object's own run paths, then the directories of `/etc/ld.so.conf`,
then the defaults, taking the first file of the same class and machine.

Little-endian ELF only (x86_64, aarch64 and their 32-bit ABIs); anything else reads as not ELF.
"""

from __future__ import annotations

import glob
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO

__all__ = ["Elf", "find_library", "read_elf", "system_library_dirs"]

_MAGIC = b"\x7fELF"
PT_LOAD, PT_DYNAMIC, PT_INTERP = 1, 2, 3
DT_NULL, DT_NEEDED, DT_STRTAB, DT_RPATH, DT_RUNPATH = 0, 1, 5, 15, 29
# The multiarch directory of each machine (e_machine): where Debian and Ubuntu keep its libraries.
_TRIPLETS = {62: "x86_64-linux-gnu", 183: "aarch64-linux-gnu", 3: "i386-linux-gnu", 40: "arm-linux-gnueabihf"}
# Longer names or lists are not a real program's; a corrupt file must not cost more than this.
_MAX_STRING = 4096
_MAX_ENTRIES = 4096


@dataclass(frozen=True, slots=True)
class Elf:
    """What one ELF file needs in order to run (or to be loaded)."""

    wide: bool  # 64-bit
    machine: int  # e_machine
    interpreter: str | None  # PT_INTERP: the loader the kernel starts it with
    needed: tuple[str, ...]  # DT_NEEDED, in order
    runpath: tuple[str, ...]  # DT_RUNPATH, or DT_RPATH when there is no DT_RUNPATH ($ORIGIN expanded)


def read_elf(path: str) -> Elf | None:
    """The ELF facts of the file at `path`, or None when it is not a little-endian ELF file."""
    try:
        with open(path, "rb") as handle:
            return _read(handle, path)
    except (OSError, struct.error, ValueError, UnicodeDecodeError):
        return None


def _read(file: BinaryIO, path: str) -> Elf | None:
    head = file.read(64)
    if head[:4] != _MAGIC or head[5] != 1:
        return None
    wide = head[4] == 2
    machine = struct.unpack_from("<H", head, 18)[0]
    if wide:
        phoff, (phentsize, phnum) = struct.unpack_from("<Q", head, 32)[0], struct.unpack_from("<HH", head, 54)
    else:
        phoff, (phentsize, phnum) = struct.unpack_from("<I", head, 28)[0], struct.unpack_from("<HH", head, 42)
    loads: list[tuple[int, int, int]] = []  # (vaddr, offset, filesz)
    interpreter: str | None = None
    dynamic: tuple[int, int] | None = None
    for index in range(min(phnum, _MAX_ENTRIES)):
        file.seek(phoff + index * phentsize)
        entry = file.read(phentsize)
        kind = struct.unpack_from("<I", entry, 0)[0]
        if wide:
            offset, vaddr, filesz = (struct.unpack_from("<Q", entry, at)[0] for at in (8, 16, 32))
        else:
            offset, vaddr, filesz = (struct.unpack_from("<I", entry, at)[0] for at in (4, 8, 16))
        if kind == PT_LOAD:
            loads.append((vaddr, offset, filesz))
        elif kind == PT_INTERP:
            file.seek(offset)
            interpreter = file.read(min(filesz, _MAX_STRING)).rstrip(b"\0").decode()
        elif kind == PT_DYNAMIC:
            dynamic = (offset, filesz)
    needed: list[str] = []
    runpath: list[str] = []
    if dynamic is not None:
        needed, runpath = _dynamic(file, wide, dynamic, loads, os.path.dirname(os.path.realpath(path)))
    return Elf(wide, machine, interpreter, tuple(needed), tuple(runpath))


def _dynamic(
    file: BinaryIO, wide: bool, dynamic: tuple[int, int], loads: list[tuple[int, int, int]], origin: str
) -> tuple[list[str], list[str]]:
    size = 16 if wide else 8
    offset, length = dynamic
    file.seek(offset)
    raw = file.read(min(length, size * _MAX_ENTRIES))
    entries: list[tuple[int, int]] = []
    for at in range(0, len(raw) - size + 1, size):
        tag, value = struct.unpack_from("<qQ" if wide else "<iI", raw, at)
        if tag == DT_NULL:
            break
        entries.append((tag, value))
    table = next((value for tag, value in entries if tag == DT_STRTAB), None)
    if table is None:
        return [], []
    base = next((off + table - vaddr for vaddr, off, size_ in loads if vaddr <= table < vaddr + size_), None)
    if base is None:
        return [], []

    def string(at: int) -> str:
        file.seek(base + at)
        return file.read(_MAX_STRING).split(b"\0", 1)[0].decode()

    needed = [string(value) for tag, value in entries if tag == DT_NEEDED]
    run = [string(value) for tag, value in entries if tag == DT_RUNPATH]
    if not run:  # DT_RPATH counts only where there is no DT_RUNPATH
        run = [string(value) for tag, value in entries if tag == DT_RPATH]
    dirs = [d.replace("$ORIGIN", origin).replace("${ORIGIN}", origin) for text in run for d in text.split(":") if d]
    return needed, dirs


def system_library_dirs(machine: int, config: str = "/etc/ld.so.conf") -> list[str]:
    """Where the loader looks for a library no run path finds: ld.so.conf's directories, then the defaults."""
    dirs: list[str] = []
    _conf(Path(config), dirs, depth=0)
    triplet = _TRIPLETS.get(machine)
    if triplet is not None:
        dirs += [f"/lib/{triplet}", f"/usr/lib/{triplet}"]
    dirs += ["/lib64", "/usr/lib64", "/lib", "/usr/lib"]
    return list(dict.fromkeys(dirs))


def _conf(path: Path, dirs: list[str], depth: int) -> None:
    try:
        lines = path.read_text(errors="replace").splitlines()
    except OSError:
        return
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line.startswith("include ") and depth < 4:
            pattern = line.split(None, 1)[1]
            pattern = pattern if os.path.isabs(pattern) else str(path.parent / pattern)
            for included in sorted(glob.glob(pattern)):
                _conf(Path(included), dirs, depth + 1)
        elif line.startswith("/"):
            dirs.append(line)


def find_library(name: str, elf: Elf, system: list[str]) -> str | None:
    """The file the loader would load for `name`, needed by the object `elf`; None if none is found."""
    if "/" in name:
        return name if os.path.isfile(name) else None
    for directory in (*elf.runpath, *system):
        candidate = os.path.join(directory, name)
        if not os.path.isfile(candidate):
            continue
        found = read_elf(candidate)
        if found is not None and (found.wide, found.machine) == (elf.wide, elf.machine):
            return candidate
    return None
