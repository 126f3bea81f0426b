"""The floor of any stdio proxy: a relay that parses each line once and forwards it, nothing else.

Run as `relay.py COMMAND [ARGS...]`: it starts the server and copies JSON-RPC lines both ways,
each passed through `json.loads` and `json.dumps` once (as a proxy that renames a tool must), with
no policy, lock, audit, renaming or validation. The benchmark measures it beside the gateway, so
that what the extra process hop costs on this machine, today, can be told from what the
gateway's own work costs. Plain asyncio streams, the standard library only.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys

_LIMIT = 1 << 26  # one line may be this long (a list of 2,000 tools is about 0.5 MB)


async def _pump(reader: asyncio.StreamReader, write: asyncio.StreamWriter | asyncio.WriteTransport) -> None:
    while line := await reader.readline():
        data = (json.dumps(json.loads(line), separators=(",", ":"), ensure_ascii=False) + "\n").encode()
        write.write(data)
    write.close()  # the client left: the server sees its stdin end and exits


async def main(argv: list[str]) -> None:
    loop = asyncio.get_running_loop()
    server = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, limit=_LIMIT
    )
    assert server.stdin is not None and server.stdout is not None
    client = asyncio.StreamReader(limit=_LIMIT)
    await loop.connect_read_pipe(lambda: asyncio.StreamReaderProtocol(client), sys.stdin)
    out, _ = await loop.connect_write_pipe(asyncio.Protocol, sys.stdout)
    await asyncio.gather(_pump(client, server.stdin), _pump(server.stdout, out))


if __name__ == "__main__":
    with contextlib.suppress(BrokenPipeError, ConnectionResetError, KeyboardInterrupt):
        asyncio.run(main(sys.argv[1:]))
