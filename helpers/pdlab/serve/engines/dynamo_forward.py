"""The loopback forwarder of a Dynamo deployment in its own network namespace (run as a process).

:func:`pdlab.serve.engines.dynamo.start_dynamo` with ``isolate`` puts Dynamo's processes in a
namespace with only ``lo``; this process listens on 127.0.0.1:PORT in the caller's namespace and
relays each connection to 127.0.0.1:PORT inside it::

    python -m pdlab.serve.engines.dynamo_forward --port P --netns NAME
"""

from __future__ import annotations

import argparse
import contextlib
import os
from collections.abc import Sequence

__all__ = ["forward", "main"]


def forward(port: int, netns: str) -> None:
    """Listen on 127.0.0.1:``port`` here, then enter namespace ``netns`` and relay each connection to
    127.0.0.1:``port`` there (a socket keeps the namespace it was made in; new ones are made in the new one)."""
    import asyncio
    import ctypes
    import socket

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind(("127.0.0.1", port))
    listener.listen(256)
    listener.setblocking(False)
    fd = os.open(f"/var/run/netns/{netns}", os.O_RDONLY)
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    if libc.setns(fd, 0x40000000) != 0:  # CLONE_NEWNET
        raise OSError(ctypes.get_errno(), f"setns into {netns} failed")
    os.close(fd)

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        with contextlib.suppress(ConnectionError, OSError, asyncio.IncompleteReadError):
            while data := await reader.read(1 << 16):
                writer.write(data)
                await writer.drain()
            if writer.can_write_eof():
                writer.write_eof()

    async def handle(c_reader: asyncio.StreamReader, c_writer: asyncio.StreamWriter) -> None:
        try:
            u_reader, u_writer = await asyncio.open_connection("127.0.0.1", port)
        except OSError:
            c_writer.close()
            return
        try:
            await asyncio.gather(pipe(c_reader, u_writer), pipe(u_reader, c_writer))
        finally:
            for w in (u_writer, c_writer):
                with contextlib.suppress(Exception):
                    w.close()

    async def main() -> None:
        server = await asyncio.start_server(handle, sock=listener)
        async with server:
            await server.serve_forever()

    asyncio.run(main())


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m pdlab.serve.engines.dynamo_forward --port P --netns NAME``."""
    parser = argparse.ArgumentParser(prog="python -m pdlab.serve.engines.dynamo_forward",
                                     description="relay 127.0.0.1:PORT here to 127.0.0.1:PORT in network namespace NAME")
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--netns", required=True)
    args = parser.parse_args(argv)
    forward(args.port, args.netns)


if __name__ == "__main__":  # pragma: no cover
    main()
