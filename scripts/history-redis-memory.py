#!/usr/bin/env python3
"""What the fleet's history costs Redis: one switchboard in cluster mode on a
redis-server of its own (both started here, stopped by pid), one 32-byte
/send to each of 10,000 ids, then 63 more to each of 500; prints Redis's
used_memory per id for the first kept message and per further one.
Usage: scripts/history-redis-memory.py [stream-node-max-bytes, default
Redis's own]. Needs target/release/switchboard (cargo build --release)."""
import http.client, subprocess, time, os, sys, socket, json
def free():
    s=socket.socket(); s.bind(("127.0.0.1",0)); p=s.getsockname()[1]; s.close(); return p
rp = free()  # redis-server takes a port it is given
extra = ["--stream-node-max-bytes", sys.argv[1]] if len(sys.argv) > 1 else []
redis = subprocess.Popen(["redis-server","--port",str(rp),"--save","","--appendonly","no","--bind","127.0.0.1",*extra],stdout=subprocess.DEVNULL)
time.sleep(0.5)
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib"))
from serve import start_switchboard
env = dict(os.environ, SWITCHBOARD__CLUSTER__REDIS_URL=f"redis://127.0.0.1:{rp}", SWITCHBOARD__LOG__LEVEL="warn")
sb, sp, _ = start_switchboard("./target/release/switchboard", env)
def used():
    return int([l for l in subprocess.check_output(["redis-cli","-p",str(rp),"info","memory"]).decode().splitlines() if l.startswith("used_memory:")][0].split(":")[1])
for _ in range(100):
    try:
        c=http.client.HTTPConnection("127.0.0.1",sp); c.request("GET","/readyz"); r=c.getresponse(); r.read()
        if r.status==200: break
    except Exception: pass
    time.sleep(0.1)
c=http.client.HTTPConnection("127.0.0.1",sp)
def send(i,msg):
    c.request("POST",f"/send/h{i}",body=msg); r=c.getresponse(); r.read(); assert r.status==200, r.status
msg="x"*32
send("warm",msg)
u0=used(); N=10000
for i in range(N): send(i,msg)
u1=used()
F=500
for k in range(63):
    for i in range(F): send(i,msg)
u2=used()
print(json.dumps({"ids":N,"first_message_bytes":(u1-u0)/N,"further_message_bytes":(u2-u1)/(F*63),"full_ring_64_bytes":(u1-u0)/N+63*(u2-u1)/(F*63)}))
sb.terminate(); sb.wait(); redis.terminate(); redis.wait()
