#!/usr/bin/env python3
"""GPU placement with the fake NVML (tests/fake-nvml/): a node of 8 GPUs on 2 NUMA nodes
(GPUs 0-3 and 4-7) whose NVLink pairs are (0,2) (1,3) (4,6) (5,7), served as one agent with
8 workers in TP groups of 2. Each TP group must sit on one NVLink pair, so the map is
0,2,1,3,4,6,5,7 rather than the identity, and each worker must be bound to the CPUs of its
GPU's NUMA node. This machine's CPUs are few (2 on CI): the fake topology names CPU lists
within the ones this process may use (NUMA 0 = the first allowed CPU, NUMA 1 = the last),
and the test reads every worker's affinity with sched_getaffinity. `ganglion info` must
print the same map. The same gang with --gpu-bind=0 keeps the identity and the
affinity it inherited."""
import os
import re
import subprocess
import sys

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness as H  # noqa: E402

NPROC, TP = 8, 2
WANT_MAP = [0, 2, 1, 3, 4, 6, 5, 7]


def write_topology(path, cpu0, cpu1):
    with open(path, "w") as f:
        for g in range(NPROC):
            numa, cpu = (0, cpu0) if g < 4 else (1, cpu1)
            f.write("gpu %d uuid=GPU-p%d numa=%d cpus=%d\n" % (g, g, numa, cpu))
        for a, b in ((0, 2), (1, 3), (4, 6), (5, 7)):
            f.write("nvlink %d %d\n" % (a, b))


def serve(h, config, bind):
    g = H.Gang(h, nnodes=1, nproc_per_node=NPROC, hb_interval_ms=200, hb_timeout_ms=3000,
               extra=["--tp", str(TP), "--pp", str(NPROC // TP), "--nvml-library", h.fake_nvml,
                      "--gpu-health-interval-ms", "500", "--gpu-bind=%d" % bind])
    argv = [h.bin, "serve"] + g.flags + [
        "--node-index", "0", "--bind-address", H.local_address(0),
        "--coordinator", "127.0.0.1:%d" % g.rdzv_port]
    g.agents[0] = h.spawn("agent-bind%d" % bind, argv, (0,), {"FAKE_NVML_CONFIG": config})
    g.wait_serving(timeout=60)
    return g


def gpus_and_affinity(g):
    """{local rank: (GPU index from /status, sched_getaffinity of the worker)}, once every
    worker has reported its GPU."""
    def ready():
        st = g.status(0)
        ranks = st and st.get("local_ranks")
        if not ranks or any(r.get("gpu") is None for r in ranks):
            return None
        return {r["local_rank"]: (r["gpu"]["index"], os.sched_getaffinity(r["pid"]))
                for r in ranks}

    return H.wait_until(ready, 10, 0.05, "every worker's GPU in /status")


def scenario(h):
    if not h.fake_nvml:
        raise H.TestSkip("no fake NVML library given (--fake-nvml)")
    allowed = sorted(os.sched_getaffinity(0))
    cpu0, cpu1 = allowed[0], allowed[-1]
    H.log("allowed CPUs %s: NUMA 0 -> CPU %d, NUMA 1 -> CPU %d" % (allowed, cpu0, cpu1))
    config = os.path.join(h.tmp, "nvml.conf")
    write_topology(config, cpu0, cpu1)

    env = dict(os.environ, FAKE_NVML_CONFIG=config)
    out = subprocess.run([h.bin, "info", "--nvml-library", h.fake_nvml, "--nproc-per-node",
                          str(NPROC), "--tp", str(TP)], env=env, capture_output=True,
                         text=True, timeout=20)
    H.check(out.returncode == 0, "info exited %d: %s" % (out.returncode, out.stderr))
    shown = [int(m) for m in re.findall(r"local rank \d+ -> GPU (\d+)", out.stdout)]
    H.check(shown == WANT_MAP, "info shows %r, want %r:\n%s" % (shown, WANT_MAP, out.stdout))
    H.check("4 NVLink island(s)" in out.stdout, "info topology:\n%s" % out.stdout)

    g = serve(h, config, bind=True)
    got = gpus_and_affinity(g)
    for lr in range(NPROC):
        gpu, aff = got[lr]
        want_cpu = cpu0 if WANT_MAP[lr] < 4 else cpu1
        H.log("local rank %d: GPU %d, CPUs %s" % (lr, gpu, sorted(aff)))
        H.check(gpu == WANT_MAP[lr],
                "local rank %d got GPU %d, want %d" % (lr, gpu, WANT_MAP[lr]))
        H.check(aff == {want_cpu},
                "local rank %d bound to %s, want {%d}" % (lr, sorted(aff), want_cpu))
    H.check(g.stop()[0] == 0, "agent did not exit 0")

    g = serve(h, config, bind=False)
    got = gpus_and_affinity(g)
    for lr in range(NPROC):
        H.check(got[lr][0] == lr, "--gpu-bind=0: local rank %d got GPU %d" % (lr, got[lr][0]))
        H.check(got[lr][1] == set(allowed), "--gpu-bind=0: local rank %d bound to %s"
                % (lr, sorted(got[lr][1])))
    H.check(g.stop()[0] == 0, "agent did not exit 0")


if __name__ == "__main__":
    H.run(scenario)
