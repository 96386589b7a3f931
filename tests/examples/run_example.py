#!/usr/bin/env python3
"""Smoke test of one example of examples/ (tests/examples.cmake runs one per example).

  run_example.py --bin PATH local-gang      examples/local-gang/run.sh: mkmodel, serve
                                            --local, curl; the answer must hold 8 tokens
  run_example.py --bin PATH python-client   a local gang started here, then
                                            examples/python-client/client.py: two prompts
                                            answered, and a bad prompt makes it exit 1
  run_example.py --bin PATH mpirun          examples/mpirun/run.sh under Open MPI's mpirun
  run_example.py --bin PATH kubernetes      examples/kubernetes/check.py: every Pod of the
                                            rendered overlay passes --check-config; a copy
                                            with replicas != --nnodes must fail

Ports are picked free at run time (free on 127.0.0.1 and 127.0.0.2, where the second
agent listens). Every process the example starts carries a unique marker in its
environment; when the example is over, any process still carrying it is a leak: it is
killed (by pid) and the test fails. Every wait has a deadline.
Exit status: 0 passed, 1 failed, 77 skipped (a tool is missing; the reason is printed).
"""
import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import uuid

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.dirname(os.path.dirname(HERE))
EXAMPLES = os.path.join(REPO, "examples")
SKIP = 77
MARK = "GANG_EXAMPLE_TEST_MARK"


def say(msg):
    print(msg, flush=True)


def free_ports(n):
    """n distinct TCP ports that are free on 127.0.0.1 and 127.0.0.2 right now."""
    ports = []
    deadline = time.monotonic() + 10
    while len(ports) < n and time.monotonic() < deadline:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        try:
            with socket.socket() as s2:
                s2.bind(("127.0.0.2", port))
        except OSError:
            continue
        if port not in ports:
            ports.append(port)
    if len(ports) < n:
        raise RuntimeError("no free ports")
    return ports


def marked_pids(mark):
    """Pids of the processes whose environment holds MARK=mark."""
    pids = []
    needle = ("%s=%s" % (MARK, mark)).encode()
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            with open("/proc/%s/environ" % d, "rb") as f:
                if needle in f.read().split(b"\0"):
                    pids.append(int(d))
        except OSError:
            pass
    return pids


class Run:
    """Runs commands with a marker in their environment; sweeps leaked processes."""

    def __init__(self, ganglion):
        self.mark = uuid.uuid4().hex
        self.env = dict(os.environ, GANGLION=ganglion, **{MARK: self.mark})
        self.failures = []

    def expect(self, cond, what, detail=""):
        say(("ok   " if cond else "FAIL ") + what)
        if not cond:
            self.failures.append(what)
            if detail:
                say(detail)

    def run(self, argv, timeout, env=None, **kw):
        """Runs argv in its own process group; on timeout the group is killed."""
        p = subprocess.Popen(argv, env=dict(self.env, **(env or {})), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True, **kw)
        try:
            out, _ = p.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            out, _ = p.communicate()
            out += "\n[killed: over its %d s deadline]" % timeout
            return 124, out
        return p.returncode, out

    def start(self, argv, log):
        return subprocess.Popen(argv, env=self.env, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True)

    @staticmethod
    def stop(p, grace=10):
        if p.poll() is None:
            p.send_signal(signal.SIGTERM)
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(timeout=10)

    def sweep(self):
        """Fails the test for every process still marked after a short grace; kills it."""
        deadline = time.monotonic() + 5
        while marked_pids(self.mark) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = marked_pids(self.mark)
        for pid in left:
            try:
                with open("/proc/%d/cmdline" % pid, "rb") as f:
                    cmd = f.read().replace(b"\0", b" ").decode(errors="replace")
                os.kill(pid, signal.SIGKILL)
            except OSError:
                cmd = "?"
            say("     leaked pid %d: %s" % (pid, cmd))
        self.expect(not left, "no process of the example is left behind")


def completion_of(out):
    """The JSON answer of /v1/completions printed by an example script."""
    for line in out.splitlines():
        if line.startswith('{"id"'):
            return json.loads(line)
    return None


def test_script(r, script, extra_env=None):
    http, rdzv = free_ports(2)
    env = {"HTTP_PORT": str(http), "RDZV_PORT": str(rdzv), "READY_TIMEOUT": "90"}
    env.update(extra_env or {})
    rc, out = r.run(["bash", os.path.join(EXAMPLES, script)], timeout=150, env=env)
    say(out)
    r.expect(rc == 0, "%s exits 0 (exit %d)" % (script, rc))
    ans = completion_of(out)
    r.expect(ans is not None and len(ans["choices"][0]["tokens"]) == 8,
             "the completion holds 8 tokens")
    r.sweep()


def test_python_client(r, ganglion):
    http, rdzv = free_ports(2)
    client = os.path.join(EXAMPLES, "python-client", "client.py")
    with tempfile.TemporaryDirectory(prefix="ganglion-example-") as work:
        rc, out = r.run([ganglion, "mkmodel", "--out", work + "/model", "--layers", "2",
                         "--hidden", "64", "--heads", "4", "--kv-heads", "2", "--ffn", "128",
                         "--vocab", "256"], timeout=60)
        r.expect(rc == 0, "mkmodel", out)
        with open(work + "/gang.log", "w") as log:
            gang = r.start([ganglion, "serve", "--local", "--model", work + "/model",
                            "--nnodes", "2", "--nproc-per-node", "1", "--tp", "1", "--pp", "2",
                            "--kv-cache-mb", "8", "--http-port", str(http), "--rdzv-port",
                            str(rdzv)], log)
        try:
            url = "http://127.0.0.1:%d" % http
            rc, out = r.run([sys.executable, client, "--url", url, "--wait", "90",
                             "--prompt", "1,2,3", "--prompt", "7,8", "--max-tokens", "5"],
                            timeout=150)
            say(out)
            r.expect(rc == 0, "client.py answers two prompts (exit %d)" % rc)
            lines = [l for l in out.splitlines() if re.match(r"^prompt \S+ -> ", l)]
            r.expect(len(lines) == 2 and all(len(l.split(" -> ")[1].split(" (")[0].split()) == 5
                                             for l in lines), "each with 5 tokens")
            rc, out = r.run([sys.executable, client, "--url", url, "--wait", "10",
                             "--prompt", "1,99999"], timeout=60)
            say(out)
            r.expect(rc == 1 and "HTTP 400" in out, "a token id outside the vocabulary: 400, "
                     "exit 1")
            if gang.poll() is not None:
                with open(work + "/gang.log") as f:
                    say(f.read()[-3000:])
            r.expect(gang.poll() is None, "the gang still runs")
        finally:
            r.stop(gang)
        r.expect(gang.returncode == 0, "the gang stops with exit 0 on SIGTERM (exit %s)"
                 % gang.returncode)
    r.sweep()


def test_kubernetes(r):
    check = os.path.join(EXAMPLES, "kubernetes", "check.py")
    rc, out = r.run([sys.executable, check], timeout=240)
    say(out)
    if rc == SKIP:
        return SKIP
    r.expect(rc == 0 and out.count("ok   ") == 2, "every Pod of the example passes (exit %d)"
             % rc)
    # A broken copy must fail: 3 replicas for a gang of --nnodes 2.
    with tempfile.TemporaryDirectory(prefix="ganglion-k8s-example-") as tmp:
        shutil.copytree(os.path.join(REPO, "k8s"), os.path.join(tmp, "k8s"))
        shutil.copytree(os.path.join(EXAMPLES, "kubernetes"),
                        os.path.join(tmp, "examples", "kubernetes"))
        kust = os.path.join(tmp, "examples", "kubernetes", "kustomization.yaml")
        with open(kust) as f:
            text = f.read()
        broken = text.replace("path: /spec/replicas\n        value: 2",
                              "path: /spec/replicas\n        value: 3")
        r.expect(broken != text, "the replicas patch is where the test expects it")
        with open(kust, "w") as f:
            f.write(broken)
        rc, out = r.run([sys.executable, os.path.join(tmp, "examples", "kubernetes", "check.py")],
                        timeout=240)
        say(out)
        r.expect(rc == 1 and "but 3 replicas" in out, "3 replicas with --nnodes 2 fail")
    r.sweep()
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="the ganglion binary")
    ap.add_argument("example", choices=["local-gang", "python-client", "mpirun", "kubernetes"])
    a = ap.parse_args()
    ganglion = os.path.abspath(a.bin)
    r = Run(ganglion)
    if a.example == "local-gang":
        test_script(r, "local-gang/run.sh")
    elif a.example == "mpirun":
        if shutil.which(os.environ.get("MPIRUN", "mpirun")) is None:
            say("SKIP example-mpirun: mpirun not found (Open MPI: apt-get install openmpi-bin)")
            return SKIP
        test_script(r, "mpirun/run.sh")
    elif a.example == "python-client":
        test_python_client(r, ganglion)
    elif test_kubernetes(r) == SKIP:
        return SKIP
    if r.failures:
        say("%d check(s) failed" % len(r.failures))
        return 1
    say("passed")
    return 0


if __name__ == "__main__":
    sys.exit(main())
