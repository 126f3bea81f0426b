"""The gateway's thread-free stdio: lines in, whole writes out, and nothing else on the wire."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import anyio
import pytest

from cellblock.gateway.stdio import PipeReader, PipeWriter

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


async def test_lines_come_whole_with_a_last_unterminated_one_and_bad_utf8_replaced() -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    os.write(write, b'{"a": 1}\n{"b":')
    reader = PipeReader(read)
    assert await reader.__anext__() == '{"a": 1}\n'
    os.write(write, b" 2}\n\xff tail")
    os.close(write)
    assert [line async for line in reader] == ['{"b": 2}\n', "\ufffd tail"]
    os.close(read)


async def test_a_write_larger_than_the_pipe_waits_and_arrives_whole() -> None:
    read, write = os.pipe()
    os.set_blocking(write, False)
    text = "x" * 1_000_000 + "\n"  # far beyond a pipe's 64 KiB
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read, 1 << 16):
            received.extend(chunk)

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, drain)
        await PipeWriter(write).write(text)
        await PipeWriter(write).flush()
        os.close(write)
    os.close(read)
    assert received.decode() == text


def test_stray_prints_and_children_never_reach_the_wire() -> None:
    script = textwrap.dedent(
        """
        import anyio, subprocess, sys
        from cellblock.gateway.stdio import pipe_stdio
        with pipe_stdio() as pipes:
            assert pipes is not None
            print("stray print", flush=True)
            subprocess.run([sys.executable, "-c", "print('child output')"])
            anyio.run(pipes[1].write, "wire\\n")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], input=b"", capture_output=True, timeout=60, check=True)
    assert done.stdout == b"wire\n"
    assert b"stray print" in done.stderr and b"child output" in done.stderr


def test_a_terminal_or_file_keeps_the_sdks_own_handling() -> None:
    script = "from cellblock.gateway.stdio import pipe_stdio\nwith pipe_stdio() as p: print(p is None)"
    with open(os.devnull) as devnull:  # a character device, not a pipe
        done = subprocess.run([sys.executable, "-c", script], stdin=devnull, capture_output=True, timeout=60)
    assert done.stdout.strip() == b"True"
