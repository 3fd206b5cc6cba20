"""Starting a switchboard of one's own from a script (Python), as
scripts/lib/serve.sh does from bash: on port 0 and admin port 0, so the
kernel picks both and no other process can take them between a pick and the
bind; the ports are read back from server.address_file."""

import os
import subprocess
import tempfile
import time


def start_switchboard(binary, env, timeout=10.0, **popen):
    """Starts `binary` with `env` plus port 0 for both listeners; answers
    (process, public port, admin port) once it serves. Raises RuntimeError
    if it exits or does not serve within `timeout` s (and stops it)."""
    fd, path = tempfile.mkstemp(prefix="switchboard-addresses.")
    os.close(fd)
    os.unlink(path)
    env = dict(env, SWITCHBOARD__SERVER__PORT="0", SWITCHBOARD__SERVER__ADMIN_PORT="0",
               SWITCHBOARD__SERVER__ADDRESS_FILE=path)
    proc = subprocess.Popen([binary], env=env, **popen)
    deadline = time.time() + timeout
    while not os.path.exists(path):
        if proc.poll() is not None:
            raise RuntimeError(f"{binary} exited ({proc.returncode}) before it served")
        if time.time() > deadline:
            proc.kill()
            proc.wait()
            raise RuntimeError(f"{binary} did not serve within {timeout} s")
        time.sleep(0.05)
    ports = {}
    with open(path) as f:
        for line in f:
            kind, addr = line.split()
            ports.setdefault(kind, int(addr.rsplit(":", 1)[1]))
    os.unlink(path)
    return proc, ports["public"], ports["admin"]
