#!/usr/bin/env python3
"""Data-parallel replicas behind `ganglion router`, as Kubernetes runs them (issue #26).

    python3 tests/k8s-sim/dp_sim.py --bin build/bin/ganglion --scenario NAME

The Pods, DNS and kubelet of k8s_sim.py (README.md), here with several gangs: gang "a",
"b", ... is a StatefulSet of NNODES Pods ("a-0", "a-1") behind its own headless Service,
plus one router Pod running `ganglion router --replicas-dns replicas...:8000`, where
"replicas" is a headless Service that selects Pod 0 of every gang and publishes only
Ready ones (publishNotReadyAddresses: false): the simulated endpoints controller keeps its
A records equal to the Ready Pod 0s, as k8s/overlays/data-parallel-router does on a
cluster. Scenarios:

  dp-kill-pod0  12 unstreamed calls through the router while gang a's Pod 0 is killed
                (SIGKILL, recreated with a new IP): every call answers 200 with exactly the
                healthy tokens (the router moves A's unanswered calls to B), and A serves
                again through the router once its Pod 0 is back.
  dp-scale      2 replicas serving, then a third gang is created: the router finds it
                through DNS without a restart and routes calls to it; all answers right.
  pd-kill-decode  disaggregated: gang p (--role prefill) and decode gangs d and e
                (--role decode) behind the router; a long greedy stream through the
                router, and at its first token the decode gang serving it loses its Pod 0
                (SIGKILL, recreated by its StatefulSet later): the router resumes the call
                through p on the other decode gang, and the client's one stream ends with
                [DONE] and exactly the healthy tokens, none twice.

Exit 0 pass, 1 fail, 77 skip (network namespaces not permitted here).
"""

import argparse
import http.client
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
import shutil
import signal

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cluster import Cluster, SimFailure, check, log, run_scenario, service_fqdn  # noqa: E402
from kubelet import Pod, http_request, load_probe_config, scaled, status_json  # noqa: E402
from k8s_sim import HB_INTERVAL_MS, MODEL_ARGS, REPO, find_token_ids  # noqa: E402

SKIP = 77
SCENARIO_DEADLINE_S = 150      # CTest's TIMEOUT (240 s) is higher
NNODES = 2                     # each gang: 2 Pods x 1 rank, PP 2
REPLICAS_SERVICE = "replicas"  # the headless Service of every gang's Pod 0 (the router's)
ROUTER_ORDINAL = 90            # only names the router Pod's veth
READY_TIMEOUT_S = 60
CALL_TIMEOUT_S = 60
N_CALLS, MAX_TOKENS = 12, 160
# These scenarios hold a gang's workers with SIGSTOP while they wait for the router to show
# calls in flight (Held): that wait took over a second on a loaded CI machine, and with the
# single-gang scenarios' 1 s heartbeat the held worker was declared dead and its gang
# aborted before the kill the scenario is about. Failure detection is not what these test
# (a killed Pod's peers see its sockets close), so the heartbeat gets room for the hold.
HB_TIMEOUT_MS = 6000


class DPSim:
    """One scenario's world: the cluster, the gangs' Pods, the router Pod."""

    def __init__(self, binary, scenario):
        self.bin = os.path.abspath(binary)
        self.scenario = scenario
        self.tmp = tempfile.mkdtemp(prefix="ganglion-dp-sim-")
        self.cluster = Cluster(self.tmp)
        self.model_dir = os.path.join(self.tmp, "model")
        self.token_path = self._secret("token", os.urandom(24).hex())
        self.api_key = os.urandom(20).hex()
        self.api_key_path = self._secret("api-key", self.api_key)
        self.probes, grace, _ = load_probe_config(REPO)
        self.grace_s = scaled(grace)
        self.gangs = {}            # gang name -> {ordinal: Pod}
        self.roles = {}            # gang name -> its --role (P/D), when not both
        self.router = None
        self.old_pods = []
        self.endpoints = None      # the "replicas" Service's published addresses
        self.stop_evt = threading.Event()
        self.ctl = None

    def _secret(self, name, value):
        path = os.path.join(self.tmp, name)
        with open(path, "w") as f:
            f.write(value + "\n")
        os.chmod(path, 0o600)
        return path

    # -- Pod templates ----------------------------------------------------------------
    def gang_spec(self, pod):
        gang = pod.name.rsplit("-", 1)[0]
        argv = [self.bin, "serve", "--nnodes", str(NNODES), "--nproc-per-node", "1",
                "--tp", "1", "--pp", str(NNODES), "--bind-address", "0.0.0.0",
                "--heartbeat-interval-ms", str(HB_INTERVAL_MS),
                "--heartbeat-timeout-ms", str(HB_TIMEOUT_MS),
                "--abort-timeout-ms", "500", "--connect-timeout-ms", "1000",
                "--handshake-timeout-ms", "1000",
                "--dns-backoff-initial-ms", "50", "--dns-backoff-max-ms", "500",
                "--restart-backoff-ms", "20", "--restart-backoff-max-ms", "500",
                "--token-file", self.token_path, "--api-key-file", self.api_key_path,
                "--termination-log", pod.termination_log,
                "--model", self.model_dir, "--kv-cache-mb", "16", "--max-ctx", "512"]
        if gang in self.roles:
            argv += ["--role", self.roles[gang]]
        return argv, self._env(pod, gang)

    def router_spec(self, pod):
        argv = [self.bin, "router", "--http-port", "8000", "--bind-address", "0.0.0.0",
                "--replicas-dns", "%s:8000" % service_fqdn(REPLICAS_SERVICE),
                "--dns-interval-ms", "200", "--poll-interval-ms", "100",
                "--poll-timeout-ms", "500", "--connect-timeout-ms", "500",
                "--request-timeout-ms", str(CALL_TIMEOUT_S * 1000)]
        return argv, self._env(pod, None)

    @staticmethod
    def _env(pod, gang):
        env = {k: v for k, v in os.environ.items()
               if not k.startswith(("GANGLION_", "OMPI_", "PMIX_", "LWS_", "GANG_SIM_"))
               and k != "POD_NAMESPACE"}
        env.update({"POD_NAME": pod.name, "POD_NAMESPACE": "default", "POD_IP": pod.ip,
                    "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"})
        if gang is not None:
            env.update({"GANGLION_SERVICE": gang, "GANGLION_HOSTNAME": pod.name,
                        "GANGLION_ADVERTISE_ADDRESS": pod.ip, "GANGLION_JOB_NAME": gang})
        return env

    def new_gang_pod(self, gang, ordinal, dns_after=0.0):
        pod = Pod(self, ordinal, self.gang_spec, self.probes, self.grace_s, dns_after,
                  name="%s-%d" % (gang, ordinal))
        self.gangs.setdefault(gang, {})[ordinal] = pod
        pod.start()
        return pod

    def start_gang(self, gang):
        for i in range(NNODES):
            self.new_gang_pod(gang, i)

    def start_router(self):
        self.router = Pod(self, ROUTER_ORDINAL, self.router_spec, self.probes, self.grace_s,
                          None, name="router-0")
        self.router.start()

    def make_model(self):
        argv = [self.bin, "mkmodel", "--out", self.model_dir] + MODEL_ARGS
        p = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        check(p.returncode == 0, "mkmodel exited %d: %s" % (p.returncode, p.stdout[-500:]))

    # -- the endpoints controller of the "replicas" Service ------------------------------
    def ready_pod0s(self):
        return sorted(g[0].ip for g in self.gangs.values() if 0 in g and g[0].ready)

    def endpoints_loop(self):
        while not self.stop_evt.wait(0.1):
            ips = self.ready_pod0s()
            if ips != self.endpoints:
                try:
                    self.cluster.dns_set_service(REPLICAS_SERVICE, ips)
                    self.endpoints = ips
                except SimFailure as e:  # tried again on the next round
                    log("endpoints controller: %s" % e)

    def start_controller(self):
        self.ctl = threading.Thread(target=self.endpoints_loop, daemon=True, name="endpoints")
        self.ctl.start()

    # -- observing ------------------------------------------------------------------------
    def router_replicas(self):
        """{"IP:8000": replica entry} of the router's /status (the entry's name)."""
        st = status_json(self.router.ip)
        return {r["name"]: r for r in (st or {}).get("replicas", [])}

    def wait_router_sees(self, gangs, what, timeout=READY_TIMEOUT_S):
        """Waits until the router has every gang of gangs up at its Pod 0's current IP."""
        deadline = time.monotonic() + timeout
        while True:
            reps = self.router_replicas()
            want = ["%s:8000" % self.gangs[g][0].ip for g in gangs]
            if all(reps.get(a, {}).get("up") for a in want):
                return reps
            check(time.monotonic() < deadline, "%s: the router does not see %s up within %.0f "
                  "s: its replicas %s; Pods ready %s" % (
                      what, want, timeout, json.dumps(reps)[:800],
                      {p.name: p.ready for g in self.gangs.values() for p in g.values()}))
            time.sleep(0.05)

    def router_counter(self, name):
        """A counter of the router's /metrics (0 when absent)."""
        code, text = http_request(self.router.ip, "/metrics", 2.0)
        check(code == 200, "router /metrics answered %s" % code)
        for ln in text.splitlines():
            if ln.startswith(name + " "):
                return float(ln.split()[1])
        return 0.0

    def call(self, ip, body, timeout=CALL_TIMEOUT_S):
        code, text = http_request(ip, "/v1/completions", timeout, method="POST",
                                  body=json.dumps(body),
                                  headers={"Authorization": "Bearer " + self.api_key})
        if code != 200:
            return code, text[:300]
        return code, find_token_ids(json.loads(text), body["max_tokens"])

    def stream(self, body, on_token=None, timeout=CALL_TIMEOUT_S):
        """(tokens, done, error event or None) of body streamed through the router;
        on_token() after each event with tokens."""
        conn = http.client.HTTPConnection(self.router.ip, 8000, timeout=timeout)
        conn.request("POST", "/v1/completions", body=json.dumps(dict(body, stream=True)),
                     headers={"Content-Type": "application/json",
                              "Authorization": "Bearer " + self.api_key})
        r = conn.getresponse()
        check(r.status == 200, "the stream answered %s" % r.status)
        toks, done, err = [], False, None
        for raw in r:
            line = raw.decode().rstrip("\r\n")
            if not line:
                continue
            check(line.startswith("data: ") and not done and err is None,
                  "an SSE line out of place: %r" % line[:200])
            if line[6:] == "[DONE]":
                done = True
                continue
            ev = json.loads(line[6:])
            if "error" in ev:
                err = ev
                continue
            for ch in ev.get("choices", []):
                toks += ch.get("tokens", [])
            if on_token is not None and toks:
                on_token()
        conn.close()
        return toks, done, err

    def bodies(self, salt):
        return [{"prompt": [1 + i, 5 + (i * 7 + salt) % 200, 3 + (i * 13) % 200],
                 "max_tokens": MAX_TOKENS, "ignore_eos": True} for i in range(N_CALLS)]

    def healthy(self, gang, bodies):
        """The answers of gang's own coordinator, one call at a time (the reference)."""
        want = []
        for b in bodies:
            code, ids = self.call(self.gangs[gang][0].ip, b)
            check(code == 200 and ids, "healthy call on gang %s answered %s %s" % (gang, code, ids))
            want.append(ids)
        return want

    def calls_through_router(self, bodies):
        """Starts one thread per body posting it through the router; returns (threads, outs)."""
        outs = [{} for _ in bodies]

        def run(i):
            outs[i]["result"] = self.call(self.router.ip, bodies[i])

        threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(len(bodies))]
        for t in threads:
            t.start()
        return threads, outs

    def check_answers(self, what, threads, outs, want):
        for t in threads:
            t.join(CALL_TIMEOUT_S + 5)
        for i, o in enumerate(outs):
            code, ids = o.get("result", (None, "no answer"))
            check(code == 200, "%s: call %d answered %s: %s" % (what, i, code, ids))
            check(ids == want[i], "%s: call %d is not the healthy answer (first difference at "
                  "%s)" % (what, i, next((k for k, (x, y) in enumerate(zip(ids or [], want[i]))
                                          if x != y), "the length")))

    # -- shut-down ------------------------------------------------------------------------
    def all_pods(self):
        return [p for g in self.gangs.values() for p in g.values()] + (
            [self.router] if self.router else [])

    def shutdown(self):
        """Deletes every Pod gracefully: each agent and the router must exit 0."""
        self.stop_evt.set()
        problems = []
        for pod in self.all_pods():
            rc = pod.delete(grace_s=max(self.grace_s, 3.0))
            if rc != 0:
                problems.append("%s exited %s on SIGTERM" % (pod.name, rc))
        check(not problems, "; ".join(problems))

    def cleanup(self):
        self.stop_evt.set()
        for pod in self.all_pods() + self.old_pods:
            pod.stop_evt.set()
            with pod.lock:
                pod.deleting = True
        self.cluster.teardown()
        if os.environ.get("GANG_SIM_KEEP") != "1":
            shutil.rmtree(self.tmp, ignore_errors=True)
        else:
            log("kept %s" % self.tmp)

    def print_logs(self):
        for pod in self.old_pods + self.all_pods():
            sys.stdout.write(pod.tail() + "\n")
        sys.stdout.flush()


def bring_up(sim, gangs):
    t0 = time.monotonic()
    sim.start_controller()
    for g in gangs:
        sim.start_gang(g)
    sim.start_router()
    sim.wait_router_sees(gangs, "bring-up")
    log("bring-up: gangs %s serving behind the router after %.2f s"
        % (", ".join(gangs), time.monotonic() - t0))


def replica_of(sim, gang):
    return "%s:8000" % sim.gangs[gang][0].ip


class Held:
    """Holds the workers of the given Pods with SIGSTOP (at once, or at hold()) until
    release() (idempotent) or the end of a with block: the calls on their gangs cannot
    finish, so a kill that follows finds them in flight however fast the machine is (the
    tiny model answers a call in a few ms on a quiet machine, faster than the router's
    table can be polled)."""

    def __init__(self, pods, now=True):
        self.pids = [pid for p in pods for pid in p.worker_pids()]
        check(self.pids, "no worker to hold in %s" % ", ".join(p.name for p in pods))
        if now:
            self.hold()

    def hold(self):
        for pid in self.pids:
            os.kill(pid, signal.SIGSTOP)

    def release(self):
        pids, self.pids = self.pids, []
        for pid in pids:
            try:
                os.kill(pid, signal.SIGCONT)
            except ProcessLookupError:
                pass

    def __enter__(self):
        return self

    def __exit__(self, *_exc):
        self.release()


def sc_dp_kill_pod0(sim):
    bring_up(sim, ["a", "b"])
    bodies = sim.bodies(0)
    want = sim.healthy("b", bodies)
    with Held([sim.gangs["a"][1]]):  # gang a's last pipeline stage
        threads, outs = sim.calls_through_router(bodies)
        deadline = time.monotonic() + CALL_TIMEOUT_S
        while sim.router_replicas().get(replica_of(sim, "a"), {}).get("in_flight", 0) < 2:
            check(time.monotonic() < deadline, "the router never had 2 calls in flight on "
                  "gang a: %s" % json.dumps(sim.router_replicas())[:600])
            time.sleep(0.005)
        old = sim.gangs["a"][0]
        in_flight = sim.router_replicas()[replica_of(sim, "a")]["in_flight"]
        t0 = time.monotonic()
        old.delete(grace_s=0)
        sim.old_pods.append(old)
    log("SIGKILL of a-0 (gang a's coordinator) with %d calls in flight on it (a-1's worker "
        "held with SIGSTOP until then)" % in_flight)
    sim.new_gang_pod("a", 0, dns_after=0.5)
    sim.check_answers("calls through the router while a-0 died", threads, outs, want)
    t_answered = time.monotonic() - t0
    moved = sim.router_replicas()
    retries = sim.router_counter("ganglion_router_retries_total")
    check(retries >= 1, "no call was moved off gang a (ganglion_router_retries_total %s): the "
          "calls in flight there finished before the kill, the scenario tested nothing" % retries)
    log("all %d calls answered with the healthy tokens %.2f s after a-0 died" %
        (N_CALLS, t_answered))
    sim.wait_router_sees(["a", "b"], "a-0 recreated")
    t_back = time.monotonic() - t0
    before = sim.router_replicas()[replica_of(sim, "a")]["requests"]
    bodies2 = sim.bodies(1)
    want2 = sim.healthy("b", bodies2)
    threads, outs = sim.calls_through_router(bodies2)
    sim.check_answers("calls after gang a came back", threads, outs, want2)
    after = sim.router_replicas()[replica_of(sim, "a")]["requests"]
    check(after > before, "the router sent nothing to gang a after it came back (%s -> %s)"
          % (before, after))
    log("RESULT %s" % json.dumps({"scenario": "dp-kill-pod0", "in_flight_on_a": in_flight,
                                  "moved": retries,
                                  "all_answered_s": round(t_answered, 2),
                                  "a_back_in_router_s": round(t_back, 2),
                                  "a_requests_after": after - before,
                                  "replicas": {k: v.get("requests") for k, v in moved.items()}}))


def sc_dp_scale(sim):
    bring_up(sim, ["a", "b"])
    t0 = time.monotonic()
    sim.start_gang("c")
    reps = sim.wait_router_sees(["a", "b", "c"], "scale 2 -> 3")
    t_seen = time.monotonic() - t0
    check(len([r for r in reps.values() if r.get("up")]) == 3, "replicas %s" % reps)
    bodies = sim.bodies(2)
    want = sim.healthy("a", bodies)
    threads, outs = sim.calls_through_router(bodies)
    sim.check_answers("calls through 3 replicas", threads, outs, want)
    got = sim.router_replicas().get(replica_of(sim, "c"), {}).get("requests", 0)
    check(got > 0, "the router sent none of %d concurrent calls to the new gang c: %s"
          % (N_CALLS, json.dumps(sim.router_replicas())[:600]))
    log("RESULT %s" % json.dumps({"scenario": "dp-scale", "c_routed_after_s": round(t_seen, 2),
                                  "calls_on_c": got}))


def pd_try_kill(sim, body):
    """Streams body through the router; at its first token read, the decode gang serving it
    loses its Pod 0 (SIGKILL). (the stream's result, the victim gang or None when the stream
    was no longer in flight on a decode gang)."""
    first, res, victim = threading.Event(), [], []
    # The decode gangs' last stages are held from the first token read to the kill, so the
    # stream cannot run to its end while the router's table is read.
    held = Held([sim.gangs[g][1] for g in ("d", "e")], now=False)

    def on_token():
        if first.is_set():
            return
        first.set()
        held.hold()
        reps, deadline = sim.router_replicas(), time.monotonic() + 5
        serving = [g for g in ("d", "e") if reps.get(replica_of(sim, g), {}).get("in_flight")]
        while not serving and time.monotonic() < deadline:  # the hand-over may lag the token
            time.sleep(0.005)
            reps = sim.router_replicas()
            serving = [g for g in ("d", "e")
                       if reps.get(replica_of(sim, g), {}).get("in_flight")]
        if len(serving) == 1:
            old = sim.gangs[serving[0]][0]
            old.delete(grace_s=0)
            sim.old_pods.append(old)
            victim.append(serving[0])
        held.release()

    with held:
        t = threading.Thread(target=lambda: res.append(sim.stream(body, on_token)),
                             daemon=True)
        t.start()
        t.join(CALL_TIMEOUT_S + 5)
    check(res, "the stream through the router did not end")
    return res[0], (victim[0] if victim else None)


def sc_pd_kill_decode(sim):
    sim.roles = {"p": "prefill", "d": "decode", "e": "decode"}
    bring_up(sim, ["p", "d", "e"])
    deadline = time.monotonic() + READY_TIMEOUT_S
    while not (status_json(sim.router.ip) or {}).get("disaggregated"):
        check(time.monotonic() < deadline, "the router never saw a prefill and a decode gang")
        time.sleep(0.05)
    body = {"prompt": [2 + (k * 5 + 3) % 200 for k in range(40)], "max_tokens": 400,
            "ignore_eos": True}
    want = sim.healthy("d", [body])[0]
    check(sim.healthy("e", [body])[0] == want, "the two decode gangs answer differently")
    resumes0 = sim.router_counter("ganglion_router_stream_resumes_total")
    t0 = time.monotonic()
    for _ in range(3):
        (toks, done, err), victim = pd_try_kill(sim, body)
        if victim is not None:
            break
        check(done and toks == want, "an uncut stream is not the healthy answer")
        log("the stream was through before its first token was read; again")
    check(victim is not None, "the stream was never in flight on a decode gang at its first "
          "token: the scenario tested nothing")
    t_stream = time.monotonic() - t0
    log("SIGKILL of %s-0 (the decode gang serving the stream) at its first token" % victim)
    check(err is None and done, "the stream after %s-0 died: done %s, error %s"
          % (victim, done, err))
    check(toks == want, "the resumed stream is not the healthy answer (%d tokens, first "
          "difference at %s)" % (len(toks), next((k for k, (x, y) in enumerate(zip(toks, want))
                                                  if x != y), "the length")))
    resumes = sim.router_counter("ganglion_router_stream_resumes_total") - resumes0
    check(resumes == 1, "ganglion_router_stream_resumes_total grew by %s" % resumes)
    log("the stream resumed on the other decode gang: %d tokens, all healthy, in %.2f s"
        % (len(toks), t_stream))
    sim.new_gang_pod(victim, 0, dns_after=0.5)  # the StatefulSet recreates it
    sim.wait_router_sees(["p", "d", "e"], "%s-0 recreated" % victim)
    log("RESULT %s" % json.dumps({"scenario": "pd-kill-decode", "victim": victim,
                                  "tokens": len(toks), "resumes": resumes,
                                  "stream_s": round(t_stream, 2)}))


SCENARIOS = {"dp-kill-pod0": sc_dp_kill_pod0, "dp-scale": sc_dp_scale,
             "pd-kill-decode": sc_pd_kill_decode}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--bin", required=True, help="path to the ganglion binary")
    ap.add_argument("--scenario", required=True, choices=sorted(SCENARIOS))
    args = ap.parse_args()
    name = "k8s-sim-" + args.scenario

    def body(sim):
        sim.make_model()
        SCENARIOS[args.scenario](sim)

    run_scenario(name, lambda: DPSim(args.bin, args.scenario), body, SCENARIO_DEADLINE_S)


if __name__ == "__main__":
    main()
