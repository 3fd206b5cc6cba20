#!/usr/bin/env python3
"""What history costs: RSS of one switchboard per id with a history ring, and
per kept message.

Starts target/release/switchboard on a free port (history.size as given,
history.ttl_ms long enough for the run), then:

  1. one message to each of --ids ids (nobody holds them): RSS growth / ids
     = the cost of an id with one kept message (its ring and its entry);
  2. --size messages to each of --full ids: RSS growth / messages = the cost
     of a kept message in a full ring.

The messages are POSTed pipelined on one keep-alive connection, 1,000 at a
time; /stats must show what was kept (history.ids, history.messages) or the
run fails. Bounded: --ids and --full ids at most, one server, stopped by PID.

  scripts/history-memory.py [--ids 100000] [--full 1000] [--size 64] [--message-bytes 32]
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release", "switchboard")
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
from serve import start_switchboard  # noqa: E402


def get(port, path):
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return json.loads(body)


def rss(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no VmRSS")


def publish(port, targets, body_for):
    """POSTs one message per (id, n) in targets, pipelined 1,000 at a time."""
    s = socket.create_connection(("127.0.0.1", port), timeout=30)
    f = s.makefile("rb")
    batch = []
    sent = 0

    def flush():
        nonlocal batch, sent
        s.sendall(b"".join(batch))
        for _ in batch:
            status = f.readline()
            if b" 200 " not in status:
                raise RuntimeError(f"/send answered {status!r}")
            length = 0
            while (line := f.readline()) not in (b"\r\n", b""):
                if line.lower().startswith(b"content-length:"):
                    length = int(line.split(b":")[1])
            f.read(length)
        sent += len(batch)
        batch = []

    for id_, n in targets:
        body = body_for(n)
        batch.append(
            f"POST /send/{id_} HTTP/1.1\r\nhost: x\r\ncontent-length: {len(body)}\r\n\r\n{body}".encode()
        )
        if len(batch) == 1000:
            flush()
    if batch:
        flush()
    s.close()
    return sent


def settle(pid):
    time.sleep(1.0)
    return rss(pid)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ids", type=int, default=100_000)
    ap.add_argument("--full", type=int, default=1000)
    ap.add_argument("--size", type=int, default=64, help="history.size")
    ap.add_argument("--message-bytes", type=int, default=32)
    args = ap.parse_args()
    if not os.access(BIN, os.X_OK):
        sys.exit(f"{BIN} missing: cargo build --release")
    # /stats is served on the internal listener.
    env = dict(
        os.environ,
        SWITCHBOARD__SERVER__WORKERS="2",
        SWITCHBOARD__LOG__LEVEL="warn",
        SWITCHBOARD__HISTORY__SIZE=str(args.size),
        SWITCHBOARD__HISTORY__TTL_MS=str(3_600_000),
    )
    server, port, admin_port = start_switchboard(BIN, env)
    try:
        pad = lambda n: (f"m{n}-" + "x" * args.message_bytes)[: args.message_bytes]
        # Warm the Router's first allocations and the connection paths.
        publish(port, [(f"warm{i}", 0) for i in range(1000)], pad)
        base = settle(server.pid)
        publish(port, [(f"one{i}", 0) for i in range(args.ids)], pad)
        after_one = settle(server.pid)
        st = get(admin_port, "/stats")["history"]
        if st["ids"] != args.ids + 1000 or st["messages"] != args.ids + 1000:
            sys.exit(f"history did not keep what was sent: {st}")
        per_id = (after_one - base) / args.ids
        publish(port, [(f"full{i}", n) for n in range(args.size) for i in range(args.full)], pad)
        after_full = settle(server.pid)
        st = get(admin_port, "/stats")["history"]
        kept = args.full * args.size
        if st["messages"] != args.ids + 1000 + kept:
            sys.exit(f"history did not keep what was sent: {st}")
        # The first message of each full id paid for its ring; the rest are messages.
        per_message = (after_full - after_one - args.full * per_id) / (kept - args.full)
        print(f"history.size {args.size}, messages of {args.message_bytes} bytes")
        print(f"  {args.ids:,} ids with one kept message: RSS +{after_one - base:,} B = {per_id:,.0f} B per id")
        print(
            f"  {args.full:,} ids x {args.size} kept messages: RSS +{after_full - after_one:,} B"
            f" = {per_message:,.0f} B per further kept message"
        )
        print(
            f"  a full ring of {args.size}: about {per_id + (args.size - 1) * per_message:,.0f} B per id"
        )
    finally:
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=10)
        except subprocess.TimeoutExpired:
            server.kill()
            server.wait()


if __name__ == "__main__":
    main()
