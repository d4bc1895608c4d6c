"""A TCP forwarder, its own process: `python -m tests.support.forward PORT TARGET_HOST
TARGET_PORT CONTROL_FILE`. Listens on 0.0.0.0:PORT (the workers in network namespaces reach
PostgreSQL through it: it listens only on 127.0.0.1) and forwards to the target.

The nemesis takes the database away from the workers through it, as a restart does, without
restarting a server others share: while CONTROL_FILE holds "down" every forwarded connection
is cut and new ones are refused (closed at once); "up" (or no file) forwards again.
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path


async def main(port: int, host: str, target: int, control: Path) -> None:
    open_pairs: set[asyncio.StreamWriter] = set()

    def down() -> bool:
        try:
            return control.read_text().strip() == "down"
        except OSError:
            return False

    async def pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while data := await reader.read(65536):
                writer.write(data)
                await writer.drain()
        except (ConnectionError, OSError):
            pass
        finally:
            writer.close()

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if down():
            writer.close()
            return
        try:
            up_reader, up_writer = await asyncio.open_connection(host, target)
        except OSError:
            writer.close()
            return
        open_pairs.update((writer, up_writer))
        try:
            await asyncio.gather(pipe(reader, up_writer), pipe(up_reader, writer))
        finally:
            open_pairs.difference_update((writer, up_writer))

    async def watch() -> None:
        while True:
            await asyncio.sleep(0.05)
            if down():
                for writer in list(open_pairs):
                    writer.transport.abort()
                open_pairs.clear()

    server = await asyncio.start_server(serve, "0.0.0.0", port)  # noqa: S104
    print("ready", flush=True)
    async with server:
        await asyncio.gather(server.serve_forever(), watch())


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), sys.argv[2], int(sys.argv[3]), Path(sys.argv[4])))
