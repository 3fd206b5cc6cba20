"""A Redis Cluster of one's own from a script (Python): the ports for its
nodes, and `redis-cli --cluster create` over them.

redis-server cannot be told to pick its own port and report it, so its
ports are probed free, then given to it: one taken in between makes that
redis-server exit at once, which the caller's start check reports; never a
silent mix-up. A cluster node also needs its bus port (its port + 10,000)
free, so every port is below 55,535."""

import socket
import subprocess
import time


def free_ports(n, start, cluster=False):
    """`n` ports from `start` that are free now (and, with `cluster`,
    whose bus port, +10,000, is free too)."""
    out = []
    for p in range(start, 55_535):
        try:
            for q in ((p, p + 10_000) if cluster else (p,)):
                with socket.socket() as s:
                    s.bind(("127.0.0.1", q))
        except OSError:
            continue
        out.append(p)
        if len(out) == n:
            return out
    raise SystemExit("no free ports")


def node_args(port, conf_dir):
    """redis-server arguments that make it a cluster node on `port`, its
    nodes.conf in `conf_dir` (a fresh directory per run: a node that finds
    an earlier run's nodes.conf is already in a cluster, and
    `--cluster create` fails)."""
    return ["--port", str(port), "--cluster-enabled", "yes", "--cluster-node-timeout", "5000",
            "--dir", conf_dir, "--cluster-config-file", f"nodes-{port}.conf"]


def create(ports, replicas=0, timeout=30.0):
    """`redis-cli --cluster create` over the nodes on `ports` (already
    started), then waits until every one says `cluster_state:ok`."""
    subprocess.run(["redis-cli", "--cluster", "create", *[f"127.0.0.1:{p}" for p in ports],
                    "--cluster-replicas", str(replicas), "--cluster-yes"], check=True,
                   stdout=subprocess.DEVNULL)
    deadline = time.time() + timeout
    while not all("cluster_state:ok" in subprocess.run(["redis-cli", "-p", str(p), "cluster", "info"],
                                                       capture_output=True, text=True).stdout for p in ports):
        if time.time() > deadline:
            raise SystemExit("the Redis Cluster did not come up")
        time.sleep(0.2)
