"""Stream clients people use from Python, for tests/clients.rs.

    python3 clients.py <requests|aiohttp|sseclient|websockets> <url>

Prints every line (plain), event data (SSE) or text frame (WebSocket) the
server sends, one per line, flushed at once; a refusal prints
"ERROR: <status> <body>" and exits 1. Installed by `.ci/run`:
pip install requests aiohttp sseclient-py websockets.
"""

import asyncio
import sys


def out(text):
    print(text, flush=True)


def with_requests(url):
    import requests

    r = requests.get(url, stream=True, timeout=(5, 60))
    if r.status_code != 200:
        out(f"ERROR: {r.status_code} {r.text}")
        sys.exit(1)
    for line in r.iter_lines(chunk_size=None, decode_unicode=True):
        out(line)


async def with_aiohttp(url):
    import aiohttp

    async with aiohttp.ClientSession() as session:
        async with session.get(url) as r:
            if r.status != 200:
                out(f"ERROR: {r.status} {await r.text()}")
                sys.exit(1)
            async for line in r.content:
                out(line.decode().rstrip("\n"))


def with_sseclient(url):
    import requests
    import sseclient

    r = requests.get(url, stream=True, headers={"Accept": "text/event-stream"}, timeout=(5, 60))
    if r.status_code != 200:
        out(f"ERROR: {r.status_code} {r.text}")
        sys.exit(1)
    for event in sseclient.SSEClient(r).events():
        out(event.data)


def with_websockets(url):
    from websockets.exceptions import InvalidStatus
    from websockets.sync.client import connect

    try:
        with connect(url, open_timeout=10) as ws:
            for frame in ws:
                out(frame)
    except InvalidStatus as e:
        out(f"ERROR: {e.response.status_code} {e.response.body!r}")
        sys.exit(1)


def main():
    kind, url = sys.argv[1], sys.argv[2]
    if kind == "requests":
        with_requests(url)
    elif kind == "aiohttp":
        asyncio.run(with_aiohttp(url))
    elif kind == "sseclient":
        with_sseclient(url)
    elif kind == "websockets":
        with_websockets(url)
    else:
        sys.exit(f"unknown client {kind}")


if __name__ == "__main__":
    main()
