#!/usr/bin/env python3
"""What the edge costs (issue 26): bytes per idle stream and connect rate.

Run through scripts/edge-cost.sh, which builds the binaries first.
For each round (--rounds, default 2), the setups one after the other (their
order turned around every other round), each
a fresh `switchboard` (2 workers, ticks off) holding --count idle streams
that floodtest opens at --rate over 127.0.0.2-127.0.0.5:
  off:   server.proxy_protocol off, every [limits] 0;
  proxy: server.proxy_protocol "v2" (floodtest sends a v2 header naming its
         own address), every [limits] 0;
  before: (with --before DIR) the previous build's switchboard from DIR,
         as it comes, for what "off" costs against it;
  edge:  the same PROXY headers, and every limit on with nothing exempt
        (streams_per_ip 10,000, 5,000 opens/s with a burst of 10,000,
        publishes 500/s with a burst of 2,000: high enough that this load
        is never refused, so every address is tracked and counted).
Reports per setup: RSS per stream ((RSS holding the streams - RSS before) /
streams, from /proc/PID/status), /stats bytes_per_connection, the connect
rate (streams / seconds from floodtest's start until /stats shows them all
open), limits.addresses_with_streams and refusals; and each setup's ratios
to off in the same round.
Only the processes it started are stopped, by pid.
"""

import argparse
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")
V2_LOCAL = b"\r\n\r\n\0\r\nQUIT\n\x20\x00\x00\x00"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def get(port, path, proxied):
    """GET over a raw socket (with a balancer's LOCAL header when proxied)."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
        if proxied:
            s.sendall(V2_LOCAL)
        s.sendall(f"GET {path} HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n".encode())
        data = b""
        while True:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def one(setup, args, out):
    port = free_port()
    edge = setup in ("proxy", "edge")
    limited = setup == "edge"
    env = dict(os.environ,
               SWITCHBOARD__SERVER__PORT=str(port), SWITCHBOARD__SERVER__WORKERS="2",
               SWITCHBOARD__LOG__LEVEL="warn", SWITCHBOARD__STREAM__TICK_INTERVAL_MS="600000")
    binary = os.path.join(BIN, "switchboard")
    # /stats: on the internal listener (plain, no PROXY header); a "before"
    # binary from ahead of it knows no admin_port and serves it on its port.
    stats_port, stats_proxied = port, edge
    if setup == "before":
        binary = os.path.join(args.before, "switchboard")
    else:
        stats_port, stats_proxied = free_port(), False
        env.update(SWITCHBOARD__SERVER__ADMIN_PORT=str(stats_port))
        env.update(SWITCHBOARD__SERVER__PROXY_PROTOCOL="v2" if edge else "off",
               SWITCHBOARD__LIMITS__STREAMS_PER_IP="10000" if limited else "0",
               SWITCHBOARD__LIMITS__STREAM_OPENS_PER_IP_PER_S="5000" if limited else "0",
               SWITCHBOARD__LIMITS__STREAM_OPENS_BURST="10000",
               SWITCHBOARD__LIMITS__PUBLISHES_PER_IP_PER_S="500" if limited else "0",
               SWITCHBOARD__LIMITS__PUBLISHES_BURST="2000",
               SWITCHBOARD__LIMITS__EXEMPT="")
    server = subprocess.Popen([binary], env=env,
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(out, f"{setup}.log"), "a"))
    flood = None
    try:
        deadline = time.time() + 10
        while True:
            try:
                if get(port, "/healthz", edge)[0] == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline:
                raise SystemExit(f"{setup}: the server did not answer")
            time.sleep(0.05)
        time.sleep(args.settle)
        before = rss(server.pid)
        cmd = [os.path.join(BIN, "floodtest"), "--url", f"http://127.0.0.1:{port}/test/e{{n}}",
               "--count", str(args.count), "--rate", str(args.rate), "--source-ips", "127.0.0.2-127.0.0.5",
               "--duration", f"{args.hold}s", "--interval", "5s", "--stats-url", "none"]
        if edge:
            cmd += ["--proxy-protocol", "v2"]
        started = time.time()
        flood = subprocess.Popen(cmd, stdout=open(os.path.join(out, f"{setup}-flood.out"), "a"),
                                 stderr=subprocess.STDOUT)
        opened_s = None
        deadline = started + args.hold - 3
        stats = {}
        while time.time() < deadline:
            stats = json.loads(get(stats_port, "/stats", stats_proxied)[1])
            if stats["connections"]["active"] >= args.count:
                opened_s = time.time() - started
                break
            time.sleep(0.1)
        if opened_s is None:
            raise SystemExit(f"{setup}: only {stats.get('connections', {}).get('active')} of {args.count} open")
        time.sleep(args.settle)
        held = rss(server.pid)
        stats = json.loads(get(stats_port, "/stats", stats_proxied)[1])
        active = stats["connections"]["active"]
        return {
            "setup": setup,
            "streams": active,
            "rss_per_stream": round((held - before) / active, 1),
            "stats_bytes_per_connection": stats["memory"].get("bytes_per_connection"),
            "connect_rate": round(args.count / opened_s),
            "opened_s": round(opened_s, 2),
            "limits": stats.get("limits"),
            "proxy_refused": stats["connections"].get("proxy_refused"),
        }
    finally:
        if flood and flood.poll() is None:
            flood.send_signal(signal.SIGINT)
            try:
                flood.wait(timeout=15)
            except subprocess.TimeoutExpired:
                flood.kill()
        server.send_signal(signal.SIGTERM)
        try:
            server.wait(timeout=20)
        except subprocess.TimeoutExpired:
            server.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--count", type=int, default=19_000)
    ap.add_argument("--rate", type=int, default=5_000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settle", type=float, default=2.0)
    ap.add_argument("--hold", type=int, default=30, help="floodtest's --duration in seconds")
    ap.add_argument("--setups", default="off,proxy,edge", help="comma-separated: off, proxy, edge, before")
    ap.add_argument("--before", help="a target/release directory holding the previous build (for setup before)")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    if not 1 <= args.count <= 19_000:
        raise SystemExit("--count is 1 to 19,000 (one process's open files)")
    out = tempfile.mkdtemp(prefix="switchboard-edge-")
    setups = [x for x in args.setups.split(",") if x]
    if "off" not in setups or any(x not in ("off", "proxy", "edge", "before") for x in setups):
        raise SystemExit("--setups: off, and any of proxy, edge, before")
    if "before" in setups and not args.before:
        raise SystemExit("--setups before needs --before DIR")
    runs = []
    for r in range(args.rounds):
        for setup in (setups if r % 2 == 0 else setups[::-1]):
            res = one(setup, args, out)
            res["round"] = r + 1
            print(json.dumps(res), file=sys.stderr, flush=True)
            runs.append(res)
            time.sleep(3)
    ratios = []
    for r in range(1, args.rounds + 1):
        off = next(x for x in runs if x["round"] == r and x["setup"] == "off")
        for x in runs:
            if x["round"] == r and x["setup"] != "off":
                ratios.append({"round": r, "setup": x["setup"],
                               "rss_per_stream_over_off": round(x["rss_per_stream"] / off["rss_per_stream"], 3),
                               "rss_per_stream_minus_off": round(x["rss_per_stream"] - off["rss_per_stream"], 1),
                               "connect_rate_over_off": round(x["connect_rate"] / off["connect_rate"], 3)})
    result = {"count": args.count, "rate": args.rate, "runs": runs, "ratios": ratios, "logs": out}
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    ok = all(x["streams"] >= args.count for x in runs)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
