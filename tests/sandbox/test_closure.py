"""The exec closure: what a jail with exec.allow shows, found as the kernel and the loader find it."""

from __future__ import annotations

import os
import shutil
import sys
from dataclasses import replace
from pathlib import Path

from cellblock.sandbox.closure import exec_closure
from cellblock.sandbox.elf import find_library, read_elf, system_library_dirs

TRUE = os.path.realpath(shutil.which("true") or "/bin/true")


def test_an_elf_program_brings_its_loader_and_its_libraries_and_nothing_else() -> None:
    elf = read_elf(TRUE)
    assert elf is not None and elf.interpreter is not None
    closure = exec_closure([TRUE], "/usr/bin:/bin")
    names = {os.path.basename(f) for f in closure.files}
    assert TRUE in closure.files and "libc.so.6" in names
    assert elf.interpreter in closure.executables and TRUE in closure.executables
    assert not any(os.path.basename(f) in ("sh", "dash", "bash", "env") for f in closure.files)
    # every file is given by its physical path: no symlink above it, so the jail can show it there
    assert all(os.path.realpath(os.path.dirname(f)) == os.path.dirname(f) for f in closure.files)


def test_a_script_brings_its_interpreter_and_an_env_line_the_program_it_names(tmp_path: Path) -> None:
    direct = tmp_path / "direct"
    direct.write_text(f"#!{sys.executable}\n")
    through_env = tmp_path / "through-env"
    through_env.write_text("#!/usr/bin/env -S true --flag\n")
    closure = exec_closure([str(direct), str(through_env)], os.path.dirname(TRUE))
    assert sys.executable in closure.executables and os.path.realpath(sys.executable) in closure.executables
    assert TRUE in closure.executables  # env's NAME, looked up on the jail's PATH


def test_a_library_is_looked_up_in_the_objects_own_run_path_first(tmp_path: Path) -> None:
    copy = tmp_path / "bin" / "tool"
    copy.parent.mkdir()
    shutil.copy(TRUE, copy)
    elf = read_elf(str(copy))
    assert elf is not None
    private = tmp_path / "lib" / "libc.so.6"
    private.parent.mkdir()
    shutil.copy(os.path.realpath(find_library("libc.so.6", elf, system_library_dirs(elf.machine)) or ""), private)
    rooted = replace(elf, runpath=(str(private.parent),))
    assert find_library("libc.so.6", rooted, system_library_dirs(elf.machine)) == str(private)
    assert find_library("libnothing.so.9", rooted, system_library_dirs(elf.machine)) is None


def test_what_is_not_elf_reads_as_none(tmp_path: Path) -> None:
    text = tmp_path / "text"
    text.write_text("not a program")
    truncated = tmp_path / "truncated"
    truncated.write_bytes(Path(TRUE).read_bytes()[:100])
    assert read_elf(str(text)) is None and read_elf(str(tmp_path / "missing")) is None
    read_elf(str(truncated))  # a cut-off program neither raises nor hangs


def test_a_virtualenvs_extensions_bring_the_libraries_they_need(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    site = venv / "lib" / "python3.11" / "site-packages" / "pkg"
    site.mkdir(parents=True)
    (venv / "pyvenv.cfg").write_text("home = /nonexistent\n")
    shutil.copy(TRUE, site / "_native.cpython-311-x86_64-linux-gnu.so")  # any ELF with libc in it
    closure = exec_closure([], "/usr/bin", [str(venv)])
    assert "libc.so.6" in {os.path.basename(f) for f in closure.files}
