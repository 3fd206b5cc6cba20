#!/usr/bin/env python3
"""The floor of a broadcast to N streams on this box, for scripts/c1m.sh's
broadcast to be read against (issue 42).

Run through scripts/c1m-floor.sh, which builds the binaries first. One run:
  1. checks (and, as root, applies) what scripts/tune-kernel.sh recommends
     for N streams, as c1m.sh does;
  2. starts P `bench-floor --writers 1` processes (P from the open-file
     limit, as c1m.sh's fleet; each binds a port of its own choosing and
     says which), which answer every GET with a chunked 200 and keep the
     socket, and write a POST's body to every socket they hold in a tight
     loop: one write(2) per stream, no routing, ticks, bus or actors;
  3. ramps floodtest to N streams over them (the same source addresses and
     ramp as c1m.sh), then POSTs one stamped probe to every process at once;
  4. reads floodtest's broadcast arrivals, SIGTERMs the processes it
     started (by pid) and prints the last arrival.
The last arrival is the least any server can take here to hand one line to
each of N streams with one write per stream: the kernel's loopback TCP work
(both ends' halves) plus floodtest's reads, over two cores.
"""

import argparse
import json
import math
import os
import resource
import shutil
import signal
import subprocess
import sys
import threading
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")
FD_MARGIN = 1000
PORTS_PER_IP = 10_000


def log(msg):
    print(f"c1m-floor: {msg}", flush=True)


def established(ports):
    """Established connections whose server end is one of `ports`."""
    want = {f"{p:04X}" for p in ports}
    n = 0
    for path in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(path) as f:
                next(f)
                for line in f:
                    parts = line.split(None, 4)
                    addr, port = parts[1].rsplit(":", 1)
                    if parts[3] == "01" and addr == "0100007F" and port in want:
                        n += 1
        except FileNotFoundError:
            pass
    return n


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--streams", type=int, default=1_000_000)
    p.add_argument("--rate", type=int, default=10_000, help="floodtest --rate ceiling")
    p.add_argument("--json", help="write the result here")
    args = p.parse_args()
    n = args.streams
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    per_proc = hard - FD_MARGIN if hard > 2 * FD_MARGIN else hard // 2
    procs = math.ceil(n / per_proc)
    ips = math.ceil(n / PORTS_PER_IP)
    if ips > 250:
        sys.exit("c1m-floor: more streams than 250 source addresses hold")
    source_ips = f"127.0.0.2-127.0.0.{1 + ips}"
    if os.geteuid() == 0:
        r = subprocess.run([os.path.join(ROOT, "scripts", "tune-kernel.sh"), "--connections", str(n), "--apply"],
                           capture_output=True, text=True)
        for line in r.stdout.splitlines():
            if line.lower().startswith(("applied", "could not", "advisory")):
                log(f"kernel: {line}")
        if r.returncode != 0:
            log(f"kernel: tune-kernel.sh --apply exited {r.returncode}: the box is partly tuned")
    log(f"{n} streams over {procs} bench-floor processes (one writer each), clients from {source_ips}")
    started = []
    flood = None
    result = {"streams": n, "processes": procs}
    try:
        ports = []
        for i in range(procs):
            proc = subprocess.Popen([os.path.join(BIN, "bench-floor"), "--port", "0", "--writers", "1"],
                                    stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            started.append(proc)
            first = proc.stdout.readline().strip()
            if not first.startswith("listening on "):
                raise RuntimeError(f"bench-floor {i} said {first!r}")
            ports.append(int(first.rsplit(":", 1)[1]))
        work = tempfile.mkdtemp(prefix="c1m-floor-")
        urls = os.path.join(work, "urls.txt")
        flood_json = os.path.join(work, "flood.json")
        with open(urls, "w") as f:
            for port in ports:
                f.write(f"http://127.0.0.1:{port}/test/all\n")
        ramp_limit = n / (args.rate / 3) + 30
        cmd = [os.path.join(BIN, "floodtest"), "--urls", urls, "--count", str(n), "--rate", str(args.rate),
               "--duration", f"{int(ramp_limit + 120)}s", "--interval", "10s", "--source-ips", source_ips,
               "--stats-url", "none", "--connect-timeout", "30s", "--until-drained",
               "--json", flood_json]
        log("floodtest: " + " ".join(cmd))
        t0 = time.time()
        flood = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        held = 0
        while time.time() - t0 < ramp_limit:
            time.sleep(5)
            held = established(ports)
            log(f"t={time.time() - t0:.0f}s held {held}")
            if held >= n or flood.poll() is not None:
                break
        result["ramp_s"] = round(time.time() - t0, 1)
        result["held"] = held
        if held < n:
            raise RuntimeError(f"only {held} of {n} streams held")
        time.sleep(5)
        stamp = f"B@{time.time_ns() // 1000}"
        answers = [None] * procs

        def send(i, port):
            req = urllib.request.Request(f"http://127.0.0.1:{port}/send/all", data=stamp.encode(), method="POST")
            with urllib.request.urlopen(req, timeout=120) as r:
                answers[i] = json.loads(r.read())["delivered"]

        threads = [threading.Thread(target=send, args=(i, port)) for i, port in enumerate(ports)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        result["delivered"] = sum(a or 0 for a in answers)
        log(f"probe written to {result['delivered']} streams")
        time.sleep(5)
    finally:
        for proc in started:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in started:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
        if flood is not None:
            try:
                flood.wait(timeout=120)
            except subprocess.TimeoutExpired:
                flood.send_signal(signal.SIGTERM)
                try:
                    flood.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    flood.kill()
                    flood.wait()
    try:
        with open(flood_json) as f:
            b = json.load(f).get("broadcast") or {}
    except (OSError, ValueError) as e:
        sys.exit(f"c1m-floor: floodtest wrote no summary: {e}")
    shutil.rmtree(work, ignore_errors=True)
    result["received"] = b.get("received")
    result["last_ms"] = b.get("last_ms")
    result["latency_ms"] = b.get("latency_ms")
    log(f"broadcast received by {result['received']} streams, last after {result['last_ms']} ms, "
        f"median {(result['latency_ms'] or {}).get('p50')} ms")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    sys.exit(0 if result["received"] == n else 1)


if __name__ == "__main__":
    main()
