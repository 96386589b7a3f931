"""What the device check's scripts share about a `ganglion serve --local` they start
(bench/gpu-health-check.py, bench/gpu-reference.py): free loopback ports and the wait for
readiness. Python standard library only; copied into the bundle with them."""
import random
import socket
import time
import urllib.request


def port_free(port):
    """Whether 127.0.0.1:port can be bound now (with SO_REUSEADDR, as the server binds)."""
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind(("127.0.0.1", port))
            return True
        except OSError:
            return False


def free_port_pair():
    """Two consecutive free ports (http, rendezvous) in [20000, 32000): below the kernel's
    ephemeral range (32768 up), so no client connection of this or another test holds them.
    RuntimeError when 200 tries find none."""
    for _ in range(200):
        port = 20000 + 2 * random.randrange(6000)
        if port_free(port) and port_free(port + 1):
            return port
    raise RuntimeError("no free port pair in [20000, 32000)")


def wait_ready(base, proc, deadline_s):
    """Polls base/readyz until 200; RuntimeError when proc (the serve process) exits first
    or deadline_s passes."""
    deadline = time.time() + deadline_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError("serve exited with %d before it was ready" % proc.returncode)
        try:
            if urllib.request.urlopen(base + "/readyz", timeout=2).status == 200:
                return
        except Exception:
            pass
        if time.time() > deadline:
            raise RuntimeError("not ready within %d s" % deadline_s)
        time.sleep(0.2)
