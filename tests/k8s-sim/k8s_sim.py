#!/usr/bin/env python3
"""The gang's life as Kubernetes Pods (tests/k8s-sim/README.md).

    python3 tests/k8s-sim/k8s_sim.py --bin build/bin/ganglion --scenario NAME

Pods are network namespaces on a Linux bridge with their own IPs, dnsmasq is the cluster
DNS of the headless Service, and a kubelet-like prober restarts containers on liveness
failures. Each scenario brings a StatefulSet of NNODES Pods up, injects one fault, and
asserts that the gang is READY again (coordinator /readyz 200, /status serving a new
generation, every Pod ready) and that POST /v1/completions answers 200 with max_tokens
token ids; it prints how long the recovery took. Like the manifests, the Pods pass
--api-key-file: the probes (which send no key) must keep working, the completion sends
the key, and the first one is also tried without it (401). Exit 0 pass, 1 fail, 77 skip (network
namespaces not permitted here).

GANG_SIM_NO_MODEL=1 serves without --model and checks only /readyz (development only:
the CTests never set it). GANG_SIM_KEEP=1 keeps the temp dir (logs) after the run.
GANG_SIM_NCCL=1 (the ctests k8s-sim-nccl-emu-* of the CUDA emulator's build, tests/cuda-emu/):
the Pods serve on --device cuda with the TP / PP groups over NCCL, each worker on its own
emulated GPU (GANG_EMU_DEVICES=2), the communicators formed across the Pods' network
namespaces from the unique id that rank 0 makes (the NCCL emulator reaches it over TCP);
kill-coordinator then runs 6 streams of 80 tokens instead of 16 of 400 (the emulator's
pace).
"""

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import (Cluster, SimFailure, check, fqdn, log, pid_alive,  # noqa: E402
                     pid_state, run_scenario)
from kubelet import (MIN_PROBE_TIMEOUT_S, TIME_SCALE, Pod, http_request,  # noqa: E402
                     load_probe_config, scaled, status_json)

SKIP = 77
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
SCENARIO_DEADLINE_S = 120      # CTest's TIMEOUT (200 s) is higher; fail cleanly before it kills us

# The gang: 3 Pods x 2 ranks, TP 2 inside each Pod, one pipeline stage per Pod.
NNODES, NPROC, TP, PP = 3, 2, 2, 3
MODEL_ARGS = ["--layers", "3", "--hidden", "64", "--heads", "4", "--kv-heads", "2",
              "--ffn", "128", "--vocab", "256", "--seed", "7"]
VOCAB = 256
MAX_TOKENS = 4
HB_INTERVAL_MS, HB_TIMEOUT_MS = 100, 1000

READY_TIMEOUT_S = 45           # from a fault to the gang serving again
COMPLETION_TIMEOUT_S = 30


class Sim:
    """One scenario's world: the cluster, the StatefulSet's Pods and the results."""

    def __init__(self, binary, scenario):
        self.bin = os.path.abspath(binary)
        self.scenario = scenario
        self.tmp = tempfile.mkdtemp(prefix="ganglion-k8s-sim-")
        self.cluster = Cluster(self.tmp)
        self.seed = (int(os.environ.get("GANG_SIM_SEED", "0")) or
                     (os.getpid() ^ int(time.time() * 1e6)) % 1000000007)
        self.rng = random.Random(self.seed)
        self.no_model = os.environ.get("GANG_SIM_NO_MODEL") == "1"
        self.model_dir = os.path.join(self.tmp, "model")
        self.token_path = os.path.join(self.tmp, "token")
        with open(self.token_path, "w") as f:
            f.write("".join(self.rng.choice("0123456789abcdef") for _ in range(48)) + "\n")
        os.chmod(self.token_path, 0o600)
        # The API key (k8s/base: Secret ganglion-api-key, --api-key-file).
        self.api_key = "".join(self.rng.choice("0123456789abcdef") for _ in range(40))
        self.api_key_path = os.path.join(self.tmp, "api-key")
        with open(self.api_key_path, "w") as f:
            f.write(self.api_key + "\n")
        os.chmod(self.api_key_path, 0o600)
        self.checked_401 = False
        self.probes, self.grace_s_manifest, self.probe_source = load_probe_config(REPO)
        self.grace_s = scaled(self.grace_s_manifest)
        self.pods = {}             # ordinal -> Pod (the current one)
        self.old_pods = []         # deleted Pods, for their logs
        self.template_extra = []   # arguments the Pod template adds (scenario 6 changes it)
        self.max_ctx = 64          # --max-ctx (scenario 7 streams longer answers)
        self.nccl_flags = []
        if os.environ.get("GANG_SIM_NCCL") == "1":
            self.nccl_flags = ["--device", "cuda", "--backend", "nccl", "--gpu-memory-mb", "256",
                               "--nccl-library", os.environ.get("GANGLION_NCCL_LIBRARY", ""),
                               "--cuda-library-dir",
                               os.environ.get("GANGLION_CUDA_LIBRARY_DIR", "")]
        self.results = []

    # -- the Pod template -----------------------------------------------------------------
    def spec(self, pod):
        argv = [self.bin, "serve",
                "--nnodes", str(NNODES), "--nproc-per-node", str(NPROC),
                "--tp", str(TP), "--pp", str(PP),
                "--bind-address", "0.0.0.0",
                "--heartbeat-interval-ms", str(HB_INTERVAL_MS),
                "--heartbeat-timeout-ms", str(HB_TIMEOUT_MS),
                "--abort-timeout-ms", "500", "--connect-timeout-ms", "1000",
                "--handshake-timeout-ms", "1000",
                "--dns-backoff-initial-ms", "50", "--dns-backoff-max-ms", "500",
                "--restart-backoff-ms", "20", "--restart-backoff-max-ms", "500",
                "--token-file", self.token_path, "--api-key-file", self.api_key_path,
                "--termination-log", pod.termination_log]
        if not self.no_model:
            argv += ["--model", self.model_dir, "--kv-cache-mb", "16", "--max-ctx",
                     str(self.max_ctx)]
        if os.environ.get("GANG_SIM_NODE_INDEX_FLAG") == "1":
            # Development aid only: identity from --node-index instead of the host name.
            argv += ["--node-index", str(pod.ordinal)]
        argv += self.nccl_flags + self.template_extra
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GANGLION_", "OMPI_", "PMIX_", "LWS_", "GANG_SIM_"))
               and k != "POD_NAMESPACE"}
        # The environment of k8s/base/statefulset.yaml: identity from the Pod's name (also
        # its host name), namespace and IP through the downward API.
        env.update({"POD_NAME": pod.name, "POD_NAMESPACE": "default", "POD_IP": pod.ip,
                    "GANGLION_SERVICE": "gang", "GANGLION_HOSTNAME": pod.name,
                    "GANGLION_ADVERTISE_ADDRESS": pod.ip, "GANGLION_JOB_NAME": "gang",
                    "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
        return argv, env

    def new_pod(self, ordinal, dns_after=0.0):
        pod = Pod(self, ordinal, self.spec, self.probes, self.grace_s, dns_after)
        self.pods[ordinal] = pod
        return pod

    # -- the model ------------------------------------------------------------------------
    def make_model(self):
        if self.no_model:
            log("GANG_SIM_NO_MODEL=1: serving WITHOUT a model, inference is NOT checked")
            return
        argv = [self.bin, "mkmodel", "--out", self.model_dir] + MODEL_ARGS
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        out = p.stdout.decode("utf-8", "replace").strip()
        check(p.returncode == 0, "`%s` exited %d: %s (GANG_SIM_NO_MODEL=1 runs the scenario "
              "without a model, for development only)" % (" ".join(argv), p.returncode, out))
        log("model: %s" % " ".join(argv[2:]))

    # -- observing the gang ---------------------------------------------------------------
    def coordinator(self):
        return self.pods[0]

    def gang_serving(self, min_gen):
        """The generation when the coordinator's /readyz is 200, its /status shows the gang
        serving a generation above min_gen, and every Pod's agent is READY in it."""
        c = self.coordinator()
        if http_request(c.ip, "/readyz", 1.0)[0] != 200:
            return None
        st = status_json(c.ip)
        g = st.get("gang") if st else None
        if not g or g.get("state") != "serving" or g.get("generation", 0) <= min_gen:
            return None
        gen = g["generation"]
        for pod in self.pods.values():
            ps = st if pod is c else status_json(pod.ip)
            if (not ps or ps.get("state") != "serving" or ps.get("ready") is not True
                    or ps.get("generation") != gen):
                return None
            if pod is not c and http_request(pod.ip, "/readyz", 1.0)[0] != 200:
                return None
        return gen

    def wait_gang(self, min_gen, t_fault, what, timeout=READY_TIMEOUT_S):
        """Waits for the gang to serve a generation above min_gen, then for kubelet to see
        every Pod Ready, then for a completion. Returns (gen, timings dict)."""
        deadline = time.monotonic() + timeout
        last = None
        while True:
            gen = None
            try:
                gen = self.gang_serving(min_gen)
            except (OSError, ValueError, KeyError, TypeError) as e:
                last = e
            if gen:
                break
            for p in self.pods.values():
                if p.last_exit and p.last_exit[0] in (2, 3):
                    # ganglion's "never retried" exits: a usage/config or model error will
                    # not go away by itself, however often kubelet restarts the container.
                    raise SimFailure("%s: %s's container exited %d (%s error, never retried): "
                                     "%s; its log: %s; Pods: %s" % (
                                         what, p.name, p.last_exit[0],
                                         "configuration" if p.last_exit[0] == 2 else "model",
                                         p.last_exit[1] or "(no termination message)",
                                         " | ".join(p.error_lines()) or "no ERROR line",
                                         self.pod_summary()))
            if time.monotonic() > deadline:
                raise SimFailure("%s: the gang did not serve a generation above %d within "
                                 "%.0f s (coordinator /status: %s)%s; Pods: %s" % (
                                     what, min_gen, timeout,
                                     json.dumps(status_json(self.coordinator().ip))[:1500],
                                     " (last error %r)" % last if last else "",
                                     self.pod_summary()))
            time.sleep(0.05)
        t_ready = time.monotonic()
        while not all(p.ready for p in self.pods.values()):
            if time.monotonic() > deadline:
                raise SimFailure("%s: the gang serves generation %d but kubelet's readiness "
                                 "probes do not see every Pod Ready: %s" % (
                                     what, gen, {p.name: p.ready for p in self.pods.values()}))
            time.sleep(0.02)
        t_kready = time.monotonic()
        self.completion(what)
        t_done = time.monotonic()
        timings = {"gang_ready_s": t_ready - t_fault, "pods_ready_s": t_kready - t_fault,
                   "completion_ok_s": t_done - t_fault, "generation": gen}
        log("%s: gang READY in generation %d after %.2f s; kubelet saw every Pod Ready after "
            "%.2f s; completion answered after %.2f s"
            % (what, gen, timings["gang_ready_s"], timings["pods_ready_s"],
               timings["completion_ok_s"]))
        return gen, timings

    def pod_summary(self):
        """kubectl-get-pods-like state of every Pod, for failure messages."""
        out = []
        for p in self.pods.values():
            st = status_json(p.ip, 0.5) or {}
            out.append("%s %s running=%s restarts=%d last_exit=%r agent_state=%s gen=%s" % (
                p.name, p.ip, p.running(), p.restart_count, p.last_exit, st.get("state"),
                st.get("generation")))
        return "; ".join(out)

    def completion(self, what):
        """POST /v1/completions on the coordinator must answer 200 with MAX_TOKENS ids."""
        if self.no_model:
            return
        body = json.dumps({"prompt": [1, 2, 3], "max_tokens": MAX_TOKENS})
        if not self.checked_401:
            code, text = http_request(self.coordinator().ip, "/v1/completions",
                                      COMPLETION_TIMEOUT_S, method="POST", body=body)
            check(code == 401, "%s: POST /v1/completions without the API key answered %s "
                  "(expected 401): %s" % (what, code, text[:300]))
            self.checked_401 = True
            log("%s: POST /v1/completions without the API key: 401 (the probes send none "
                "and pass)" % what)
        t = time.monotonic()
        code, text = http_request(self.coordinator().ip, "/v1/completions",
                                  COMPLETION_TIMEOUT_S, method="POST", body=body,
                                  headers={"Authorization": "Bearer " + self.api_key})
        check(code == 200, "%s: POST /v1/completions answered %s: %s" % (what, code, text[:500]))
        try:
            resp = json.loads(text)
        except ValueError:
            raise SimFailure("%s: /v1/completions answered 200 with a body that is not JSON: "
                             "%r" % (what, text[:500]))
        ids = find_token_ids(resp, MAX_TOKENS)
        check(ids is not None, "%s: /v1/completions answered 200 without a list of %d "
              "generated token ids: %s" % (what, MAX_TOKENS, text[:500]))
        check(all(0 <= i < VOCAB for i in ids), "%s: generated ids outside the vocabulary: %r"
              % (what, ids))
        log("%s: completion %r -> %r in %.0f ms" % (what, [1, 2, 3], ids,
                                                    (time.monotonic() - t) * 1000))

    def record(self, what, t_fault, timings, **extra):
        r = dict(scenario=self.scenario, step=what, **timings)
        r.update(extra)
        self.results.append(r)

    # -- bring-up and shut-down -----------------------------------------------------------
    def start_all(self, order=None, dns_delays=None, gap=(0.0, 0.0)):
        for i in (order or range(NNODES)):
            pod = self.new_pod(i, dns_delays[i] if dns_delays else 0.0)
            pod.start()
            if gap[1] > 0:
                time.sleep(self.rng.uniform(*gap))

    def bring_up(self):
        t0 = time.monotonic()
        self.start_all()
        r = self.wait_gang(0, t0, "bring-up")
        self.report_respawns("bring-up")
        return r

    def report_respawns(self, what):
        """Logs workers the agents respawned on their own (no gang failure needed one)."""
        re = {}
        for pod in self.pods.values():
            st = status_json(pod.ip) or {}
            n = sum(r.get("restarts", 0) for r in st.get("local_ranks", []))
            if n:
                re[pod.name] = n
        if re:
            log("%s: NOTE: agents respawned workers meanwhile: %s (see the container logs)"
                % (what, re))

    def shutdown(self):
        """Deletes every Pod gracefully; each agent must stop cleanly (exit 0) within the
        grace period, and nothing may stay alive in the Pods' namespaces."""
        problems = []
        for pod in self.pods.values():
            pod.stop_kubelet()
        for pod in self.pods.values():
            try:
                pod.agent_pid(timeout=0.2)
                running = True
            except SimFailure:
                running = False
            if not running:
                problems.append("%s: no container running at the end" % pod.name)
        procs = {}
        for pod in self.pods.values():
            with pod.lock:
                procs[pod.name] = pod.popen
        for pod in self.pods.values():
            try:
                kill_pid = pod.agent_pid(timeout=0.2)
                os.kill(kill_pid, signal.SIGTERM)
            except (SimFailure, OSError):
                pass
        deadline = time.monotonic() + max(self.grace_s, 3.0)
        for pod in self.pods.values():
            p = procs[pod.name]
            if p is None:
                continue
            try:
                p.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                problems.append("%s: the agent did not stop within the %.1f s grace period "
                                "after SIGTERM" % (pod.name, max(self.grace_s, 3.0)))
                continue
            if p.returncode != 0:
                problems.append("%s: the container exited %s after SIGTERM, expected 0"
                                % (pod.name, p.returncode))
            else:
                log("pod %s: agent stopped cleanly (exit 0)" % pod.name)
        for pod in self.pods.values():
            left = Cluster.netns_pids(pod.ns)
            if left:
                problems.append("%s: processes left in the namespace: %s" % (pod.name, left))
            pod.delete(grace_s=0.5)
        check(not problems, "; ".join(problems))

    def print_logs(self):
        if not self.pods and not self.old_pods:
            return
        for pod in self.old_pods + list(self.pods.values()):
            sys.stdout.write(pod.tail() + "\n")
        try:
            with open(self.cluster.dns_log) as f:
                lines = f.read().splitlines()
            sys.stdout.write("----- dnsmasq (last 15 lines) -----\n%s\n" % "\n".join(lines[-15:]))
        except OSError:
            pass
        sys.stdout.flush()

    def cleanup(self):
        for pod in list(self.pods.values()) + self.old_pods:
            pod.stop_evt.set()
            with pod.lock:
                pod.deleting = True
        self.cluster.teardown()
        for pod in list(self.pods.values()) + self.old_pods:
            with pod.lock:
                p = pod.popen
            if p is not None:
                try:
                    p.wait(3)  # reaps it; teardown killed everything in the namespaces
                except subprocess.TimeoutExpired:
                    log("pod %s: container process %d still alive after the clean-up"
                        % (pod.name, p.pid))
        if os.environ.get("GANG_SIM_KEEP") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            log("kept %s" % self.tmp)


def find_token_ids(obj, n):
    """The generated token ids in a completion response: a list of n ints under a key
    that names tokens, searched depth-first (the API's field names are not fixed yet)."""
    if isinstance(obj, dict):
        for k, v in obj.items():
            if ("token" in k or k in ("ids", "output", "generated")) and isinstance(v, list) \
                    and len(v) == n and all(isinstance(x, int) for x in v):
                return v
        for v in obj.values():
            r = find_token_ids(v, n)
            if r is not None:
                return r
    elif isinstance(obj, list):
        for v in obj:
            r = find_token_ids(v, n)
            if r is not None:
                return r
    return None


# ---------------------------------------------------------------------------------------
# Scenarios
# ---------------------------------------------------------------------------------------

def sc_start_order(sim):
    """(1) Pods start in random order, each one's DNS record appears 1-3 s after it."""
    order = list(range(NNODES))
    sim.rng.shuffle(order)
    delays = {i: round(sim.rng.uniform(1.0, 3.0), 2) for i in order}
    log("start order %s, DNS records late by %s s"
        % (["gang-%d" % i for i in order], [delays[i] for i in order]))
    t0 = time.monotonic()
    sim.start_all(order=order, dns_delays=delays, gap=(0.2, 0.8))
    gen, tm = sim.wait_gang(0, t0, "random start order")
    t_dns = sim.cluster.dns_published[fqdn("gang-0")] - t0
    t_last = max(sim.cluster.dns_published.values()) - t0
    log("the coordinator's DNS record appeared %.2f s and the last one %.2f s after the first "
        "Pod started; the gang was READY %.2f s after the coordinator's record"
        % (t_dns, t_last, tm["gang_ready_s"] - t_dns))
    sim.record("start-order", t0, tm, after_coordinator_dns_s=tm["gang_ready_s"] - t_dns,
               order=["gang-%d" % i for i in order], dns_delays_s=[delays[i] for i in order])
    check(all(p.restart_count == 0 for p in sim.pods.values()),
          "containers were restarted during bring-up: %s" % {
              p.name: p.restart_count for p in sim.pods.values()})


def sc_kill_worker(sim):
    """(2) kill -9 of one worker process inside a Pod: the agent respawns it, the gang
    re-forms; kubelet must not restart any container."""
    gen0, _ = sim.bring_up()
    pod = sim.pods[NNODES - 1]
    agent = pod.agent_pid()
    workers = pod.worker_pids()
    check(len(workers) == NPROC, "%s runs %d workers, expected %d: %s"
          % (pod.name, len(workers), NPROC, workers))
    victim = sorted(workers)[0]
    t0 = time.monotonic()
    os.kill(victim, signal.SIGKILL)
    log("kill -9 of worker pid %d (%s) in %s, generation %d"
        % (victim, " ".join(workers[victim][1:4]), pod.name, gen0))
    local = [a.split("=", 1)[1] for a in workers[victim] if a.startswith("--local-rank=")]
    gen, tm = sim.wait_gang(gen0, t0, "kill -9 worker")
    check(not pid_alive(victim), "the killed worker %d is still alive" % victim)
    lf = (status_json(sim.coordinator().ip) or {}).get("gang", {}).get("last_failure") or {}
    log("coordinator's last_failure: %s" % json.dumps(lf))
    if local:
        rank = pod.ordinal * NPROC + int(local[0])
        check(lf.get("rank") == rank, "the coordinator's last_failure names rank %r, expected "
              "the killed rank %d" % (lf.get("rank"), rank))
    check(pod.agent_pid() == agent, "%s's agent changed: the container was restarted" % pod.name)
    check(all(p.restart_count == 0 for p in sim.pods.values()),
          "kubelet restarted containers after a worker crash: %s" % {
              p.name: p.restart_count for p in sim.pods.values()})
    sim.record("kill-worker", t0, tm)


def sc_recreate_pod(sim):
    """(3) The coordinator's Pod is deleted and recreated with a NEW IP; its DNS record
    follows one second late. Every agent must re-resolve gang-0 and rejoin."""
    gen0, _ = sim.bring_up()
    old = sim.pods[0]
    old_ip = old.ip
    t0 = time.monotonic()
    rc = old.delete()
    sim.old_pods.append(old)
    log("deleted %s (IP %s, exit %s); recreating it" % (old.name, old_ip, rc))
    check(rc == 0, "the deleted Pod's agent exited %s after SIGTERM, expected 0" % rc)
    pod = sim.new_pod(0, dns_after=1.0)
    pod.start()
    check(pod.ip != old_ip, "the recreated Pod kept its IP")
    gen, tm = sim.wait_gang(gen0, t0, "recreate gang-0 with a new IP")
    log("gang-0 moved %s -> %s" % (old_ip, pod.ip))
    sim.record("recreate-pod", t0, tm, old_ip=old_ip, new_ip=pod.ip)


def sc_freeze_agent(sim):
    """(4) A whole agent frozen with SIGSTOP: /healthz stops answering, kubelet's liveness
    probe fails failureThreshold times, the container is SIGKILLed and started again."""
    gen0, _ = sim.bring_up()
    pod = sim.pods[1]
    agent = pod.agent_pid()
    t0 = time.monotonic()
    os.kill(agent, signal.SIGSTOP)
    deadline = time.monotonic() + 2
    while pid_state(agent) not in ("T", "t"):
        check(time.monotonic() < deadline, "the agent %d did not stop on SIGSTOP" % agent)
        time.sleep(0.01)
    log("SIGSTOP to %s's agent (pid %d) in generation %d" % (pod.name, agent, gen0))
    deadline = time.monotonic() + 30
    while pod.liveness_kills == 0:
        check(time.monotonic() < deadline, "kubelet did not restart the frozen container")
        time.sleep(0.02)
    t_kill = time.monotonic()
    log("liveness failed and the container was killed %.2f s after the freeze" % (t_kill - t0))
    gen, tm = sim.wait_gang(gen0, t0, "SIGSTOP agent")
    check(not pid_alive(agent), "the frozen agent %d is still alive" % agent)
    check(pod.restart_count >= 1, "the container was not restarted")
    sim.record("freeze-agent", t0, tm, liveness_kill_s=t_kill - t0)


def sc_partition(sim):
    """(5) One Pod cut off the network (its eth0 down) long enough for the gang to notice
    (longer than the heartbeat timeout), then restored."""
    gen0, _ = sim.bring_up()
    pod = sim.pods[NNODES - 1]
    # Twice the heartbeat timeout: long enough for every side to declare the other dead.
    # Whether kubelet's liveness probe (which crosses the same cut link) restarts the
    # container meanwhile depends on where its period falls; both outcomes must recover.
    cut_s = 2 * HB_TIMEOUT_MS / 1000.0
    t0 = time.monotonic()
    sim.cluster.set_link(pod.ns, up=False)
    log("%s cut off the network (eth0 down) for %.1f s, generation %d" % (pod.name, cut_s, gen0))
    noticed = None
    while time.monotonic() - t0 < cut_s:
        if noticed is None:
            st = status_json(sim.coordinator().ip, 0.5)
            g = st.get("gang") if st else None
            if g and (g.get("state") != "serving" or g.get("generation", 0) > gen0):
                noticed = time.monotonic() - t0
                log("the coordinator noticed after %.2f s (gang state %s)" % (noticed, g["state"]))
        time.sleep(0.05)
    t1 = time.monotonic()
    sim.cluster.set_link(pod.ns, up=True)
    log("%s's network restored" % pod.name)
    check(noticed is not None, "the coordinator still served generation %d after %.1f s "
          "without %s" % (gen0, cut_s, pod.name))
    kills0 = pod.liveness_kills
    gen, tm = sim.wait_gang(gen0, t1, "network cut and restored")
    # Probes that failed during the cut may still add up to failureThreshold: wait until
    # kubelet has decided (a liveness success that started after the restore, or a
    # restart), and if it restarted the container, the gang must re-form once more.
    deadline = time.monotonic() + 15
    while pod.liveness_kills == kills0:
        lp = pod.last_probe.get("liveness")
        if "liveness" not in sim.probes or (lp and lp[0] >= t1 and lp[1]):
            break
        check(time.monotonic() < deadline, "kubelet's liveness probe of %s neither succeeded "
              "nor restarted the container after the network came back" % pod.name)
        time.sleep(0.02)
    extra = {}
    if pod.liveness_kills != kills0:
        log("kubelet restarted %s: its liveness probe failed %d times across the cut"
            % (pod.name, sim.probes["liveness"]["failureThreshold"]))
        gen, tm2 = sim.wait_gang(gen, t1, "after kubelet's restart of %s" % pod.name)
        extra = {"after_liveness_restart_ready_s": tm2["gang_ready_s"]}
    log("containers restarted by kubelet: %s" % {
        p.name: p.restart_count for p in sim.pods.values()})
    sim.record("partition", t1, tm, cut_s=cut_s, noticed_s=noticed,
               restarts=pod.restart_count, **extra)


def sc_update(sim):
    """(6) An update of the StatefulSet: the Pod template changes an argument and every
    Pod of the gang is replaced at once (a gang cannot serve with mixed members, so the
    whole gang is replaced together); the new gang must become Ready."""
    gen0, _ = sim.bring_up()
    t0 = time.monotonic()
    old = list(sim.pods.values())
    sim.template_extra = ["--max-batch", "4"]
    for pod in old:  # all deleted at once: SIGTERM in parallel, then wait
        pod.stop_kubelet()
        sim.cluster.dns_delete(pod.name)
    rcs = {}
    ts = [threading.Thread(target=lambda p=pod: rcs.__setitem__(p.name, p.delete(keep_dns=True)))
          for pod in old]
    for t in ts:
        t.start()
    for t in ts:
        t.join(30)
    sim.old_pods += old
    log("old Pods deleted: exit codes %s" % rcs)
    check(all(rc == 0 for rc in rcs.values()), "old agents did not all exit 0 on SIGTERM: %s"
          % rcs)
    sim.pods = {}
    sim.start_all(order=range(NNODES), dns_delays={i: 0.3 for i in range(NNODES)})
    gen, tm = sim.wait_gang(0, t0, "replace every Pod with a changed argument")
    for pod in sim.pods.values():
        argv = open("/proc/%d/cmdline" % pod.agent_pid(), "rb").read().split(b"\0")
        check(b"--max-batch" in argv, "%s runs the old template: %r" % (pod.name, argv))
    log("every Pod runs the new template (old generation %d, new %d)" % (gen0, gen))
    sim.record("update-all-at-once", t0, tm)


def stream_tokens(ip, body, key, out, timeout=COMPLETION_TIMEOUT_S * 2):
    """POSTs body as a streamed completion to ip and appends each event's token ids to
    out["tokens"] as they arrive; out["done"] is set at [DONE], out["error"] on an error
    event or a failure. Runs in a thread."""
    import http.client
    try:
        conn = http.client.HTTPConnection(ip, 8000, timeout=timeout)
        conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
                     headers={"Content-Type": "application/json",
                              "Authorization": "Bearer " + key})
        r = conn.getresponse()
        if r.status != 200:
            out["error"] = "HTTP %d: %r" % (r.status, r.read()[:300])
            return
        for raw in r:
            line = raw.decode().strip()
            if not line.startswith("data: "):
                continue
            if line[6:] == "[DONE]":
                out["done"] = True
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                out["error"] = ev["error"]
                continue
            for ch in ev.get("choices", []):
                out["tokens"].extend(ch.get("tokens") or [])
        conn.close()
    except Exception as e:  # noqa: BLE001 (reported by the scenario)
        out["error"] = "%s: %s" % (type(e).__name__, e)


def sc_kill_coordinator(sim):
    """(7) A front door on every Pod (issue #14): 16 streamed requests run through Pods
    1..n (the client Service selects every Pod) when Pod 0, the coordinator, dies with its
    workers (SIGKILL of the container, as on a node failure) and is recreated with a new
    IP. The members keep their clients' requests and resubmit them to the re-formed gang:
    every stream completes, without an error, with exactly the healthy gang's tokens."""
    n_req, max_tokens = 16, 400
    if sim.nccl_flags:  # on the CUDA emulator: fewer and shorter streams (its pace)
        n_req, max_tokens = 6, 80
    sim.max_ctx = 512
    gen0, _ = sim.bring_up()
    bodies = [{"prompt": [1 + i, 2 + (i * 7) % 200, 3 + (i * 13) % 200], "max_tokens": max_tokens,
               "ignore_eos": True} for i in range(n_req)]
    want = []
    for b in bodies:  # the healthy gang's answers, through the coordinator
        code, text = http_request(sim.coordinator().ip, "/v1/completions", COMPLETION_TIMEOUT_S,
                                  method="POST", body=json.dumps(b),
                                  headers={"Authorization": "Bearer " + sim.api_key})
        check(code == 200, "healthy completion answered %s: %s" % (code, text[:300]))
        want.append(find_token_ids(json.loads(text), max_tokens))
    members = [sim.pods[i] for i in range(1, NNODES)]
    outs = [{"tokens": [], "done": False, "error": None} for _ in range(n_req)]
    threads = [threading.Thread(target=stream_tokens, daemon=True,
                                args=(members[i % len(members)].ip, bodies[i], sim.api_key,
                                      outs[i])) for i in range(n_req)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + COMPLETION_TIMEOUT_S
    while not all(len(o["tokens"]) >= 2 or o["error"] for o in outs):
        check(time.monotonic() < deadline, "the streams through Pods 1..%d did not start: %r"
              % (NNODES - 1, [(len(o["tokens"]), o["error"]) for o in outs]))
        time.sleep(0.002)
    old = sim.pods[0]
    t0 = time.monotonic()
    rc = old.delete(grace_s=0)
    at_kill = [len(o["tokens"]) for o in outs]
    sim.old_pods.append(old)
    log("SIGKILL of %s (agent and workers, exit %s) with the streams at %r of %d tokens"
        % (old.name, rc, at_kill, max_tokens))
    running = sum(1 for n in at_kill if n < max_tokens)
    check(running >= n_req // 2, "only %d of %d streams were still running when Pod 0 died: "
          "the scenario did not test what it should" % (running, n_req))
    pod = sim.new_pod(0, dns_after=0.5)
    pod.start()
    gen, tm = sim.wait_gang(gen0, t0, "Pod 0 killed and recreated")
    for t in threads:
        t.join(max(0.1, deadline + 60 - time.monotonic()))
    t_done = time.monotonic() - t0
    for i, o in enumerate(outs):
        check(o["error"] is None and o["done"], "stream %d (through %s) ended with %r after %d "
              "tokens" % (i, members[i % len(members)].name, o["error"], len(o["tokens"])))
        check(o["tokens"] == want[i], "stream %d (through %s) is not the healthy gang's answer: "
              "%d tokens, first difference at %s" % (
                  i, members[i % len(members)].name, len(o["tokens"]),
                  next((k for k, (a, b) in enumerate(zip(o["tokens"], want[i])) if a != b),
                       min(len(o["tokens"]), len(want[i])))))
    res = {}
    for m in members:
        code, text = http_request(m.ip, "/metrics", 2.0)
        for ln in text.splitlines() if code == 200 else []:
            if ln.startswith(("ganglion_forwarded_requests_total ",
                              "ganglion_forwarded_resubmits_total ",
                              "ganglion_forwarded_requests_lost_total ")):
                k, v = ln.split()
                res[k] = res.get(k, 0) + float(v)
    log("all %d streams through Pods 1..%d completed with the healthy gang's tokens %.2f s "
        "after Pod 0 died (%d were mid-stream); members' metrics %r"
        % (n_req, NNODES - 1, t_done, running, res))
    check(res.get("ganglion_forwarded_requests_lost_total", 0) == 0 and
          res.get("ganglion_forwarded_resubmits_total", 0) >= running,
          "members' forwarding metrics %r" % res)
    sim.record("kill-coordinator", t0, tm, streams=n_req, mid_stream=running,
               streams_done_s=t_done)


SCENARIOS = {
    "start-order": sc_start_order,
    "kill-worker": sc_kill_worker,
    "recreate-pod": sc_recreate_pod,
    "freeze-agent": sc_freeze_agent,
    "partition": sc_partition,
    "update": sc_update,
    "kill-coordinator": sc_kill_coordinator,
}


# ---------------------------------------------------------------------------------------
# Entry point
# ---------------------------------------------------------------------------------------

def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="path to the ganglion binary")
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    args = ap.parse_args()
    name = "k8s-sim-" + args.scenario
    if not os.access(args.bin, os.X_OK):
        print("FAIL: %s is not an executable ganglion binary" % args.bin)
        sys.exit(1)

    def intro(sim):
        log("%s: probes from %s; time scale %.2f (1 manifest second = %.0f ms), probe "
            "timeouts at least %.1f s; GANG_SIM_SEED=%d" % (
                name, sim.probe_source, TIME_SCALE, TIME_SCALE * 1000, MIN_PROBE_TIMEOUT_S,
                sim.seed))
        for kind, p in sorted(sim.probes.items()):
            log("  %s probe %s: initialDelay %.2f s, period %.2f s, timeout %.2f s, failure "
                "threshold %d" % (kind, p["path"], scaled(p["initialDelaySeconds"]),
                                  scaled(p["periodSeconds"]),
                                  max(MIN_PROBE_TIMEOUT_S, scaled(p["timeoutSeconds"])),
                                  p["failureThreshold"]))

    def body(sim):
        sim.make_model()
        SCENARIOS[args.scenario](sim)
        for r in sim.results:
            log("RESULT %s" % json.dumps(r, sort_keys=True))

    run_scenario(name, lambda: Sim(args.bin, args.scenario), body, SCENARIO_DEADLINE_S, intro)


if __name__ == "__main__":
    main()
