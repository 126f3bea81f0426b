"""The gateway's pipes: lines in as they arrive, whole writes out in order, and nothing else on the wire."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import anyio
import anyio.lowlevel
import pytest

from cellblock.gateway.wire.stdio import LineReader, Oversized, PipeWriter

pytestmark = pytest.mark.anyio


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


class Lines:
    """What a LineReader delivered, and when it ended."""

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.oversized: list[Oversized] = []
        self.ended = anyio.Event()
        self.arrived = anyio.Event()

    def line(self, line: bytes) -> None:
        self.lines.append(line)
        self.arrived.set()

    def oversize(self, line: Oversized) -> None:
        self.oversized.append(line)

    def eof(self) -> None:
        self.ended.set()


async def a_later_turn_of_the_loop() -> None:
    """Until a line written now on a new pipe is read: by then every pipe ready before has been read."""
    read, write = os.pipe()
    os.set_blocking(read, False)
    witness = Lines()
    reader = LineReader(read, witness.line, witness.eof, witness.oversize)
    try:
        reader.start()
        os.write(write, b"w\n")
        with anyio.fail_after(5):
            await witness.arrived.wait()
    finally:
        reader.close()
        os.close(read)
        os.close(write)


async def test_lines_come_whole_across_reads_with_a_last_unterminated_one() -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    got = Lines()
    reader = LineReader(read, got.line, got.eof, got.oversize)
    reader.start()
    os.write(write, b'{"a": 1}\n{"b":')
    with anyio.fail_after(5):
        await got.arrived.wait()
    assert got.lines == [b'{"a": 1}']
    os.write(write, b" 2}\n\xff tail")
    os.close(write)
    with anyio.fail_after(5):
        await got.ended.wait()
    assert got.lines == [b'{"a": 1}', b'{"b": 2}', b"\xff tail"]
    os.close(read)


async def test_a_paused_reader_delivers_nothing_until_resumed_and_then_everything_in_order() -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    got = Lines()

    def first_pauses(line: bytes) -> None:
        got.line(line)
        if line == b"1":
            reader.pause()

    reader = LineReader(read, first_pauses, got.eof, got.oversize)
    reader.start()
    os.write(write, b"1\n2\n3\n")
    os.close(write)
    with anyio.fail_after(5):
        await got.arrived.wait()
    await a_later_turn_of_the_loop()  # which would have read this pipe's end, had the reader watched it
    assert got.lines == [b"1"]  # paused after the first: the rest waits, and so does the end
    assert not got.ended.is_set()
    reader.resume()
    assert got.lines == [b"1", b"2", b"3"]
    with anyio.fail_after(5):
        await got.ended.wait()
    os.close(read)


async def test_a_line_handler_that_fails_costs_only_its_line() -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    got = Lines()

    def handle(line: bytes) -> None:
        if line == b"bad":
            raise RuntimeError("boom")
        got.line(line)

    reader = LineReader(read, handle, got.eof, got.oversize)
    reader.start()
    os.write(write, b"one\nbad\ntwo\n")
    os.close(write)
    with anyio.fail_after(5):
        await got.ended.wait()
    assert got.lines == [b"one", b"two"]
    os.close(read)


async def test_writes_larger_than_the_pipe_from_many_writers_arrive_whole_and_in_order() -> None:
    read, write = os.pipe()
    os.set_blocking(write, False)
    writer = PipeWriter(write)
    # far beyond a pipe's 64 KiB; some writers wait for the pipe, some queue without waiting
    texts = [bytes([ord("a") + i]) * 300_000 + b"\n" for i in range(6)]
    received = bytearray()

    def drain() -> None:
        while chunk := os.read(read, 1 << 16):
            received.extend(chunk)

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, drain)
        async with anyio.create_task_group() as writers:
            for i, text in enumerate(texts):
                if i % 2:
                    writer.write_nowait(text)
                else:
                    writers.start_soon(writer.write, text)
                await anyio.lowlevel.checkpoint()
        await writer.drained()
        os.close(write)
    os.close(read)
    assert received == b"".join(texts)


async def test_a_write_to_a_closed_reader_raises_and_so_do_later_ones() -> None:
    read, write = os.pipe()
    os.set_blocking(write, False)
    os.close(read)
    writer = PipeWriter(write)
    with pytest.raises(BrokenPipeError):
        writer.write_nowait(b"gone\n")
    with pytest.raises(BrokenPipeError):
        await writer.write(b"still gone\n")
    os.close(write)


def test_stray_prints_and_children_never_reach_the_wire() -> None:
    script = textwrap.dedent(
        """
        import anyio, subprocess, sys
        from cellblock.gateway.wire.stdio import PipeWriter, client_stdio
        with client_stdio() as (make_reader, writer):
            assert isinstance(writer, PipeWriter)
            print("stray print", flush=True)
            subprocess.run([sys.executable, "-c", "print('child output')"])
            anyio.run(writer.write, b"wire\\n")
        """
    )
    done = subprocess.run([sys.executable, "-c", script], input=b"", capture_output=True, timeout=60, check=True)
    assert done.stdout == b"wire\n"
    assert b"stray print" in done.stderr and b"child output" in done.stderr


ECHO = textwrap.dedent(
    """
    import anyio
    from cellblock.gateway.wire.stdio import FileWriter, client_stdio

    async def echo(make_reader, writer):
        ended = anyio.Event()
        reader = make_reader(lambda line: writer.write_nowait(b"got " + line + b"\\n"), ended.set, print)
        reader.start()
        await ended.wait()

    with client_stdio() as (make_reader, writer):
        assert isinstance(writer, FileWriter)
        anyio.run(echo, make_reader, writer)
    """
)


def test_a_terminal_or_file_is_read_by_a_thread_and_written_directly() -> None:
    with open(os.devnull) as devnull:  # a character device, not a pipe
        done = subprocess.run([sys.executable, "-c", ECHO], stdin=devnull, capture_output=True, timeout=60)
    assert done.returncode == 0, done.stderr
    source = Path(__file__)
    with source.open() as regular:  # a regular file: read to its end, each line answered in order
        done = subprocess.run([sys.executable, "-c", ECHO], stdin=regular, capture_output=True, timeout=60)
    answered = done.stdout.decode().splitlines()
    assert answered == ["got " + line for line in source.read_text().splitlines()]


async def test_a_line_without_end_is_dropped_as_it_arrives_and_never_delivered() -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    got = Lines()
    limit = 64 << 10
    reader = LineReader(read, got.line, got.eof, got.oversize, limit=limit)
    reader.start()
    size = 4 << 20  # 64 times the limit, and far more than a pipe holds

    def write_all() -> None:
        view = memoryview(b"{" + b"x" * (size - 1))
        while view:
            view = view[os.write(write, view) :]
        os.close(write)

    async with anyio.create_task_group() as tg:
        tg.start_soon(anyio.to_thread.run_sync, write_all)
        with anyio.fail_after(10):
            await got.ended.wait()
    assert got.lines == []
    [dropped] = got.oversized
    assert (dropped.size, dropped.head[:2], dropped.tail[-1:]) == (size, b"{x", b"x")
    assert len(reader._buffer) <= limit  # what is held waits for a newline: never more than the limit
    os.close(read)


async def test_lines_at_the_limit_pass_and_one_byte_over_is_dropped_between_them() -> None:
    read, write = os.pipe()
    os.set_blocking(read, False)
    got = Lines()
    reader = LineReader(read, got.line, got.eof, got.oversize, limit=10)
    reader.start()
    os.write(write, b"0123456789\n0123456789A\nok\n")
    os.close(write)
    with anyio.fail_after(5):
        await got.ended.wait()
    assert got.lines == [b"0123456789", b"ok"]
    assert [(d.size, d.head) for d in got.oversized] == [(11, b"0123456789A")]
    os.close(read)


OVERSIZED = textwrap.dedent(
    """
    import anyio
    from cellblock.gateway.wire.stdio import client_stdio

    async def run(make_reader, writer):
        ended = anyio.Event()
        reader = make_reader(
            lambda line: writer.write_nowait(b"line " + line + b"\\n"),
            ended.set,
            lambda dropped: writer.write_nowait(b"dropped %d\\n" % dropped.size),
        )
        reader.start()
        await ended.wait()

    with client_stdio(limit=1000) as (make_reader, writer):
        anyio.run(run, make_reader, writer)
    """
)


def test_a_file_read_by_a_thread_drops_long_lines_too(tmp_path: Path) -> None:
    source = tmp_path / "in.txt"
    source.write_bytes(b"short\n" + b"y" * 5000 + b"\nlast\n" + b"z" * 3000)
    with source.open() as regular:
        done = subprocess.run([sys.executable, "-c", OVERSIZED], stdin=regular, capture_output=True, timeout=60)
    assert done.stdout.decode().splitlines() == ["line short", "dropped 5000", "line last", "dropped 3000"]
