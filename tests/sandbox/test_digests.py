"""Executable pins and the exec allow-list launcher."""

from __future__ import annotations

import hashlib
import importlib.util
import os
import shutil
import subprocess
import sys
from pathlib import Path
from types import ModuleType

import pytest

from cellblock.sandbox.bwrap import bwrap_plan
from cellblock.sandbox.digests import verify_pins
from cellblock.sandbox.spawn import run_plan
from cellblock.sandbox.types import JailError, JailSpec

SANDBOX = Path(__file__).resolve().parents[2] / "cellblock" / "sandbox"


def load_pin() -> ModuleType:
    """pin.py is a standalone script; load it by path, as the jail runs it."""
    spec = importlib.util.spec_from_file_location("cellblock_pin_script", SANDBOX / "pin.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_a_matching_pin_gives_a_private_read_only_copy_of_the_same_bytes(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_bytes(b"#!/bin/sh\necho original\n")
    copies = verify_pins("s", {str(tool): digest(tool.read_bytes()).upper()}, tmp_path / "store")
    copy = Path(copies[str(tool)])
    assert copy.read_bytes() == tool.read_bytes()
    assert copy.stat().st_mode & 0o777 == 0o500
    assert (tmp_path / "store").stat().st_mode & 0o777 == 0o700


def test_a_mismatch_names_the_file_and_both_digests(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_bytes(b"changed")
    with pytest.raises(JailError) as caught:
        verify_pins("s", {str(tool): "a" * 64}, tmp_path / "store")
    assert f"got sha256 {digest(b'changed')}, expected {'a' * 64}" in str(caught.value)
    assert not list((tmp_path / "store").iterdir())


def test_a_missing_pinned_file_refuses(tmp_path: Path) -> None:
    with pytest.raises(JailError, match="cannot be read"):
        verify_pins("s", {str(tmp_path / "gone"): "a" * 64}, tmp_path / "store")


@pytest.mark.jail
@pytest.mark.skipif(shutil.which("bwrap") is None, reason="needs bubblewrap")
def test_the_verified_bytes_are_what_runs_even_if_the_file_changes_after_the_check(tmp_path: Path) -> None:
    tool = tmp_path / "tool"
    tool.write_bytes(b"#!/bin/sh\necho original\n")
    tool.chmod(0o755)
    copies = verify_pins("s", {str(tool): digest(tool.read_bytes())}, tmp_path / "store")
    tool.write_bytes(b"#!/bin/sh\necho tampered\n")  # after the check, before the start
    spec = JailSpec(name="s", argv=(str(tool),), env={"PATH": "/usr/bin:/bin"}, home="/root", pinned=copies)
    done = run_plan(bwrap_plan(spec, []), 30)
    assert done.stdout.strip() == "original", done.stderr


def test_the_pin_launcher_refuses_to_run_nothing() -> None:
    done = subprocess.run([sys.executable, "-I", "-S", str(SANDBOX / "pin.py"), "--allow", "/bin/true"], check=False)
    assert done.returncode == 2


@pytest.mark.parametrize(
    ("line", "words"),
    [
        (b"#!/bin/sh\n", ["/bin/sh"]),
        (
            b"#! \t/usr/bin/env -S node --flag  \n",
            ["/usr/bin/env", "-S node --flag"],
        ),  # one argument, as the kernel passes it
        (b"#!/bin/sh\t-e\n", ["/bin/sh", "-e"]),
        (b"#!/bin/sh\r\n", ["/bin/sh\r"]),  # a carriage return is part of the name to the kernel
        (b"#!/bin/sh\0 -x\n", ["/bin/sh"]),  # a NUL ends the line
        (b"#!/bin/sh", ["/bin/sh"]),  # no newline at the end of a short file
        (b"#!\n", None),
        (b"#!   \n", None),
        (b"echo hi\n", None),
        (b"#!/" + b"x" * 300 + b"\n", None),  # cut off by the 256 bytes the kernel reads
    ],
)
def test_the_shebang_line_is_read_as_the_kernel_reads_it(tmp_path: Path, line: bytes, words: list[str] | None) -> None:
    pin = load_pin()
    script = tmp_path / "script"
    script.write_bytes(line)
    assert pin.shebang(str(script)) == words


def test_elf_files_are_told_from_scripts(tmp_path: Path) -> None:
    pin = load_pin()
    script = tmp_path / "script"
    script.write_bytes(b"#!/bin/sh\n")
    assert pin.is_elf(os.path.realpath(sys.executable)) and not pin.is_elf(str(script))
    assert not pin.is_elf(str(tmp_path / "missing"))
