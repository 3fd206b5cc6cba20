"""Starting an nginx of one's own from a script, on a port it can name.

nginx cannot bind port 0 and say which port it took: a free port is picked,
nginx started on it, and if something took the port in between (its error
log says "Address already in use") another is tried. Never a port picked
once and trusted."""

import os
import socket
import subprocess
import time


def start_nginx(d, conf_for, tries=5, within=10.0):
    """Starts `nginx -p d -c d/nginx.conf`, the configuration being
    `conf_for(port)` (it must log errors to d/error.log and run in the
    foreground). Answers (process, port) once the port answers; raises
    SystemExit if nginx fails for another reason or every try is taken."""
    log_path = os.path.join(d, "error.log")
    for _ in range(tries):
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        conf = os.path.join(d, "nginx.conf")
        with open(conf, "w") as f:
            f.write(conf_for(port))
        with open(os.path.join(d, "stderr"), "w") as err:
            proc = subprocess.Popen(["nginx", "-p", d, "-c", conf], stdout=subprocess.DEVNULL, stderr=err)
        deadline = time.time() + within
        while time.time() < deadline and proc.poll() is None:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
                return proc, port
            except OSError:
                time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
        proc.wait()
        log = open(log_path).read() if os.path.exists(log_path) else ""
        if "Address already in use" not in log:
            raise SystemExit(f"nginx did not start: {log[-500:]}")
        os.remove(log_path)
    raise SystemExit(f"nginx: no free port in {tries} tries")
