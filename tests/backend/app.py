#!/usr/bin/env python3
"""The application's side, as a real process, for tests/backend.rs.

Serves, on 127.0.0.1 and a port the kernel picks (printed as
"listening on 127.0.0.1:PORT"):

  GET /jwks   the identity provider's JWKS: the file STATE/jwks.json, or,
              as STATE/jwks.mode says, "500" (an error), "hang" (no answer
              for 60 s) or "garbage" (not JSON).

Every request is appended to STATE/requests.log ("METHOD PATH"), so a test
can count what the server asked. The files are read at each request: the
test rotates keys or breaks the endpoint by rewriting them.

Usage: app.py STATE
"""

import http.server
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

    def do_GET(self):
        with LOCK, open(os.path.join(STATE, "requests.log"), "a") as log:
            log.write(f"GET {self.path}\n")
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
