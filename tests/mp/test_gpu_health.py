#!/usr/bin/env python3
"""GPU health through the real agents, coordinator and workers, with the fake NVML
(tests/fake-nvml/) loaded by every worker through --nvml-library. Two agents of 2 workers
(4 ranks), 3 s heartbeat timeout; each node has its own fake configuration, into which the
test appends faults while the gang serves:

1. throttling on node 0's GPU 0: shows in /metrics (DCGM_FI_DEV_CLOCK_THROTTLE_REASONS,
   ganglion_gpu_throttled) and nothing else happens: same generation, no failure;
2. Xid 79 on node 1's GPU 1 (rank 3): the gang restarts well before the heartbeat timeout;
   the reason names the rank, the GPU and the Xid in the coordinator's /status, in node
   1's /status and termination log, and in node 1's fault metric; the fault was a single
   event, so /healthz stays 200 once the gang serves again;
3. Xid 79 plus a GPU that stops answering for good on node 1's GPU 0 (rank 2): the rank
   fails again at the next START, so the fault persisted across the restart and node 1's
   /healthz turns 503 (node 0's stays 200);
4. a second gang, one agent of 3 workers: a double-bit ECC count, pages pending retirement
   and rows pending remapping, one on each GPU for 1.5 s: each fails its rank (counted by
   kind in /metrics) and the gang serves again once they clear.
A non-fatal Xid (13) in phase 1 is counted in /metrics and changes nothing else."""
import os
import re
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NNODES, NPROC = 2, 2
HB_TIMEOUT_MS = 3000


def write_config(path, node):
    with open(path, "w") as f:
        for i in range(NPROC):
            f.write("gpu %d name=FakeH200 uuid=GPU-n%d-%d util=%d temp=50\n"
                    % (i, node, i, 10 * (i + 1)))


def append(path, line):
    with open(path, "a") as f:
        f.write(line + "\n")


def metric(text, name, **labels):
    """The value of the first sample of `name` whose labels include `labels`, or None."""
    for line in text.splitlines():
        m = re.match(r'^%s\{(.*)\} (\S+)$' % re.escape(name), line)
        if not m:
            continue
        got = dict(re.findall(r'(\w+)="([^"]*)"', m.group(1)))
        if all(got.get(k) == str(v) for k, v in labels.items()):
            return float(m.group(2))
    return None


def start(h, g, configs):
    for i in range(NNODES):
        argv = [h.bin, "serve"] + g.flags + [
            "--node-index", str(i), "--bind-address", H.local_address(i),
            "--coordinator", "127.0.0.1:%d" % g.rdzv_port]
        g.agents[i] = h.spawn("agent%d" % i, argv, (0,), {"FAKE_NVML_CONFIG": configs[i]})


def throttle_only(g, configs, gen):
    append(configs[0], "throttle 0 0x40 %d" % H.wall_ms())
    append(configs[0], "xid 1 13 %d" % H.wall_ms())

    def throttled():
        code, text = g.get(0, "/metrics")
        return code == 200 and metric(text, "DCGM_FI_DEV_CLOCK_THROTTLE_REASONS", gpu=0,
                                      rank=0) == 64 and \
            metric(text, "ganglion_gpu_throttled", gpu=0) == 1 and \
            metric(text, "ganglion_gpu_xid_errors_total", rank=1, xid=13) == 1

    H.wait_until(throttled, 5, 0.05, "the throttle reasons and Xid 13 in node 0's /metrics")
    st = g.status(0)
    H.check(st["generation"] == gen and st["last_failure"] is None,
            "throttling changed the gang: %r" % st)
    H.check(g.coord()["state"] == "serving", "gang not serving after throttling")
    g.assert_all_ready("after throttling")
    H.log("throttling and a non-fatal Xid: in /metrics only")


def xid_restart(h, g, configs, gen):
    t0 = H.wall_ms()
    append(configs[1], "xid 1 79 %d" % t0)

    def aborted():
        st = g.status(0)
        return st and st.get("last_abort_wall_ms", 0) >= t0 and st["last_abort_wall_ms"]

    abort_ms = H.wait_until(aborted, 5, 0.005, "the ABORT after Xid 79") - t0

    def restarted():
        c = g.coord()
        return c and c.get("generation", 0) > gen and c["state"] in ("starting", "serving")

    H.wait_until(restarted, 5, 0.005, "the coordinator to start the next generation")
    restart_ms = H.wall_ms() - t0
    gen2 = g.wait_serving(timeout=10, min_gen=gen)
    serving_ms = H.wall_ms() - t0
    H.log("Xid 79 -> ABORT on the coordinator after %d ms, next generation started after %d "
          "ms, serving generation %d after %d ms (heartbeat timeout %d ms)"
          % (abort_ms, restart_ms, gen2, serving_ms, HB_TIMEOUT_MS))
    H.check(restart_ms < 1000, "the gang restarted %d ms after the Xid, not within 1 s"
            % restart_ms)
    H.check(serving_ms < HB_TIMEOUT_MS,
            "the gang served again after %d ms, not before the heartbeat timeout" % serving_ms)
    lf = g.coord()["last_failure"]
    H.check(lf and lf["rank"] == 3 and lf["code"] == "GANG_EGPU",
            "coordinator last_failure: %r" % lf)
    for part in ("rank 3", "GPU 1", "GPU-n1-1", "Xid 79", "fallen off the bus"):
        H.check(part in lf["reason"], "%r missing from the reason %r" % (part, lf["reason"]))
    st1 = g.status(1)
    H.check(st1["last_failure"] and "Xid 79" in st1["last_failure"]["reason"],
            "node 1 /status: %r" % st1["last_failure"])
    with open(h.termination_log) as f:
        term = f.read()
    H.check("rank 3" in term and "Xid 79" in term, "termination log: %r" % term)
    code, text = g.get(1, "/metrics")
    H.check(metric(text, "ganglion_gpu_faults_total", rank=3, gpu=1, kind="xid_79") == 1,
            "fault metric missing:\n%s" % text)
    # The worker sends its sample with the failure; allow one heartbeat for the rest.
    H.wait_until(lambda: metric(g.get(1, "/metrics")[1], "ganglion_gpu_xid_errors_total",
                                rank=3, xid=79) == 1, 2, 0.05, "the Xid count in /metrics")
    code, text = g.get(1, "/metrics")
    H.check(metric(text, "DCGM_FI_DEV_XID_ERRORS", gpu=1, rank=3) == 79, "last Xid gauge")
    H.check(metric(text, "DCGM_FI_DEV_GPU_UTIL", gpu=1, UUID="GPU-n1-1") == 20,
            "DCGM utilisation gauge missing")
    for i in range(NNODES):
        code, body = g.get(i, "/healthz")
        H.check(code == 200, "node %d /healthz %s %r after a one-time fault" % (i, code, body))
    return gen2, serving_ms


def persistent_fault(g, configs, gen):
    t0 = H.wall_ms()
    append(configs[1], "xid 0 79 %d" % t0)
    append(configs[1], "lost 0 %d" % t0)

    def unhealthy():
        code, body = g.get(1, "/healthz")
        return code == 503 and body

    body = H.wait_until(unhealthy, 10, 0.02, "node 1 /healthz to fail")
    H.log("persistent fault: node 1 /healthz 503 %r after %d ms" % (body.strip(),
                                                                    H.wall_ms() - t0))
    H.check("GPU fault persists" in body, "healthz body %r" % body)
    st1 = g.status(1)
    H.check(st1["gpu_fault_persistent"] is True, "status: %r" % st1)
    H.check("GPU 0" in st1["gpu_fault"] and "rank 2" in st1["gpu_fault"], st1["gpu_fault"])
    H.check(st1["generation"] > gen, "no restart before /healthz failed")
    code, text = g.get(1, "/metrics")
    H.check(metric(text, "ganglion_gpu_fault_persistent") is None and
            "ganglion_gpu_fault_persistent 1" in text, "persistent metric missing")
    code, _ = g.get(0, "/healthz")
    H.check(code == 200, "node 0 /healthz %s: its GPUs are fine" % code)


def level_faults(h):
    config = os.path.join(h.tmp, "nvml-levels.conf")
    with open(config, "w") as f:
        for i in range(3):
            f.write("gpu %d uuid=GPU-l%d\n" % (i, i))
    g = H.Gang(h, nnodes=1, nproc_per_node=3, hb_interval_ms=500, hb_timeout_ms=HB_TIMEOUT_MS,
               extra=["--nvml-library", h.fake_nvml, "--gpu-health-interval-ms", "100",
                      "--max-restarts", "1000"])
    argv = [h.bin, "serve"] + g.flags + [
        "--node-index", "0", "--bind-address", H.local_address(0),
        "--coordinator", "127.0.0.1:%d" % g.rdzv_port]
    g.agents[0] = h.spawn("levels", argv, (0,), {"FAKE_NVML_CONFIG": config})
    gen = g.wait_serving(timeout=30)
    t0 = H.wall_ms()
    t1 = t0 + 1500
    append(config, "dbe 0 2 %d %d" % (t0, t1))
    append(config, "retired 1 %d %d" % (t0, t1))
    append(config, "remap 2 %d %d" % (t0, t1))
    want = {(0, "dbe"), (1, "retired_pending"), (2, "remap_pending")}

    def all_kinds():
        code, text = g.get(0, "/metrics")
        return code == 200 and all(
            (metric(text, "ganglion_gpu_faults_total", rank=r, gpu=r, kind=k) or 0) >= 1
            for r, k in want)

    H.wait_until(all_kinds, 5, 0.05, "a fault of every level kind in /metrics")
    H.log("level faults: dbe, retired_pending, remap_pending counted after %d ms"
          % (H.wall_ms() - t0))
    gen2 = g.wait_serving(timeout=10, min_gen=gen)
    H.check(H.wall_ms() >= t1, "the gang served while a level fault held")
    H.log("served generation %d again %d ms after the faults cleared" % (gen2, H.wall_ms() - t1))
    H.check(g.stop()[0] == 0, "agent did not exit 0")


def scenario(h):
    if not h.fake_nvml:
        raise H.TestSkip("no fake NVML library given (--fake-nvml)")
    configs = [os.path.join(h.tmp, "nvml-node%d.conf" % i) for i in range(NNODES)]
    for i, c in enumerate(configs):
        write_config(c, i)
    g = H.Gang(h, nnodes=NNODES, nproc_per_node=NPROC, hb_interval_ms=500,
               hb_timeout_ms=HB_TIMEOUT_MS,
               extra=["--nvml-library", h.fake_nvml, "--gpu-health-interval-ms", "200",
                      "--max-restarts", "1000"])
    open(h.termination_log, "w").close()  # kubelet creates it; the agent only writes it
    start(h, g, configs)
    gen = g.wait_serving(timeout=30)
    throttle_only(g, configs, gen)
    gen, _ = xid_restart(h, g, configs, gen)
    persistent_fault(g, configs, gen)
    codes = g.stop()
    H.check(all(c == 0 for c in codes.values()), "agents exited %r" % codes)
    level_faults(h)


if __name__ == "__main__":
    H.run(scenario)
