#!/usr/bin/env python3
"""The application's side, as a real process, for tests/backend.rs.

Serves, on 127.0.0.1 and a port the kernel picks (printed as
"listening on 127.0.0.1:PORT"):

  GET /jwks   the identity provider's JWKS: the file STATE/jwks.json, or,
              as STATE/jwks.mode says, "500" (an error), "hang" (no answer
              for 60 s) or "garbage" (not JSON).

  POST /hook  the subscribe hook: decides by the stream id's first part
              (before "-"): "allow" 200, "deny" 403 and "unauth" 401 with
              {"reason": ...}, "hang" no answer for 30 s, "slow" 200 after
              0.3 s, "error" 500, "garbage" bytes that are not HTTP,
              "huge" 200 with a 10 MB body, "redirect" 302 to
              /hook-followed (which nobody should ask). Each request's
              body is appended to STATE/hook.log, a JSON line.

  POST /events the webhook receiver: checks X-Switchboard-Signature
              against the HMAC-SHA256 of the body keyed with the file
              STATE/secret, and appends each event to STATE/events.log, a
              JSON line with "verified" (whether the signature matched)
              and "time_ms" (the batch's) added. As STATE/events.mode
              says: "ok" (200), "500", "400" or "hang" (no answer for 30 s;
              nothing logged).

Every request is appended to STATE/requests.log ("METHOD PATH"), so a test
can count what the server asked. The files are read at each request: the
test rotates keys or breaks the endpoint by rewriting them.

Usage: app.py STATE
"""

import hashlib
import hmac
import http.server
import json
import os
import sys
import threading
import time

STATE = sys.argv[1]
LOCK = threading.Lock()


def read(name, default=""):
    try:
        with open(os.path.join(STATE, name), "rb") as f:
            return f.read()
    except FileNotFoundError:
        return default.encode()


class App(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args):
        pass

    def answer(self, status, body, content_type="application/json"):
        self.send_response(status)
        self.send_header("content-type", content_type)
        self.send_header("content-length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def logged(self, method):
        with LOCK, open(os.path.join(STATE, "requests.log"), "a") as log:
            log.write(f"{method} {self.path}\n")

    def do_POST(self):
        self.logged("POST")
        length = int(self.headers.get("content-length", "0"))
        body = self.rfile.read(length)
        if self.path == "/events":
            return self.events(body)
        if self.path != "/hook":
            return self.answer(404, b'{"error": "not found"}')
        with LOCK, open(os.path.join(STATE, "hook.log"), "ab") as log:
            log.write(body + b"\n")
        asked = json.loads(body)
        kind = asked["id"].split("-")[0]
        if kind in ("allow", "chat:allow"):
            return self.answer(200, b'{"ok": true}')
        if kind == "slow":
            time.sleep(0.3)
            return self.answer(200, b"{}")
        if kind in ("deny", "unauth"):
            status = 403 if kind == "deny" else 401
            reason = json.dumps({"reason": f"not a member of {asked['id']}"}).encode()
            return self.answer(status, reason)
        if kind == "hang":
            time.sleep(30)
            return
        if kind == "error":
            return self.answer(500, b'{"error": "boom"}')
        if kind == "garbage":
            self.wfile.write(b"this is not HTTP at all\r\n\r\n")
            self.close_connection = True
            return
        if kind == "huge":
            return self.answer(200, b" " * (10 * 1024 * 1024))
        if kind == "redirect":
            self.send_response(302)
            self.send_header("location", "/hook-followed")
            self.send_header("content-length", "0")
            self.end_headers()
            return
        self.answer(400, b'{"error": "unknown kind"}')

    def events(self, body):
        mode = read("events.mode", "ok").decode().strip()
        if mode == "hang":
            time.sleep(30)
            return
        if mode == "500":
            return self.answer(500, b'{"error": "down"}')
        if mode == "400":
            return self.answer(400, b'{"error": "no"}')
        expected = "sha256=" + hmac.new(read("secret"), body, hashlib.sha256).hexdigest()
        verified = hmac.compare_digest(expected, self.headers.get("x-switchboard-signature", ""))
        batch = json.loads(body)
        with LOCK, open(os.path.join(STATE, "events.log"), "a") as log:
            for event in batch["events"]:
                event["verified"] = verified
                event["time_ms"] = batch["time_ms"]
                log.write(json.dumps(event) + "\n")
        self.answer(200 if verified else 401, b"{}")

    def do_GET(self):
        self.logged("GET")
        if self.path != "/jwks":
            return self.answer(404, b'{"error": "not found"}')
        mode = read("jwks.mode", "ok").decode().strip()
        if mode == "500":
            return self.answer(500, b'{"error": "down"}')
        if mode == "hang":
            time.sleep(60)
            return
        if mode == "garbage":
            return self.answer(200, b"<html>not a JWKS</html>", "text/html")
        self.answer(200, read("jwks.json", '{"keys": []}'))


def main():
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), App)
    server.daemon_threads = True
    host, port = server.server_address[:2]
    print(f"listening on {host}:{port}", flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
