"""The simulated cluster: a Pod network on a Linux bridge, a cluster DNS (dnsmasq) that
serves the headless Service's records, and Pods as network namespaces whose one container
runs `ganglion serve` (Python 3 standard library only; see README.md).

Everything this module creates carries a fixed prefix (namespaces "gsim-*", veths "gsv*",
the bridge "gsimbr0", the state directory /run/ganglion-k8s-sim) so that leftovers of a
run that was killed are found and removed by the next one. Runs are serialised by an
flock on /run/ganglion-k8s-sim/lock: two build trees running `ctest` at once would
otherwise fight over the one subnet, and under the lock anything with the prefix is
stale by definition.
"""

import errno
import fcntl
import ipaddress
import os
import random
import shutil
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
import traceback

SUBNET = "10.244.77"             # private Pod subnet (/24), unlikely to clash with real ones
BRIDGE = "gsimbr0"
BRIDGE_IP = SUBNET + ".1"        # the "node": host side of the Pod network, and the DNS
BRIDGE_MAC = "02:67:73:69:6d:01"  # locally administered, fixed (see setup())
NS_PREFIX = "gsim-"              # network namespaces of Pods
VETH_PREFIX = "gsv"              # host ends of the Pods' veth pairs
STATE_DIR = "/run/ganglion-k8s-sim"
LOCK_PATH = STATE_DIR + "/lock"
DNSMASQ_PID = STATE_DIR + "/dnsmasq.pid"
MARKER = "ganglion-k8s-sim"      # appears in dnsmasq's argv so a stale one can be recognised

SERVICE = "gang"                 # headless Service and StatefulSet name
NAMESPACE = "default"
DOMAIN = "cluster.local"
HTTP_PORT = 8000                 # every Pod has its own IP, so every agent uses the same port

_T0 = time.monotonic()
_log_lock = threading.Lock()


class SimFailure(Exception):
    """An expectation of the scenario did not hold."""


class SimSkip(Exception):
    """The simulation cannot run here (the message says why)."""


def log(msg):
    with _log_lock:
        print("[%7.3f] %s" % (time.monotonic() - _T0, msg), flush=True)


def check(cond, msg):
    if not cond:
        raise SimFailure(msg)


def sh(*argv, check_rc=True, timeout=10):
    """Runs a command; returns (rc, stdout+stderr text). Raises SimFailure on rc != 0 when
    check_rc."""
    try:
        p = subprocess.run(list(argv), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=timeout)
    except subprocess.TimeoutExpired:
        raise SimFailure("%s timed out after %d s" % (" ".join(argv), timeout))
    out = p.stdout.decode("utf-8", "replace")
    if check_rc and p.returncode != 0:
        raise SimFailure("%s failed (%d): %s" % (" ".join(argv), p.returncode, out.strip()))
    return p.returncode, out


def fqdn(pod_name):
    """A StatefulSet Pod's name in its headless Service, which is named like the StatefulSet
    in these simulations: Pod "<set>-<ordinal>" is "<set>-<ordinal>.<set>.<namespace>..."
    (SERVICE for the one gang of k8s_sim.py, "a", "b", ... for dp_sim.py's replicas)."""
    return "%s.%s.%s.svc.%s" % (pod_name, pod_name.rsplit("-", 1)[0], NAMESPACE, DOMAIN)


def service_fqdn(service):
    return "%s.%s.svc.%s" % (service, NAMESPACE, DOMAIN)


# ---------------------------------------------------------------------------------------
# Processes in /proc
# ---------------------------------------------------------------------------------------

def proc_table():
    """{pid: (ppid, state, argv)} of every process visible in /proc."""
    table = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open("/proc/%s/stat" % d) as f:
                stat = f.read()
            rest = stat[stat.rindex(")") + 2:].split()
            with open("/proc/%s/cmdline" % d, "rb") as f:
                args = [c.decode("utf-8", "replace") for c in f.read().split(b"\0") if c]
            table[int(d)] = (int(rest[1]), rest[0], args)
        except (OSError, ValueError, IndexError):
            continue
    return table


def descendants(root, table=None):
    """Live (non-zombie) descendants of root, as {pid: argv}."""
    table = table if table is not None else proc_table()
    children = {}
    for pid, (ppid, _st, _a) in table.items():
        children.setdefault(ppid, []).append(pid)
    out, todo = {}, [root]
    while todo:
        for c in children.get(todo.pop(), []):
            if table[c][1] != "Z":
                out[c] = table[c][2]
            todo.append(c)
    return out


def pid_alive(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2] != "Z"
    except (OSError, ValueError, IndexError):
        return False


def pid_state(pid):
    try:
        with open("/proc/%d/stat" % pid) as f:
            stat = f.read()
        return stat[stat.rindex(")") + 2]
    except (OSError, ValueError, IndexError):
        return None


def kill(pid, sig):
    try:
        os.kill(pid, sig)
        return True
    except OSError:
        return False


# ---------------------------------------------------------------------------------------
# DNS: a minimal A-record client, to know when dnsmasq really answers a change
# ---------------------------------------------------------------------------------------

def dns_query_a(name, server=BRIDGE_IP, timeout=0.5):
    """The IPv4 addresses dnsmasq answers for name (empty list for NXDOMAIN/NODATA); None
    when the server did not answer."""
    qid = random.randrange(65536)
    q = struct.pack(">HHHHHH", qid, 0x0100, 1, 0, 0, 0)
    for label in name.rstrip(".").split("."):
        q += bytes([len(label)]) + label.encode()
    q += b"\0" + struct.pack(">HH", 1, 1)
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.settimeout(timeout)
    try:
        s.sendto(q, (server, 53))
        data, _ = s.recvfrom(4096)
    except OSError:
        return None
    finally:
        s.close()
    if len(data) < 12 or struct.unpack(">H", data[:2])[0] != qid:
        return None
    _id, flags, qd, an, _ns, _ar = struct.unpack(">HHHHHH", data[:12])
    if flags & 0xF not in (0, 3):  # NOERROR or NXDOMAIN
        return None
    off = 12

    def skip_name(off):
        while True:
            n = data[off]
            if n == 0:
                return off + 1
            if n & 0xC0 == 0xC0:
                return off + 2
            off += n + 1

    for _ in range(qd):
        off = skip_name(off) + 4
    addrs = []
    for _ in range(an):
        off = skip_name(off)
        rtype, _cls, _ttl, rdlen = struct.unpack(">HHIH", data[off:off + 10])
        off += 10
        if rtype == 1 and rdlen == 4:
            addrs.append(socket.inet_ntoa(data[off:off + 4]))
        off += rdlen
    return addrs


# ---------------------------------------------------------------------------------------
# The cluster
# ---------------------------------------------------------------------------------------

class Cluster:
    """Owns the lock, the bridge, dnsmasq, the IP allocator and every Pod namespace."""

    def __init__(self, tmp):
        self.tmp = tmp
        self.hostsdir = os.path.join(tmp, "dns-hosts")
        self.dns_staging = os.path.join(tmp, "dns-staging")
        self.dns_log = os.path.join(tmp, "dnsmasq.log")
        self.lock_fd = None
        self.dnsmasq = None
        self.namespaces = set()
        self.ip_next = 10  # IPs are never reused within a run: a recreated Pod gets a new one
        self.ip_lock = threading.Lock()
        self.dns_timers = []
        self.dns_published = {}  # name -> monotonic time dnsmasq first answered the record
        self.up = False

    # -- permission probe ----------------------------------------------------------------
    @staticmethod
    def probe_permissions():
        """Raises SimSkip when network namespaces cannot be used here."""
        if os.geteuid() != 0:
            raise SimSkip("network namespaces need root (running as uid %d)" % os.geteuid())
        for tool in ("ip", "unshare", "dnsmasq"):
            if shutil.which(tool) is None and not os.path.exists("/usr/sbin/" + tool):
                raise SimSkip("'%s' is not installed (scripts/install-deps.sh installs it)" % tool)
        name = NS_PREFIX + "probe-%d" % os.getpid()
        rc, out = sh("ip", "netns", "add", name, check_rc=False)
        if rc != 0:
            raise SimSkip("'ip netns add' is not permitted here: %s" % out.strip())
        sh("ip", "netns", "del", name, check_rc=False)

    # -- lock and stale state ------------------------------------------------------------
    def acquire_lock(self, timeout):
        os.makedirs(STATE_DIR, exist_ok=True)
        self.lock_fd = os.open(LOCK_PATH, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        deadline = time.monotonic() + timeout
        waited = False
        while True:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except OSError as e:
                if e.errno not in (errno.EAGAIN, errno.EACCES):
                    raise
            if not waited:
                log("another k8s-sim run holds %s; waiting for it" % LOCK_PATH)
                waited = True
            if time.monotonic() > deadline:
                raise SimFailure("another k8s-sim run held %s for more than %d s"
                                 % (LOCK_PATH, timeout))
            time.sleep(0.2)
        os.ftruncate(self.lock_fd, 0)
        os.write(self.lock_fd, b"%d\n" % os.getpid())

    def release_lock(self):
        if self.lock_fd is not None:
            try:
                fcntl.flock(self.lock_fd, fcntl.LOCK_UN)
                os.close(self.lock_fd)
            except OSError:
                pass
            self.lock_fd = None

    @staticmethod
    def remove_everything(verbose):
        """Removes every namespace, veth, bridge, /etc/netns entry and dnsmasq with our
        prefix, killing the processes inside the namespaces first. Idempotent. Only ever
        called while holding the lock (so nothing with the prefix belongs to a live run)."""
        removed = []
        _rc, out = sh("ip", "netns", "list", check_rc=False)
        for line in out.splitlines():
            ns = line.split()[0] if line.split() else ""
            if not ns.startswith(NS_PREFIX):
                continue
            _rc, pids = sh("ip", "netns", "pids", ns, check_rc=False)
            for p in pids.split():
                if p.isdigit():
                    kill(int(p), signal.SIGKILL)
            sh("ip", "netns", "del", ns, check_rc=False)
            removed.append("netns " + ns)
        if os.path.isdir("/etc/netns"):
            for d in os.listdir("/etc/netns"):
                if d.startswith(NS_PREFIX):
                    shutil.rmtree(os.path.join("/etc/netns", d), ignore_errors=True)
        _rc, out = sh("ip", "-o", "link", "show", check_rc=False)
        for line in out.splitlines():
            parts = line.split(":")
            if len(parts) < 2:
                continue
            dev = parts[1].strip().split("@")[0]
            if dev.startswith(VETH_PREFIX) or dev == BRIDGE:
                sh("ip", "link", "del", dev, check_rc=False)
                removed.append("link " + dev)
        try:
            with open(DNSMASQ_PID) as f:
                pid = int(f.read().strip() or "0")
            with open("/proc/%d/cmdline" % pid, "rb") as f:
                cmd = f.read()
            if b"dnsmasq" in cmd and MARKER.encode() in cmd:
                kill(pid, signal.SIGKILL)
                removed.append("dnsmasq %d" % pid)
        except (OSError, ValueError):
            pass
        try:
            os.unlink(DNSMASQ_PID)
        except OSError:
            pass
        if verbose and removed:
            log("removed leftovers of an earlier run: %s" % ", ".join(removed))

    # -- bring up / tear down ------------------------------------------------------------
    def setup(self, lock_timeout=60):
        self.acquire_lock(lock_timeout)
        self.remove_everything(verbose=True)
        _rc, route = sh("ip", "-o", "route", "show", "to", "match", BRIDGE_IP, check_rc=False)
        for line in route.splitlines():
            net = line.split()[0]
            if net != "default" and ipaddress.ip_network(net, strict=False).prefixlen >= 8:
                raise SimFailure("the Pod subnet %s.0/24 clashes with this host's route '%s'"
                                 % (SUBNET, line.strip()))
        self.up = True
        # A fixed MAC: by default a bridge takes the lowest MAC of its ports, so deleting a
        # Pod's veth could change it and leave every Pod with a stale ARP entry for the
        # node (and its DNS) for seconds, a fault no real cluster network has.
        sh("ip", "link", "add", BRIDGE, "address", BRIDGE_MAC, "type", "bridge")
        sh("ip", "addr", "add", BRIDGE_IP + "/24", "dev", BRIDGE)
        sh("ip", "link", "set", BRIDGE, "up")
        os.makedirs(self.hostsdir)
        os.makedirs(self.dns_staging)
        self.start_dns()

    def start_dns(self):
        """dnsmasq as the cluster DNS: authoritative for cluster.local from the files in
        hostsdir (re-read through inotify on every change), NXDOMAIN for any other name
        in the domain, no upstream servers, no negative caching, TTL 0."""
        conf = os.path.join(self.tmp, "dnsmasq.conf")
        with open(conf, "w") as f:
            f.write("# %s cluster DNS\n" % MARKER)
            for line in ("no-resolv", "no-hosts", "no-negcache", "no-poll", "bind-interfaces",
                         "listen-address=" + BRIDGE_IP, "port=53", "local=/%s/" % DOMAIN,
                         "domain-needed", "local-ttl=0", "cache-size=0", "user=root",
                         "hostsdir=" + self.hostsdir, "log-queries",
                         "log-facility=" + self.dns_log, "pid-file=" + DNSMASQ_PID):
                f.write(line + "\n")
        self.dns_log_f = open(os.path.join(self.tmp, "dnsmasq.out"), "wb")
        self.dnsmasq = subprocess.Popen(
            ["dnsmasq", "--keep-in-foreground", "--conf-file=" + conf],
            stdin=subprocess.DEVNULL, stdout=self.dns_log_f, stderr=subprocess.STDOUT,
            start_new_session=True)
        deadline = time.monotonic() + 10
        while dns_query_a("probe." + DOMAIN) is None:
            if self.dnsmasq.poll() is not None or time.monotonic() > deadline:
                raise SimFailure("dnsmasq did not start (exit %s): %s" % (
                    self.dnsmasq.poll(), open(os.path.join(self.tmp, "dnsmasq.out")).read()))
            time.sleep(0.05)
        log("cluster DNS: dnsmasq (pid %d) on %s:53, records in %s"
            % (self.dnsmasq.pid, BRIDGE_IP, self.hostsdir))

    def teardown(self):
        for t in self.dns_timers:
            t.cancel()
        if self.dnsmasq is not None and self.dnsmasq.poll() is None:
            self.dnsmasq.kill()
            try:
                self.dnsmasq.wait(5)
            except subprocess.TimeoutExpired:
                pass
        if self.up or self.lock_fd is not None:
            self.remove_everything(verbose=False)
        self.up = False
        self.release_lock()

    # -- addresses and DNS records -------------------------------------------------------
    def alloc_ip(self):
        with self.ip_lock:
            check(self.ip_next < 250, "the Pod subnet ran out of addresses")
            ip = "%s.%d" % (SUBNET, self.ip_next)
            self.ip_next += 1
            return ip

    def dns_set(self, pod_name, ip, wait=True):
        """Publishes (or changes) the Pod's A record; with wait, returns once dnsmasq
        answers it."""
        name = fqdn(pod_name)
        staged = os.path.join(self.dns_staging, pod_name)
        with open(staged, "w") as f:
            f.write("%s %s\n" % (ip, name))
        os.rename(staged, os.path.join(self.hostsdir, pod_name))  # atomic for inotify
        if wait:
            self._wait_dns(name, [ip])
        self.dns_published[name] = time.monotonic()
        log("DNS: %s -> %s" % (name, ip))

    def dns_delete(self, pod_name, wait=True):
        name = fqdn(pod_name)
        try:
            os.unlink(os.path.join(self.hostsdir, pod_name))
        except OSError:
            return
        if wait:
            self._wait_dns(name, [])
        log("DNS: %s removed" % name)

    def dns_set_service(self, service, ips):
        """A headless Service's own name with one A record per address in ips (the Ready
        endpoints it selects; none: the name does not resolve), as the endpoints controller
        and cluster DNS publish it; returns once dnsmasq answers the new set."""
        name = service_fqdn(service)
        path = os.path.join(self.hostsdir, "svc-" + service)
        if ips:
            staged = os.path.join(self.dns_staging, "svc-" + service)
            with open(staged, "w") as f:
                f.write("".join("%s %s\n" % (ip, name) for ip in ips))
            os.rename(staged, path)
        else:
            try:
                os.unlink(path)
            except OSError:
                pass
        self._wait_dns(name, list(ips))
        log("DNS: %s -> %s" % (name, ", ".join(ips) or "(no address)"))

    def dns_set_later(self, pod_name, ip, delay):
        """Publishes the record after delay seconds (a slow endpoints controller / DNS)."""
        t = threading.Timer(delay, self.dns_set, args=(pod_name, ip))
        t.daemon = True
        self.dns_timers.append(t)
        t.start()
        return t

    @staticmethod
    def _wait_dns(name, want, timeout=5.0):
        deadline = time.monotonic() + timeout
        while True:
            got = dns_query_a(name)
            if got is not None and sorted(got) == sorted(want):
                return
            if time.monotonic() > deadline:
                raise SimFailure("dnsmasq answers %r for %s, expected %r" % (got, name, want))
            time.sleep(0.02)

    # -- network namespaces ---------------------------------------------------------------
    def create_netns(self, ns, veth, ip, pod_name):
        """A Pod sandbox: namespace, veth pair (eth0 inside, veth on the bridge outside),
        its IP, a default route via the node, resolv.conf and the kubelet-managed hosts
        file (bind-mounted by `ip netns exec`)."""
        self.namespaces.add(ns)
        sh("ip", "netns", "add", ns)
        sh("ip", "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns)
        sh("ip", "link", "set", veth, "master", BRIDGE, "up")
        sh("ip", "-n", ns, "addr", "add", ip + "/24", "dev", "eth0")
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        sh("ip", "-n", ns, "link", "set", "eth0", "up")
        sh("ip", "-n", ns, "route", "add", "default", "via", BRIDGE_IP)
        etc = os.path.join("/etc/netns", ns)
        os.makedirs(etc, exist_ok=True)
        with open(os.path.join(etc, "resolv.conf"), "w") as f:
            f.write("nameserver %s\nsearch %s.svc.%s svc.%s %s\noptions ndots:5\n"
                    % (BRIDGE_IP, NAMESPACE, DOMAIN, DOMAIN, DOMAIN))
        with open(os.path.join(etc, "hosts"), "w") as f:
            f.write("# Kubernetes-managed hosts file (simulated).\n127.0.0.1\tlocalhost\n"
                    "%s\t%s\t%s\n" % (ip, fqdn(pod_name), pod_name))

    def delete_netns(self, ns, veth):
        _rc, pids = sh("ip", "netns", "pids", ns, check_rc=False)
        for p in pids.split():
            if p.isdigit():
                kill(int(p), signal.SIGKILL)
        sh("ip", "link", "del", veth, check_rc=False)
        sh("ip", "netns", "del", ns, check_rc=False)
        shutil.rmtree(os.path.join("/etc/netns", ns), ignore_errors=True)
        self.namespaces.discard(ns)

    @staticmethod
    def netns_pids(ns):
        _rc, pids = sh("ip", "netns", "pids", ns, check_rc=False)
        return [int(p) for p in pids.split() if p.isdigit()]

    @staticmethod
    def set_link(ns, up):
        """Cuts (or restores) the Pod's network: its eth0 goes down (up)."""
        sh("ip", "-n", ns, "link", "set", "eth0", "up" if up else "down")
        if up:
            # Taking the link down flushed the default route with it.
            sh("ip", "-n", ns, "route", "replace", "default", "via", BRIDGE_IP)


# ---------------------------------------------------------------------------------------
# Running one scenario (the entry points of k8s_sim.py and dp_sim.py)
# ---------------------------------------------------------------------------------------

def run_scenario(name, make_sim, body, deadline_s, intro=None):
    """Runs one scenario as a process: skips (77) where network namespaces are not
    permitted; otherwise builds the sim (make_sim()), logs intro(sim) when given, sets the
    cluster up, then under a deadline of deadline_s (SIGALRM, armed after the lock) runs
    body(sim) (the model, the scenario) and sim.shutdown(); on a failure prints the Pods'
    logs (sim.print_logs()); always sim.cleanup(). Exits the process: 0 pass, 1 fail."""
    try:
        Cluster.probe_permissions()
    except SimSkip as e:
        print("SKIP: %s" % e, flush=True)
        os._exit(77)

    def on_signal(sig, _frame):
        raise SimFailure("interrupted by signal %d" % sig)

    def on_alarm(_sig, _frame):
        raise SimFailure("the scenario exceeded its %d s deadline" % deadline_s)

    for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(s, on_signal)
    signal.signal(signal.SIGALRM, on_alarm)
    sim = make_sim()
    rc = 1
    try:
        if intro is not None:
            intro(sim)
        sim.cluster.setup()
        signal.alarm(deadline_s)  # after the lock: waiting for it has its own limit
        body(sim)
        sim.shutdown()
        signal.alarm(0)
        log("PASS %s" % name)
        rc = 0
    except SimFailure as e:
        signal.alarm(0)
        log("FAIL %s: %s" % (name, e))
        sim.print_logs()
    except Exception:  # a bug in the scenario itself is a failure too, with its trace
        signal.alarm(0)
        traceback.print_exc()
        log("FAIL %s: unexpected exception" % name)
        sim.print_logs()
    finally:
        signal.alarm(0)
        for s in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(s, signal.SIG_IGN)
        sim.cleanup()
    sys.stdout.flush()
    os._exit(rc)
