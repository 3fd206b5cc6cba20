#!/usr/bin/env python3
"""Through a buffering proxy: how long until a page sees its first message,
with the JavaScript client (`clients/js/`) against a bare `EventSource`
(issue 39).

One page in headless Chromium, served by the proxy itself, subscribes twice
through nginx with `proxy_buffering on` (and `proxy_ignore_headers
X-Accel-Buffering`, as a proxy that does not know switchboard's header
behaves; HTTP/1.0 upstream, nginx's default, so the stream is not chunked
and nginx holds its bytes until a buffer fills):

  * `client`: `connect(...)` from the client, with its defaults
    (`fallbackAfterMs` 5,000: it moves to long-poll when no welcome arrives);
  * `eventsource`: a bare `new EventSource(...)`, what a page without the
    client does.

Once both have been opened, the page publishes one message to each id every
--interval ms (`POST /send/{id}` through the same nginx) for --seconds, and
records when each message was published and when each subscription first
showed it. Reported per round: the time from the first publish to the first
message shown, for each, and how many of the messages each showed by the end.
The page POSTs its figures (through nginx) to a listener of this script
3 s after the last publish.

Starts and stops only its own processes, by pid.
Usage: scripts/proxy-first-message.py [--rounds 3] [--seconds 30] [--interval 250] [--json FILE]
Needs a release build, nginx and Debian's chromium.
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SWITCHBOARD = os.path.join(ROOT, "target", "release", "switchboard")
CLIENT = os.path.join(ROOT, "clients", "js", "index.js")
CHROMIUM = "/usr/bin/chromium"
sys.path.insert(0, os.path.join(ROOT, "scripts", "lib"))
from nginx import start_nginx  # noqa: E402
from serve import start_switchboard  # noqa: E402

NGINX_CONF = """worker_processes 1;
daemon off;
pid {d}/nginx.pid;
error_log {d}/error.log warn;
events {{ worker_connections 1024; }}
http {{
  access_log off;
  types {{ text/html html; text/javascript js; }}
  client_body_temp_path {d}/body; proxy_temp_path {d}/proxy; fastcgi_temp_path {d}/fcgi;
  uwsgi_temp_path {d}/uwsgi; scgi_temp_path {d}/scgi;
  server {{
    listen 127.0.0.1:{port};
    root {d}/www;
    # A buffering proxy: HTTP/1.0 upstream (nginx's default), buffering on,
    # switchboard's X-Accel-Buffering: no ignored.
    location /test/ {{
      proxy_pass http://127.0.0.1:{upstream};
      proxy_http_version 1.0;
      proxy_buffering on;
      proxy_ignore_headers X-Accel-Buffering;
      proxy_read_timeout 60s;
    }}
    location /send/ {{ proxy_pass http://127.0.0.1:{upstream}; }}
    location = /result {{ proxy_pass http://127.0.0.1:{collector}; }}
  }}
}}
"""

PAGE = """<!doctype html>
<html><head><meta charset="utf-8"><title>first message through a buffering proxy</title></head>
<body><pre id="result">running</pre>
<script type="module">
import { connect } from './switchboard-client.js';
const SECONDS = %(seconds)d, INTERVAL = %(interval)d, TAG = '%(tag)s';
const opened = performance.now();
const r = { client: { shown: [], transport: [] }, eventsource: { shown: [] }, published: [] };
connect(location.origin, 'client-' + TAG, {
  onMessage: (m) => r.client.shown.push([m.data, performance.now()]),
  onState: (s) => r.client.transport.push([s.state, s.transport, performance.now() - opened]),
});
const es = new EventSource('/test/eventsource-' + TAG);
es.addEventListener('message', (e) => {
  const m = /^Recvd msg #\\d+: '(.*)'$/.exec(e.data);
  r.eventsource.shown.push([m ? m[1] : e.data, performance.now()]);
});
// Both open (their requests are with the proxy) before the first publish.
await new Promise((ok) => setTimeout(ok, 300));
const start = performance.now();
let k = 0;
const timer = setInterval(() => {
  if (performance.now() - start > SECONDS * 1000) {
    clearInterval(timer);
    return;
  }
  const body = 'm' + k++;
  r.published.push([body, performance.now()]);
  for (const id of ['client-' + TAG, 'eventsource-' + TAG]) {
    fetch('/send/' + id, { method: 'POST', body });
  }
}, INTERVAL);
setTimeout(() => {
  const first = r.published.length ? r.published[0][1] : null;
  const summary = (s) => ({
    first_ms: s.shown.length && first !== null ? Math.round(s.shown[0][1] - first) : null,
    shown: s.shown.length,
    missing: r.published.map((p) => p[0]).filter((b) => !s.shown.some((x) => x[0] === b)).slice(0, 5),
  });
  const result = JSON.stringify({
    published: r.published.length,
    client: { ...summary(r.client), states: r.client.transport },
    eventsource: summary(r.eventsource),
  });
  document.getElementById('result').textContent = result;
  fetch('/result', { method: 'POST', body: result });
}, SECONDS * 1000 + 3000);
</script></body></html>
"""


class Collector:
    """Takes the one POST the page makes with its figures, on a port of
    its own (bound to 0: the kernel picks it)."""

    def __init__(self):
        import http.server
        import queue
        import threading
        self.results = queue.Queue()
        results = self.results

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("content-length", 0)))
                results.put(json.loads(body))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *_):
                pass

        self.server = http.server.HTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.server.server_address[1]
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def close(self):
        self.server.shutdown()
        self.server.server_close()


def one_round(n, args, work):
    d = tempfile.mkdtemp(prefix=f"first-message-{n}-", dir=work)
    os.makedirs(os.path.join(d, "www"))
    # nginx's workers (nobody, when it is started as root) read the page.
    for path in (work, d, os.path.join(d, "www")):
        os.chmod(path, 0o755)
    shutil.copy(CLIENT, os.path.join(d, "www", "switchboard-client.js"))
    with open(os.path.join(d, "www", "index.html"), "w") as f:
        f.write(PAGE % {"seconds": args.seconds, "interval": args.interval, "tag": f"r{n}"})
    env = dict(os.environ, SWITCHBOARD__LOG__LEVEL="warn", SWITCHBOARD__SERVER__WORKERS="2")
    server, port, _ = start_switchboard(SWITCHBOARD, env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    nginx = chromium = None
    collector = Collector()
    try:
        nginx, proxy = start_nginx(
            d, lambda listen: NGINX_CONF.format(d=d, port=listen, upstream=port, collector=collector.port))
        profile = os.path.join(d, "profile")
        chromium = subprocess.Popen(
            [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
             "--disable-background-networking", f"--user-data-dir={profile}", "--remote-debugging-port=0",
             f"http://127.0.0.1:{proxy}/index.html"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        import queue
        try:
            return collector.results.get(timeout=args.seconds + 30)
        except queue.Empty:
            raise SystemExit("the page sent no result") from None
    finally:
        collector.close()
        for p in (chromium, nginx, server):
            if p is not None and p.poll() is None:
                p.terminate()
                try:
                    p.wait(timeout=10)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--seconds", type=int, default=30)
    ap.add_argument("--interval", type=int, default=250, help="ms between publishes")
    ap.add_argument("--json")
    args = ap.parse_args()
    for need, what in [(SWITCHBOARD, "a release build (cargo build --release)"), (CHROMIUM, "chromium"),
                       (shutil.which("nginx") or "/nonexistent", "nginx")]:
        if not os.path.exists(need):
            sys.exit(f"needs {what}")
    if not 1 <= args.seconds <= 300 or args.interval < 20:
        sys.exit("--seconds 1..300, --interval at least 20 ms")
    work = tempfile.mkdtemp(prefix="proxy-first-message-")
    rounds = []
    try:
        for n in range(1, args.rounds + 1):
            r = one_round(n, args, work)
            rounds.append(r)
            c, e = r["client"], r["eventsource"]
            print(f"round {n}: {r['published']} published every {args.interval} ms; first message shown after "
                  f"client {c['first_ms']} ms ({c['shown']} shown, missing {c['missing']}), bare EventSource "
                  f"{e['first_ms'] if e['first_ms'] is not None else 'never'} ms ({e['shown']} shown); "
                  f"client states {[(s[0], s[1], round(s[2])) for s in c['states']]}", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rounds, f, indent=1)
    # The client must have shown every message it was sent.
    short = [n + 1 for n, r in enumerate(rounds) if r["client"]["missing"] or not r["client"]["shown"]]
    if short:
        sys.exit(f"the client missed messages in round(s) {short}")


if __name__ == "__main__":
    main()
