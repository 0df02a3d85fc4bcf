#!/usr/bin/env python3
"""Forwards TCP connections from LISTEN_ADDR:PORT to TARGET_ADDR:PORT, byte for byte (TLS passes through).
The real node (scripts/k8s-node.sh) reaches the test control plane, which listens on loopback only, through
its network namespace's link: usage: tcp-forward.py LISTEN_ADDR LISTEN_PORT TARGET_ADDR TARGET_PORT"""
import asyncio
import sys


async def pipe(reader, writer):
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        try:
            writer.close()
        except OSError:
            pass


async def main(listen, lport, target, tport):
    async def handle(r, w):
        try:
            tr, tw = await asyncio.open_connection(target, tport)
        except OSError:
            w.close()
            return
        await asyncio.gather(pipe(r, tw), pipe(tr, w))

    server = await asyncio.start_server(handle, listen, lport)
    async with server:
        await server.serve_forever()


asyncio.run(main(sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])))
