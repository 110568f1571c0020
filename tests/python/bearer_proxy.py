"""A loopback reverse proxy that adds `Authorization: Bearer <token>` to every request, for MCP
clients that cannot send one (the conformance suite's server mode, the Inspector CLI's
older releases). Everything else passes through byte for byte, Host and Origin included, so
the gateway's own checks (DNS rebinding, sessions, SSE streams) see what the client sent.

Each connection carries one request: the proxy asks the gateway to close after answering
(`Connection: close`), closes the client's side when the gateway does, and the client opens
a new connection for its next request. Streams (SSE) stay open as long as the gateway keeps
them open.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from contextlib import contextmanager

HEAD_LIMIT = 64 * 1024


def rewrite_head(head: bytes, token: str) -> bytes:
    """The request head with the bearer added (unless the client sent one) and Connection: close."""
    lines = head.split(b"\r\n")
    kept = [lines[0]]
    has_authorization = False
    for line in lines[1:]:
        if not line:
            continue
        name = line.split(b":", 1)[0].strip().lower()
        if name == b"connection" or name == b"keep-alive":
            continue
        if name == b"authorization":
            has_authorization = True
        kept.append(line)
    if not has_authorization:
        kept.append(b"Authorization: Bearer " + token.encode())
    kept.append(b"Connection: close")
    return b"\r\n".join(kept) + b"\r\n\r\n"


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while chunk := await reader.read(65536):
            writer.write(chunk)
            await writer.drain()
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        try:
            writer.close()
        except RuntimeError:
            pass


async def _handle(
    client_reader: asyncio.StreamReader, client_writer: asyncio.StreamWriter, upstream: tuple[str, int], token: str
) -> None:
    try:
        head = await client_reader.readuntil(b"\r\n\r\n")
    except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, ConnectionError):
        client_writer.close()
        return
    try:
        up_reader, up_writer = await asyncio.open_connection(*upstream)
    except OSError:
        client_writer.close()
        return
    up_writer.write(rewrite_head(head, token))
    await up_writer.drain()
    # The body (if any) follows as the client sends it; the answer streams back as it comes.
    await asyncio.gather(_pipe(client_reader, up_writer), _pipe(up_reader, client_writer))


@contextmanager
def bearer_proxy(upstream: tuple[str, int], token: str) -> Iterator[int]:
    """Runs the proxy on 127.0.0.1 in a background thread; yields its port."""
    loop = asyncio.new_event_loop()
    started = threading.Event()
    port: list[int] = []
    server_box: list[asyncio.base_events.Server] = []

    async def serve() -> None:
        server = await asyncio.start_server(
            lambda r, w: _handle(r, w, upstream, token), "127.0.0.1", 0, limit=HEAD_LIMIT
        )
        server_box.append(server)
        port.append(server.sockets[0].getsockname()[1])
        started.set()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve())
        loop.run_forever()

    thread = threading.Thread(target=run, name="bearer-proxy", daemon=True)
    thread.start()
    if not started.wait(10):
        raise RuntimeError("the bearer proxy did not start")
    try:
        yield port[0]
    finally:

        async def close() -> None:
            for server in server_box:
                server.close()
            pending = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
            for task in pending:
                task.cancel()
            await asyncio.gather(*pending, return_exceptions=True)

        asyncio.run_coroutine_threadsafe(close(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()
