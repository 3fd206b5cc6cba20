#!/usr/bin/env python3
"""A Redis Sentinel failover under load, measured (issue 25).

Run through scripts/cluster-failover.sh, which builds the binaries first.
One run:
  1. starts its own Redis master, --replicas replicas of it and three sentinels
     (down-after-milliseconds 1000) on loopback, in a temporary directory;
  2. starts `switchboard --processes P` on one port and one more node on a
     port of its own (the probe node), both told only the sentinels;
  3. floodtest holds --streams streams through the shared port and sends
     --msg-rate messages per second to them through it (most cross
     processes); meanwhile the probe sends one message every 20 ms through
     the shared port to a stream held on the probe node, so every probe
     message crosses the bus;
  4. at --fault-at seconds: SIGKILL of the master, or SIGSTOP (and SIGCONT
     once the sentinels have promoted the replica, so the old master comes
     back as a replica);
  5. reports: time from the fault to the sentinels naming the new master and
     to the first probe message delivered after the fault (the first
     cross-node delivery), messages answered 200 and never received
     (floodtest matches each by its stamp), messages answered 503, and the
     reconnects and
     master switches the nodes logged, and the new epochs they began
     (history_regressed: the promoted replica lacked ids a node had seen).
With --tls every server and sentinel also listens with TLS (certificates
from a test authority made with openssl), replication and the sentinels go
over TLS, and the nodes speak only TLS: rediss://, redis_sentinel_tls and
redis_ca_file. The test's own commands use the plain ports.
Every wait is bounded; only the processes it started are stopped, by pid.
"""

import argparse
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BIN = os.path.join(ROOT, "target", "release")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def log(msg):
    print(f"failover: {msg}", file=sys.stderr, flush=True)


def redis_cli(port, *args):
    out = subprocess.run(["redis-cli", "-p", str(port), *args], capture_output=True, text=True, timeout=5)
    return out.stdout.strip()


def wait_for(what, within, check):
    deadline = time.time() + within
    while time.time() < deadline:
        try:
            if check():
                return
        except Exception:
            pass
        time.sleep(0.05)
    raise SystemExit(f"not within {within} s: {what}")


def http(method, url, body=None, timeout=5):
    req = urllib.request.Request(url, data=body, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


class Run:
    def __init__(self, out):
        self.out = out
        self.procs = []

    def start(self, name, cmd, env=None):
        f = open(os.path.join(self.out, f"{name}.log"), "w")
        p = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                             env={**os.environ, **(env or {})})
        self.procs.append(p)
        return p

    def stop_all(self):
        for p in reversed(self.procs):
            if p.poll() is None:
                try:
                    os.kill(p.pid, signal.SIGCONT)
                    p.terminate()
                    p.wait(timeout=10)
                except Exception:
                    p.kill()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--fault", choices=["kill", "stop", "none"],
                    help="none: the same load without a fault (for the cost of --wait-replicas)", default="kill")
    ap.add_argument("--processes", type=int, default=4)
    ap.add_argument("--streams", type=int, default=10_000)
    ap.add_argument("--msg-rate", type=float, default=1000.0)
    ap.add_argument("--fault-at", type=float, default=10.0, help="seconds after every stream is open")
    ap.add_argument("--after", type=float, default=20.0, help="seconds of load after the fault")
    ap.add_argument("--replicas", type=int, default=1, help="replicas of the master (one is promoted)")
    ap.add_argument("--wait-replicas", type=int, default=0,
                    help="cluster.redis_wait_replicas of every node (0: publishes do not wait for a replica)")
    ap.add_argument("--tls", action="store_true",
                    help="Redis, replication and the sentinels over TLS; the nodes speak only TLS")
    ap.add_argument("--json", help="write the result here")
    args = ap.parse_args()
    out = tempfile.mkdtemp(prefix="switchboard-failover-")
    run = Run(out)
    result = {"fault": args.fault, "tls": args.tls, "replicas": args.replicas, "wait_replicas": args.wait_replicas, "processes": args.processes, "streams": args.streams,
              "msg_rate": args.msg_rate, "down_after_ms": 1000}
    try:
        measure(run, args, out, result)
    finally:
        run.stop_all()
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    log(f"logs in {out}")
    ok = result.get("never_received") == 0 and (
        args.fault == "none" or result.get("first_cross_node_delivery_s") is not None)
    return 0 if ok else 1


def report_flood(result, flood_json):
    f = json.load(open(flood_json))
    m = f["messages"]
    # floodtest matches every message by its stamp (each sender process
    # its own): answered 200 and never received, and received without a
    # 200 (a 503 whose publish ran after all, or a local delivery of a node
    # whose bus was down, or a message twice).
    result.update({"answered_200": m["sent"], "answered_503": m["send_errors"],
                   "answered_503_delivered_locally": m["send_errors_delivered"],
                   "received": m["received"], "never_received": m["never_received"],
                   "received_without_200": m["received_unrequested"]})
    lat = f.get("latency_ms") or {}
    result["latency_ms"] = {k: lat.get(k) for k in ("p50", "p99", "max")}


def make_certificates(out):
    """A test authority and a certificate it signed for 127.0.0.1 (openssl)."""
    ca_key, ca, key, csr, crt, ext = (os.path.join(out, n) for n in
                                       ("ca.key", "ca.pem", "redis.key", "redis.csr", "redis.crt", "redis.ext"))
    ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
    def openssl(*a):
        subprocess.run(["openssl", *a], check=True, capture_output=True, timeout=30)
    openssl("req", "-x509", "-days", "2", "-subj", "/CN=failover test authority", *ec, "-keyout", ca_key, "-out", ca,
            "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign")
    openssl("req", "-subj", "/CN=127.0.0.1", *ec, "-keyout", key, "-out", csr)
    with open(ext, "w") as f:
        f.write("subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\n"
                "keyUsage=critical,digitalSignature,keyEncipherment\nextendedKeyUsage=serverAuth\n")
    openssl("x509", "-req", "-in", csr, "-CA", ca, "-CAkey", ca_key, "-CAcreateserial", "-days", "2",
            "-out", crt, "-extfile", ext)
    return ca, crt, key


def measure(run, args, out, result):
    tls = make_certificates(out) if args.tls else None

    def tls_args(port):
        if not tls:
            return []
        ca, crt, key = tls
        return ["--tls-port", str(port), "--tls-cert-file", crt, "--tls-key-file", key, "--tls-ca-cert-file", ca,
                "--tls-auth-clients", "no", "--tls-replication", "yes"]
    master = free_port()
    master_tls = free_port()
    # The port replicas, sentinels and (through the sentinels) the nodes use.
    served = master_tls if tls else master
    common = ["--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--dir", out]
    run.start("master", ["redis-server", "--port", str(master), *common, *tls_args(master_tls)])
    wait_for("the master", 5, lambda: redis_cli(master, "PING") == "PONG")
    for i in range(args.replicas):
        replica = free_port()
        run.start(f"replica-{i}", ["redis-server", "--port", str(replica), *common, *tls_args(free_port()),
                                   "--dbfilename", f"replica-{i}.rdb", "--replicaof", "127.0.0.1", str(served)])
        wait_for("the replica in sync", 10,
                 lambda: "master_link_status:up" in redis_cli(replica, "INFO", "replication"))
    sentinels = []
    for _ in range(3):
        port = free_port()
        conf = os.path.join(out, f"sentinel-{port}.conf")
        tls_port = free_port()
        with open(conf, "w") as f:
            f.write(f"port {port}\nbind 127.0.0.1\ndir {out}\n"
                    f"sentinel monitor sbm 127.0.0.1 {served} 2\n"
                    "sentinel down-after-milliseconds sbm 1000\n"
                    "sentinel failover-timeout sbm 5000\n")
            if tls:
                ca, crt, key = tls
                f.write(f"tls-port {tls_port}\ntls-cert-file {crt}\ntls-key-file {key}\ntls-ca-cert-file {ca}\n"
                        "tls-auth-clients no\ntls-replication yes\n")
        run.start(f"sentinel-{port}", ["redis-server", conf, "--sentinel"])
        sentinels.append((port, tls_port if tls else port))
    def sentinel_view(s):
        lines = redis_cli(s, "SENTINEL", "master", "sbm").split("\n")
        return dict(zip(lines[::2], lines[1::2]))
    wait_for("sentinels that know the replica and each other", 30, lambda: all(
        sentinel_view(s).get("num-slaves") == str(args.replicas) and sentinel_view(s).get("num-other-sentinels") == "2"
        for s, _ in sentinels))

    def named_master():
        return redis_cli(sentinels[0][0], "SENTINEL", "get-master-addr-by-name", "sbm").split("\n")[-1]

    port, probe_port = free_port(), free_port()
    env = {
        "SWITCHBOARD__CLUSTER__REDIS_SENTINELS": ",".join(f"127.0.0.1:{t}" for _, t in sentinels),
        "SWITCHBOARD__CLUSTER__REDIS_SENTINEL_MASTER": "sbm",
        "SWITCHBOARD__CLUSTER__PREFIX": "failover",
        "SWITCHBOARD__STREAM__TICK_INTERVAL_MS": "600000",
        "SWITCHBOARD__LOG__FORMAT": "json",
        "SWITCHBOARD__CLUSTER__REDIS_WAIT_REPLICAS": str(args.wait_replicas),
    }
    if tls:
        env.update({"SWITCHBOARD__CLUSTER__REDIS_URL": "rediss://sentinel-master",
                    "SWITCHBOARD__CLUSTER__REDIS_SENTINEL_TLS": "true",
                    "SWITCHBOARD__CLUSTER__REDIS_CA_FILE": tls[0]})
    # Each server's internal listener (/cluster) on a port of its own: the
    # fleet's processes share theirs, as they share the main port.
    admin_port, probe_admin_port = free_port(), free_port()
    run.start("fleet", [os.path.join(BIN, "switchboard"), "--processes", str(args.processes)],
              env={**env, "SWITCHBOARD__SERVER__PORT": str(port),
                   "SWITCHBOARD__SERVER__ADMIN_PORT": str(admin_port)})
    run.start("probe-node", [os.path.join(BIN, "switchboard")],
              env={**env, "SWITCHBOARD__SERVER__PORT": str(probe_port),
                   "SWITCHBOARD__SERVER__ADMIN_PORT": str(probe_admin_port),
                   "SWITCHBOARD__CLUSTER__NODE_NAME": "probe"})
    base, probe_base = f"http://127.0.0.1:{port}", f"http://127.0.0.1:{probe_port}"
    admin = f"http://127.0.0.1:{admin_port}"
    wait_for("every node in /cluster", 30, lambda: json.loads(
        http("GET", f"{admin}/cluster")[1])["totals"]["nodes"] == args.processes + 1)
    wait_for("the probe node ready", 10, lambda: http("GET", f"{probe_base}/readyz")[0] == 200)

    opening = args.streams / 5000 + 2
    total = opening + args.fault_at + args.after
    flood_json = os.path.join(out, "flood.json")
    flood = run.start("floodtest", [
        os.path.join(BIN, "floodtest"), "--url", f"{base}/test/f{{n}}", "--count", str(args.streams),
        "--rate", "5000", "--duration", f"{int(total)}s", "--interval", "1s",
        "--source-ips", "127.0.0.2-127.0.0.5", "--msg-rate", str(args.msg_rate),
        "--stats-url", f"{admin}/cluster", "--json", flood_json,
    ])

    # The probe: a stream on the probe node; messages to it through the
    # shared port, each stamped with its send time.
    arrivals = []
    probe = socket.create_connection(("127.0.0.1", probe_port))
    probe.sendall(b"GET /test/probe HTTP/1.1\r\nhost: x\r\n\r\n")
    probe.settimeout(1.0)

    def read_probe():
        buf = b""
        end = time.time() + total + 10
        while time.time() < end:
            try:
                data = probe.recv(65536)
            except socket.timeout:
                continue
            except OSError:
                return
            if not data:
                return
            buf += data
            now = time.time()
            while b"'probe@" in buf:
                i = buf.index(b"'probe@")
                j = buf.find(b"'", i + 1)
                if j < 0:
                    break
                arrivals.append((float(buf[i + 7:j]), now))
                buf = buf[j + 1:]
    reader = threading.Thread(target=read_probe, daemon=True)
    reader.start()
    stop_probe = threading.Event()

    def send_probe():
        while not stop_probe.is_set():
            try:
                http("POST", f"{base}/send/probe", f"probe@{time.time():.6f}".encode(), timeout=2)
            except Exception:
                pass
            time.sleep(0.02)
    sender = threading.Thread(target=send_probe, daemon=True)
    sender.start()

    time.sleep(opening + args.fault_at)
    if args.fault == "none":
        flood.wait(timeout=total + 60)
        stop_probe.set()
        report_flood(result, flood_json)
        return
    old = named_master()
    master_proc = run.procs[0]
    fault_t = time.time()
    if args.fault == "kill":
        master_proc.kill()
        log(f"SIGKILL to the master (pid {master_proc.pid}, port {master})")
    else:
        os.kill(master_proc.pid, signal.SIGSTOP)
        log(f"SIGSTOP to the master (pid {master_proc.pid}, port {master})")
    wait_for("the sentinels naming a new master", 30, lambda: named_master() not in ("", old))
    result["new_master_named_s"] = round(time.time() - fault_t, 2)
    if args.fault == "stop":
        os.kill(master_proc.pid, signal.SIGCONT)
        log("SIGCONT to the old master: it comes back and is made a replica")
    flood.wait(timeout=total + 60)
    stop_probe.set()
    time.sleep(1)
    after = [recv - fault_t for sent, recv in arrivals if sent > fault_t]
    result["first_cross_node_delivery_s"] = round(min(after), 2) if after else None
    probe_gap = [recv - sent for sent, recv in arrivals if sent <= fault_t < recv]
    result["probe_messages_sent_before_and_delivered_after_the_fault"] = len(probe_gap)
    report_flood(result, flood_json)
    # Every node logs bus_up with reconnect=true once its link is back, and
    # redis_master with `before` when it moved to the new master.
    events = {"bus_up_reconnects": 0, "master_switches": 0, "switch_master_seen": 0, "history_regressed": 0}
    for name in ("fleet", "probe-node"):
        for line in open(os.path.join(out, f"{name}.log")):
            try:
                f = json.loads(line)["fields"]
            except (ValueError, KeyError):
                continue
            ev = f.get("event")
            if ev == "bus_up" and f.get("reconnect"):
                events["bus_up_reconnects"] += 1
            elif ev == "redis_master" and f.get("before"):
                events["master_switches"] += 1
            elif ev == "redis_switch_master":
                events["switch_master_seen"] += 1
            elif ev == "history_regressed":
                events["history_regressed"] += 1
    result.update(events)
    result["nodes"] = args.processes + 1


if __name__ == "__main__":
    sys.exit(main())
