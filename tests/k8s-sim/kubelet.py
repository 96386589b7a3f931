"""The kubelet of the simulation: the Pod's one container (`ganglion serve` in the Pod's
network namespace, in its own PID and UTS namespaces), and the probe workers that poll
/healthz (liveness), /readyz (readiness) and, when the manifest has one, a startup probe,
restarting the container as kubelet does (see README.md for the model and the time scale).
"""

import glob
import http.client
import json
import os
import re
import signal
import subprocess
import threading
import time

from cluster import (HTTP_PORT, NS_PREFIX, VETH_PREFIX, SimFailure, descendants, kill, log,
                     proc_table)

# Manifest seconds are multiplied by this factor (10 s of the manifest = 1 s here), so that
# every scenario fits the test's time budget while keeping the manifest's proportions.
TIME_SCALE = 0.1
# A scaled probe timeout is never shorter than this: on a loaded 2-core CI machine an HTTP
# answer can take more than the 100 ms that timeoutSeconds 1 would scale to, and a false
# liveness failure would restart a healthy container.
MIN_PROBE_TIMEOUT_S = 0.5

# Kubernetes' defaults for any field the manifest leaves out (kubelet / API defaults).
K8S_PROBE_DEFAULTS = {"initialDelaySeconds": 0, "periodSeconds": 10, "timeoutSeconds": 1,
                      "successThreshold": 1, "failureThreshold": 3}
# What the simulation uses when k8s/base has no probe (a typical serving manifest).
FALLBACK_PROBES = {
    "liveness": {"path": "/healthz", "initialDelaySeconds": 0, "periodSeconds": 10,
                 "timeoutSeconds": 2, "successThreshold": 1, "failureThreshold": 3},
    "readiness": {"path": "/readyz", "initialDelaySeconds": 0, "periodSeconds": 5,
                  "timeoutSeconds": 2, "successThreshold": 1, "failureThreshold": 1},
}
FALLBACK_GRACE_S = 30
# kubelet's container restart back-off: the first restart is immediate, then 10 s doubling
# up to 300 s, reset after 10 min of running (all scaled by TIME_SCALE).
BACKOFF_BASE_S, BACKOFF_MAX_S, BACKOFF_RESET_S = 10, 300, 600


# ---------------------------------------------------------------------------------------
# Probe settings from k8s/base/*.yaml
# ---------------------------------------------------------------------------------------

def _mini_yaml_probe_blocks(text):
    """Without PyYAML: the indented blocks under livenessProbe/readinessProbe/startupProbe
    keys, each turned into {field: int} plus the httpGet path. Enough for probe blocks."""
    out = {}
    lines = text.splitlines()
    for i, line in enumerate(lines):
        m = re.match(r"^(\s*)(-\s+)?(livenessProbe|readinessProbe|startupProbe):\s*$", line)
        if not m:
            continue
        indent = len(m.group(1)) + (len(m.group(2)) if m.group(2) else 0)
        block = {}
        for sub in lines[i + 1:]:
            if not sub.strip() or sub.strip().startswith("#"):
                continue
            if len(sub) - len(sub.lstrip()) <= indent:
                break
            kv = re.match(r"^\s*([A-Za-z]+):\s*(\S.*?)?\s*(#.*)?$", sub)
            if not kv or kv.group(2) is None:
                continue
            val = kv.group(2).strip("\"'")
            if kv.group(1) == "path":
                block["path"] = val
            elif re.fullmatch(r"\d+", val):
                block[kv.group(1)] = int(val)
        out.setdefault(m.group(3), block)
    return out


def _yaml_probe_blocks(text):
    try:
        import yaml  # optional; the mini parser covers probe blocks
    except ImportError:
        return _mini_yaml_probe_blocks(text)
    out = {}

    def walk(node):
        if isinstance(node, dict):
            for k, v in node.items():
                if k in ("livenessProbe", "readinessProbe", "startupProbe") and isinstance(v, dict):
                    b = {f: v[f] for f in K8S_PROBE_DEFAULTS if isinstance(v.get(f), int)}
                    if isinstance(v.get("httpGet"), dict) and v["httpGet"].get("path"):
                        b["path"] = v["httpGet"]["path"]
                    out.setdefault(k, b)
                else:
                    walk(v)
        elif isinstance(node, list):
            for v in node:
                walk(v)
    try:
        for doc in yaml.safe_load_all(text):
            walk(doc)
    except yaml.YAMLError:
        return _mini_yaml_probe_blocks(text)
    return out


def load_probe_config(repo_root):
    """Probe settings of the manifests in k8s/base (the first file with a container probe
    wins), completed with Kubernetes' defaults; the fallback when there are none. Returns
    (probes, grace_seconds, source description)."""
    files = sorted(glob.glob(os.path.join(repo_root, "k8s", "base", "*.yaml")) +
                   glob.glob(os.path.join(repo_root, "k8s", "base", "*.yml")))
    for path in files:
        try:
            with open(path) as f:
                text = f.read()
        except OSError:
            continue
        blocks = _yaml_probe_blocks(text)
        if "livenessProbe" not in blocks and "readinessProbe" not in blocks:
            continue
        probes = {}
        for key, kind, default_path in (("livenessProbe", "liveness", "/healthz"),
                                        ("readinessProbe", "readiness", "/readyz"),
                                        ("startupProbe", "startup", "/healthz")):
            if key in blocks:
                p = dict(K8S_PROBE_DEFAULTS)
                p.update(blocks[key])
                p.setdefault("path", default_path)
                probes[kind] = p
        m = re.search(r"terminationGracePeriodSeconds:\s*(\d+)", text)
        grace = int(m.group(1)) if m else FALLBACK_GRACE_S
        return probes, grace, os.path.relpath(path, repo_root)
    return (dict((k, dict(v)) for k, v in FALLBACK_PROBES.items()), FALLBACK_GRACE_S,
            "built-in constants (k8s/base has no probes yet)")


def scaled(seconds):
    return seconds * TIME_SCALE


# ---------------------------------------------------------------------------------------
# HTTP
# ---------------------------------------------------------------------------------------

def http_request(ip, path, timeout, method="GET", body=None, port=HTTP_PORT, headers=None):
    """(status, body text); (None, error text) when unreachable or too slow. The probes call
    it without headers: like kubelet's, they carry no API key."""
    conn = http.client.HTTPConnection(ip, port, timeout=timeout)
    try:
        hdrs = {"Content-Type": "application/json"} if body is not None else {}
        hdrs.update(headers or {})
        conn.request(method, path, body=body, headers=hdrs)
        resp = conn.getresponse()
        return resp.status, resp.read().decode("utf-8", "replace")
    except (OSError, http.client.HTTPException) as e:
        return None, repr(e)
    finally:
        conn.close()


def status_json(ip, timeout=1.0):
    code, body = http_request(ip, "/status", timeout)
    if code != 200:
        return None
    try:
        return json.loads(body)
    except ValueError:
        return None


# ---------------------------------------------------------------------------------------
# A Pod: sandbox (netns) + one container + probe workers
# ---------------------------------------------------------------------------------------

class Pod:
    """One StatefulSet Pod, from creation to deletion. `spec` is a callable that returns
    (argv, env) for a container start: the Pod template."""

    _uid = 0
    _uid_lock = threading.Lock()

    def __init__(self, sim, ordinal, spec, probes, grace_s, publish_dns_after=0.0, name=None):
        self.sim = sim
        self.cluster = sim.cluster
        self.ordinal = ordinal
        self.name = name or "gang-%d" % ordinal
        with Pod._uid_lock:
            Pod._uid += 1
            self.uid = Pod._uid
        self.ns = "%s%s-%d" % (NS_PREFIX, self.name, self.uid)
        self.veth = "%s%dx%d" % (VETH_PREFIX, ordinal, self.uid)
        self.ip = self.cluster.alloc_ip()
        self.spec = spec
        self.probes = probes
        self.grace_s = grace_s
        self.dir = os.path.join(sim.tmp, "pods", "%s-%d" % (self.name, self.uid))
        os.makedirs(self.dir)
        self.termination_log = os.path.join(self.dir, "termination-log")
        self.lock = threading.RLock()
        self.popen = None          # the container's process (ip netns exec -> unshare)
        self.log_f = None
        self.container_id = 0      # increments on every (re)start
        self.started_at = None
        self.restart_count = 0
        self.next_start_at = 0.0
        self.backoff_s = 0.0
        self.last_exit = None
        self.ready = False
        self.liveness_kills = 0
        self.last_probe = {}       # kind -> (monotonic start, ok) of the latest probe
        self.events = []
        self.deleting = False
        self.stop_evt = threading.Event()
        self.threads = []
        self.cluster.create_netns(self.ns, self.veth, self.ip, self.name)
        self.event("Scheduled", "sandbox %s, IP %s" % (self.ns, self.ip))
        if publish_dns_after is not None:
            if publish_dns_after > 0:
                self.cluster.dns_set_later(self.name, self.ip, publish_dns_after)
            else:
                self.cluster.dns_set(self.name, self.ip)

    def event(self, reason, msg):
        self.events.append((time.monotonic(), reason, msg))
        log("pod %s: %s: %s" % (self.name, reason, msg))

    # -- container ------------------------------------------------------------------------
    def _start_container(self):
        argv, env = self.spec(self)
        open(self.termination_log, "w").close()  # kubelet creates /dev/termination-log
        self.container_id += 1
        path = os.path.join(self.dir, "container-%d.log" % self.container_id)
        if self.log_f:
            self.log_f.close()
        self.log_f = open(path, "wb")
        # The container: the Pod's network namespace (resolv.conf and hosts bind-mounted by
        # ip netns exec), its own PID namespace (the agent is PID 1, so killing it kills
        # every worker, as a container runtime does) and its own UTS namespace whose host
        # name is the Pod's name, which is where a StatefulSet Pod's ordinal comes from.
        full = ["ip", "netns", "exec", self.ns, "unshare", "--uts", "--pid", "--fork",
                "--kill-child", "sh", "-c", 'hostname "$0" && exec "$@"', self.name] + argv
        self.popen = subprocess.Popen(full, stdin=subprocess.DEVNULL, stdout=self.log_f,
                                      stderr=subprocess.STDOUT, env=env, start_new_session=True)
        self.started_at = time.monotonic()
        self.event("Started", "container #%d (restart count %d), log %s"
                   % (self.container_id, self.restart_count, path))

    def agent_pid(self, timeout=5.0):
        """Host PID of the agent (PID 1 of the container's PID namespace), or of the
        router in a router Pod."""
        deadline = time.monotonic() + timeout
        while True:
            with self.lock:
                p = self.popen
            if p is not None and p.poll() is None:
                for pid, argv in descendants(p.pid).items():
                    if len(argv) >= 2 and argv[1] in ("serve", "router"):
                        return pid
            if time.monotonic() > deadline:
                raise SimFailure("pod %s: no running agent found" % self.name)
            time.sleep(0.02)

    def worker_pids(self):
        """{host pid: argv} of the agent's `ganglion worker` children."""
        agent = self.agent_pid()
        table = proc_table()
        return {pid: argv for pid, argv in descendants(agent, table).items()
                if len(argv) >= 2 and argv[1] == "worker"}

    def running(self):
        with self.lock:
            return self.popen is not None and self.popen.poll() is None

    def kill_container(self, reason, grace_s=0.0):
        """Stops the container: SIGTERM and up to grace_s for it to exit, then SIGKILL of
        PID 1 (the kernel then kills every process of the PID namespace). Returns the
        exit status as kubelet would report it."""
        with self.lock:
            p = self.popen
        if p is None:
            return None
        if p.poll() is None:
            try:
                agent = self.agent_pid(timeout=0.5)
            except SimFailure:
                agent = None
            if grace_s > 0 and agent is not None:
                kill(agent, signal.SIGTERM)
                try:
                    p.wait(grace_s)
                except subprocess.TimeoutExpired:
                    self.event("Killing", "grace period of %.1f s over" % grace_s)
            if p.poll() is None:
                if agent is not None:
                    kill(agent, signal.SIGKILL)
                kill(p.pid, signal.SIGKILL)
                try:
                    p.wait(5)
                except subprocess.TimeoutExpired:
                    pass
        self.event("Killed", "%s (exit status %s)" % (reason, p.returncode))
        return p.returncode

    # -- kubelet loops --------------------------------------------------------------------
    def start(self):
        """Starts the container and the kubelet's loops for it."""
        with self.lock:
            self._start_container()
        t = threading.Thread(target=self._sync_loop, name="sync-" + self.name, daemon=True)
        self.threads.append(t)
        t.start()
        for kind in ("startup", "liveness", "readiness"):
            if kind in self.probes:
                t = threading.Thread(target=self._probe_loop, args=(kind,),
                                     name="%s-%s" % (kind, self.name), daemon=True)
                self.threads.append(t)
                t.start()

    def _sync_loop(self):
        """Restarts the container when it exits (restartPolicy Always), with back-off."""
        while not self.stop_evt.wait(0.02):
            with self.lock:
                if self.deleting:
                    return
                p = self.popen
                if p is not None and p.poll() is not None:
                    self._on_exit(p)
                    continue
                if p is None and time.monotonic() >= self.next_start_at:
                    self.restart_count += 1
                    self._start_container()

    def _on_exit(self, p):
        ran = time.monotonic() - self.started_at
        msg = ""
        try:
            with open(self.termination_log) as f:
                msg = f.read().strip()
        except OSError:
            pass
        self.last_exit = (p.returncode, msg)
        self.last_exit_cid = self.container_id
        self.ready = False
        self.popen = None
        if ran > scaled(BACKOFF_RESET_S):
            self.backoff_s = 0.0
        delay = self.backoff_s
        self.backoff_s = (scaled(BACKOFF_BASE_S) if self.backoff_s == 0
                          else min(self.backoff_s * 2, scaled(BACKOFF_MAX_S)))
        self.next_start_at = time.monotonic() + delay
        self.event("Terminated", "container #%d exited with %s after %.1f s%s; restart in %.1f s"
                   % (self.container_id, p.returncode, ran,
                      (", message: %r" % msg[:200]) if msg else "", delay))

    def _probe_loop(self, kind):
        """One probe worker, as kubelet runs one per container and probe type."""
        cfg = self.probes[kind]
        period = scaled(cfg["periodSeconds"])
        timeout = max(MIN_PROBE_TIMEOUT_S, scaled(cfg["timeoutSeconds"]))
        seen_cid, fails, succ, next_at = None, 0, 0, 0.0
        while not self.stop_evt.is_set():
            with self.lock:
                cid, started, alive = self.container_id, self.started_at, (
                    self.popen is not None and self.popen.poll() is None)
                startup_done = getattr(self, "_startup_ok_cid", None) == cid
            if cid != seen_cid:  # a new container: counters reset, initial delay again
                seen_cid, fails, succ = cid, 0, 0
                next_at = started + scaled(cfg["initialDelaySeconds"])
                if kind == "readiness":
                    self.ready = False
            now = time.monotonic()
            waiting_startup = kind != "startup" and "startup" in self.probes and not startup_done
            if not alive or now < next_at or waiting_startup \
                    or (kind == "startup" and startup_done):
                self.stop_evt.wait(0.02)
                continue
            next_at = now + period
            code, _body = http_request(self.ip, cfg["path"], timeout)
            ok = code is not None and 200 <= code < 400
            with self.lock:
                if self.container_id != cid:
                    continue
                self.last_probe[kind] = (now, ok)
                if ok:
                    fails, succ = 0, succ + 1
                    if kind == "readiness" and succ >= cfg["successThreshold"] and not self.ready:
                        self.ready = True
                        self.event("Ready", "readiness probe succeeded")
                    if kind == "startup":
                        self._startup_ok_cid = cid
                    continue
                succ, fails = 0, fails + 1
                if fails < cfg["failureThreshold"]:
                    continue
                if kind == "readiness":
                    if self.ready:
                        self.ready = False
                        self.event("NotReady", "readiness probe failed %d times (%s)"
                                   % (fails, code if code is not None else _body[:80]))
                    continue
                self.liveness_kills += 1
                self.event("Unhealthy", "%s probe failed %d times in a row (last: %s); "
                           "restarting the container" % (kind, fails,
                                                         code if code is not None else _body[:80]))
                # Killed with SIGKILL at once: a wedged agent would not act on SIGTERM.
                self.kill_container("%s probe failed" % kind, grace_s=0.0)

    def stop_kubelet(self):
        """Stops restarting and probing (the containers keep running)."""
        with self.lock:
            self.deleting = True
        self.stop_evt.set()
        for t in self.threads:
            if t is not threading.current_thread():
                t.join(5)

    def delete(self, grace_s=None, keep_dns=False):
        """Deletes the Pod: endpoints/DNS record removed, SIGTERM, grace period, SIGKILL,
        sandbox removed. Returns the container's exit status."""
        self.stop_kubelet()
        if not keep_dns:
            self.cluster.dns_delete(self.name)
        rc = self.kill_container("pod deleted", grace_s=self.grace_s if grace_s is None
                                 else grace_s)
        self.cluster.delete_netns(self.ns, self.veth)
        self.event("Deleted", "sandbox %s removed" % self.ns)
        return rc

    def error_lines(self, n=3):
        """The first ERROR lines of the log of the container that exited last."""
        path = os.path.join(self.dir, "container-%d.log" % getattr(self, "last_exit_cid", 0))
        try:
            with open(path, "rb") as f:
                lines = f.read().decode("utf-8", "replace").splitlines()
        except OSError:
            return []
        return [ln for ln in lines if " ERROR " in ln][:n]

    def tail(self, n=40):
        out = []
        for path in sorted(glob.glob(os.path.join(self.dir, "container-*.log")),
                           key=lambda p: int(re.search(r"(\d+)\.log$", p).group(1)))[-2:]:
            try:
                with open(path, "rb") as f:
                    lines = f.read().decode("utf-8", "replace").splitlines()
            except OSError:
                continue
            out.append("----- %s (%s, %s) -----\n%s"
                       % (self.name, self.ip, path, "\n".join(lines[-n:])))
        return "\n".join(out)
