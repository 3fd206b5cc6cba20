#!/usr/bin/env python3
"""Native TLS against a terminating proxy (issue 27): bytes per idle stream.

Run through scripts/tls-terminator-cost.sh, which builds the binaries first.
For each round (--rounds, default 2; order turned around every other round):
  native:  switchboard serving TLS itself (server.tls_cert_file), floodtest
           holding --count idle https streams;
  haproxy: plain switchboard behind HAProxy terminating TLS (mode tcp,
           `bind ... ssl crt`), the same floodtest through HAProxy;
  plain:   plain switchboard, plain streams (the floor).
RSS per stream = (RSS of every server process holding the streams - RSS
before) / streams, from /proc/PID/status: switchboard's, plus HAProxy's for
"haproxy". HAProxy holds two sockets per stream and this machine allows
20,000 open files per process, so --count defaults to 9,000.
Only the processes it started are stopped, by pid.
"""

import argparse
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rss(pid):
    for line in open(f"/proc/{pid}/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


def stats(port):
    import json
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/stats", timeout=5) as r:
        return json.load(r)


def certificates(d):
    """A test authority and a certificate for 127.0.0.1 (openssl)."""
    def run(*args):
        subprocess.run(["openssl", *args], cwd=d, check=True, capture_output=True)
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    run("req", "-x509", "-days", "2", "-subj", "/CN=cost test authority", *ec,
        "-keyout", "ca.key", "-out", "ca.pem",
        "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign")
    run("req", "-subj", "/CN=127.0.0.1", *ec, "-keyout", "server.key", "-out", "server.csr")
    with open(os.path.join(d, "server.ext"), "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n")
    run("x509", "-req", "-in", "server.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
        "-days", "2", "-out", "server.crt", "-extfile", "server.ext")
    with open(os.path.join(d, "combined.pem"), "w") as f:
        f.write(open(os.path.join(d, "server.crt")).read() + open(os.path.join(d, "server.key")).read())


def wait_ready(port, within=20):
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            stats(port)
            return
        except OSError:
            time.sleep(0.1)
    sys.exit(f"server on {port} not ready")


def stop(p):
    if p.poll() is None:
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def one(setup, args, d):
    port = free_port()
    # /stats is served on the internal listener.
    admin_port = free_port()
    env = dict(os.environ, SWITCHBOARD__SERVER__PORT=str(port), SWITCHBOARD__SERVER__ADMIN_PORT=str(admin_port),
               SWITCHBOARD__SERVER__WORKERS="2",
               SWITCHBOARD__LOG__LEVEL="warn", SWITCHBOARD__STREAM__TICK_INTERVAL_MS="600000")
    target = port
    if setup == "native":
        tls_port = free_port()
        env.update(SWITCHBOARD__SERVER__EXTRA_PORTS=str(tls_port), SWITCHBOARD__SERVER__TLS_PORTS=str(tls_port),
                   SWITCHBOARD__SERVER__TLS_CERT_FILE=os.path.join(d, "server.crt"),
                   SWITCHBOARD__SERVER__TLS_KEY_FILE=os.path.join(d, "server.key"))
        target = tls_port
    server = subprocess.Popen([os.path.join(BIN, "switchboard")], env=env,
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    procs = [server]
    haproxy = None
    try:
        wait_ready(admin_port)
        if setup == "haproxy":
            target = free_port()
            conf = os.path.join(d, "haproxy.cfg")
            with open(conf, "w") as f:
                f.write(f"""global
    maxconn {args.count + 500}
defaults
    mode tcp
    timeout connect 5s
    timeout client 1h
    timeout server 1h
frontend tls
    bind 127.0.0.1:{target} ssl crt {d}/combined.pem alpn http/1.1
    default_backend sb
backend sb
    server s1 127.0.0.1:{port}
""")
            haproxy = subprocess.Popen([shutil.which("haproxy") or "/usr/sbin/haproxy", "-db", "-f", conf],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
            procs.append(haproxy)
            time.sleep(1)
            if haproxy.poll() is not None:
                sys.exit("haproxy did not start: " + haproxy.stderr.read().decode())
        time.sleep(2)
        before = sum(rss(p.pid) for p in procs)
        scheme = "http" if setup == "plain" else "https"
        flood = [os.path.join(BIN, "floodtest"), "--url", f"{scheme}://127.0.0.1:{target}/test/{{n}}",
                 "--count", str(args.count), "--rate", str(args.rate), "--duration", "600s",
                 "--source-ips", "127.0.0.2-127.0.0.5", "--stats-url", "none"]
        if setup != "plain":
            flood += ["--tls-ca", os.path.join(d, "ca.pem")]
        started = time.time()
        client = subprocess.Popen(flood, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            deadline = started + 300
            while stats(admin_port)["connections"]["active"] < args.count and time.time() < deadline:
                time.sleep(0.2)
            held = stats(admin_port)["connections"]["active"]
            ramp = time.time() - started
            time.sleep(args.settle)
            after = sum(rss(p.pid) for p in procs)
            parts = {("haproxy" if p is haproxy else "switchboard"): rss(p.pid) for p in procs}
        finally:
            stop(client)
        per = (after - before) / max(held, 1)
        if held < args.count:
            FAILED.append(f"{setup}: held {held} of {args.count}")
        print(f"{setup:8} held {held:6}  RSS/stream {per:8.0f} B  ramp {ramp:5.1f} s  "
              f"({', '.join(f'{k} {v / 2**20:.1f} MiB' for k, v in parts.items())})", flush=True)
        return per
    finally:
        for p in reversed(procs):
            stop(p)


# Setups that did not hold every stream (the exit status is 1 then).
FAILED = []


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--count", type=int, default=9000)
    ap.add_argument("--rate", type=int, default=2000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--settle", type=float, default=5)
    ap.add_argument("--setups", default="plain,native,haproxy")
    args = ap.parse_args()
    setups = args.setups.split(",")
    d = tempfile.mkdtemp(prefix="tls-cost-")
    try:
        certificates(d)
        for r in range(args.rounds):
            order = setups if r % 2 == 0 else list(reversed(setups))
            print(f"round {r + 1}: {', '.join(order)}", flush=True)
            got = {s: one(s, args, d) for s in order}
            if "plain" in got:
                print("  vs plain: " + ", ".join(f"{s} {v / got['plain']:.2f}x" for s, v in got.items()), flush=True)
    finally:
        shutil.rmtree(d, ignore_errors=True)
    if FAILED:
        sys.exit("not every stream was held: " + "; ".join(FAILED))


if __name__ == "__main__":
    main()
