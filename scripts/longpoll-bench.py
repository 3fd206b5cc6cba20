#!/usr/bin/env python3
"""Long-poll, measured against its peers in one run (issue 39).

Two measures, each over fresh server processes, alternated round by round:

  memory  Bytes per waiting poll: N long-polls (`GET /test/{id}?transport=poll`)
          held waiting on switchboard, against N idle chunked streams
          (`GET /test/{id}`) on switchboard, and N waiting long-polls on Nchan
          (`nchan_subscriber longpoll`). Server RSS after they are all open,
          minus its RSS before, divided by N (all of nginx's processes for
          Nchan). Clients are spread over 127.0.0.2, .3, ...
  rate    1,000 long-poll clients, each on its own id, re-polling as soon as
          an answer comes (switchboard: `since=<last_event_id>`; Nchan:
          `If-Modified-Since` and `If-None-Match` from the last answer), and a
          publisher POSTing --rate messages per second round-robin to their ids
          for --seconds. Routed latency (POST written to the answer read,
          p50 / p99), messages delivered per second, and messages lost.

Every client speaks HTTP/1.0 (one request per connection, the answer ends
with the connection), the same for both servers. Both servers run two
workers (switchboard `server.workers = 2`, nginx `worker_processes 2`).
Starts and stops only its own processes, by pid; every load is bounded in
count and time.

Usage: scripts/longpoll-bench.py [--measure memory,rate] [--count 10000]
       [--polls 1000] [--rate 200] [--seconds 20] [--rounds 2] [--json FILE]
Needs a release build (cargo build --release), nginx and libnginx-mod-nchan
(scripts/bench/peers.sh installs them).
"""

import argparse
import asyncio
import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWITCHBOARD = os.path.join(ROOT, "target", "release", "switchboard")
NCHAN_MODULE = "/usr/lib/nginx/modules/ngx_nchan_module.so"
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
from nginx import start_nginx  # noqa: E402
from serve import start_switchboard  # noqa: E402

CLIENT_IPS = [f"127.0.0.{i}" for i in range(2, 12)]


def rss(pid):
    """Resident bytes of `pid` and its children (nginx's master and workers)."""
    total = 0
    pids = [pid]
    try:
        out = subprocess.run(["pgrep", "-P", str(pid)], capture_output=True, text=True).stdout
        pids += [int(p) for p in out.split()]
    except OSError:
        pass
    for p in pids:
        try:
            with open(f"/proc/{p}/status") as f:
                for line in f:
                    if line.startswith("VmRSS:"):
                        total += int(line.split()[1]) * 1024
        except FileNotFoundError:
            pass
    return total


class Server:
    """switchboard or nginx + Nchan, on a port of its own."""

    def __init__(self, kind, work, poll_timeout_ms):
        self.kind = kind
        self.dir = tempfile.mkdtemp(prefix=f"longpoll-{kind}-", dir=work)
        if kind == "switchboard":
            env = dict(os.environ, SWITCHBOARD__SERVER__WORKERS="2", SWITCHBOARD__LOG__LEVEL="warn",
                       SWITCHBOARD__STREAM__POLL_TIMEOUT_MS=str(poll_timeout_ms),
                       SWITCHBOARD__STREAM__TICK_INTERVAL_MS="600000")
            self.proc, self.port, self.admin = start_switchboard(
                SWITCHBOARD, env, stderr=open(os.path.join(self.dir, "log"), "w"), stdout=subprocess.DEVNULL)
        else:
            self.proc, self.port = start_nginx(self.dir, lambda port: nchan_conf(self.dir, port, poll_timeout_ms))
            self.admin = None

    def sub_path(self, i):
        return f"/test/p{i}?transport=poll" if self.kind == "switchboard" else f"/sub/p{i}"

    def stream_path(self, i):
        return f"/test/p{i}"

    def pub_path(self, i):
        return f"/send/p{i}" if self.kind == "switchboard" else f"/pub/p{i}"

    def active(self):
        """Streams open (switchboard's /stats), or None."""
        if self.admin is None:
            return None
        try:
            with socket.create_connection(("127.0.0.1", self.admin), timeout=2) as s:
                s.sendall(b"GET /stats HTTP/1.0\r\n\r\n")
                data = b""
                while chunk := s.recv(65536):
                    data += chunk
            return json.loads(data.split(b"\r\n\r\n", 1)[1])["connections"]["active"]
        except (OSError, ValueError, KeyError):
            return None

    def stop(self):
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()


def nchan_conf(d, port, poll_timeout_ms):
    return f"""load_module {NCHAN_MODULE};
worker_processes 2;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
worker_rlimit_nofile 20000;
events {{ worker_connections 20000; multi_accept on; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location ~ ^/sub/(.+)$ {{ nchan_subscriber longpoll; nchan_channel_id $1;
      nchan_subscriber_timeout {max(1, poll_timeout_ms // 1000)}s; }}
    location ~ ^/test/(.+)$ {{ nchan_subscriber http-raw-stream; nchan_channel_id $1; }}
    location ~ ^/pub/(.+)$ {{ nchan_publisher; nchan_channel_id $1; }}
  }}
}}
"""


async def http10(port, request, local_ip):
    """One HTTP/1.0 exchange: (status, headers, body)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port, local_addr=(local_ip, 0))
    try:
        writer.write(request)
        data = await reader.read()
    finally:
        writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    lines = head.decode("latin-1").split("\r\n")
    status = int(lines[0].split()[1]) if lines and len(lines[0].split()) > 1 else 0
    headers = {}
    for line in lines[1:]:
        k, _, v = line.partition(":")
        headers[k.strip().lower()] = v.strip()
    return status, headers, body


def get(path, extra=""):
    return f"GET {path} HTTP/1.0\r\n{extra}\r\n".encode()


# -- memory ---------------------------------------------------------------

async def hold(server, n, what):
    """Opens `n` waiting polls (or idle chunked streams), 1,000 at a time;
    answers their connections once each has its response head."""
    conns = []

    async def one(i):
        ip = CLIENT_IPS[i % len(CLIENT_IPS)]
        reader, writer = await asyncio.open_connection("127.0.0.1", server.port, local_addr=(ip, 0))
        path = server.sub_path(i) if what == "poll" else server.stream_path(i)
        writer.write(get(path, "Host: bench\r\n") if what == "poll" else
                     f"GET {path} HTTP/1.1\r\nHost: bench\r\n\r\n".encode())
        if what == "stream":
            # The head and the welcome line: it is a held, idle stream.
            await asyncio.wait_for(reader.readuntil(b"welcomes you"), 10)
        conns.append((reader, writer))

    for start in range(0, n, 1000):
        await asyncio.gather(*(one(i) for i in range(start, min(n, start + 1000))))
    return conns


async def memory_round(kind, what, n, work):
    server = Server(kind, work, poll_timeout_ms=600_000)
    try:
        # Warm up: a few of each opened and closed, so one-time costs are
        # in the baseline.
        warm = await hold(server, 200, what)
        for _, w in warm:
            w.close()
        await asyncio.sleep(1.5)
        before = rss(server.proc.pid)
        conns = await hold(server, n, what)
        deadline = time.time() + 20
        while server.admin is not None and server.active() != n and time.time() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(2)
        after = rss(server.proc.pid)
        alive = server.proc.poll() is None
        for _, w in conns:
            w.close()
        return {"server": kind, "what": what, "n": n, "rss_before": before, "rss_after": after,
                "bytes_per": (after - before) / n, "alive": alive}
    finally:
        server.stop()


# -- rate -----------------------------------------------------------------

async def rate_round(kind, polls, rate, seconds, work):
    server = Server(kind, work, poll_timeout_ms=25_000)
    sent = {}
    got = {}
    answers = [0]
    errors = []
    stop = asyncio.Event()

    async def poller(i):
        ip = CLIENT_IPS[i % len(CLIENT_IPS)]
        since, modified, etag = None, None, None
        while not stop.is_set():
            if kind == "switchboard":
                path = server.sub_path(i) + (f"&since={since}" if since is not None else "")
                extra = ""
            else:
                path = server.sub_path(i)
                extra = (f"If-Modified-Since: {modified}\r\n" if modified else "") + (
                    f"If-None-Match: {etag}\r\n" if etag else "")
            try:
                status, headers, body = await http10(server.port, get(path, extra), ip)
            except OSError as e:
                errors.append(str(e))
                await asyncio.sleep(0.1)
                continue
            now = time.monotonic()
            answers[0] += 1
            if kind == "switchboard":
                if status != 200:
                    errors.append(f"status {status}")
                    await asyncio.sleep(0.1)
                    continue
                v = json.loads(body)
                for m in v["messages"]:
                    got.setdefault(m["data"], now)
                since = v["last_event_id"]
            else:
                if status == 200:
                    got.setdefault(body.decode(), now)
                    modified = headers.get("last-modified", modified)
                    etag = headers.get("etag", etag)
                elif status not in (304, 408):
                    errors.append(f"status {status}")
                    await asyncio.sleep(0.1)

    try:
        tasks = [asyncio.create_task(poller(i)) for i in range(polls)]
        # Every poller waiting before the first publish.
        deadline = time.time() + 20
        while server.admin is not None and server.active() != polls and time.time() < deadline:
            await asyncio.sleep(0.2)
        await asyncio.sleep(1)

        async def publish(k):
            body = f"m{k}"
            req = (f"POST {server.pub_path(k % polls)} HTTP/1.0\r\nContent-Length: {len(body)}\r\n\r\n{body}"
                   ).encode()
            sent[body] = time.monotonic()
            try:
                status, _, _ = await http10(server.port, req, "127.0.0.1")
                if status not in (200, 201, 202):
                    errors.append(f"publish status {status}")
            except OSError as e:
                errors.append(f"publish {e}")

        start = time.monotonic()
        total = int(rate * seconds)
        pubs = []
        for k in range(total):
            delay = start + k / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            pubs.append(asyncio.create_task(publish(k)))
        await asyncio.gather(*pubs)
        span = time.monotonic() - start
        # Settle: every answer on its way read.
        settle = time.monotonic() + 5
        while len(got) < len(sent) and time.monotonic() < settle:
            await asyncio.sleep(0.1)
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        lat = sorted((got[b] - t) * 1000 for b, t in sent.items() if b in got)

        def pct(p):
            return round(lat[min(len(lat) - 1, int(len(lat) * p))], 2) if lat else None

        first = min(sent.values()) if sent else 0
        last = max(got.values()) if got else 0
        return {"server": kind, "polls": polls, "rate": rate, "sent": len(sent),
                "delivered": sum(1 for b in sent if b in got), "lost": sum(1 for b in sent if b not in got),
                "delivered_per_s": round(sum(1 for b in sent if b in got) / max(last - first, span), 1),
                "p50_ms": pct(0.50), "p99_ms": pct(0.99), "max_ms": round(lat[-1], 2) if lat else None,
                "answers": answers[0], "errors": len(errors), "first_errors": errors[:3]}
    finally:
        server.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--measure", default="memory,rate")
    ap.add_argument("--count", type=int, default=10_000, help="polls / streams held (memory)")
    ap.add_argument("--polls", type=int, default=1000, help="long-poll clients (rate)")
    ap.add_argument("--rate", type=float, default=200, help="messages per second (rate)")
    ap.add_argument("--seconds", type=float, default=20)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--servers", default="switchboard,nchan")
    ap.add_argument("--json")
    args = ap.parse_args()
    if not os.path.exists(SWITCHBOARD):
        sys.exit("no release build: cargo build --release")
    servers = args.servers.split(",")
    if "nchan" in servers and (not shutil.which("nginx") or not os.path.exists(NCHAN_MODULE)):
        sys.exit("nginx with libnginx-mod-nchan is missing (scripts/bench/peers.sh installs it)")
    if args.count > 18_000 or args.polls > 18_000:
        sys.exit("at most 18,000: one process holds fewer than 20,000 files")
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    work = tempfile.mkdtemp(prefix="longpoll-bench-")
    results = {"memory": [], "rate": []}
    measures = args.measure.split(",")
    try:
        for r in range(args.rounds):
            if "memory" in measures:
                runs = [("switchboard", "stream"), ("switchboard", "poll")]
                if "nchan" in servers:
                    runs.append(("nchan", "poll"))
                if r % 2:
                    runs.reverse()
                for kind, what in runs:
                    m = asyncio.run(memory_round(kind, what, args.count, work))
                    m["round"] = r + 1
                    results["memory"].append(m)
                    print(f"round {r + 1} memory {kind:11} {what:6} n={m['n']}: "
                          f"{m['bytes_per']:.0f} B each (RSS {m['rss_before']} -> {m['rss_after']})", flush=True)
            if "rate" in measures:
                order = servers if r % 2 == 0 else list(reversed(servers))
                for kind in order:
                    x = asyncio.run(rate_round(kind, args.polls, args.rate, args.seconds, work))
                    x["round"] = r + 1
                    results["rate"].append(x)
                    print(f"round {r + 1} rate   {kind:11} {x['polls']} polls {x['rate']}/s: "
                          f"p50 {x['p50_ms']} ms, p99 {x['p99_ms']} ms, max {x['max_ms']} ms, "
                          f"{x['delivered_per_s']}/s delivered, {x['lost']} lost of {x['sent']}, "
                          f"{x['answers']} answers, {x['errors']} errors {x['first_errors']}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    for r in range(args.rounds):
        mem = {(m["server"], m["what"]): m["bytes_per"] for m in results["memory"] if m["round"] == r + 1}
        if ("switchboard", "poll") in mem and ("switchboard", "stream") in mem:
            print(f"round {r + 1}: waiting poll / idle chunked stream = "
                  f"{mem[('switchboard', 'poll')] / mem[('switchboard', 'stream')]:.2f}")
        rate = {x["server"]: x for x in results["rate"] if x["round"] == r + 1}
        if "switchboard" in rate and "nchan" in rate and rate["nchan"]["p99_ms"]:
            s, n = rate["switchboard"], rate["nchan"]
            print(f"round {r + 1}: p99 switchboard / Nchan = {s['p99_ms'] / n['p99_ms']:.2f}, "
                  f"delivered/s = {s['delivered_per_s'] / max(n['delivered_per_s'], 0.001):.2f}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=1)
    lost = sum(x["lost"] for x in results["rate"] if x["server"] == "switchboard")
    sys.exit(1 if lost else 0)


if __name__ == "__main__":
    main()
