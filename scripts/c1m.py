#!/usr/bin/env python3
"""A million concurrent streams on this box, routed through the cluster bus.

Run through scripts/c1m.sh, which builds the binaries first. One run:
  1. checks (and, as root, applies) what scripts/tune-kernel.sh recommends
     for N streams, and lists what it changed;
  2. starts its own redis-server and `switchboard --processes P` on one port,
     P from the open-file limit;
  3. runs floodtest (its own child processes, over enough source addresses)
     to ramp to N streams, holds them while routing --msg-rate messages per
     second through the shared port (so they land on random processes and
     cross the bus) and measuring every tick's lag, and sends one broadcast
     probe in the middle of the hold;
  4. SIGTERMs the fleet with every stream held and checks the drain: every
     stream ended by the server, every process exited 0.
It samples memory and CPU every few seconds, aborts cleanly (stopping only
what it started, by pid) when free memory falls under a margin, prints one
table and writes JSON.
"""

import argparse
import json
import math
import os
import shlex
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
import redis_cluster  # noqa: E402

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")
# What one process keeps for itself besides streams (listeners, Redis, logs).
FD_MARGIN = 1000
# Connections per source address to the one server port. The port range
# tune-kernel.sh recommends has 64,000 ports, but connect() takes them from
# one half first and past that scans for a free one on every connect: at
# ~30,000 per address the first run stalled at 635,000 streams with the
# box in system time. 10,000 per address keeps the search short.
PORTS_PER_IP = 10_000
# Abort when MemAvailable falls below this.
MEMORY_MARGIN = 1_500_000_000
SAMPLE_EVERY = 5.0
# Draining costs CPU per stream (the final chunk, the close, the id's
# unsubscribe and presence, and on loopback the client's side of all of it):
# ~22 s for 1,000,000 streams on this 2-core box in the first full run,
# where the default 5 s shutdown_timeout_ms killed processes mid-drain;
# 50.9 s and 56.5 s with history and presence on a fresh box of the same
# kind, which a budget of 50 µs per stream cut short. The run sets
# shutdown_timeout_ms to this per stream (at least the default), says so,
# and reports how long the drain took.
DRAIN_US_PER_STREAM = 100
# --rate is a ceiling, not a schedule: floodtest's opening window
# (--max-opening, half a second of a process's share of the rate) holds the
# ramp to what the box sustains, so a slower box ramps slower instead of
# piling up connects that end in 408s and timeouts. The run's time budget
# allows the ramp down to this share of --rate.
RAMP_FLOOR_SHARE = 1 / 3


def parse_duration(text):
    units = {"ms": 0.001, "s": 1, "m": 60}
    for suffix in ("ms", "s", "m"):
        if text.endswith(suffix):
            return float(text[: -len(suffix)]) * units[suffix]
    return float(text)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def meminfo():
    out = {}
    with open("/proc/meminfo") as f:
        for line in f:
            key, value = line.split(":", 1)
            out[key] = int(value.split()[0]) * 1024
    return out


def rss(pid):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def cpu_ticks(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return int(fields[11]) + int(fields[12])
    except OSError:
        return 0


def servers_of(fleet_pid):
    """The fleet's server processes: its children, or the parent itself
    when it runs the server alone (`--processes 1`)."""
    return children_of(fleet_pid) or [fleet_pid]


def children_of(pid):
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as f:
            return [int(p) for p in f.read().split()]
    except OSError:
        return []


def get_json(url, timeout=5):
    with urllib.request.urlopen(url, timeout=timeout) as r:
        return json.load(r)


def post(url, body, timeout=120):
    req = urllib.request.Request(url, data=body.encode(), method="POST")
    with urllib.request.urlopen(req, timeout=timeout) as r:
        return r.status, json.load(r)


def nofile_hard():
    import resource

    return resource.getrlimit(resource.RLIMIT_NOFILE)[1]


def log(msg):
    print(f"c1m: {msg}", flush=True)


class Run:
    def __init__(self, args):
        self.args = args
        self.procs = []  # (name, Popen) we started, stopped by pid
        self.samples = []
        self.notes = []
        self.tools = []

    def start(self, name, cmd, env=None, **kw):
        # The command line as run, for the result's `tools` (env first).
        shown = [f"{k}={v}" for k, v in (env or {}).items()] + [os.path.relpath(c, ROOT) if c.startswith(ROOT) else c
                                                               for c in cmd]
        self.tools.append(" ".join(shlex.quote(c) if c else "''" for c in shown))
        p = subprocess.Popen(cmd, env={**os.environ, **(env or {})}, **kw)
        self.procs.append((name, p))
        return p

    def stop_all(self):
        for name, p in reversed(self.procs):
            if p.poll() is None:
                p.send_signal(signal.SIGTERM)
        deadline = time.time() + 15
        for name, p in reversed(self.procs):
            try:
                p.wait(timeout=max(0.1, deadline - time.time()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--streams", type=int, default=1_000_000)
    ap.add_argument("--hold", type=parse_duration, default=180.0)
    ap.add_argument("--msg-rate", type=float, default=1000.0)
    ap.add_argument("--rate", type=float, default=10_000.0,
                    help="streams opened per second, at most: the ramp goes as fast as the box sustains up to it")
    ap.add_argument("--tick-interval", type=parse_duration, default=60.0)
    ap.add_argument("--processes", type=int, help="default: from the open-file limit")
    ap.add_argument("--json", help="write the result here, as `bench report` reads it (bench/results/c1m.json "
                    "for BENCHMARKS.md)")
    ap.add_argument("--max-minutes", type=float, default=15.0)
    ap.add_argument("--redis-cluster", action="store_true",
                    help="the fleet on a Redis Cluster of three masters (cluster.redis_cluster_nodes) "
                         "instead of one redis-server")
    args = ap.parse_args()
    n = args.streams
    if n < 1 or args.hold <= 0:
        ap.error("--streams and --hold must be positive")

    per_proc = nofile_hard() - FD_MARGIN
    processes = args.processes or max(1, math.ceil(n / (per_proc * 0.97)))
    if processes > 64:
        ap.error(f"{n} streams need {processes} processes at {per_proc} each; switchboard runs at most 64")
    ips = max(2, math.ceil(n / PORTS_PER_IP) + 1)
    source_ips = f"127.0.0.2-127.0.0.{1 + ips}"
    # floodtest's own duration: a slow ramp, the hold, and the drain after
    # it (floodtest must still hold every stream when the fleet is stopped).
    ramp_s = n / (args.rate * RAMP_FLOOR_SHARE)
    shutdown_ms = max(5000, math.ceil(n * DRAIN_US_PER_STREAM / 1000))
    total_s = ramp_s + 20 + args.hold + shutdown_ms / 1000 + 20
    if total_s > args.max_minutes * 60:
        ap.error(f"the run would take ~{total_s:.0f} s, over --max-minutes {args.max_minutes}")
    log(f"{n} streams over {processes} server processes ({per_proc} fds each), "
        f"clients from {source_ips}, ticks every {args.tick_interval:g} s")
    if args.tick_interval < 60 and n >= 500_000:
        log("note: at 10 s a million streams is 100,000 chunks/s; at ~30 µs per chunk on loopback two cores "
            "cannot carry it, so this run ticks every 60 s (one event per stream per minute, as Mochiweb's test)")

    log(f"shutdown_timeout_ms {shutdown_ms} ({DRAIN_US_PER_STREAM} µs per stream, at least the default 5000): "
        "every process must drain and exit 0 within it")
    run_started = time.time()
    kernel, in_effect = tune_kernel(n)
    run = Run(args)
    result = {"streams_target": n, "processes": processes, "source_ips": source_ips,
              "tick_interval_s": args.tick_interval, "msg_rate": args.msg_rate, "hold_s": args.hold,
              "rate_ceiling": args.rate,
              "shutdown_timeout_ms": shutdown_ms, "kernel_changes": kernel, "kernel_in_effect": in_effect}
    try:
        measure(run, result, n, processes, source_ips, total_s, shutdown_ms)
    finally:
        run.stop_all()
    result["notes"] = run.notes
    result["samples"] = run.samples
    print_table(result)
    if args.json:
        # The shape every `bench` result has (bench/src/outcome.rs), so
        # `bench report` renders it into BENCHMARKS.md with its charts.
        outcome = {
            "benchmark": "c1m", "smoke": n < 1_000_000,
            "command": " ".join(["scripts/c1m.sh", *map(shlex.quote, sys.argv[1:])]),
            "tools": run.tools, "commit": commit(), "started_unix": int(run_started),
            "elapsed_s": round(time.time() - run_started, 1), "notes": run.notes, "data": result,
        }
        with open(args.json, "w") as f:
            json.dump(finite(outcome), f, indent=1)
        log(f"wrote {args.json}")
    # 0: every target met; 3: the run did what it should (streams held,
    # nothing lost, broadcast received, clean drain) but a figure missed
    # its target; 1: it did not.
    return 0 if result.get("ok") else 3 if result.get("ran") else 1


def finite(v):
    """`v` with every infinity (a quantile past the last latency bucket) as
    the text `> 20000`: JSON has no infinity."""
    if isinstance(v, float) and math.isinf(v):
        return "> 20000"
    if isinstance(v, dict):
        return {k: finite(x) for k, x in v.items()}
    if isinstance(v, list):
        return [finite(x) for x in v]
    return v


def commit():
    """The checkout's commit as `bench` names it: short hash, `-dirty` if
    tracked files outside the results differ."""
    def git(*a):
        out = subprocess.run(["git", *a], cwd=ROOT, capture_output=True, text=True)
        return out.stdout.strip() if out.returncode == 0 else None
    head = git("rev-parse", "--short=12", "HEAD")
    if head is None:
        return "unknown"
    dirty = git("status", "--porcelain", "--untracked-files=no", "--", ".", ":(exclude)bench/results",
                ":(exclude)BENCHMARKS.md", ":(exclude)docs")
    return f"{head}-dirty" if dirty else head


def tune_kernel(n):
    script = os.path.join(ROOT, "scripts", "tune-kernel.sh")
    apply = ["--apply"] if os.geteuid() == 0 else []
    out = subprocess.run([script, "--connections", str(n), *apply], capture_output=True, text=True)
    changed = [l.strip() for l in (out.stdout + out.stderr).splitlines()
               if l.strip().lower().startswith(("applied:", "could not", "failed", "advisory"))]
    if not apply:
        log("not root: kernel settings checked, not applied")
    for line in changed:
        log(f"kernel: {line}")
    # What holds now: a second, read-only pass over the same table.
    table = subprocess.run([script, "--connections", str(n)], capture_output=True, text=True).stdout
    in_effect = []
    for line in table.splitlines()[1:]:
        cols = [c for c in line.split("  ") if c.strip()]
        if len(cols) >= 2:
            in_effect.append(f"{cols[0].strip()} = {cols[1].strip()}")
    return changed, in_effect


def measure(run, result, n, processes, source_ips, total_s, shutdown_ms):
    args = run.args
    rport, port = free_port(), free_port()
    # The fleet's internal listener (/cluster), shared by its processes as
    # the main port is.
    admin_port = free_port()
    # Redis is the fleet's one shared bus; here it is one process among
    # ~110 busy ones (55 servers, floodtest's children) on two cores, where
    # a deployment gives it cores of its own. At its fair share it fell
    # seconds behind late in the ramp (every node's link timed out at once
    # and reconnected), so as root it runs at nice -10 and the run says so.
    redis_log = (args.json or "/tmp/c1m") + ".redis.log"
    result["redis_log"] = redis_log
    nice = ["nice", "-n", "-10"] if os.geteuid() == 0 else []
    if nice:
        run.notes.append("redis-server ran at nice -10: on this box it shares two cores with ~110 busy processes")
    redis_args = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--loglevel", "warning",
                  # The fleet's history: Redis 7.0 preallocates a stream
                  # node of this many bytes per id (4,344 B of used_memory
                  # per id with one message at the default 4096; 480 B at
                  # 256).
                  "--stream-node-max-bytes", "256"]
    if args.redis_cluster:
        # Three masters, no replicas (a replica's replication would take
        # CPU from the same two cores; the fault tests have replicas).
        ports = redis_cluster.free_ports(3, 43001, cluster=True)
        redis_pids, nodes = [], []
        conf_dir = tempfile.mkdtemp(prefix="c1m-redis-cluster-")
        for i, p in enumerate(ports):
            node = run.start(f"redis-{p}", [*nice, "redis-server", *redis_cluster.node_args(p, conf_dir),
                                           *redis_args,
                                           # Why Redis closes a client is only in its log.
                                           "--logfile", f"{redis_log}.{i}"])
            redis_pids.append(node.pid)
            nodes.append(node)
        time.sleep(0.5)
        for p, node in zip(ports, nodes):
            if node.poll() is not None:
                raise SystemExit(f"redis-server on {p} exited (its port taken?)")
        redis_cluster.create(ports)
        bus = {"SWITCHBOARD__CLUSTER__REDIS_CLUSTER_NODES": ",".join(f"127.0.0.1:{p}" for p in ports)}
        result["redis_cluster_masters"] = len(ports)
    else:
        redis = run.start("redis", [*nice, "redis-server", "--port", str(rport), *redis_args,
                                    # Why Redis closes a client (an output
                                    # buffer over its limit) is only in its log.
                                    "--logfile", redis_log])
        redis_pids = [redis.pid]
        bus = {"SWITCHBOARD__CLUSTER__REDIS_URL": f"redis://127.0.0.1:{rport}"}
    time.sleep(0.5)
    env = {
        "SWITCHBOARD__SERVER__PORT": str(port),
        "SWITCHBOARD__SERVER__ADMIN_PORT": str(admin_port),
        "SWITCHBOARD__SERVER__WORKERS": "1",
        "SWITCHBOARD__LOG__LEVEL": "warn",
        "SWITCHBOARD__STREAM__TICK_INTERVAL_MS": str(int(args.tick_interval * 1000)),
        **bus,
        "SWITCHBOARD__CLUSTER__PREFIX": "c1m",
        "SWITCHBOARD__SERVER__SHUTDOWN_TIMEOUT_MS": str(shutdown_ms),
    }
    fleet = run.start("fleet", [os.path.join(BIN, "switchboard"), "--processes", str(processes)], env=env,
                      stderr=subprocess.PIPE, text=True)
    # The fleet's log goes on to stderr; lost bus links are counted.
    result["bus_links_lost"] = 0

    def relay():
        for line in fleet.stderr:
            if "lost its Redis link" in line or "lost its link to one shard's master" in line:
                result["bus_links_lost"] += 1
            sys.stderr.write(line)
    threading.Thread(target=relay, daemon=True).start()
    base = f"http://127.0.0.1:{port}"
    admin = f"http://127.0.0.1:{admin_port}"
    deadline = time.time() + 60
    while True:
        try:
            if get_json(f"{admin}/cluster")["totals"]["nodes"] == processes:
                break
        except Exception:
            pass
        if time.time() > deadline or fleet.poll() is not None:
            raise SystemExit("the fleet did not come up")
        time.sleep(0.2)
    time.sleep(2)  # let every process finish starting before its baseline
    mem0 = meminfo()
    result["box_memory_before_bytes"] = mem0["MemTotal"] - mem0["MemAvailable"]
    servers = servers_of(fleet.pid)
    idle_rss = sum(rss(p) for p in servers)
    flood_json = (args.json or "/tmp/c1m") + ".flood.json"
    flood = run.start("floodtest", [
        os.path.join(BIN, "floodtest"), "--url", f"{base}/test/m{{n}}", "--count", str(n),
        "--rate", str(args.rate), "--duration", f"{int(total_s)}s", "--interval", "10s",
        "--source-ips", source_ips, "--msg-rate", str(args.msg_rate),
        "--tick-interval", f"{int(args.tick_interval * 1000)}ms",
        "--stats-url", f"{admin}/cluster", "--connect-timeout", "30s", "--json", flood_json,
        # The fleet's drain ends the run; --duration is only its bound.
        "--until-drained",
    ])
    started = time.time()
    result["started_unix"] = started
    tck = os.sysconf("SC_CLK_TCK")
    peak = {"streams": 0, "box": 0, "server_rss": 0, "redis_rss": 0, "slab": 0, "client_rss": 0}
    held_at = None
    broadcast = None
    cpu0 = None
    while flood.poll() is None:
        time.sleep(SAMPLE_EVERY)
        t = time.time() - started
        m = meminfo()
        servers = servers_of(fleet.pid)
        clients = [flood.pid, *children_of(flood.pid)]
        try:
            held = get_json(f"{admin}/cluster", timeout=10)["totals"]["streams"]
        except Exception:
            held = None
        s = {
            "t": round(t, 1), "unix": round(time.time(), 1), "streams": held,
            "box_used": m["MemTotal"] - m["MemAvailable"],
            "server_rss": sum(rss(p) for p in servers), "redis_rss": sum(rss(p) for p in redis_pids),
            "client_rss": sum(rss(p) for p in clients), "slab": m["Slab"],
        }
        run.samples.append(s)
        for k, key in (("streams", "streams"), ("box", "box_used"), ("server_rss", "server_rss"),
                       ("redis_rss", "redis_rss"), ("slab", "slab"), ("client_rss", "client_rss")):
            if s[key] is not None and s[key] > peak[k]:
                peak[k] = s[key]
        log(f"t={t:.0f}s streams {held} box {s['box_used'] / 1e9:.2f} GB server {s['server_rss'] / 1e9:.2f} GB "
            f"clients {s['client_rss'] / 1e9:.2f} GB slab {s['slab'] / 1e9:.2f} GB")
        if m["MemAvailable"] < MEMORY_MARGIN:
            run.notes.append(f"aborted at t={t:.0f}s: MemAvailable {m['MemAvailable']} under the margin")
            log(run.notes[-1])
            return
        if held_at is None and held is not None and held >= n:
            held_at = t
            result["held_at_unix"] = time.time()
            cpu0 = (time.time(), sum(cpu_ticks(p) for p in servers), sum(cpu_ticks(p) for p in redis_pids))
            result["ramp_s"] = round(t, 1)
            # Idle: before the hold's messages, with only the ramp's behind
            # it (in cluster mode the history is in Redis, not the nodes).
            result["server_rss_bytes_per_stream_idle"] = round((s["server_rss"] - idle_rss) / held)
            result["redis_rss_at_held_bytes"] = s["redis_rss"]
            log(f"all {n} streams held after {t:.0f} s; holding {args.hold:.0f} s")
        if held_at is not None and broadcast is None and t >= held_at + args.hold / 2:
            if held:
                result["server_rss_bytes_per_stream_before_broadcast"] = round((s["server_rss"] - idle_rss) / held)
            stamp = f"B@{time.time_ns() // 1000}"
            sent = time.time()
            try:
                status, body = post(f"{base}/broadcast", stamp)
            except Exception as e:  # a 503 or a timeout is a result, not a crash
                status, body = getattr(e, "code", None), str(e)
                run.notes.append(f"the broadcast probe failed: {e}")
            broadcast = {"status": status, "answer": body, "answer_ms": round((time.time() - sent) * 1000, 1),
                         "sent_unix": sent}
            log(f"broadcast: {status} {body} in {broadcast['answer_ms']} ms")
        if held_at is not None and t >= held_at + args.hold:
            result["streams_held_end_cluster"] = held
            cpu1 = (time.time(), sum(cpu_ticks(p) for p in servers), sum(cpu_ticks(p) for p in redis_pids))
            window = cpu1[0] - cpu0[0]
            result["server_cpu_pct"] = round(100 * (cpu1[1] - cpu0[1]) / tck / window, 1)
            result["redis_cpu_pct"] = round(100 * (cpu1[2] - cpu0[2]) / tck / window, 1)
            result["memory_at_hold_end"] = s
            result["redis_rss_at_hold_end_bytes"] = s["redis_rss"]
            log("hold over: SIGTERM to the fleet with every stream held")
            term = time.time()
            result["term_unix"] = term
            fleet.send_signal(signal.SIGTERM)
            try:
                code = fleet.wait(timeout=shutdown_ms / 1000 + 30)
            except subprocess.TimeoutExpired:
                code = None
                run.notes.append("the fleet did not exit within shutdown_timeout_ms + 30 s")
            result["drain_ms"] = round((time.time() - term) * 1000)
            result["exit_code"] = code
            log(f"fleet exited {code} after {result['drain_ms']} ms")
            # floodtest sees every stream end and stops (--until-drained).
            break
        if t > total_s + 30:
            run.notes.append("floodtest ran past its duration")
            break
    try:
        flood.wait(timeout=total_s + 60 - (time.time() - started))
    except (subprocess.TimeoutExpired, ValueError):
        flood.kill()
        run.notes.append("floodtest did not stop by itself")
    summary = {}
    try:
        with open(flood_json) as f:
            summary = json.load(f)
    except OSError:
        run.notes.append("floodtest wrote no summary")
    result["peak"] = peak
    result["broadcast"] = broadcast
    result["floodtest"] = summary
    held_peak = peak["streams"]
    result["streams_held_peak_cluster"] = held_peak
    result["server_rss_bytes_per_stream"] = (
        round((peak["server_rss"] - idle_rss) / held_peak) if held_peak else None)
    result["kernel_slab_bytes_per_pair"] = (
        round((peak["slab"] - mem0["Slab"]) / held_peak) if held_peak else None)
    result["client_rss_bytes_per_stream"] = round(peak["client_rss"] / held_peak) if held_peak else None
    result["box_memory_used_bytes"] = peak["box"]
    result["redis_rss_bytes"] = peak["redis_rss"]
    held_during_hold = [x["streams"] for x in run.samples
                        if held_at is not None and x["streams"] is not None and held_at <= x["t"] <= held_at + args.hold]
    result["streams_held_min_during_hold"] = min(held_during_hold) if held_during_hold else None
    result["closed_during_hold"] = n - min(held_during_hold) if held_during_hold else None
    result["phases"] = phases(result, summary)
    result["targets"] = targets(result, summary, n)
    result["ok"] = all(t["met"] for t in result["targets"])
    result["ran"] = all(t["met"] for t in result["targets"] if t.get("kind") == "function")


def bucket_quantile(counts, bounds, q):
    """The upper bound (ms) of the bucket holding quantile q; None if empty;
    float('inf') past the last bound."""
    total = sum(counts)
    if not total:
        return None
    need, seen = q * total, 0
    for i, c in enumerate(counts):
        seen += c
        if seen >= need:
            return bounds[i] if i < len(bounds) else float("inf")
    return float("inf")


def phases(result, flood):
    """Messages and ticks of each phase of the run, from floodtest's
    per-second timeline: ramp (before every stream was held), steady (the
    hold outside the broadcast), broadcast (from the probe's send to its
    last arrival, a second either side), hold (steady + broadcast) and drain
    (from the SIGTERM). Messages count in the second they were sent, ticks
    in the second they were due."""
    tl = flood.get("timeline") or {}
    bounds, rows = tl.get("bounds_ms") or [], tl.get("seconds") or []
    held, term = result.get("held_at_unix"), result.get("term_unix")
    bc = result.get("broadcast") or {}
    b0, last = bc.get("sent_unix"), (flood.get("broadcast") or {}).get("last_ms")
    b1 = b0 + last / 1000 if b0 is not None and last is not None else None

    def phase_of(sec):
        if held is None or sec < int(held):
            return "ramp"
        if term is not None and sec >= int(term):
            return "drain"
        if b0 is not None and b1 is not None and int(b0) - 1 <= sec <= int(b1) + 1:
            return "broadcast"
        return "steady"

    nb = len(bounds) + 1
    acc = {p: {"seconds": 0, "sent": 0, "received": 0, "lost": 0, "unsent": 0, "lat": [0] * nb, "ticks": [0] * nb}
           for p in ("ramp", "steady", "broadcast", "hold", "drain")}
    for sec, sent, received, lat, ticks in rows:
        names = [phase_of(sec)]
        if names[0] in ("steady", "broadcast"):
            names.append("hold")
        for name in names:
            a = acc[name]
            a["seconds"] += 1
            a["sent"] += sent
            a["received"] += received
            # Per second, so arrivals never hide losses: more arrivals than
            # accepted sends are floodtest's retried POSTs whose first try
            # was delivered but its answer lost (a new stamp on the retry).
            a["lost"] += max(0, sent - received)
            a["unsent"] += max(0, received - sent)
            a["lat"] = [x + y for x, y in zip(a["lat"], lat)]
            a["ticks"] = [x + y for x, y in zip(a["ticks"], ticks)]
    out = {}
    for name, a in acc.items():
        lat, ticks = a["lat"], a["ticks"]
        within = lambda counts, ms: (sum(c for c, b in zip(counts, bounds) if b <= ms) / sum(counts)
                                     if sum(counts) else None)
        out[name] = {
            "seconds": a["seconds"],
            "messages": {"sent": a["sent"], "received": a["received"], "lost": a["lost"],
                         "arrived_without_accepted_send": a["unsent"],
                         "latency_ms_p50_at_most": bucket_quantile(lat, bounds, 0.5),
                         "latency_ms_p99_at_most": bucket_quantile(lat, bounds, 0.99),
                         "latency_ms_max_at_most": bucket_quantile(lat, bounds, 1.0),
                         "share_within_50ms": within(lat, 50)},
            "ticks": {"arrived": sum(ticks),
                      "lag_ms_p50_at_most": bucket_quantile(ticks, bounds, 0.5),
                      "lag_ms_p99_at_most": bucket_quantile(ticks, bounds, 0.99),
                      "lag_ms_max_at_most": bucket_quantile(ticks, bounds, 1.0),
                      "share_within_1s": within(ticks, 1000)},
        }
    return out


def targets(r, f, n):
    """Each target of the issue, measured, and whether it is met."""
    hold = (r.get("phases") or {}).get("hold", {})
    hm = hold.get("messages", {})
    steady = (r.get("phases") or {}).get("steady", {})
    sm, st = steady.get("messages", {}), steady.get("ticks", {})
    idle = r.get("server_rss_bytes_per_stream_idle")
    bc = f.get("broadcast") or {}
    box = r.get("box_memory_used_bytes") or 0
    per = r.get("server_rss_bytes_per_stream")
    fmt = lambda v: "-" if v is None else ("> 20 s" if v == float("inf") else f"≤ {v:g} ms")
    return [
        {"target": f"{n:,} streams held for the whole hold, Closed = 0, every process alive",
         "measured": f"{r.get('streams_held_min_during_hold') or 0:,} held at least (peak "
                     f"{r.get('streams_held_peak_cluster') or 0:,}), closed during the hold "
                     f"{r.get('closed_during_hold')}, floodtest errors {f.get('errors') or 'none'}",
         "kind": "function",
         "met": (r.get("streams_held_min_during_hold") or 0) >= n and r.get("closed_during_hold") == 0
                and not f.get("errors")},
        {"target": "routed messages outside the broadcast window (steady): p99 ≤ 100 ms",
         "measured": f"{sm.get('sent', 0):,} sent, p99 {fmt(sm.get('latency_ms_p99_at_most'))}",
         "kind": "performance",
         "met": sm.get("sent", 0) > 0 and (sm.get("latency_ms_p99_at_most") or float("inf")) <= 100},
        {"target": "routed messages during the hold: none lost",
         "measured": f"{hm.get('sent', 0):,} sent, {hm.get('lost')} lost", "kind": "function",
         "met": hm.get("sent", 0) > 0 and hm.get("lost") == 0},
        {"target": "ticks outside the broadcast window (steady): p99 lag ≤ 1 s",
         "measured": f"{st.get('arrived', 0):,} ticks, p99 {fmt(st.get('lag_ms_p99_at_most'))}",
         "kind": "performance",
         "met": st.get("arrived", 0) > 0 and (st.get("lag_ms_p99_at_most") or float("inf")) <= 1000},
        {"target": "bus links: none lost over the run",
         "measured": f"{r.get('bus_links_lost')} lost", "kind": "performance",
         "met": r.get("bus_links_lost") == 0},
        {"target": "box memory used by the whole run ≤ 14 GB",
         "measured": f"{box / 1e9:.2f} GB", "kind": "performance", "met": 0 < box <= 14e9},
        {"target": "server RSS ≤ 1,250 B per idle stream (all processes, when every stream is held)",
         "measured": f"{idle} B idle; {r.get('server_rss_bytes_per_stream_before_broadcast')} B before the "
                     f"broadcast, {per} B at the peak (after it)",
         "kind": "performance", "met": idle is not None and idle <= 1250},
        {"target": "broadcast: every stream receives it (report the last arrival)",
         "measured": f"{bc.get('received', 0):,} received, last {bc.get('last_ms')} ms",
         "kind": "function", "met": bc.get("received") == n},
        {"target": "drain: every stream ended with the final chunk, every process exits 0 "
                   "within shutdown_timeout_ms",
         "measured": f"{f.get('closed', 0):,} streams ended by the server, exit {r.get('exit_code')} "
                     f"after {r.get('drain_ms')} ms (shutdown_timeout_ms {r.get('shutdown_timeout_ms')})",
         "kind": "function",
         "met": r.get("exit_code") == 0 and f.get("closed") == n
                and (r.get("drain_ms") or 1e12) <= r.get("shutdown_timeout_ms", 0)},
    ]


def print_table(r):
    f = r.get("floodtest", {})
    m = f.get("messages", {})
    lat = f.get("latency_ms") or {}
    tick = f.get("tick_lag_ms") or {}
    bc = f.get("broadcast") or {}
    gb = lambda b: f"{b / 1e9:.2f} GB" if b else "-"
    rows = [
        ("streams target", f"{r['streams_target']:,} over {r['processes']} processes"),
        ("held: peak / at hold end (/cluster)",
         f"{r.get('streams_held_peak_cluster', 0):,} / {r.get('streams_held_end_cluster') or 0:,}"),
        ("floodtest: established, closed by the server, errors",
         f"{f.get('established', 0):,}, {f.get('closed', 0):,} (all at the drain), {f.get('errors') or 'none'}"),
        ("ramp: time, rate settled on, held back by the opening window",
         f"{r.get('ramp_s', '-')} s, {f.get('connect_rate', 0):,.0f} connects/s (--rate "
         f"{r.get('rate_ceiling', 0):,.0f}), {f.get('ramp_held_back_s', 0):.1f} s"),
        ("server RSS per stream (all processes): idle / before the broadcast / peak",
         f"{r.get('server_rss_bytes_per_stream_idle')} B / "
         f"{r.get('server_rss_bytes_per_stream_before_broadcast')} B / {r.get('server_rss_bytes_per_stream')} B"),
        ("kernel slab per client+server pair", f"{r.get('kernel_slab_bytes_per_pair')} B"),
        ("client RSS per stream", f"{r.get('client_rss_bytes_per_stream')} B"),
        ("box memory used, peak", gb(r.get("box_memory_used_bytes"))),
        ("Redis RSS: all streams held / hold end / peak (history: rings of the messages, bounded by "
         "history.size and history.ttl_ms)",
         f"{gb(r.get('redis_rss_at_held_bytes'))} / {gb(r.get('redis_rss_at_hold_end_bytes'))} / "
         f"{gb(r.get('redis_rss_bytes'))}"),
        ("CPU during the hold: servers / Redis", f"{r.get('server_cpu_pct')}% / {r.get('redis_cpu_pct')}%"),
        ("bus links lost (and reconnected) over the run", f"{r.get('bus_links_lost')}"),
        ("routed messages: sent / received / lost", f"{m.get('sent', 0):,} / {m.get('received', 0):,} / {m.get('lost')}"),
        ("send errors (503s while the fleet drains, then refused connections: floodtest sends to its end)",
         f"{m.get('send_errors', 0):,}"),
        ("message latency p50 / p99 / max", f"{lat.get('p50')} / {lat.get('p99')} / {lat.get('max')} ms"),
        ("ticks: arrived, lag p50 / p99 / max", f"{f.get('ticks', 0):,}, {tick.get('p50')} / {tick.get('p99')} / {tick.get('max')} ms"),
        ("broadcast: received, last arrival", f"{bc.get('received', 0):,}, {bc.get('last_ms')} ms"),
        ("drain: SIGTERM to exit, exit code", f"{r.get('drain_ms')} ms, {r.get('exit_code')}"),
        ("result", "ok" if r.get("ok") else "NOT ok"),
    ]
    width = max(len(k) for k, _ in rows)
    print()
    for k, v in rows:
        print(f"| {k.ljust(width)} | {v} |")
    ms = lambda v: "-" if v is None else ("> 20000" if v == float("inf") else f"≤ {v:g}")
    print()
    print("| phase | seconds with events | messages sent / lost | latency p50 / p99 / max ms | within 50 ms "
          "| ticks | tick lag p50 / p99 / max ms | within 1 s |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |")
    for name, p in (r.get("phases") or {}).items():
        m, t = p["messages"], p["ticks"]
        share = lambda v: "-" if v is None else f"{100 * v:.2f}%"
        print(f"| {name} | {p['seconds']} | {m['sent']:,} / {m['lost']:,} "
              f"| {ms(m['latency_ms_p50_at_most'])} / {ms(m['latency_ms_p99_at_most'])} / "
              f"{ms(m['latency_ms_max_at_most'])} | {share(m['share_within_50ms'])} | {t['arrived']:,} "
              f"| {ms(t['lag_ms_p50_at_most'])} / {ms(t['lag_ms_p99_at_most'])} / {ms(t['lag_ms_max_at_most'])} "
              f"| {share(t['share_within_1s'])} |")
    print()
    print("| target | measured | met |")
    print("| --- | --- | --- |")
    for t in r.get("targets") or []:
        print(f"| {t['target']} | {t['measured']} | {'met' if t['met'] else '**not met**'} |")
    for note in r.get("notes", []):
        print(f"note: {note}")


if __name__ == "__main__":
    sys.exit(main())
