"""Multi-process test harness for ganglion (Python 3 standard library only).

Every scenario in tests/mp/test_*.py is a small script run by CTest as

    python3 tests/mp/test_x.py --bin /path/to/ganglion

and exits 0 on pass, 1 on failure, 77 to skip (with the reason printed). The harness does
the parts every scenario needs and must get right:

* processes: each one in its own session (so its whole tree can be signalled), its output
  captured to a log file whose tail is printed on failure, its exit code collected and
  checked against what the scenario expects; the harness is a child subreaper, so workers
  orphaned by a killed agent are re-parented to it and cannot escape the clean-up, and at
  the end nothing that descends from the test may still be running;
* deadlines: every wait has one, and the whole scenario runs under an alarm that fails it
  well inside CTest's timeout;
* ports: chosen per test at random from a range below Linux's ephemeral ports, and
  checked free, so that serial tests never trip over each other's TIME_WAIT sockets;
* HTTP: http_get() / status() with timeouts, for the agents' probes and /status;
* the rendezvous wire protocol v1 (include/ganglion/rendezvous.h, docs/protocol.md):
  WireClient encodes and decodes frames exactly as the C codec does and performs the
  HMAC-SHA256 handshake, so scenarios can play a member or a hostile peer.
"""

import argparse
import atexit
import ctypes
import hashlib
import hmac
import http.client
import importlib
import json
import os
import queue
import random
import re
import shutil
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
import time
import traceback

SKIP = 77
TEST_DEADLINE_S = 110  # CTest's limit is higher; fail cleanly before it kills us

# Fast timings so that failures are noticed and repaired within the test's budget.
HB_INTERVAL_MS = 100
HB_TIMEOUT_MS = 1000


class TestFailure(Exception):
    """A scenario's expectation did not hold."""


class TestSkip(Exception):
    """The scenario cannot run here; the message says why."""


def check(cond, msg):
    if not cond:
        raise TestFailure(msg)


def log(msg):
    sys.stdout.write("[%7.3f] %s\n" % (time.monotonic() - _T0, msg))
    sys.stdout.flush()


_T0 = time.monotonic()


def wait_until(pred, timeout, interval=0.02, what="condition"):
    """Polls pred() until it returns a truthy value, which is returned. Raises TestFailure
    after timeout seconds, naming `what`. Exceptions from pred count as a falsy value."""
    deadline = time.monotonic() + timeout
    last_exc = None
    while True:
        try:
            v = pred()
            if v:
                return v
        except (OSError, ValueError, KeyError, TypeError) as e:
            last_exc = e
        if time.monotonic() >= deadline:
            extra = " (last error: %r)" % (last_exc,) if last_exc else ""
            raise TestFailure("timed out after %.1f s waiting for %s%s" % (timeout, what, extra))
        time.sleep(interval)


_FETCH = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(
    os.path.abspath(__file__)))), "scripts", "fetch-reference.sh")


def fetch_reference(what, timeout):
    """The path `scripts/fetch-reference.sh WHAT` prints (its last line); TestSkip with the
    reason when it fails, prints nothing, or does not finish in `timeout` seconds (a first
    fetch, minutes, belongs to scripts/install-deps.sh)."""
    try:
        r = subprocess.run(["bash", _FETCH, what], stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise TestSkip("fetch-reference.sh %s did not finish in %d s (not cached yet? run "
                       "scripts/install-deps.sh or scripts/fetch-reference.sh %s once)"
                       % (what, timeout, what))
    err = r.stderr.decode(errors="replace").strip().splitlines()
    out = r.stdout.decode().strip().splitlines()
    if r.returncode != 0 or not out:
        raise TestSkip("fetch-reference.sh %s failed (%d): %s"
                       % (what, r.returncode, err[-1] if err else "no reason"))
    return out[-1]


def reexec_with_reference_python(*modules):
    """Runs the calling test again with the reference Python (scripts/fetch-reference.sh
    python) when one of the Python packages `modules` cannot be imported here. Exits SKIP,
    with the reason, when the reference Python lacks them too or cannot be had."""
    try:
        for m in modules:
            importlib.import_module(m)
        return
    except ImportError:
        pass
    if os.environ.get("GANGLION_OPENAI_REEXEC"):
        print("SKIP: the reference Python has no %s package" % " or ".join(modules))
        sys.exit(SKIP)
    try:
        py = fetch_reference("python", 90)
    except TestSkip as e:
        print("SKIP: %s" % e)
        sys.exit(SKIP)
    os.environ["GANGLION_OPENAI_REEXEC"] = "1"
    os.execv(py, [py] + sys.argv)


def wall_ms():
    return int(time.time() * 1000)


# ---------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------

def http_get(addr, port, path, timeout=1.0):
    """GET http://addr:port/path. Returns (status, body_text); (None, error) when the
    agent cannot be reached or does not answer within timeout."""
    conn = http.client.HTTPConnection(addr, port, timeout=timeout)
    try:
        conn.request("GET", path)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return None, repr(e)
    finally:
        conn.close()


def http_post(addr, port, path, body, timeout=10.0):
    """POST body (bytes, str, or an object sent as JSON) to http://addr:port/path.
    Returns (status, parsed JSON or text); (None, error) when unreachable or silent."""
    if not isinstance(body, (bytes, str)):
        body = json.dumps(body)
    if isinstance(body, str):
        body = body.encode()
    conn = http.client.HTTPConnection(addr, port, timeout=timeout)
    try:
        conn.request("POST", path, body=body, headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        text = resp.read().decode("utf-8", "replace")
        try:
            return resp.status, json.loads(text)
        except ValueError:
            return resp.status, text
    except (OSError, http.client.HTTPException) as e:
        return None, repr(e)
    finally:
        conn.close()


def mkmodel(binary, out_dir, **shape):
    """Writes a tiny random model with `ganglion mkmodel` (shape as flag=value)."""
    argv = [binary, "mkmodel", "--out", out_dir]
    for k, v in shape.items():
        flag = "--" + k.replace("_", "-")
        argv += [flag] if v is True else [flag, str(v)]
    r = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
    check(r.returncode == 0, "mkmodel failed (%d): %s" % (r.returncode, r.stdout.decode()[-500:]))
    return out_dir


def status_json(addr, port, timeout=1.0):
    """The parsed /status of an agent, or None."""
    code, body = http_get(addr, port, "/status", timeout)
    if code != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


def local_address(i):
    """The loopback address local mode gives node i (launcher/local.c)."""
    if i < 254:
        return "127.0.0.%d" % (i + 1)
    return "127.0.%d.%d" % (1 + i // 254, 1 + i % 254)


# ---------------------------------------------------------------------------------------
# Processes
# ---------------------------------------------------------------------------------------

def _proc_table():
    """{pid: (ppid, state, cmdline)} of every process visible in /proc."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
            # comm may contain spaces and parentheses; fields resume after the last ')'.
            rest = stat[stat.rindex(")") + 2:].split()
            with open("/proc/%s/cmdline" % d, "rb") as f:
                cmd = f.read().split(b"\0")
            args = [c.decode("utf-8", "replace") for c in cmd if c]
            table[int(d)] = (int(rest[1]), rest[0], args)
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(root, table=None):
    """Pids of every live (non-zombie) descendant of root."""
    table = table if table is not None else _proc_table()
    children = {}
    for pid, (ppid, _state, _cmd) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = [], [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if table[c][1] != "Z":
                out.append(c)
            todo.append(c)
    return out


def pid_alive(pid):
    """True while pid exists and is not a zombie."""
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return False


class Proc:
    """One process the test started, with its log and the exit codes it may end with."""

    def __init__(self, harness, name, argv, expect, env):
        self.name = name
        self.argv = argv
        self.expect = set(expect)
        self.log_path = os.path.join(harness.tmp, name + ".log")
        self._log = open(self.log_path, "wb")
        self.popen = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=self._log,
                                      stderr=subprocess.STDOUT, env=env,
                                      start_new_session=True)
        self.pid = self.popen.pid
        self.killed = False  # the harness had to SIGKILL it

    def poll(self):
        return self.popen.poll()

    def running(self):
        return self.popen.poll() is None

    def signal(self, sig):
        if self.running():
            os.kill(self.pid, sig)

    def wait(self, timeout):
        """Waits for the exit; returns the code or None at the deadline."""
        try:
            return self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            return None

    def stop(self, timeout=15.0):
        """SIGTERM, then SIGKILL of the whole group after timeout. Returns the exit code."""
        if self.running():
            self.signal(signal.SIGTERM)
            if self.wait(timeout) is None:
                self.killed = True
                self.kill_group()
                self.wait(5.0)
        return self.popen.returncode

    def kill_group(self):
        try:
            os.killpg(self.pid, signal.SIGKILL)
        except OSError:
            pass

    def log_text(self):
        self._log.flush()
        try:
            with open(self.log_path, "rb") as f:
                return f.read().decode("utf-8", "replace")
        except OSError:
            return ""

    def tail(self, n=60):
        return "\n".join(self.log_text().splitlines()[-n:])

    def close(self):
        self._log.close()


# The first line of a sanitizer report in a process log. Sanitizer builds (make sanitize) send
# AddressSanitizer's, LeakSanitizer's and ThreadSanitizer's reports to files that ctest
# checks (cmake/sanitize.cmake), but gcc's UBSan, built into AddressSanitizer's runtime,
# writes to stderr whatever log_path says; and a worker stopped by a report is restarted
# by its gang, so a scenario could pass over one. finish() fails on any of these lines.
SANITIZER_REPORT = re.compile(r"^(\S+:\d+:\d+: runtime error: .*"
                              r"|==\d+==ERROR: \w+Sanitizer.*"
                              r"|WARNING: ThreadSanitizer.*)$", re.M)


class Harness:
    """Owns the temp dir, the processes and the clean-up of one scenario."""

    def __init__(self, binary, name):
        self.bin = os.path.abspath(binary)
        self.name = name
        self.tmp = tempfile.mkdtemp(prefix="ganglion-mp-%s-" % name)
        self.procs = []
        self.rng = random.Random(os.getpid() ^ int(time.time() * 1e6))
        self.token_path = os.path.join(self.tmp, "token")
        self.token = "".join(self.rng.choice("0123456789abcdef") for _ in range(48))
        with open(self.token_path, "w") as f:
            f.write(self.token + "\n")
        os.chmod(self.token_path, 0o600)
        self.termination_log = os.path.join(self.tmp, "termination-log")
        self._cleaned = False
        # Workers orphaned by a SIGKILLed agent become our children instead of init's.
        try:
            libc = ctypes.CDLL(None, use_errno=True)
            libc.prctl(36, 1, 0, 0, 0)  # PR_SET_CHILD_SUBREAPER
        except (OSError, AttributeError):
            pass
        atexit.register(self.cleanup)

    def clean_env(self, extra=None):
        """The environment for ganglion processes: without identity variables that could
        leak in from the machine running the tests (docs/design.md §3 discovery order)."""
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GANGLION_", "OMPI_", "PMIX_", "LWS_"))
               and k not in ("POD_NAMESPACE",)}
        env.update(extra or {})
        return env

    def free_port_pair(self):
        """Two consecutive free ports (rendezvous, http) in [10000, 20000)."""
        for _ in range(200):
            base = 10000 + 2 * self.rng.randrange(5000)
            if all(_port_free(p) for p in (base, base + 1)):
                return base, base + 1
        raise TestFailure("no free port pair found")

    def spawn(self, name, argv, expect=(0,), env=None):
        p = Proc(self, name, argv, expect, self.clean_env(env))
        self.procs.append(p)
        log("started %s (pid %d): %s" % (name, p.pid, " ".join(argv)))
        return p

    def print_logs(self, lines=80):
        for p in self.procs:
            sys.stdout.write("----- tail of %s (%s) -----\n%s\n"
                             % (p.name, p.log_path, p.tail(lines)))
        sys.stdout.flush()

    def finish(self):
        """Stops every process, checks every exit code against its expectation, and
        checks that nothing descending from the test is left running. Raises TestFailure
        listing every problem."""
        problems = []
        for p in self.procs:
            code = p.stop()
            if p.killed:
                problems.append("%s did not stop within 15 s of SIGTERM (SIGKILLed)" % p.name)
            elif code not in p.expect:
                problems.append("%s exited with %s, expected %s" % (p.name, code, sorted(p.expect)))
            else:
                log("%s exited with %s" % (p.name, code))
            report = SANITIZER_REPORT.search(p.log_text())
            if report:
                problems.append("%s (or a process it started) hit a sanitizer report: %s"
                                % (p.name, report.group(0)))
        try:
            wait_until(lambda: not descendants(os.getpid()), 5.0, 0.05,
                       "leftover processes to exit")
        except TestFailure:
            table = _proc_table()
            left = descendants(os.getpid(), table)
            problems.append("processes left running after the gang stopped: %s" %
                            ", ".join("%d %s" % (pid, " ".join(table[pid][2])[:120])
                                      for pid in left if pid in table))
        if problems:
            raise TestFailure("; ".join(problems))

    def cleanup(self):
        """Kills everything still alive; safe to call more than once."""
        if self._cleaned:
            return
        self._cleaned = True
        for p in self.procs:
            if p.running():
                p.kill_group()
        for pid in descendants(os.getpid()):
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        popen_pids = {p.pid for p in self.procs}
        deadline = time.monotonic() + 5
        for p in self.procs:
            p.wait(max(0.1, deadline - time.monotonic()))
            p.close()
        # Reap adopted orphans (never our own Popen children: their codes matter).
        for pid, (ppid, _st, _cmd) in _proc_table().items():
            if ppid == os.getpid() and pid not in popen_pids:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except OSError:
                    pass
        if os.environ.get("GANGLION_MP_KEEP") is None:
            shutil.rmtree(self.tmp, ignore_errors=True)


def _port_free(port):
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", port))
        return True
    except OSError:
        return False
    finally:
        s.close()


# ---------------------------------------------------------------------------------------
# Gangs
# ---------------------------------------------------------------------------------------

class Gang:
    """A gang of agents on loopback addresses: either one `serve --local` process that
    supervises them all (start_local), or agents started one by one (start_agent)."""

    def __init__(self, h, nnodes, nproc_per_node=1, extra=(), token=True,
                 hb_interval_ms=HB_INTERVAL_MS, hb_timeout_ms=HB_TIMEOUT_MS, job="mp-test"):
        self.h = h
        self.nnodes = nnodes
        self.nproc = nproc_per_node
        self.hb_interval_ms = hb_interval_ms
        self.hb_timeout_ms = hb_timeout_ms
        self.job = job
        self.rdzv_port, self.http_port = h.free_port_pair()
        self.token = token
        self.local = None
        self.agents = {}
        self.flags = [
            "--nnodes", str(nnodes), "--nproc-per-node", str(nproc_per_node),
            "--rdzv-port", str(self.rdzv_port), "--http-port", str(self.http_port),
            "--job-name", job,
            "--heartbeat-interval-ms", str(hb_interval_ms),
            "--heartbeat-timeout-ms", str(hb_timeout_ms),
            "--abort-timeout-ms", "500",
            "--handshake-timeout-ms", "1000",
            "--connect-timeout-ms", "1000",
            "--dns-backoff-initial-ms", "20", "--dns-backoff-max-ms", "200",
            "--restart-backoff-ms", "20", "--restart-backoff-max-ms", "200",
            "--give-up-linger-ms", "3000",
            "--termination-log", h.termination_log,
        ]
        if token:
            self.flags += ["--token-file", h.token_path]
        self.flags += list(extra)

    # -- starting ---------------------------------------------------------------------
    def start_local(self, expect=(0,)):
        self.local = self.h.spawn("local", [self.h.bin, "serve", "--local"] + self.flags, expect)
        return self.local

    def start_agent(self, i, expect=(0,)):
        argv = [self.h.bin, "serve"] + self.flags + [
            "--node-index", str(i), "--bind-address", local_address(i),
            "--coordinator", "127.0.0.1:%d" % self.rdzv_port]
        self.agents[i] = self.h.spawn("agent%d" % i, argv, expect)
        return self.agents[i]

    # -- observing --------------------------------------------------------------------
    def addr(self, i):
        return local_address(i)

    def status(self, i, timeout=1.0):
        return status_json(self.addr(i), self.http_port, timeout)

    def get(self, i, path, timeout=1.0):
        return http_get(self.addr(i), self.http_port, path, timeout)

    def coord(self):
        """The coordinator's "gang" object, or None."""
        st = self.status(0)
        return st.get("gang") if st else None

    def wait_serving(self, timeout=30.0, min_gen=0, nodes=None):
        """Waits until the coordinator serves a generation > min_gen and every agent in
        `nodes` (default all) reports state serving, ready, in that generation, and
        answers /readyz 200. Returns the generation."""
        nodes = range(self.nnodes) if nodes is None else nodes

        def ok():
            g = self.coord()
            if not g or g.get("state") != "serving" or g.get("generation", 0) <= min_gen:
                return None
            gen = g["generation"]
            for i in nodes:
                st = self.status(i)
                if (not st or st.get("state") != "serving" or st.get("ready") is not True
                        or st.get("generation") != gen):
                    return None
                if self.get(i, "/readyz")[0] != 200:
                    return None
            return gen

        return wait_until(ok, timeout, 0.05, "the gang to serve a generation above %d" % min_gen)

    def worker_pid(self, node, local_rank):
        st = self.status(node)
        check(st is not None, "no /status from node %d" % node)
        for r in st.get("local_ranks", []):
            if r.get("local_rank") == local_rank:
                return int(r["pid"])
        raise TestFailure("node %d has no local rank %d in /status: %s" % (node, local_rank, st))

    def agent_pid(self, node):
        """The pid of agent `node`: a direct child of the local parent, or our own."""
        if node in self.agents:
            return self.agents[node].pid
        check(self.local is not None, "no gang process")
        table = _proc_table()
        for pid, (ppid, state, cmd) in table.items():
            if ppid != self.local.pid or state == "Z":
                continue
            if "--node-index" in cmd and cmd[cmd.index("--node-index") + 1:][:1] == [str(node)]:
                return pid
        raise TestFailure("agent %d not found among the local parent's children" % node)

    def assert_all_ready(self, what=""):
        for i in range(self.nnodes):
            code, body = self.get(i, "/readyz")
            check(code == 200, "node %d /readyz = %s %s %s" % (i, code, body[:200], what))

    def stop(self):
        """Stops the local gang (or each agent); returns the exit codes."""
        codes = {}
        if self.local:
            codes["local"] = self.local.stop()
        for i, a in self.agents.items():
            codes[i] = a.stop()
        return codes


# ---------------------------------------------------------------------------------------
# Wire protocol v2 (include/ganglion/rendezvous.h, docs/protocol.md)
# ---------------------------------------------------------------------------------------

MAGIC = 0x474E4147
VERSION = 2
HEADER = struct.Struct("<IHHQI")  # magic, version, type, generation, payload_len
MAX_PAYLOAD = 64 * 1024
TAG = 16  # session tag after every frame once a token handshake succeeded
DIR_TO_MEMBER, DIR_TO_COORD = 1, 2
NONCE = MAC = DIGEST = 32
JOB_MAX, HOST_MAX, REASON_MAX = 64, 256, 256

CHALLENGE, JOIN, WELCOME, REJECT, BLOB_REQUEST, BLOB, START, READY, HEARTBEAT, ABORT, \
    REJOIN, GIVE_UP, API = range(1, 14)
MSG_NAMES = {v: k for k, v in dict(
    CHALLENGE=1, JOIN=2, WELCOME=3, REJECT=4, BLOB_REQUEST=5, BLOB=6, START=7, READY=8,
    HEARTBEAT=9, ABORT=10, REJOIN=11, GIVE_UP=12, API=13).items()}
API_FRAME_MAX = 9216  # GANG_API_FRAME_MAX: bytes of a forwarded request's frame

RANK_DOWN, RANK_IDLE, RANK_STARTING, RANK_READY, RANK_ABORTING, RANK_FAILED = range(6)

# GANG_E* codes (include/ganglion/common.h).
EVERSION, EAUTH, ESTALE, EPEER, EABORTED, EDUPLICATE, EMISMATCH = range(-3001, -3008, -1)

EMPTY_DIGEST = hashlib.sha256(b"").digest()  # gang_model_digest("") (no --model)


def frame(msg_type, generation, payload, version=VERSION, magic=MAGIC, payload_len=None):
    """One frame; the keyword arguments let tests forge broken headers."""
    n = len(payload) if payload_len is None else payload_len
    return HEADER.pack(magic, version, msg_type, generation, n) + payload


def p_str(s, cap):
    b = s.encode()
    assert len(b) < cap, "string too long for its field"
    return struct.pack("<H", len(b)) + b


def p_join(job, node_index, nnodes, nproc_per_node, tp, pp, digest, generation_seen, host,
           client_nonce, mac):
    return (p_str(job, JOB_MAX) + struct.pack("<IIIII", node_index, nnodes, nproc_per_node, tp, pp)
            + digest + struct.pack("<Q", generation_seen) + p_str(host, HOST_MAX)
            + client_nonce + mac)


def p_heartbeat(node_index, state, rank_states, ages):
    return (struct.pack("<III", node_index, state, len(rank_states)) + bytes(rank_states)
            + struct.pack("<%dI" % len(ages), *ages))


def p_u32(v):
    return struct.pack("<I", v)


def p_blob(world_size, data):
    return struct.pack("<II", world_size, len(data)) + data


def p_abort(rank, code, reason):
    return struct.pack("<ii", rank, code) + p_str(reason, REASON_MAX)


class _Reader:
    def __init__(self, b):
        self.b, self.off = b, 0

    def take(self, n):
        if self.off + n > len(self.b):
            raise ValueError("truncated payload")
        v = self.b[self.off:self.off + n]
        self.off += n
        return v

    def u(self, fmt):
        s = struct.Struct("<" + fmt)
        return s.unpack(self.take(s.size))[0]

    def s(self):
        return self.take(self.u("H")).decode("utf-8", "replace")


def decode_payload(msg_type, payload):
    """The fields of a payload as a dict (the message types a member receives, plus
    READY/REJOIN/ABORT for symmetry)."""
    r = _Reader(payload)
    if msg_type == CHALLENGE:
        d = {"nonce": r.take(NONCE), "auth_required": r.u("B")}
    elif msg_type == WELCOME:
        d = {"mac": r.take(MAC), "heartbeat_interval_ms": r.u("I"),
             "heartbeat_timeout_ms": r.u("I"), "generation": r.u("Q")}
    elif msg_type == REJECT:
        d = {"code": r.u("i"), "reason": r.s()}
    elif msg_type in (BLOB_REQUEST, BLOB, START):
        d = {"world_size": r.u("I")}
        d["blob"] = r.take(r.u("I"))
    elif msg_type == HEARTBEAT:
        d = {"node_index": r.u("I"), "state": r.u("I"), "nranks": r.u("I")}
        d["rank_state"] = list(r.take(d["nranks"]))
        d["rank_age_ms"] = [r.u("I") for _ in range(d["nranks"])]
    elif msg_type == ABORT:
        d = {"rank": r.u("i"), "code": r.u("i"), "reason": r.s()}
    elif msg_type in (READY, REJOIN):
        d = {"node_index": r.u("I")}
    elif msg_type == GIVE_UP:
        d = {"reason": r.s()}
    elif msg_type == API:
        d = {"data": r.take(r.u("I"))}
    else:
        raise ValueError("unknown message type %d" % msg_type)
    if r.off != len(payload):
        raise ValueError("trailing bytes in %s payload" % MSG_NAMES.get(msg_type, msg_type))
    return d


def token_key(token):
    """The HMAC key: SHA-256 of the token with trailing whitespace stripped."""
    return hashlib.sha256(token.rstrip(" \t\r\n\v\f").encode()).digest()


def join_mac(key, server_nonce, client_nonce, job, node_index, nnodes, nproc_per_node, tp, pp,
             digest, generation_seen, host):
    """mac_m = HMAC(k, "ganglion-join-v1" | server_nonce | client_nonce | job | 0x00 |
    u32le node_index | u32le nnodes | u32le nproc_per_node | u32le tp | u32le pp | digest |
    u64le generation_seen | host | 0x00) (rendezvous/auth.c)."""
    msg = (b"ganglion-join-v1" + server_nonce + client_nonce + job.encode() + b"\0"
           + struct.pack("<IIIII", node_index, nnodes, nproc_per_node, tp, pp) + digest
           + struct.pack("<Q", generation_seen) + host.encode() + b"\0")
    return hmac.new(key, msg, hashlib.sha256).digest()


def welcome_mac(key, client_nonce, server_nonce):
    return hmac.new(key, b"ganglion-welcome-v1" + client_nonce + server_nonce,
                    hashlib.sha256).digest()


def session_key(key, server_nonce, client_nonce):
    """session_key = HMAC(k, "ganglion-session-v1" | server_nonce | client_nonce)
    (docs/protocol.md §5.3)."""
    return hmac.new(key, b"ganglion-session-v1" + server_nonce + client_nonce,
                    hashlib.sha256).digest()


def session_tag(skey, direction, seq, data):
    """tag = HMAC(session_key, dir | u64le seq | frame bytes), first 16 bytes."""
    return hmac.new(skey, bytes([direction]) + struct.pack("<Q", seq) + data,
                    hashlib.sha256).digest()[:TAG]


class Session:
    """A member's side of the per-connection session MACs: tags what it sends
    (member -> coordinator) and checks what it receives (coordinator -> member)."""

    def __init__(self, key, server_nonce, client_nonce):
        self.key = session_key(key, server_nonce, client_nonce)
        self.send_seq = 0
        self.recv_seq = 0

    def tag(self, data, seq=None, direction=DIR_TO_COORD):
        """The tag of the next frame sent (advancing the counter); seq/direction let a
        test forge one for another position or direction without advancing it."""
        if seq is None and direction == DIR_TO_COORD:
            t = session_tag(self.key, direction, self.send_seq, data)
            self.send_seq += 1
            return t
        return session_tag(self.key, direction, self.send_seq if seq is None else seq, data)

    def check(self, data, tag):
        want = session_tag(self.key, DIR_TO_MEMBER, self.recv_seq, data)
        if not hmac.compare_digest(want, tag):
            raise ValueError("frame %d from the coordinator carries a wrong session tag"
                             % self.recv_seq)
        self.recv_seq += 1


class Msg:
    def __init__(self, msg_type, generation, fields):
        self.type, self.generation, self.f = msg_type, generation, fields

    def __repr__(self):
        return "%s(gen=%d, %r)" % (MSG_NAMES.get(self.type, self.type), self.generation,
                                   {k: v for k, v in self.f.items() if not isinstance(v, bytes)})


class WireClient:
    """A raw TCP client of the rendezvous port. Not thread-safe except as documented:
    start_member_threads() hands reading to a thread (messages then arrive in
    self.inbox) and sends heartbeats from another; send() is locked."""

    def __init__(self, host, port, timeout=3.0, source=None):
        self.sock = socket.create_connection((host, port), timeout=timeout,
                                             source_address=(source, 0) if source else None)
        self.sock.settimeout(timeout)
        self.buf = b""
        self.lock = threading.Lock()
        self.inbox = queue.Queue()
        self.closed = threading.Event()
        self.stop = threading.Event()
        self.hb_state = None  # (node_index, rank_states) once heartbeating
        self.session = None   # Session once a handshake with a token succeeded

    def close(self):
        self.stop.set()
        try:
            self.sock.close()
        except OSError:
            pass

    def send_raw(self, data):
        with self.lock:
            self.sock.sendall(data)

    def send(self, msg_type, generation, payload):
        """Sends one frame, tagged when the session is up (the tag and the counter are
        taken under the lock, so frames leave in sequence order)."""
        data = frame(msg_type, generation, payload)
        with self.lock:
            if self.session is not None:
                data += self.session.tag(data)
            self.sock.sendall(data)

    def tagged(self, msg_type, generation, payload):
        """The bytes of the next frame with its tag, without sending them (the counter
        advances): for tests that replay, reorder or tamper with frames."""
        data = frame(msg_type, generation, payload)
        with self.lock:
            return data + self.session.tag(data)

    def _fill(self, n, deadline):
        while len(self.buf) < n:
            left = deadline - time.monotonic()
            if left <= 0:
                raise socket.timeout("timed out")
            self.sock.settimeout(left)
            chunk = self.sock.recv(65536)
            if not chunk:
                raise EOFError("connection closed by the peer")
            self.buf += chunk

    def recv(self, timeout=3.0):
        """The next message (a Msg). EOFError when the peer closed, socket.timeout at the
        deadline, ValueError for a frame that is not valid v2 (or whose session tag is
        wrong)."""
        deadline = time.monotonic() + timeout
        self._fill(HEADER.size, deadline)
        magic, version, msg_type, gen, n = HEADER.unpack(self.buf[:HEADER.size])
        if magic != MAGIC or version != VERSION or n > MAX_PAYLOAD:
            raise ValueError("bad header from the coordinator: %x v%d len %d" % (magic, version, n))
        tag = TAG if self.session is not None else 0
        self._fill(HEADER.size + n + tag, deadline)
        data = self.buf[:HEADER.size + n]
        if tag:
            self.session.check(data, self.buf[HEADER.size + n:HEADER.size + n + tag])
        self.buf = self.buf[HEADER.size + n + tag:]
        return Msg(msg_type, gen, decode_payload(msg_type, data[HEADER.size:]))

    def wait_closed(self, timeout):
        """Reads (and returns) every message until the peer closes; raises TestFailure
        if it is still open after timeout seconds."""
        got = []
        deadline = time.monotonic() + timeout
        try:
            while True:
                got.append(self.recv(max(0.01, deadline - time.monotonic())))
        except EOFError:
            return got
        except ConnectionResetError:
            return got
        except socket.timeout:
            raise TestFailure("the coordinator did not close the connection within %.1f s "
                              "(got %r)" % (timeout, got))

    def handshake(self, job, node_index, nnodes, nproc_per_node, token=None, tp=1, pp=1,
                  digest=EMPTY_DIGEST, generation_seen=0, host=None, mac_token=None):
        """CHALLENGE -> JOIN -> WELCOME or REJECT. token: the shared token (None: zero MAC);
        mac_token overrides the token used for the MAC (to forge a wrong one). Returns the
        WELCOME or REJECT Msg; verifies the coordinator's WELCOME MAC when token is set,
        and then starts the session: every later frame is tagged and checked."""
        ch = self.recv()
        check(ch.type == CHALLENGE, "first frame is %r, expected CHALLENGE" % ch)
        server_nonce = ch.f["nonce"]
        client_nonce = os.urandom(NONCE)
        host = host or local_address(node_index)
        key_src = mac_token if mac_token is not None else token
        mac = (join_mac(token_key(key_src), server_nonce, client_nonce, job, node_index,
                        nnodes, nproc_per_node, tp, pp, digest, generation_seen, host)
               if key_src is not None else bytes(MAC))
        self.send(JOIN, generation_seen,
                  p_join(job, node_index, nnodes, nproc_per_node, tp, pp, digest,
                         generation_seen, host, client_nonce, mac))
        m = self.recv()
        if m.type == WELCOME and token is not None:
            check(hmac.compare_digest(m.f["mac"], welcome_mac(token_key(token), client_nonce,
                                                              server_nonce)),
                  "WELCOME carries a MAC that does not prove the token")
            self.session = Session(token_key(token), server_nonce, client_nonce)
        return m

    def start_member_threads(self, node_index, nranks, interval_ms):
        """Reads every incoming message into self.inbox (None marks the close) and sends
        a member HEARTBEAT every interval_ms, reporting self.hb_state's rank states."""
        self.hb_state = [RANK_IDLE] * nranks
        self.sock.settimeout(None)

        def reader():
            try:
                while not self.stop.is_set():
                    self.inbox.put(self.recv(timeout=3600))
            except (EOFError, OSError, ValueError):
                pass
            self.closed.set()
            self.inbox.put(None)

        def beater():
            while not self.stop.is_set() and not self.closed.is_set():
                try:
                    self.send(HEARTBEAT, 0, p_heartbeat(node_index, 0, list(self.hb_state),
                                                        [0] * nranks))
                except OSError:
                    return
                self.stop.wait(interval_ms / 1000.0)

        for fn in (reader, beater):
            threading.Thread(target=fn, daemon=True).start()

    def expect(self, msg_type, timeout=5.0, skip=(HEARTBEAT,)):
        """Takes messages from the inbox until one of msg_type arrives (types in skip are
        dropped; anything else fails the test)."""
        deadline = time.monotonic() + timeout
        while True:
            left = deadline - time.monotonic()
            try:
                m = self.inbox.get(timeout=max(0.01, left))
            except queue.Empty:
                raise TestFailure("no %s within %.1f s" % (MSG_NAMES[msg_type], timeout))
            if m is None:
                raise TestFailure("connection closed while waiting for %s" % MSG_NAMES[msg_type])
            if m.type == msg_type:
                return m
            if m.type not in skip:
                raise TestFailure("got %r while waiting for %s" % (m, MSG_NAMES[msg_type]))


# ---------------------------------------------------------------------------------------
# A real worker driven by the test (launcher/wctl.h)
# ---------------------------------------------------------------------------------------

# The agent <-> worker packets (launcher/wctl.h): u8 type, u64 generation, then the fields
# of that type, little-endian; each message is one SEQPACKET of its own size.
WCTL_HELLO, WCTL_HEARTBEAT, WCTL_BLOB, WCTL_START, WCTL_READY, WCTL_ERROR = 1, 2, 4, 5, 6, 7
WCTL_SHUTDOWN, WCTL_GPU = 10, 16
WCTL_PACKET_MAX = 9 + 8400  # GANG_WCTL_PACKET_MAX
WCTL_HEAD = struct.Struct("<BQ")


def wctl_pack(msg_type, generation=0, rank=0, world=0, blob=b""):
    """A control message the fake agent sends (START carries rank, world and the blob)."""
    body = b""
    if msg_type == WCTL_START:
        body = struct.pack("<III", rank, world, len(blob)) + blob
    return WCTL_HEAD.pack(msg_type, generation) + body


def wctl_unpack(b):
    """A worker's control message as a dict: type, gen, and its type's fields (reason for
    ERROR, state for HEARTBEAT, blob for BLOB/READY/GPU, ...); request messages (TOKEN,
    DONE) keep only type and gen. Raises TestFailure for a malformed packet."""
    r = _Reader(b)
    try:
        m = {"type": r.u("B"), "gen": r.u("Q")}
        t = m["type"]
        if t == WCTL_HELLO:
            m["local_rank"], m["pid"] = r.u("I"), r.u("i")
        elif t == WCTL_HEARTBEAT:
            m["state"] = r.u("I")
        elif t in (WCTL_BLOB, WCTL_READY, WCTL_GPU):
            m["blob"] = r.take(r.u("I"))
        elif t == WCTL_ERROR:
            m["code"], m["rank"] = r.u("i"), r.u("I")
            m["reason"] = r.take(r.u("H")).decode(errors="replace")
        elif 11 <= t <= 15:
            return m  # a request message: not this fake agent's business
        elif t not in (3, 8, 9, 10):
            raise TestFailure("worker peer: unknown packet type %d" % t)
        check(r.off == len(b), "worker peer: %d trailing bytes in a packet of type %d"
              % (len(b) - r.off, t))
    except (struct.error, ValueError) as e:
        raise TestFailure("worker peer: malformed packet of %d bytes: %s" % (len(b), e))
    return m


class WorkerPeer:
    """One real `ganglion worker` process that the test drives as its agent, over the
    SOCK_SEQPACKET control channel of launcher/wctl.h: START(generation, rank, world,
    blob) makes it join the gang's real data plane (the socket backend) as `rank`, and
    READY comes back once the communicator is up. A scenario that plays a whole node at
    the protocol level needs this, because rank 0 is READY only once every rank joined."""

    def __init__(self, harness, blob, generation, rank, world, hb_interval_ms=100,
                 timeout=10.0, advertise="127.0.0.2"):
        self.path = os.path.join(harness.tmp, "wpeer-%d-%d.sock" % (generation, rank))
        self.lsock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.lsock.bind(self.path)
        self.lsock.listen(1)
        self.lsock.settimeout(timeout)
        self.error = None
        self.stop = threading.Event()
        argv = [harness.bin, "worker", "--agent-socket", self.path, "--local-rank", "0",
                "--node-index", str(rank), "--nproc-per-node", "1",
                "--heartbeat-interval-ms", str(hb_interval_ms),
                "--advertise-address", advertise]
        self.proc = harness.spawn("wpeer%d-g%d" % (rank, generation), argv,
                                  expect=(0, -signal.SIGKILL))
        self.conn, _ = self.lsock.accept()
        self.conn.settimeout(timeout)
        hello = self._recv()
        check(hello["type"] == WCTL_HELLO, "worker peer: expected HELLO, got type %d"
              % hello["type"])
        self.conn.send(wctl_pack(WCTL_START, generation, rank, world, blob))
        deadline = time.time() + timeout
        while True:
            m = self._recv()
            if m["type"] == WCTL_READY and m["gen"] == generation:
                break
            if m["type"] == WCTL_ERROR:
                raise TestFailure("worker peer failed to join: %s" % m["reason"])
            check(time.time() < deadline, "worker peer: no READY within %.0f s" % timeout)
        threading.Thread(target=self._run, daemon=True).start()

    def _recv(self):
        b = self.conn.recv(WCTL_PACKET_MAX + 1)
        if not b:
            raise EOFError("the worker closed its control channel")
        check(len(b) <= WCTL_PACKET_MAX, "worker peer: packet of %d bytes, over %d"
              % (len(b), WCTL_PACKET_MAX))
        return wctl_unpack(b)

    def _run(self):
        self.conn.settimeout(0.2)
        while not self.stop.is_set():
            try:
                m = self._recv()
            except socket.timeout:
                continue
            except (OSError, EOFError, TestFailure) as e:
                if not self.stop.is_set():
                    self.error = e
                return
            if m["type"] == WCTL_ERROR and not self.stop.is_set():
                self.error = m["reason"]

    def close(self):
        self.stop.set()
        try:
            self.conn.send(wctl_pack(WCTL_SHUTDOWN))
        except OSError:
            pass
        if self.proc.wait(5.0) is None:
            self.proc.kill_group()
            self.proc.wait(5.0)
        for s in (self.conn, self.lsock):
            try:
                s.close()
            except OSError:
                pass


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------

def run(test_fn, name=None):
    """Parses --bin, runs test_fn(harness) under the deadline, and exits 0 / 1 / 77."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--bin", required=True, help="path to the ganglion binary")
    ap.add_argument("--fake-nvml", default="", help="the fake NVML library (tests/fake-nvml/)")
    args = ap.parse_args()
    name = name or os.path.splitext(os.path.basename(sys.argv[0]))[0]
    if not os.access(args.bin, os.X_OK):
        print("SKIP: %s is not an executable ganglion binary" % args.bin)
        sys.exit(SKIP)

    def on_alarm(_sig, _frame):
        raise TestFailure("the scenario exceeded its %d s deadline" % TEST_DEADLINE_S)

    signal.signal(signal.SIGALRM, on_alarm)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(1))
    signal.alarm(TEST_DEADLINE_S)
    h = Harness(args.bin, name)
    h.fake_nvml = os.path.abspath(args.fake_nvml) if args.fake_nvml else ""
    rc = 1
    try:
        test_fn(h)
        signal.alarm(TEST_DEADLINE_S)  # room for the stop and exit checks
        h.finish()
        log("PASS %s" % name)
        rc = 0
    except TestSkip as e:
        print("SKIP: %s" % e)
        rc = SKIP
    except TestFailure as e:
        signal.alarm(0)
        log("FAIL %s: %s" % (name, e))
        h.print_logs()
    except Exception:  # a bug in the scenario itself is a failure too, with its trace
        signal.alarm(0)
        traceback.print_exc()
        log("FAIL %s: unexpected exception" % name)
        h.print_logs()
    finally:
        signal.alarm(0)
        h.cleanup()
    sys.stdout.flush()
    os._exit(rc)
