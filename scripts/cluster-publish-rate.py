#!/usr/bin/env python3
"""Publishes per second through the fleet's Redis: one Redis against a Redis
Cluster, and Nchan's Redis mode on both, alternated in one run.

Each setup is two servers (node A and node B) on the same Redis:
  * switchboard on one `redis-server` (cluster.redis_url);
  * switchboard on a Redis Cluster of three masters, no replicas
    (cluster.redis_cluster_nodes), made with `redis-cli --cluster create`;
  * nginx + Nchan on one `redis-server` (`nchan_redis_pass`);
  * nginx + Nchan on the same kind of Redis Cluster (Nchan finds the cluster
    from one node).
For each, two measures with `wrk -t1 -cC -dS` POSTing to node A:
  1. no subscribers: `/send/r<random of 100,000>`; accepted = 2xx per second;
  2. 200 streams held on node B (`/test/k0` .. `/test/k199`), wrk POSTing to
     random ones of them: accepted per second, and delivered per second (the
     messages B's streams got, counted until 2 s after wrk ends).
The Redis side's CPU (all its processes) is reported per 1,000 accepted
publishes. With --latency, a third measure: floodtest holds 2,000 streams of
distinct ids on node B and POSTs 500 msg/s to random ones of them on node A
for ~20 s: cross-node routed latency p50 / p99, and messages lost. Starts and stops only its own processes, by pid; every load is
bounded by wrk's duration.

Usage: scripts/cluster-publish-rate.py [--seconds 10] [--rounds 2]
       [--connections 32] [--only switchboard-one,...] [--latency] [--json FILE]
Needs redis-server, redis-cli, wrk, nginx and libnginx-mod-nchan
(scripts/bench/peers.sh installs the peers).
"""

import argparse
import json
import os
import re
import selectors
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWITCHBOARD = os.path.join(ROOT, "target", "release", "switchboard")
FLOODTEST = os.path.join(ROOT, "target", "release", "floodtest")
NCHAN_MODULE = "/usr/lib/nginx/modules/ngx_nchan_module.so"
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
import redis_cluster  # noqa: E402
from serve import start_switchboard  # noqa: E402
STREAMS = 200
MARK = b"pubmsg"
SETUPS = ["switchboard-one", "switchboard-cluster", "nchan-one", "nchan-cluster"]


def wait_port(port, proc, what, within=15):
    deadline = time.time() + within
    while time.time() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode}) before listening on {port}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit(f"{what} is not listening on {port}")


def cpu_s(pid):
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Setup:
    def __init__(self, name, work):
        self.name, self.work = name, work
        self.procs, self.redis_pids = [], []
        self.dir = tempfile.mkdtemp(prefix=f"pubrate-{name}-", dir=work)

    def start(self, cmd, env=None, **kw):
        p = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, stdout=subprocess.DEVNULL, **kw)
        self.procs.append(p)
        return p

    def redis(self):
        """Starts the Redis side; answers the server settings for it."""
        common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning",
                  "--dir", self.dir]
        if self.name.endswith("-one"):
            (p,) = redis_cluster.free_ports(1, 44001)
            proc = self.start(["redis-server", "--port", str(p), *common])
            wait_port(p, proc, "redis-server")
            self.redis_pids = [proc.pid]
            return [p]
        ps = redis_cluster.free_ports(3, 44101, cluster=True)
        for p in ps:
            # `--dir` comes last in `common`: node_args' own wins.
            proc = self.start(["redis-server", *common, *redis_cluster.node_args(p, self.dir)])
            wait_port(p, proc, "redis-server (cluster node)")
            self.redis_pids.append(proc.pid)
        redis_cluster.create(ps)
        return ps

    def servers(self, redis_ports):
        """Starts node A and node B; answers their ports."""
        out = []
        for i in range(2):
            if self.name.startswith("switchboard"):
                # Port 0: switchboard picks its own and reports it.
                env = {**os.environ, "SWITCHBOARD__LOG__LEVEL": "warn", "SWITCHBOARD__CLUSTER__PREFIX": "pubrate"}
                if len(redis_ports) == 1:
                    env["SWITCHBOARD__CLUSTER__REDIS_URL"] = f"redis://127.0.0.1:{redis_ports[0]}"
                else:
                    env["SWITCHBOARD__CLUSTER__REDIS_CLUSTER_NODES"] = ",".join(
                        f"127.0.0.1:{p}" for p in redis_ports)
                proc, port, _ = start_switchboard(SWITCHBOARD, env, stdout=subprocess.DEVNULL)
                self.procs.append(proc)
                deadline = time.time() + 15
                while subprocess.run(["curl", "-fs", f"http://127.0.0.1:{port}/readyz"],
                                     stdout=subprocess.DEVNULL).returncode != 0:
                    if time.time() > deadline:
                        raise SystemExit("switchboard is not ready")
                    time.sleep(0.1)
            else:
                # nginx cannot report a port it picked: probed, and its
                # start is checked.
                (port,) = redis_cluster.free_ports(1, 45001 + 10 * SETUPS.index(self.name) + i)
                d = os.path.join(self.dir, f"nginx-{port}")
                os.makedirs(d)
                conf = os.path.join(d, "nginx.conf")
                with open(conf, "w") as f:
                    f.write(nchan_conf(d, port, redis_ports[0]))
                proc = self.start([shutil.which("nginx") or "/usr/sbin/nginx", "-c", conf, "-p", d],
                                  stderr=subprocess.DEVNULL)
                wait_port(port, proc, "nginx")
            out.append(port)
        return out

    def stop(self):
        # The servers first, each waited for (they leave the fleet through
        # Redis), then Redis.
        for p in reversed(self.procs):
            if p.poll() is None:
                p.terminate()
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def nchan_conf(d, port, redis_port):
    """Nchan's Redis mode: both nginx servers keep every channel in the
    same Redis (one server, or a cluster found from one of its nodes);
    raw-stream subscribers on /test/{id}, the publisher on /send/{id}."""
    return f"""load_module {NCHAN_MODULE};
worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 4096; }}
http {{
  access_log off;
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  keepalive_requests 1000000;
  upstream redis_bus {{ nchan_redis_server redis://127.0.0.1:{redis_port}; }}
  server {{
    listen 127.0.0.1:{port} backlog=4096;
    location ~ ^/test/(.+)$ {{ nchan_subscriber http-raw-stream; nchan_channel_id $1; nchan_redis_pass redis_bus; }}
    location ~ ^/send/(.+)$ {{ nchan_publisher; nchan_channel_id $1; nchan_redis_pass redis_bus; }}
  }}
}}
"""


class Streams:
    """`n` streams held on `port`, counting the messages they get."""

    def __init__(self, port, n):
        self.sel = selectors.DefaultSelector()
        self.count = 0
        self.stop = False
        self.socks = []
        for i in range(n):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(f"GET /test/k{i} HTTP/1.1\r\nHost: t\r\n\r\n".encode())
            s.setblocking(False)
            self.sel.register(s, selectors.EVENT_READ, [b""])
            self.socks.append(s)
        self.thread = threading.Thread(target=self.run, daemon=True)
        self.thread.start()

    def run(self):
        while not self.stop:
            for key, _ in self.sel.select(timeout=0.2):
                try:
                    data = key.fileobj.recv(65536)
                except BlockingIOError:
                    continue
                if not data:
                    self.sel.unregister(key.fileobj)
                    continue
                # A mark split across two reads is counted once.
                buf = key.data[0] + data
                self.count += buf.count(MARK)
                key.data[0] = buf[-(len(MARK) - 1):] if not buf.endswith(MARK) else b""

    def close(self):
        self.stop = True
        self.thread.join()
        for s in self.socks:
            s.close()


def wrk(port, ids, seconds, connections, lua_dir):
    lua = os.path.join(lua_dir, f"pub-{ids}.lua")
    with open(lua, "w") as f:
        f.write(f"""math.randomseed(os.time())
local prefix = "{'k' if ids == STREAMS else 'r'}"
request = function()
  return wrk.format("POST", "/send/" .. prefix .. math.random(0, {ids - 1}), nil, "{MARK.decode()}")
end
""")
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{seconds}s", "-s", lua, f"http://127.0.0.1:{port}/"],
                         capture_output=True, text=True, check=True).stdout
    total = int(re.search(r"(\d+) requests in", out).group(1))
    bad = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    errors = re.search(r"Socket errors: connect (\d+), read (\d+), write (\d+), timeout (\d+)", out)
    return {"requests": total, "non_2xx": int(bad.group(1)) if bad else 0,
            "socket_errors": sum(map(int, errors.groups())) if errors else 0}


def latency(a, b, work):
    """Cross-node routed latency: floodtest's streams on `b`, its messages
    POSTed to `a` (it starts sending once every stream is open)."""
    out = os.path.join(work, f"flood-{a}.json")
    subprocess.run([FLOODTEST, "--url", f"http://127.0.0.1:{b}/test/l{{n}}", "--count", "2000", "--rate", "2000",
                    "--duration", "25s", "--interval", "60s", "--msg-rate", "500",
                    "--send-url", f"http://127.0.0.1:{a}/send/{{id}}", "--stats-url", "none", "--json", out],
                   check=True, stdout=subprocess.DEVNULL, timeout=120)
    with open(out) as f:
        j = json.load(f)
    m = j["messages"]
    return {"sent": m["sent"], "received": m["received"], "lost": m["lost"],
            "p50_ms": j["latency_ms"]["p50"], "p99_ms": j["latency_ms"]["p99"]}


def measure(name, args, work):
    s = Setup(name, work)
    try:
        redis_ports = s.redis()
        a, b = s.servers(redis_ports)
        row = {"setup": name}
        cpu0 = sum(cpu_s(p) for p in s.redis_pids)
        r = wrk(a, 100_000, args.seconds, args.connections, s.dir)
        cpu1 = sum(cpu_s(p) for p in s.redis_pids)
        ok = r["requests"] - r["non_2xx"]
        row["empty"] = {**r, "accepted_per_s": round(ok / args.seconds),
                        "redis_cpu_ms_per_1000": round(1e6 * (cpu1 - cpu0) / max(ok, 1), 1)}
        streams = Streams(b, STREAMS)
        time.sleep(3)  # every stream subscribed
        before = streams.count
        cpu0 = sum(cpu_s(p) for p in s.redis_pids)
        r = wrk(a, STREAMS, args.seconds, args.connections, s.dir)
        cpu1 = sum(cpu_s(p) for p in s.redis_pids)
        time.sleep(2)
        got = streams.count - before
        streams.close()
        ok = r["requests"] - r["non_2xx"]
        row["held"] = {**r, "accepted_per_s": round(ok / args.seconds), "delivered": got,
                       "delivered_per_s": round(got / args.seconds), "undelivered": max(0, ok - got),
                       "redis_cpu_ms_per_1000": round(1e6 * (cpu1 - cpu0) / max(ok, 1), 1)}
        if args.latency:
            row["latency"] = latency(a, b, s.dir)
        return row
    finally:
        s.stop()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--seconds", type=int, default=10)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--connections", type=int, default=32)
    ap.add_argument("--only", default=",".join(SETUPS))
    ap.add_argument("--json")
    ap.add_argument("--latency", action="store_true", help="also cross-node routed latency (floodtest)")
    args = ap.parse_args()
    setups = [x for x in args.only.split(",") if x]
    for x in setups:
        if x not in SETUPS:
            ap.error(f"--only: {x} is not one of {', '.join(SETUPS)}")
    if not (1 <= args.seconds <= 120 and 1 <= args.rounds <= 10):
        ap.error("--seconds 1..120, --rounds 1..10")
    for tool in ("redis-server", "redis-cli", "wrk", "curl"):
        if not shutil.which(tool):
            sys.exit(f"{tool} is missing")
    if any(x.startswith("nchan") for x in setups) and not os.path.exists(NCHAN_MODULE):
        sys.exit("libnginx-mod-nchan is missing (scripts/bench/peers.sh installs it)")
    work = tempfile.mkdtemp(prefix="pubrate-")
    rows = []
    try:
        for rnd in range(1, args.rounds + 1):
            for name in setups:
                row = measure(name, args, work)
                row["round"] = rnd
                rows.append(row)
                e, h = row["empty"], row["held"]
                print(f"round {rnd} {name:20} no subscribers: {e['accepted_per_s']:>6}/s accepted "
                      f"(non-2xx {e['non_2xx']}, Redis {e['redis_cpu_ms_per_1000']} ms/1000)  "
                      f"200 streams: {h['accepted_per_s']:>6}/s accepted, {h['delivered_per_s']:>6}/s delivered, "
                      f"undelivered {h['undelivered']} (non-2xx {h['non_2xx']}, "
                      f"Redis {h['redis_cpu_ms_per_1000']} ms/1000)", flush=True)
                if "latency" in row:
                    t = row["latency"]
                    print(f"round {rnd} {name:20} cross-node latency p50 {t['p50_ms']} ms p99 {t['p99_ms']} ms "
                          f"(sent {t['sent']}, lost {t['lost']})", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"command": " ".join(sys.argv), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
